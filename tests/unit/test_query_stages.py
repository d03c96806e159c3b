"""Query-side stages (IDF filter, expansion, decomposition) and the khive TF-IDF channel."""

from __future__ import annotations

import math

import pytest

from hybridsearch.engines import Bm25Options
from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.models import Document, RankedList
from query_service.channels import Bm25Channel, Bm25Config, QueryContext
from query_service.stages import alias_variants, decompose, idf_filter, keyword_variant, merge_subqueries
from query_service.tfidf import TfidfChannel, TfidfConfig

DOCS = [Document(id=f"filler{i}", title=f"note {i}", text="the common word appears everywhere") for i in range(20)]
DOCS += [
    Document(id="hb", title="Heine Borel theorem", text="compact iff closed and bounded, common word",
             subjects=["topology"]),
    Document(id="bw", title="Bolzano Weierstrass theorem", text="bounded sequences have convergent subsequences"),
]


@pytest.fixture
def engine(tmp_path):
    e = EmbeddedEngine(tmp_path / "idx")
    e.write(DOCS)
    yield e
    e.close()


def test_idf_filter_drops_common_terms_and_keeps_unseen_ones(engine) -> None:
    stats = engine.term_stats(["common", "heine", "zzunseen"])
    n = stats.num_docs
    df = stats.terms["common"].df
    assert stats.terms["common"].idf == pytest.approx(math.log(1 + (n - df + 0.5) / (df + 0.5)))
    assert idf_filter(["common", "heine", "zzunseen"], stats, 0.6) == ["heine", "zzunseen"]
    filtered = Bm25Channel(Bm25Config(min_idf=0.6)).retrieve(QueryContext("common word heine"), engine, 50)
    plain = Bm25Channel().retrieve(QueryContext("common word heine"), engine, 50)
    assert filtered.ids == ["hb"] and len(plain.ids) == 21


def test_expansion_terms_are_discounted(engine) -> None:
    ctx = QueryContext("Heine", variants=["Bolzano"])
    rl = Bm25Channel(Bm25Config(expand_discount=0.35)).retrieve(ctx, engine, 10)
    base_bw = Bm25Channel().retrieve(QueryContext("Bolzano"), engine, 10)
    assert rl.ids[:2] == ["hb", "bw"]
    assert dict(rl.items())["bw"] == pytest.approx(0.35 * dict(base_bw.items())["bw"], rel=1e-5)


def test_alias_and_keyword_variants() -> None:
    assert "c* algebra spectrum" in alias_variants("C-star algebra spectrum")
    assert alias_variants("Moebius band") == ["mobius band"]
    assert alias_variants("plain words only") == []
    assert keyword_variant("What is the Heine-Borel theorem?") == "what heine-borel theorem"


def test_decomposition_and_intersection_bonus(engine) -> None:
    assert decompose("Markov inequality vs Chebyshev inequality") == ["Markov inequality", "Chebyshev inequality"]
    assert decompose("Godel theorem") == ["Godel theorem"]
    assert len(decompose("compact sets in metric spaces are bounded")) == 2
    a = RankedList.of("bm25", ["x", "y"], [2.0, 1.0])
    b = RankedList.of("bm25", ["y", "z"], [3.0, 0.5])
    merged = dict(merge_subqueries([a, b], 10, 0.25, "bm25").items())
    assert merged == {"y": 3.0 * 1.25, "x": 2.0, "z": 0.5}
    rl = Bm25Channel(Bm25Config(decompose=True)).retrieve(
        QueryContext("Heine Borel theorem and bounded sequences subsequences"), engine, 10)
    assert rl.ids[0] in {"hb", "bw"} and {"hb", "bw"} <= set(rl.ids)


def test_tfidf_multisignal_formula(engine) -> None:
    ch = TfidfChannel(TfidfConfig(rerank=False))
    rl = ch.retrieve(QueryContext("Heine Borel theorem"), engine, 5)
    assert rl.ids[0] == "hb"
    stats = engine.term_stats(["hein", "borel", "theorem"])
    n = stats.num_docs
    idf = {t: math.log((n + 1) / (s.df + 1)) + 1 for t, s in stats.terms.items()}
    # hb: name tokens == query tokens (exact), tf in name 1/3 each, bigrams hein-borel and
    # borel-theorem in the name; description and tags have none of them; full coverage
    expected = sum(idf[t] * (5.0 * 1 + 3.0 * (1 / 3) + 2.0 * (1 if t != "theorem" else 0)) for t in idf)
    assert dict(rl.items())["hb"] == pytest.approx(expected)
    bw = dict(rl.items())["bw"]
    # bw: only "theorem" (1 of 3 terms) in its 3-token name: coverage 1/3
    assert bw == pytest.approx(idf["theorem"] * 3.0 * (1 / 3) * (1 / 3) ** 0.5)


def test_bm25_with_other_k1_rescoring_matches_tantivy_and_the_formula(engine) -> None:
    # short fields: tantivy's length quantisation is exact there, so its scores are the formula's
    base = engine.bm25("heine theorem bounded", k=5)
    same = engine.bm25("heine theorem bounded", k=5, options=Bm25Options(k1=1.2 + 1e-12))
    assert same.ids == base.ids and same.scores == pytest.approx(base.scores, rel=1e-4)
    k15 = dict(engine.bm25("heine theorem bounded", {"title": 1.0}, k=5, options=Bm25Options(k1=1.5)).items())
    n, avg = engine.bm25_index.field_stats()
    toks = engine.analyzer.analyze("Heine Borel theorem")
    expected = 0.0
    for t in ("hein", "theorem"):
        df = engine.bm25_index.field_doc_freq("title", t)
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        expected += idf * 1 * 2.5 / (1 + 1.5 * (1 - 0.75 + 0.75 * len(toks) / avg["title"]))
    assert k15["hb"] == pytest.approx(expected)


def test_rebuilds_a_bm25_index_written_with_another_schema(tmp_path) -> None:
    import shutil

    import tantivy

    path = tmp_path / "idx"
    with EmbeddedEngine(path) as e:
        e.write(DOCS)
    shutil.rmtree(path / "bm25")
    (path / "bm25").mkdir()
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("other", stored=True)
    tantivy.Index(sb.build(), path=str(path / "bm25"))
    (path / "bm25" / "applied.json").write_text('{"seq": 999, "fields": ["title"]}')
    with EmbeddedEngine(path) as e:
        assert e.bm25("heine").ids == ["hb"] and e.stats().details["bm25_docs"] == len(DOCS)


def test_equal_scores_rank_by_id_whatever_the_ingest_order(tmp_path, encoder) -> None:
    """Four documents with the same text score alike in every channel: the same content ingested in
    the opposite order gives the same top 3, by id, on one channel and fused (engines order ties by
    where a document lies in the index)."""
    from query_service.searcher import Searcher, adhoc_profile

    same = [Document(id=i, title="compact operator", text="compact operators on Banach spaces")
            for i in ("zeta", "beta", "alpha", "mid")]
    vectors = encoder.encode([d.dense_text for d in same])
    got = {}
    for order in ("forward", "reverse"):
        docs, vecs = (same, vectors) if order == "forward" else (same[::-1], vectors[::-1])
        with EmbeddedEngine(tmp_path / order) as e:
            e.write(docs, vecs)
            s = Searcher(e, encoder=encoder)
            got[order] = [[h.id for h in s.search("compact operator", prof, k=3).hits]
                          for prof in ("lexical", adhoc_profile(["bm25", "dense"]))]
            s.close()
    assert got["forward"] == got["reverse"] == [["alpha", "beta", "mid"]] * 2
