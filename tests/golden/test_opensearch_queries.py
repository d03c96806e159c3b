"""The OpenSearch engine's pure request builders as data: golden request bodies, the one filter
builder, score conversions and the indexed form of a chunk."""

from __future__ import annotations

import numpy as np
import pytest

from hybridsearch.engines.opensearch import queries as Q
from hybridsearch.models import DateRange, Document, Filters
from hybridsearch.scoring import EMPTY_FIELD_TOKEN

FILTERS = Filters(date_range=DateRange(gte="1990", lte="2001-06"), subjects=[" Topology", "topology", "Analysis"],
                  kind=["Theorem"], sources=["a.pdf", "a.pdf"], license=["CC-BY-4.0"])
FILTER_CLAUSES = [
    {"range": {"ym": {"gte": 199000, "lte": 200106}}},
    {"terms": {"keys.subjects": ["analysis", "topology"]}},
    {"terms": {"keys.kind": ["theorem"]}},
    {"terms": {"keys.license": ["cc-by-4.0"]}},
    {"terms": {"source": ["a.pdf"]}},
]


def test_one_filter_builder() -> None:
    assert Q.filter_clauses(FILTERS) == FILTER_CLAUSES
    assert Q.filter_clauses(None) == [] and Q.filter_clauses(Filters()) == []
    assert Q.filter_clauses(Filters(date_range=DateRange(lte=1900))) == [{"range": {"ym": {"lte": 190012}}}]


def test_bm25_most_fields() -> None:
    body = Q.bm25_query({"spectral": 1.0, "gap": 0.35}, {"title": 1.5, "text": 1.0, "role": 0.0}, 50, None,
                        "most_fields", 0.2)
    assert body == {"size": 50, **Q.HITS_BY_ID, "query": {"bool": {"should": [
        {"term": {"bm25.title": {"value": "spectral", "boost": 1.5}}},
        {"term": {"bm25.title": {"value": "gap", "boost": pytest.approx(0.525)}}},
        {"term": {"bm25.text": {"value": "spectral", "boost": 1.0}}},
        {"term": {"bm25.text": {"value": "gap", "boost": 0.35}}}]}}}


def test_bm25_best_fields_with_filters() -> None:
    body = Q.bm25_query({"gap": 1.0}, {"title": 1.5, "subjects": 1.25}, 10, FILTERS, "best_fields", 0.3)
    assert body["query"] == {"bool": {"must": [{"dis_max": {"tie_breaker": 0.3, "queries": [
        {"bool": {"should": [{"term": {"bm25.title": {"value": "gap", "boost": 1.5}}}]}},
        {"bool": {"should": [{"term": {"bm25.subjects": {"value": "gap", "boost": 1.25}}}]}}]}}],
        "filter": FILTER_CLAUSES}}


def test_knn_with_efficient_filtering() -> None:
    body = Q.knn_query("dense", [0.5, -0.5], 7, FILTERS, ef_search=200)
    assert body == {"size": 7, **Q.HITS_BY_ID, "query": {"knn": {"dense": {
        "vector": [0.5, -0.5], "k": 7, "filter": {"bool": {"filter": FILTER_CLAUSES}},
        "method_parameters": {"ef_search": 200}}}}}
    clause = Q.knn_query("hdc_topic", [99, -56], 3, None, ef_search=100)["query"]["knn"]["hdc_topic"]
    assert "filter" not in clause and clause["method_parameters"] == {"ef_search": 100}
    # k above ef_search: the search examines k vectors
    assert Q.knn_query("dense", [0.5], 500, None, ef_search=100)["query"]["knn"]["dense"]["method_parameters"] == {
        "ef_search": 500}


def test_exact_scores_by_the_knn_script() -> None:
    body = Q.exact_score_query("hdc_claim", "hamming", [99, -56], ["a", "b"])
    assert body == {"size": 2, **Q.HITS_BY_ID, "query": {"script_score": {
        "query": {"bool": {"filter": [{"ids": {"values": ["a", "b"]}}, {"exists": {"field": "hdc_claim"}}]}},
        "script": {"lang": "knn", "source": "knn_score",
                   "params": {"field": "hdc_claim", "query_value": [99, -56], "space_type": "hamming"}}}}}


def test_vector_sample_orders_chunks_with_the_field_by_their_sample_key() -> None:
    assert Q.sample_query("dense", 500) == {"size": 500, "_source": ["dense"],
                                            "sort": [{"_score": "desc"}, {"id": "asc"}], "query": {"script_score": {
        "query": {"bool": {"filter": [{"exists": {"field": "dense"}}]}},
        "script": {"source": Q.SAMPLE_KEY_SCRIPT}}}}
    licensed = Q.sample_query("dense", 5, Filters(license=["CC-BY-4.0"]))["query"]["script_score"]["query"]
    assert licensed == {"bool": {"filter": [{"exists": {"field": "dense"}}, *Q.filter_clauses(Filters(
        license=["CC-BY-4.0"]))]}}


def test_statistics_and_the_peer_hybrid_query() -> None:
    df = Q.doc_freq_query(["gap"], ["title", "text"])
    assert df["aggs"] == {"df": {"filters": {"filters": {"title\tgap": {"term": {"bm25.title": "gap"}},
                                                         "text\tgap": {"term": {"bm25.text": "gap"}}}}}}
    assert df["track_total_hits"] is True and df["size"] == 0
    assert Q.length_sum_query(["title"])["aggs"] == {"title": {"sum": {"field": "bm25_len.title"}}}
    hy = Q.hybrid_query({"gap": 1.0}, {"title": 1.0}, [0.1], 100, None, "most_fields", 0.2, 100)
    assert hy["query"]["hybrid"]["pagination_depth"] == 100
    assert [next(iter(q)) for q in hy["query"]["hybrid"]["queries"]] == ["bool", "knn"]


@pytest.mark.parametrize(("score", "space", "cosine"), [
    (1.0, "cosinesimil", 1.0), (0.5, "cosinesimil", 0.0), (0.0, "cosinesimil", -1.0),
    (1.25, "innerproduct", 0.25), (1.0, "innerproduct", 0.0), (0.8, "innerproduct", -0.25),
])
def test_scores_map_back_to_raw_cosine(score, space, cosine) -> None:
    assert Q.cosine_from_score(score, space) == pytest.approx(cosine)


def test_hamming_scores_map_back_to_similarity() -> None:
    for d in (0, 1, 7, 2048, 4095, 4096):
        score = float(np.float32(1.0 / (1 + d)))  # what the node sends, in float32
        assert Q.hamming_similarity(score) == 1 - d / 4096


def test_packed_codes_become_signed_bytes_msb_first() -> None:
    bits = np.zeros(4096, dtype=np.uint8)
    bits[[1, 2, 6, 7, 8]] = 1  # byte 0 = 0b01100011 = 99, byte 1 = 0b10000000 = -128
    code = np.packbits(bits)
    assert Q.packed_to_int8(code)[:3] == [99, -128, 0]


def test_the_indexed_form_of_a_chunk() -> None:
    doc = Document(id="x", title="Heine-Borel", text="", subjects=[" Analysis "], year=1895, month=3,
                   kind="Theorem", metadata={"k": 1})
    tokens = {"title": ("heine-borel heine borel", 3), "text": ("", 0), "subjects": ("analysi", 1)}
    src = Q.to_source(doc, tokens, "123", None, {"topic": np.zeros(512, dtype=np.uint8)})
    assert src["bm25"] == {"title": "heine-borel heine borel", "text": EMPTY_FIELD_TOKEN, "subjects": "analysi"}
    assert src["bm25_len"] == {"title": 3, "text": 1, "subjects": 1}
    assert src["keys"] == {"subjects": ["analysis"], "kind": "theorem", "license": None}
    assert (src["ym"], src["published"], src["hdc_encoded"]) == (189503, "1895-03", True)
    assert src["hdc_topic"].tolist() == [0] * 512 and "dense" not in src and "hdc_claim" not in src
    assert Q.from_source(src) == doc
    # the title's binary doc value, its UTF-8 bytes in base64 (what the reindex script writes too),
    # served without padding
    assert src["title_bin"] == "SGVpbmUtQm9yZWw=" and Q.title_bin("Ä") == "w4Q="
    info = Q.info_from_docvalues({"id": ["x"], "title_bin": ["w4Q"], "year": [1895]})
    assert info is not None and (info.title, info.work_id, info.year) == ("Ä", "x", 1895)


def test_a_works_graph_document_and_its_binary_doc_value() -> None:
    """A graph document's `lists` carries the whole graph; read back as served (base64 without
    padding) it gives the same Neighbors as its keyword lists, order and exact floats included;
    its digest changes with any of it. Chunks of the earlier layout read `graph.lists`."""
    import dataclasses

    from hybridsearch.engines import Neighbors

    nb = Neighbors(("b", "ä\"\\x"), ("😀",), ("c", "a"), 0.1 + 0.2, 1 / 3)
    g = Q.graph_doc("w1", nb)
    assert {k: g[k] for k in ("id", "cites", "cited_by", "cocited")} == {
        "id": "w1", "cites": ["b", "ä\"\\x"], "cited_by": ["😀"], "cocited": ["c", "a"]}
    served = g["lists"].rstrip("=")
    assert served != g["lists"]  # this one has padding to restore
    assert Q.neighbors_from_docvalues({"lists": [served], "authority": [0.33]}, "") == nb
    assert Q.neighbors_from_docvalues({"graph.lists": [served], "graph.authority": [0.33]}) == nb
    assert Q.neighbors_of(g) == nb
    other = dataclasses.replace(nb, authority=0.5)
    assert Q.graph_doc("w1", nb)["digest"] == g["digest"] != Q.graph_doc("w1", other)["digest"]
    # a chunk graph written before `graph.lists`: not from doc values; no graph at all: empty
    assert Q.neighbors_from_docvalues({"id": ["x"], "graph.authority": [0.0]}) is None
    assert Q.neighbors_from_docvalues({"id": ["x"]}) == Neighbors() == Q.neighbors_of(None)
    # a work the build did not see: no PageRank or authority (null), read back as empty Neighbors
    unseen = Q.graph_doc("w2", Neighbors())
    assert unseen["authority"] is None and unseen["pagerank"] is None and Q.neighbors_of(unseen) == Neighbors()
    assert Q.neighbors_from_docvalues({"lists": [unseen["lists"]]}, "") == Neighbors()
    # the graph index: named so that no logical index, version, alias or template can take it
    body = Q.graph_index_body("cacm", 2)
    assert Q.graph_index("cacm") == "graph+cacm" and body["mappings"]["_meta"]["hybridsearch"]["graph_of"] == "cacm"
    assert body["settings"]["index"] == {"number_of_shards": 1, "number_of_replicas": 2}  # as many copies as chunks
    assert set(body["mappings"]["properties"]) == {"id", "cites", "cited_by", "cocited", "pagerank",
                                                   "authority", "lists", "digest"}


def test_templates_name_the_configured_knn_engine() -> None:
    lucene, faiss = Q.chunks_template("lucene", 2), Q.chunks_template("faiss", 2)
    props = lucene["template"]["mappings"]["properties"]
    assert props["dense"]["space_type"] == "cosinesimil" and props["dense"]["method"]["engine"] == "lucene"
    assert props["hdc_topic"]["data_type"] == "binary" and props["hdc_topic"]["dimension"] == 4096
    fprops = faiss["template"]["mappings"]["properties"]
    assert fprops["dense"]["space_type"] == "innerproduct" and fprops["hdc_acts"]["method"]["engine"] == "faiss"
    assert lucene["template"]["settings"]["index"]["similarity"]["hs_bm25"] == {"type": "BM25", "k1": 1.2, "b": 0.75}
    # 3.x's BM25 drops the (k1+1) factor: the classic form, the embedded engine's scale, is LegacyBM25 there
    on3 = Q.chunks_template("lucene", 3)
    assert on3["template"]["settings"]["index"]["similarity"]["hs_bm25"] == {"type": "LegacyBM25", "k1": 1.2, "b": 0.75}
    assert on3["template"]["mappings"] == lucene["template"]["mappings"]
    # compressed dense vectors (3.x): the dense and passage vectors quantised, the HDC codes as they are; a
    # component template of their own, which the index template names
    small = Q.chunks_template("lucene", 3, "32x", niofs=True)
    sprops = small["template"]["mappings"]["properties"]
    assert sprops["dense"]["compression_level"] == "32x" == sprops["passages"]["properties"]["v"]["compression_level"]
    assert all("compression_level" not in v for f, v in sprops.items() if f.startswith("hdc_"))
    assert small["template"]["settings"]["index"]["store"] == {"type": "niofs"}
    assert "store" not in Q.chunks_template("lucene", 3, "4x")["template"]["settings"]["index"]
    assert "compression_level" not in props["dense"]
    assert Q.chunks_component("lucene", "1x") == "hybridsearch-chunks-lucene"
    assert Q.index_template("papers", "lucene", "4x")["composed_of"] == ["hybridsearch-chunks-lucene-4x"]
    knn = Q.knn_query("dense", [0.5, 0.5], 10, None, 100, oversample=5.0)["query"]["knn"]["dense"]
    assert knn["rescore"] == {"oversample_factor": 5.0} and knn["k"] == 10
    assert set(Q.COMPRESSED_SEARCH) == {"4x", "32x"}  # every compression is rescored
    assert "rescore" not in Q.knn_query("dense", [0.5, 0.5], 10, None, 100)["query"]["knn"]["dense"]
    every = ("title", "text", "procedure", "utility_acts", "utility_note", "condition", "role", "subjects")
    assert all(props["bm25"]["properties"][f]["analyzer"] == "hs_tokens" for f in every)
    assert props["title"]["analyzer"] == "english" and props["subjects"]["fields"]["en"]["analyzer"] == "english"
    tpl = Q.index_template("papers", "lucene")
    assert tpl["index_patterns"] == ["papers-v*"] and tpl["composed_of"] == ["hybridsearch-chunks-lucene"]
    assert "aliases" not in tpl.get("template", {})


def test_the_query_log_policy_and_template() -> None:
    from hybridsearch.engines.opensearch.admin import digest, with_digest

    policy = Q.template("policies/hybridsearch-queries-30d")["policy"]
    states = {s["name"]: s for s in policy["states"]}
    assert policy["default_state"] == "hot"
    assert states["hot"]["transitions"] == [{"state_name": "delete", "conditions": {"min_index_age": "30d"}}]
    assert states["delete"]["actions"] == [{"delete": {}}]
    assert policy["ism_template"] == [{"index_patterns": ["hybridsearch-queries-*"], "priority": 100}]
    log = Q.template("hybridsearch-queries")
    assert log["index_patterns"] == ["hybridsearch-queries-*"]
    # a priority of its own, so it can never tie with a chunk index template (those are 200)
    assert log["priority"] != Q.index_template("x", "lucene")["priority"]
    # the digest ignores a stored digest, so a template read back compares equal
    assert digest(with_digest(log)) == digest(log) and with_digest(log)["_meta"]["digest"] == digest(log)
    changed = {**log, "priority": 151}
    assert digest(changed) != digest(log)
    # another query-log prefix: a template and a deletion policy of its own, covering its indices only;
    # the longer prefix (a narrower pattern) takes the higher priority, so nested prefixes never tie
    default = "hybridsearch-queries-"
    assert Q.query_log_template(default) == ("hybridsearch-queries", {**log, "priority": 150 + len(default)})
    name, tpl = Q.query_log_template("hybridsearch-queries-staging-")
    assert name == "hybridsearch-queries-staging" and tpl == {
        **log, "index_patterns": ["hybridsearch-queries-staging-*"], "priority": 150 + len(default) + 8}
    assert Q.query_log_template(default)[1]["priority"] != Q.index_template("x", "lucene")["priority"]
    name, body = Q.query_log_policy("staging-queries-")
    assert name == "staging-queries-30d" and body["policy"]["ism_template"] == [
        {"index_patterns": ["staging-queries-*"], "priority": 100 + len("staging-queries-")}]
    name, body = Q.query_log_policy(default)
    assert name == "hybridsearch-queries-30d" and body["policy"]["ism_template"][0]["priority"] == 100 + len(default)


def test_missing_fields_of_an_older_mapping() -> None:
    from hybridsearch.engines.opensearch.admin import missing_fields

    want = Q.chunks_template("faiss", 2)["template"]["mappings"]
    assert missing_fields(want, want) == []
    old = {"properties": {name: dict(spec) for name, spec in want["properties"].items() if name != "ym"}}
    del old["properties"]["title"]["fields"]
    # an engine or a parameter of the same field is not a missing field; a sub-field and a nested one are
    old["properties"]["dense"] = {**want["properties"]["dense"], "method": {"name": "hnsw", "engine": "lucene"}}
    graph = want["properties"]["graph"]
    old["properties"]["graph"] = {"properties": {k: v for k, v in graph["properties"].items() if k != "authority"}}
    assert missing_fields(want, old) == ["title.raw", "graph.authority", "ym"]
