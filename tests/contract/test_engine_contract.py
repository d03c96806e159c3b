"""The engine contract, one suite for every engine: the embedded engine always, OpenSearch whenever
a node is configured (always in CI). Each test runs the same calls with the same expectations."""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import pytest

from hybridsearch.engines import (
    BinarySearch,
    Bm25Options,
    Engine,
    GraphStore,
    LexicalSearch,
    Neighbors,
    VectorSearch,
    WorkLinks,
    sample_keys,
)
from hybridsearch.errors import EngineError, IndexNotFoundError, QueryError, ValidationError
from hybridsearch.hdc import HdcEncoder
from hybridsearch.models import DateRange, DocInfo, Document, Filters, RankedList
from hybridsearch.scoring import bm25_idf
from tests.conftest import opensearch_requests


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


DOCS = [
    Document(id="a", title="Compact space", text="Every open cover has a finite subcover.",
             subjects=["Topology"], year=1923, month=4, kind="definition", license="CC-BY-4.0",
             source="topology.pdf", cites=["b"], role="definition", utility_acts="covering argument"),
    Document(id="b", title="Heine–Borel theorem", text="A subset of R^n is compact iff closed and bounded.",
             subjects=["analysis"], year=1895, kind="theorem", license="CC-BY-NC-4.0", source="analysis.pdf",
             authors=["E. Heine", "É. Borel"], venue="Math. Ann."),
    Document(id="c", title="C*-algebra", text="A Banach algebra with an involution and the C* identity.",
             subjects=["analysis", "operator algebras"], year=1943, kind="definition", license="CC-BY-4.0",
             cites=["b", "not-indexed"], metadata={"doi": "10.1/x", "rank": 2}),
]
VECS = unit_vectors(3)
PASSAGES = [unit_vectors(len(d.passages), seed=20 + i) for i, d in enumerate(DOCS)]
ENC = HdcEncoder()
CODES = [ENC.encode_document(d) for d in DOCS]


@pytest.fixture(params=["embedded", pytest.param("opensearch", marks=pytest.mark.opensearch)])
def blank(request, tmp_path):
    """An empty engine of each kind."""
    if request.param == "opensearch":
        yield request.getfixturevalue("opensearch_index")
        return
    from hybridsearch.engines import open_engine

    e = open_engine(str(tmp_path / "idx"))
    yield e
    e.close()


@pytest.fixture
def engine(blank):
    blank.write(DOCS, VECS, CODES, PASSAGES)
    return blank


def test_protocols_and_capabilities(engine) -> None:
    for proto in (Engine, LexicalSearch, VectorSearch, BinarySearch, GraphStore):
        assert isinstance(engine, proto), proto.__name__
    assert {"lexical", "vector", "binary", "graph"} <= engine.capabilities


def test_write_get_count_and_stats(engine) -> None:
    assert engine.count() == 3
    got = engine.get(["a", "c", "missing"])
    assert set(got) == {"a", "c"} and got["a"] == DOCS[0] and got["c"] == DOCS[2]
    info = engine.doc_info(["b"])["b"]
    assert info.work_id == "b" and info.authors == ("E. Heine", "É. Borel") and info.venue == "Math. Ann."
    # in id order, each with the DocInfo `doc_info` gives
    chunks = engine.work_chunks(["c", "a", "not-a-work"])
    assert list(chunks) == ["a", "c"] and chunks == engine.doc_info(["a", "c"]) and engine.work_chunks([]) == {}
    # filtered as every channel filters: the licence of a chunk the caller may not see hides it
    assert list(engine.work_chunks(["a", "b", "c"], Filters(license=["cc-by-4.0"]))) == ["a", "c"]
    assert list(engine.work_chunks(["a", "b", "c"], Filters(kind=["theorem"], date_range=DateRange(lte=1900)))) == ["b"]
    st = engine.stats()
    assert (st.documents, st.vectors, st.codes) == (3, 3, 3)
    assert {"documents", "vectors", "hdc_codes"} <= set(st.as_dict())
    engine.set_meta("corpus", {"fingerprint": "abc", "n": 3})
    assert engine.get_meta("corpus") == {"fingerprint": "abc", "n": 3} and engine.get_meta("nothing") is None


def test_bm25_finds_written_documents_and_weights_fields(engine) -> None:
    assert engine.bm25("compact").ids == ["a", "b"]
    assert engine.bm25("C-star algebra").ids == ["c"]  # the shared analysis on both engines
    assert engine.bm25("compact", {"text": 1.0}).ids == ["b"]
    assert engine.bm25("compact", {"title": 1.0}).ids == ["a"]
    assert engine.bm25("zzzunknown").ids == [] and engine.bm25("").ids == []


def test_most_fields_sums_and_best_fields_takes_the_max(engine) -> None:
    engine.write([DOCS[0].model_copy(update={"text": "A compact space; every open cover is finite."})])
    t = engine.bm25("compact", {"title": 1.0}).scores[0]
    x = dict(engine.bm25("compact", {"text": 1.0}, 3).items())["a"]
    most = dict(engine.bm25("compact", {"title": 1.0, "text": 1.0}, 3).items())["a"]
    best0 = dict(engine.bm25("compact", {"title": 1.0, "text": 1.0}, 3,
                             options=Bm25Options("best_fields", tie_breaker=0.0)).items())["a"]
    best5 = dict(engine.bm25("compact", {"title": 1.0, "text": 1.0}, 3,
                             options=Bm25Options("best_fields", tie_breaker=0.5)).items())["a"]
    assert most == pytest.approx(t + x, rel=1e-5)
    assert best0 == pytest.approx(max(t, x), rel=1e-5)
    assert best5 == pytest.approx(max(t, x) + 0.5 * min(t, x), rel=1e-5)
    boosted = engine.bm25("compact", options=Bm25Options(role_boost=2.0)).scores
    assert boosted == pytest.approx([2 * s for s in engine.bm25("compact").scores])


def test_bm25_with_other_k1_is_the_exact_formula(engine) -> None:
    """k1=1.5 rescoring: one field, one term, so the formula is checkable by hand from the
    engine's own statistics (average length over all documents)."""
    docs = {d.id: d for d in DOCS}
    stats = engine.term_stats(["compact"])
    n = stats.num_docs
    lengths = {i: len(engine.analyzer.analyze(d.text)) for i, d in docs.items()}
    avg = sum(lengths.values()) / n
    got = dict(engine.bm25("compact", {"text": 1.0}, 3, options=Bm25Options(k1=1.5, b=0.75)).items())
    idf = bm25_idf(n, 1)
    norm = 1.5 * (1 - 0.75 + 0.75 * lengths["b"] / avg)
    assert set(got) == {"b"} and got["b"] == pytest.approx(idf * 1 * 2.5 / (1 + norm), rel=1e-9)


def test_the_joined_field_scores_title_and_text_as_one(engine) -> None:
    """`title_text` (JOINED_FIELDS) is BM25 over title and text together: a term's frequency and the
    length count over both, and a chunk with the term in both counts once in its document frequency.
    By hand from the engine's own statistics, from the index (k1 1.2) and rescored (k1 1.5)."""
    engine.write([Document(id="d", title="Compact sets", text="Every compact set is closed.")])
    an = engine.analyzer
    docs = engine.get(["a", "b", "c", "d"])
    lengths = {i: len(an.analyze(d.title)) + len(an.analyze(d.text)) for i, d in docs.items()}
    avg = sum(lengths.values()) / 4
    idf = bm25_idf(4, 3)  # "compact": in a's title, b's text, and d's title and text

    def bm25(tf: int, dl: int, k1: float) -> float:
        return idf * tf * (k1 + 1) / (tf + k1 * (1 - 0.75 + 0.75 * dl / avg))

    for k1, rel in ((1.2, 1e-5), (1.5, 1e-9)):
        got = dict(engine.bm25("compact", {"title_text": 1.0}, 4, options=Bm25Options(k1=k1)).items())
        assert got == {i: pytest.approx(bm25(tf, lengths[i], k1), rel=rel) for i, tf in (("a", 1), ("b", 1), ("d", 2))}
    # with the other fields, as `hybrid` asks: the joined field stands for title and text
    assert engine.bm25("C-star algebra", {"title_text": 1.0, "subjects": 1.0}).ids == ["c"]
    with pytest.raises(QueryError, match="unknown BM25 field 'titel'; valid: title, text, .*, title_text"):
        engine.bm25("compact", {"titel": 1.0})


def test_term_stats(engine) -> None:
    stats = engine.term_stats(["compact", "algebra", "zzunseen"])
    assert stats.num_docs == 3
    assert stats.terms["compact"].df == 1  # the field where it is most frequent: title and text have 1 each
    assert stats.terms["algebra"].df == 1 and stats.terms["zzunseen"].df == 0
    assert stats.terms["compact"].idf == pytest.approx(math.log(1 + (3 - 1 + 0.5) / 1.5))


def test_words_longer_than_lucenes_tokens_are_found_alike(engine) -> None:
    """OpenSearch's whitespace tokenizer cuts a token after 255 UTF-16 code units; the shared
    analysis emits the same pieces, so a 300-letter word and one of 200 characters outside the BMP
    (two units each) are found, with the same statistics, on every engine."""
    from hybridsearch.analysis import default_analyzer

    ascii_word, astral_word = "z" * 300, "\U00020000" * 200
    engine.write([Document(id="long", title="Long words", text=f"alpha {ascii_word} beta {astral_word}")])
    pieces = default_analyzer().analyze(f"{ascii_word} {astral_word}")
    assert [len(p) for p in pieces] == [255, 45, 128, 72]
    assert engine.bm25(ascii_word).ids == ["long"] and engine.bm25(astral_word).ids == ["long"]
    assert {t: s.df for t, s in engine.term_stats(pieces).terms.items()} == dict.fromkeys(pieces, 1)


def test_dense_scores_are_raw_cosine(engine) -> None:
    hit = engine.knn(VECS[1], 1)
    assert hit.ids == ["b"] and hit.scores[0] == pytest.approx(1.0, abs=1e-5)
    q = unit_vectors(1, seed=5)[0]
    rl = engine.knn(q, 3)
    expected = {d.id: float(VECS[i] @ q) for i, d in enumerate(DOCS)}
    assert rl.ids == sorted(expected, key=lambda i: -expected[i])
    assert rl.scores == pytest.approx([expected[i] for i in rl.ids], abs=1e-5)
    exact = engine.vector_score(q, ["a", "b", "missing"])
    assert set(exact) == {"a", "b"} and exact["a"] == pytest.approx(expected["a"], abs=1e-6)
    vecs = engine.vectors(["c", "missing"])
    assert set(vecs) == {"c"} and np.allclose(vecs["c"], VECS[2], atol=1e-7)
    with pytest.raises(QueryError, match="384 finite numbers"):
        engine.knn(np.zeros(10, dtype=np.float32), 3)
    with pytest.raises(QueryError, match="384 finite numbers"):
        engine.vector_score(np.full(384, np.nan, dtype=np.float32), ["a"])


def test_hamming_scores_are_exact_similarities(engine) -> None:
    q = ENC.encode_query("compact open cover")
    hits = engine.hamming({"topic": CODES[0]["topic"]}, 3)["topic"]
    assert hits.ids[0] == "a" and hits.scores[0] == 1.0
    exact = engine.hamming_score({"claim": q["claim"]}, ["a", "b", "c", "missing"])["claim"]
    for i, d in enumerate(DOCS[:3]):
        d_bits = int(np.unpackbits(np.bitwise_xor(q["claim"], CODES[i]["claim"])).sum())
        assert exact[d.id] == pytest.approx(1 - d_bits / 4096, abs=1e-12)
    # role is empty on b and c: no code, never matches
    assert set(engine.hamming_score({"role": CODES[0]["role"]}, ["a", "b", "c"])["role"]) == {"a"}
    assert engine.hamming({"role": CODES[0]["role"]}, 5)["role"].ids == ["a"]
    with pytest.raises(QueryError, match="unknown HDC field 'tags'; valid: topic, claim, role, acts"):
        engine.hamming({"topic": q["topic"], "tags": q["topic"]}, 3)
    with pytest.raises(QueryError, match=r"an HDC code is 512 uint8 bytes, got int64 \(512,\) for claim"):
        engine.hamming_score({"topic": q["topic"], "claim": q["claim"].astype(np.int64)}, ["a"])
    assert engine.hdc_encoder().ngrams is False


def test_hamming_of_several_fields_equals_each_field_alone(engine) -> None:
    q = ENC.encode_query("compact open cover of a Banach space")
    assert set(q) >= {"topic", "claim"}
    both = engine.hamming(q, 3)
    scores = engine.hamming_score(q, ["a", "b", "c", "missing"])
    assert set(both) == set(scores) == set(q)
    for f, code in q.items():
        assert both[f] == engine.hamming({f: code}, 3)[f] and both[f].ids
        assert scores[f] == engine.hamming_score({f: code}, ["a", "b", "c", "missing"])[f] and scores[f]
    assert engine.hamming(q, 0) == {f: RankedList.of(f"hdc:{f}", [], []) for f in q}
    assert engine.hamming_score(q, []) == {f: {} for f in q}
    if hasattr(engine, "client"):  # OpenSearch: every field in one _msearch round trip, no other search
        with opensearch_requests(engine) as sent:
            assert engine.hamming(q, 3) == both and engine.hamming_score(q, ["a", "b", "c", "missing"]) == scores
        assert [(what, len(bodies)) for what, bodies in sent] == [("hamming", len(q)), ("hamming score", len(q))]


@pytest.mark.opensearch
def test_opensearch_msearch_failures_are_one_clear_error(opensearch_index) -> None:
    """A search inside an `_msearch` that fails raises what the same search alone would."""
    q = ENC.encode_query("compact open cover")
    with pytest.raises(IndexNotFoundError, match=r"no index 'test-.*' at http.*; ingest into it first$"):
        opensearch_index.hamming(q, 3)
    opensearch_index.write(DOCS, VECS, CODES)
    with pytest.raises(EngineError, match=r"^OpenSearch hamming failed: parsing_exception: .*no_such_query"):
        opensearch_index._msearch([{"query": {"match_all": {}}}, {"query": {"no_such_query": {}}}], "hamming")


@pytest.mark.opensearch
def test_compressed_vectors_find_and_score_as_the_float32_ones(opensearch_url, monkeypatch) -> None:
    """opensearch_vector_compression: a new index quantises its dense vectors (k-NN's
    compression_level), and a kNN search rescores its candidates with the float32 vectors, so the
    hits and their cosines are the exact ones. A 3.x node without the k-NN native libraries reads
    such an index through NIOFS (with the files mapped, 3.x scores quantised vectors with those
    libraries, and the node dies at the first search). 2.x, which would not rescore, refuses."""
    import uuid

    from hybridsearch.engines.opensearch import OpenSearchEngine
    from hybridsearch.engines.opensearch.admin import lacking_native_knn, server_major
    from hybridsearch.errors import ConfigError

    rng = np.random.default_rng(3)
    n = 2000
    vecs = unit_vectors(20, seed=5)[rng.integers(0, 20, n)] + 0.05 * rng.standard_normal((n, 384))
    vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
    docs = [Document(id=f"d{i}", title=f"chunk {i}", text="a compressed vector") for i in range(n)]
    # queries near the chunks, as a query's vector is near those of the chunks that answer it
    queries = vecs[rng.integers(0, n, 12)] + 0.03 * rng.standard_normal((12, 384))
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    probe = OpenSearchEngine(opensearch_url, index="unused")
    major, lacking = server_major(probe.client), bool(lacking_native_knn(probe.client))
    probe.close()
    for level in ("4x", "32x"):
        monkeypatch.setenv("HYBRIDSEARCH_OPENSEARCH_VECTOR_COMPRESSION", level)
        engine = OpenSearchEngine(opensearch_url, index=f"test-compressed-{level}-{uuid.uuid4().hex[:6]}")
        try:
            if major < 3:
                with pytest.raises(ConfigError, match=rf"^opensearch_vector_compression: '{level}' needs OpenSearch "
                                                      r"3\.x .*; the cluster runs 2\.x$"):
                    engine.write(docs[:1], vecs[:1])
                continue
            engine.write(docs, vecs)
            details = engine.stats().details
            assert details["compression"] == level
            live = details["concrete_index"]
            store = engine.client.indices.get_settings(index=live)[live]["settings"]["index"].get("store", {})
            assert store.get("type") == ("niofs" if major >= 3 and lacking else None)
            found = total = 0
            for q in queries:
                got = engine.knn(q, 10)
                exact = vecs @ q
                tenth = np.sort(exact)[-10]
                found += sum(exact[int(i[1:])] >= tenth - 1e-6 for i in got.ids)
                total += 10
                # rescored with the float32 vectors: each hit's cosine is its exact one
                assert got.scores == pytest.approx([float(exact[int(i[1:])]) for i in got.ids], abs=1e-5)
            assert found / total >= 0.95, (level, found, total)
        finally:
            engine.drop()
            engine.close()


@pytest.mark.parametrize(("filters", "bm25_ids", "dense_ids"), [
    (Filters(subjects=["topology"]), {"a"}, {"a"}),
    (Filters(subjects=["ANALYSIS"]), {"b"}, {"b", "c"}),
    (Filters(subjects=[" Operator Algebras "]), set(), {"c"}),
    (Filters(kind=["theorem"]), {"b"}, {"b"}),
    (Filters(license=["cc-by-4.0"]), {"a"}, {"a", "c"}),
    (Filters(sources=["analysis.pdf"]), {"b"}, {"b"}),
    (Filters(sources=["ANALYSIS.pdf"]), set(), set()),
    (Filters(date_range=DateRange(gte="1900", lte="1930")), {"a"}, {"a"}),
    (Filters(date_range=DateRange(gte="1923-05")), set(), {"c"}),
    (Filters(date_range=DateRange(gte="1923-04", lte="1923-04")), {"a"}, {"a"}),
    (Filters(date_range=DateRange(lte=1900)), {"b"}, {"b"}),
    (Filters(subjects=["analysis"], date_range=DateRange(gte=1940)), set(), {"c"}),
])
def test_filters_mean_the_same_in_every_channel(engine, filters, bm25_ids, dense_ids) -> None:
    assert set(engine.bm25("compact", k=10, filters=filters).ids) == bm25_ids
    assert set(engine.knn(VECS[0], 10, filters).ids) == dense_ids
    assert set(engine.hamming({"topic": CODES[0]["topic"]}, 10, filters)["topic"].ids) == dense_ids


def test_update_replaces_and_delete_removes_in_every_channel(engine) -> None:
    new_vec = unit_vectors(1, seed=9)
    new = Document(id="a", title="Connectedness", text="No separation into open sets.")
    engine.write([new], new_vec, [ENC.encode_document(new)])
    assert "a" not in engine.bm25("compact").ids and engine.bm25("connectedness").ids == ["a"]
    assert engine.knn(new_vec[0], 1).ids == ["a"] and engine.knn(VECS[0], 3).ids.count("a") == 1
    assert engine.hamming({"topic": ENC.encode_document(new)["topic"]}, 1)["topic"].ids == ["a"]
    assert engine.get(["a"])["a"] == new and engine.count() == 3
    assert engine.delete(["b", "nope", ""]) == ["b"]  # an id no chunk can have fails nothing
    assert "b" not in engine.bm25("compact").ids and "b" not in engine.knn(VECS[1], 3).ids
    assert "b" not in engine.hamming({"topic": CODES[1]["topic"]}, 3)["topic"].ids
    assert engine.count() == 2 and engine.get(["b"]) == {}


def test_vector_sample_is_a_fixed_subset_of_the_stored_vectors(engine) -> None:
    engine.write([DOCS[0].model_copy(update={"id": "no-vector", "text": "Written without a vector."})])
    everything = engine.vector_sample(10)  # the chunk without a vector is not in it
    assert everything.shape == (3, VECS.shape[1])
    assert sorted(map(tuple, np.round(everything, 5))) == sorted(map(tuple, np.round(VECS, 5)))
    two = engine.vector_sample(2)
    assert two.shape == (2, VECS.shape[1]) and np.array_equal(two, engine.vector_sample(2))
    assert all(any(np.allclose(row, v, atol=1e-5) for v in VECS) for row in two)
    # only chunks passing the filters (the domain check's licence filter): a and c are CC-BY-4.0
    licensed = engine.vector_sample(10, Filters(license=["cc-by-4.0"]))
    assert sorted(map(tuple, np.round(licensed, 5))) == sorted(map(tuple, np.round(VECS[[0, 2]], 5)))
    assert engine.vector_sample(10, Filters(license=["none-such"])).shape[0] == 0
    engine.delete(["a", "b", "c"])
    assert engine.vector_sample(5).shape[0] == 0 and engine.count() == 1


def test_vector_sample_takes_the_same_chunks_on_every_engine(blank) -> None:
    """The n chunks with the smallest (sample key, id), in that order: an index larger than the
    domain sample gives the domain check the same centroid and edge on both engines."""
    ids = [f"doc-{i}" for i in range(40)] + ["Heine–Borel", "𝔽-field", "日本語"]
    vecs = unit_vectors(len(ids), seed=3)
    blank.write([Document(id=i, title=f"Title {i}", text="Some text.") for i in ids], vecs)
    keys = sample_keys(ids)
    want = sorted(range(len(ids)), key=lambda j: (int(keys[j]), ids[j]))[:10]
    got = blank.vector_sample(10)
    assert got.shape == (10, 384) and np.allclose(got, vecs[want], atol=1e-5)


def test_has_vectors_says_whether_any_chunk_holds_one(blank) -> None:
    assert blank.has_vectors() is False  # before the first write too
    blank.write([Document(id="a", title="Alpha", text="No vector yet.")])
    assert blank.has_vectors() is False
    blank.set_vectors(["a"], unit_vectors(1), passages=[unit_vectors(1)])
    assert blank.has_vectors() is True
    blank.delete(["a"])
    assert blank.has_vectors() is False


def test_vectors_and_codes_follow_the_text(engine) -> None:
    # same dense text, no vectors given: the vector stays; changed text: it is dropped
    engine.write([DOCS[2].model_copy(update={"subjects": ["algebra"]})])
    assert engine.knn(VECS[2], 1).ids == ["c"] and engine.missing_vectors() == []
    engine.write([DOCS[1].model_copy(update={"text": "Entirely new statement."})])
    assert "b" not in engine.knn(VECS[1], 3).ids
    assert [i for i, _ in engine.missing_vectors()] == ["b"]
    # among given ids (what a worker's batch asks): only those still needing the work
    assert [i for i, _ in engine.missing_vectors(ids=["c", "b", "unknown"])] == ["b"]
    assert engine.missing_vectors(ids=["a", "c"]) == [] and engine.missing_vectors(ids=[]) == []
    assert engine.missing_vectors(ids=["b"])[0][1].text == "Entirely new statement."
    # written without codes: the stale codes are gone
    assert sorted(i for i, _ in engine.missing_codes()) == ["b", "c"]
    assert [i for i, _ in engine.missing_codes(ids=["a", "c"])] == ["c"]
    assert engine.set_vectors(["b", "unknown"], unit_vectors(2, seed=4)) == 1
    # a vector without passage vectors (an older writer's) leaves the chunk to embed
    assert [i for i, _ in engine.missing_vectors()] == ["b"] and engine.passage_vectors(["b"]) == {}
    # a vector computed from text the chunk no longer has is dropped (a worker's stale result)
    new_b = engine.get(["b"])["b"]
    b_passages = [unit_vectors(len(new_b.passages), seed=7)]
    assert engine.set_vectors(["b"], unit_vectors(1, seed=9), texts=["Compact space Old statement."],
                              passages=b_passages) == 0
    assert engine.passage_vectors(["b"]) == {}
    assert engine.set_vectors(["b"], unit_vectors(1, seed=4), texts=[new_b.dense_text], passages=b_passages) == 1
    assert engine.knn(unit_vectors(2, seed=4)[0], 1).ids == ["b"] and engine.missing_vectors() == []
    np.testing.assert_allclose(engine.passage_vectors(["b"])["b"], b_passages[0], atol=1e-6)
    assert engine.set_codes(["b"], [ENC.encode_document(engine.get(["b"])["b"])]) == 1
    assert [i for i, _ in engine.missing_codes()] == ["c"] and engine.stats().codes == 2


def test_passage_score_is_the_best_passage_cosine_and_passages_follow_the_text(engine) -> None:
    q = unit_vectors(1, seed=99)[0]
    want = {d.id: float(np.max(p @ q)) for d, p in zip(DOCS, PASSAGES, strict=True)}
    assert engine.passage_score(q, ["a", "b", "c", "unknown"]) == {i: pytest.approx(s, abs=1e-5)
                                                                 for i, s in want.items()}
    assert engine.passage_score(q, []) == {} and engine.passage_score(q, ["unknown"]) == {}
    got = engine.passage_vectors(["c", "unknown"])
    assert set(got) == {"c"} and got["c"].shape == (len(DOCS[2].passages), 384)
    np.testing.assert_allclose(got["c"], PASSAGES[2], atol=1e-6)
    # rewritten without vectors: kept while the dense text is unchanged, dropped with it otherwise
    engine.write([DOCS[0].model_copy(update={"subjects": ["algebra"]})])
    assert engine.passage_score(q, ["a"]) == {"a": pytest.approx(want["a"], abs=1e-5)}
    engine.write([DOCS[1].model_copy(update={"title": "Heine-Borel"})])
    assert engine.passage_score(q, ["b"]) == {} and engine.passage_vectors(["b"]) == {}
    # bad input: one error naming the field, nothing written
    with pytest.raises(ValidationError, match=r"field 'passages': chunk 0: row 1 has a non-finite value"):
        engine.write(DOCS[:1], VECS[:1], passages=[np.array([[1.0] * 384, [np.nan] * 384])])
    with pytest.raises(ValidationError, match=r"field 'passages': chunk 0: expected shape \(passages, 384\)"):
        engine.write(DOCS[:1], VECS[:1], passages=[np.zeros((0, 384))])
    with pytest.raises(ValidationError, match=r"field 'passages': passage vectors come with the chunks' vectors"):
        engine.write(DOCS[:1], passages=PASSAGES[:1])
    with pytest.raises(ValidationError, match=r"field 'passages': expected passage vectors of 1 chunks, got 2"):
        engine.set_vectors(["a"], VECS[:1], passages=PASSAGES[:2])
    assert engine.passage_score(q, ["a"]) == {"a": pytest.approx(want["a"], abs=1e-5)}


def test_doc_info_is_the_documents_own(engine) -> None:
    """However the engine reads it (OpenSearch: doc values, the title from its binary copy, however
    long), DocInfo is what the stored document gives; authors and subjects as sets."""
    engine.write([Document(id="long", title="Compact " * 700, text="x", authors=["Z", "A", "Z"],
                           subjects=["topology", "analysis"], year=1901)])
    infos = engine.doc_info(["a", "b", "c", "long", "missing"])
    assert infos == {i: DocInfo.of(d) for i, d in engine.get(["a", "b", "c", "long"]).items()}
    assert infos["long"].authors == ("A", "Z") and infos["long"].subjects == ("analysis", "topology")
    assert len(infos["long"].title) > 4096 and infos["c"].subjects == ("analysis", "operator algebras")
    if hasattr(engine, "client"):  # OpenSearch: an id that does not exist costs one request, not two
        with opensearch_requests(engine) as sent:
            assert engine.doc_info(["missing"]) == {}
        assert [what for what, _ in sent] == ["doc info"]
    # a work's chunks come with the same DocInfo (OpenSearch: read in the request that finds them)
    with opensearch_requests(engine) if hasattr(engine, "client") else nullcontext([]) as sent:
        assert engine.work_chunks(["long", "c", "missing"]) == {"c": infos["c"], "long": infos["long"]}
    assert [what for what, _ in sent] == (["scan"] if hasattr(engine, "client") else [])


def test_citation_graph(engine) -> None:
    """Built by indexer.graph from the stored `cites`, stored with the index and served per chunk;
    the same input again builds nothing, a change rebuilds, and a rewritten chunk keeps its work's."""
    from indexer.graph import update_graph

    assert engine.neighbors(["a", "missing"]) == {"a": Neighbors()} and engine.graph_summary() is None
    assert engine.citation_links() == [WorkLinks("a", 192304, ("b",)), WorkLinks("b", 189500, ()),
                                       WorkLinks("c", 194300, ("b", "not-indexed"))]
    summary, built = update_graph(engine)
    # edges a->b, c->b, c->not-indexed; b and the missing target cite nothing
    assert built and (summary.works, summary.edges, summary.missing, summary.dangling) == (3, 3, 1, 2)
    assert engine.graph_summary() == summary and engine.stats().details["graph"] == summary.as_dict()
    nb = engine.neighbors(["a", "b", "c", "missing"])
    assert set(nb) == {"a", "b", "c"}
    assert nb["b"].cited_by == ("a", "c") and nb["c"].cites == ("b", "not-indexed") and nb["a"].cites == ("b",)
    assert nb["b"].authority == 1.0 and nb["a"].authority == 0.0
    assert nb["b"].pagerank > nb["a"].pagerank > 0
    # what the reranker reads: the authority alone, the same as in the neighbour lists
    assert engine.authority(["a", "b", "c", "missing"]) == {i: nb[i].authority for i in "abc"}
    if hasattr(engine, "client"):  # OpenSearch: the chunks' work ids, then the works' `lists` (graph index)
        with opensearch_requests(engine) as sent:
            assert engine.neighbors(["a", "b", "c", "missing"]) == nb
        assert [what for what, _ in sent] == ["neighbors", "read graph"], sent
        assert sent[1][1][0]["docvalue_fields"] == ["id", "lists"], sent
    assert update_graph(engine) == (summary, False)

    engine.write([Document(id="d", title="Tychonoff theorem", text="Products of compact spaces are compact.",
                           year=1950, cites=["a", "b"])])
    engine.write([DOCS[1]])  # rewritten unchanged: keeps its work's graph until the next build
    assert engine.neighbors(["b"])["b"].cited_by == ("a", "c")
    assert set(engine.authority(["b", "d"])) == {"b"}  # d was written after the build
    # a chunk takes the graph of the work it is written into, as the last build saw that work
    engine.write([DOCS[0].model_copy(update={"id": "b#1", "work_id": "b"})])
    assert engine.neighbors(["b#1"])["b#1"] == engine.neighbors(["b"])["b"]
    engine.write([DOCS[0].model_copy(update={"id": "b#1", "work_id": "unbuilt"})])
    assert engine.neighbors(["b#1"]) == {"b#1": Neighbors()} and engine.authority(["b#1"]) == {}
    engine.delete(["b#1"])
    summary, built = update_graph(engine)
    assert built and summary.works == 4 and summary.edges == 5
    # a chunk whose id does not name its work (neither the work id nor work#n) stands for its work
    # when cited: it is not a missing target
    engine.write([Document(id="p1", work_id="W1", title="Part one", text="x"),
                  Document(id="p2", work_id="W1", title="Part two", text="y"),
                  Document(id="e", title="Citing a part", text="z", cites=["p1"])])
    assert WorkLinks("W1", None, (), ("p1", "p2")) in engine.citation_links()
    summary, built = update_graph(engine)
    assert built and summary.missing == 1  # not-indexed, as before; p1 is W1
    assert engine.neighbors(["p2", "e"]) == {"p2": engine.neighbors(["p1"])["p1"], "e": engine.neighbors(["e"])["e"]}
    assert engine.neighbors(["p1"])["p1"].cited_by == ("e",) and engine.neighbors(["e"])["e"].cites == ("W1",)
    nb = engine.neighbors(["a", "b", "d"])
    assert nb["a"].cocited == ("b",) and nb["b"].cocited == ("a",) and nb["d"].cocited == ()
    assert nb["b"].cited_by == ("a", "c", "d")
    engine.delete(["a"])
    update_graph(engine)
    assert engine.neighbors(["b"])["b"].cited_by == ("c", "d") and engine.neighbors(["b"])["b"].cocited == ()


def test_bad_input_is_rejected_and_nothing_is_stored(engine) -> None:
    bad = VECS.copy()
    bad[1, 3] = np.nan
    changed = [d.model_copy(update={"title": "changed"}) for d in DOCS]
    with pytest.raises(ValidationError, match="row 1 has a non-finite"):
        engine.write(changed, bad)
    with pytest.raises(ValidationError, match="shape"):
        engine.write(changed, VECS[:2])
    with pytest.raises(ValidationError, match="row 2 is all zeros"):
        engine.write(changed, np.vstack([VECS[:2], np.zeros((1, 384), np.float32)]))
    with pytest.raises(ValidationError, match="duplicate id"):
        engine.write([changed[0], changed[0]])
    with pytest.raises(ValidationError, match="record 'b', field 'cites': a value longer than 32766 bytes"):
        engine.write([changed[0], changed[1].model_copy(update={"cites": ["b", "x" * 32767]})])
    with pytest.raises(ValidationError, match="512 uint8"):
        engine.write(changed[:1], codes=[{"topic": np.zeros(10, dtype=np.uint8)}])
    with pytest.raises(QueryError, match="mode must be one of most_fields, best_fields"):
        engine.bm25("x", options=Bm25Options(mode="sum"))  # type: ignore[arg-type]
    with pytest.raises(QueryError, match="tie_breaker"):
        engine.bm25("x", options=Bm25Options(tie_breaker=float("nan")))
    assert engine.get(["a"])["a"].title == "Compact space"


def test_requests_at_the_edges_are_answered_alike(engine) -> None:
    """Ids no chunk can have, repeated ids across pages, sizes past OpenSearch's 10,000-hit window,
    fields weighted 0 and query vectors of any length: answered as the contract says, on every
    engine, instead of failing a whole request or matching everything."""
    assert set(engine.doc_info(["a", ""])) == {"a"} and set(engine.vector_score(VECS[0], ["", "a"])) == {"a"}
    assert set(engine.neighbors(["", "a"])) == {"a"} and engine.authority([""]) == {}
    assert set(engine.hamming_score({"topic": CODES[0]["topic"]}, ["a", ""])["topic"]) == {"a"}
    engine.write([Document(id="novec", title="No vector", text="x")])
    assert [i for i, _ in engine.missing_vectors(ids=["novec"] * 1001 + ["", "a"])] == ["novec"]
    assert [i for i, _ in engine.missing_codes(["novec"] * 1001)] == ["novec"]
    assert engine.bm25("compact", {"title": 0.0, "text": 0.0}).ids == []  # no field scored: nothing
    assert engine.knn(VECS[0], 20_000).ids[0] == "a" and len(engine.knn(VECS[0], 20_000)) == 3
    assert engine.hamming({"topic": CODES[0]["topic"]}, 20_000)["topic"].ids[0] == "a"
    assert engine.bm25("compact", k=3000, options=Bm25Options(k1=1.0)).ids[0] in {"a", "b"}
    assert engine.vector_sample(-1).shape == (0, 384) and engine.vector_sample(20_000).shape == (3, 384)
    assert engine.knn(3.5 * VECS[1], 1).scores == pytest.approx([1.0], abs=1e-5)  # a cosine, whatever the length
    with pytest.raises(QueryError, match="all zeros"):
        engine.knn(np.zeros(384, np.float32), 3)
    with pytest.raises(QueryError, match="unknown BM25 field 'abstract'"):
        engine.bm25("compact", {"abstract": 1.0})
    with pytest.raises(QueryError, match=r"tie_breaker must be in \[0, 1\]"):
        engine.bm25("compact", options=Bm25Options("best_fields", tie_breaker=1.5))
    for bound, message in (("99999999", "year out of range"), ("\u00b2", "expected YYYY or YYYY-MM")):
        with pytest.raises(ValidationError, match=message):
            engine.bm25("compact", filters=Filters(date_range=DateRange(gte=bound)))


def test_dense_scores_are_cosines_whatever_the_stored_vectors_length(blank) -> None:
    q = unit_vectors(1, seed=5)[0]
    near = 0.8 * q + 0.6 * unit_vectors(1, seed=6)[0]
    far = unit_vectors(1, seed=7)[0]
    docs = [Document(id=i, title=i, text="x") for i in ("long", "unit", "huge")]
    blank.write(docs, np.stack([5.0 * far, near / np.linalg.norm(near), 1e30 * far]).astype(np.float32))
    cos = {"long": float(far @ q), "unit": float(near @ q / np.linalg.norm(near)), "huge": float(far @ q)}
    got = blank.knn(q, 3)
    assert got.ids[0] == "unit" and dict(zip(got.ids, got.scores, strict=True)) == pytest.approx(cos, abs=1e-4)
    huge = blank.knn((1e30 * q).astype(np.float32), 3)  # a query whose float32 length overflows
    assert huge.ids == got.ids and huge.scores == pytest.approx(got.scores, abs=1e-4)
    assert blank.vector_score(q, ["huge", "long"]) == pytest.approx({"huge": cos["huge"], "long": cos["long"]},
                                                                  abs=1e-4)
    blank.set_vectors(["unit"], (7.0 * far)[None, :])
    assert blank.vector_score(q, ["unit"]) == pytest.approx({"unit": cos["long"]}, abs=1e-4)


def test_an_empty_engine_answers_empty(blank) -> None:
    blank.write([Document(id="only", title="Lonely", text="x")])
    blank.delete(["only"])
    assert blank.count() == 0 and blank.bm25("lonely").ids == [] and blank.knn(VECS[0], 5).ids == []
    assert blank.neighbors(["only"]) == {} and blank.authority(["only"]) == {} and blank.missing_vectors() == []


def test_long_queries_are_answered(engine) -> None:
    """150 distinct terms over 8 fields: 1,200 term clauses on OpenSearch."""
    terms = [(f"zz{i}", 1.0) for i in range(150)] + [("compact", 1.0)]
    assert engine.bm25(terms).ids == ["a", "b"]


def test_ingesting_a_corpus_again_embeds_only_changed_text(blank, tmp_path) -> None:
    """A corpus ingested again keeps the vectors of chunks whose text is unchanged (the model is
    not run for them) and embeds the changed ones; every chunk still has a vector for its text."""
    import json

    from indexer.pipeline import ingest

    class Counting:  # a deterministic encoder that records what it was asked to embed
        name, dim = "counting", 384

        def __init__(self) -> None:
            self.texts: list[str] = []

        def encode(self, texts, *, batch_size=None, progress=False, query=False) -> np.ndarray:  # noqa: ANN001
            self.texts += texts
            out = np.stack([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=self.dim) for t in texts])
            return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)

    records = [{"id": f"w{i}", "title": f"Work {i}", "text": f"the text of work {i}"} for i in range(6)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    enc = Counting()
    first = ingest(blank, corpus, encoder=enc, graph=False, progress=False, batch_size=4)
    # each chunk's dense text, then its passages: the title and the text's one sentence
    assert first.embedded == 6 and first.kept == 0 and len(enc.texts) == 6 * 3
    before = blank.vectors([r["id"] for r in records])
    passages = blank.passage_vectors([r["id"] for r in records])
    assert {i: p.shape for i, p in passages.items()} == {r["id"]: (2, 384) for r in records}

    records[2]["text"] = "a new text for work 2"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    enc.texts = []
    again = ingest(blank, corpus, encoder=enc, graph=False, progress=False, batch_size=4)
    assert again.indexed == 6 and again.embedded == 1 and again.kept == 5
    new = blank.get(["w2"])["w2"]
    assert enc.texts == sorted([new.dense_text, *new.passages], key=len, reverse=True)  # one queue, longest first
    assert "embedded 1 (kept the vectors of 5 unchanged chunks)" in again.lines()[0]
    after = blank.vectors([r["id"] for r in records])
    assert set(after) == set(before) and not blank.missing_vectors()
    now = blank.passage_vectors([r["id"] for r in records])
    for i in (0, 1, 3, 4, 5):
        assert np.array_equal(after[f"w{i}"], before[f"w{i}"])
        assert np.array_equal(now[f"w{i}"], passages[f"w{i}"])
    assert not np.array_equal(after["w2"], before["w2"])
    assert np.array_equal(now["w2"][0], passages["w2"][0]) and not np.array_equal(now["w2"][1], passages["w2"][1])
    assert blank.get(["w2"])["w2"].text == "a new text for work 2"
