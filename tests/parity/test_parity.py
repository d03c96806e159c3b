"""Parity of the two engines on the demo corpus: the same documents, vectors and codes in the
embedded engine and in OpenSearch, the same queries, and the issue's targets."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import DEMO

pytestmark = [pytest.mark.opensearch, pytest.mark.integration]


@pytest.fixture(scope="module")
def compared(demo_index, opensearch_url, encoder):
    """The engines and their parity report: the channels compared on the corpus as written, the
    `hybrid` profile after the citation graph was built on OpenSearch (by partial updates of
    every chunk, whose soft-deleted copies Lucene's BM25 statistics count until merged away)."""
    from hybridsearch.engines import open_engine
    from hybridsearch.engines.opensearch import OpenSearchEngine
    from indexer.graph import update_graph
    from query_service.parity import compare, copy_corpus

    embedded = open_engine(str(demo_index))
    remote = OpenSearchEngine(opensearch_url, index=f"parity-demo-{uuid.uuid4().hex[:8]}")
    try:
        copy_corpus(DEMO, embedded, remote, log=lambda m: None, graph=False)
        assert remote.count() == embedded.count() == 242
        engines = {"embedded": embedded, "opensearch": remote}
        report = compare(DEMO, engines, runs=("bm25", "dense"), encoder=encoder)
        update_graph(remote, force=True)
        report.channels.update(compare(DEMO, engines, runs=("hybrid",), encoder=encoder, hdc_queries=0).channels)
        yield engines, report
    finally:
        remote.drop()
        remote.close()
        embedded.close()


@pytest.fixture(scope="module")
def engines(compared):
    return compared[0]


@pytest.fixture(scope="module")
def report(compared):
    return compared[1]


def test_bm25_parity(report) -> None:
    p = report.channels["bm25"]
    assert p.queries >= 60
    assert p.identical_top10 >= 0.95, report.table()
    assert p.ndcg_diff <= 0.005, report.table()


def test_dense_parity(report) -> None:
    p = report.channels["dense"]
    assert p.overlap_top10 >= 0.9, report.table()
    assert p.ndcg_diff <= 0.01, report.table()


def test_hdc_exact_scores_are_equal(report) -> None:
    assert report.hdc_scored > 1000
    assert report.hdc_max_abs_diff <= 1e-6, report.table()


def test_hybrid_profile_parity(report) -> None:
    assert report.channels["hybrid"].ndcg_diff <= 0.01, report.table()


@pytest.mark.parametrize(("query", "reached"), [
    ("what to read before the Gauss-Bonnet theorem", {"geom-gaussian-curvature", "topo-euler-characteristic"}),
    ("results similar to Brouwer fixed point theorem", set()),
])
def test_citation_expansion_and_reranker_through_the_engine_contract(engines, encoder, query, reached) -> None:
    """The same seeds, directions, citation scores and authorities on both engines; the graph was
    built on OpenSearch by the same functions (indexer.graph) from the chunks' own links."""
    import math

    from query_service.searcher import Searcher

    got = {}
    for name, engine in engines.items():
        s = Searcher(engine, encoder=encoder)
        got[name] = s.search(query, "hybrid", k=20)
        s.close()
    a, b = got["embedded"], got["opensearch"]
    ea, eb = a.diagnostics["stages"]["expand"], b.diagnostics["stages"]["expand"]
    assert ea["seeds"] == eb["seeds"] and ea["directions"] == eb["directions"] and ea["works"] == eb["works"] > 0
    cit = {n: {h.id: h.components.get("citation", 0.0) for h in r.hits} for n, r in got.items()}
    # seed strengths are fused-score ratios, and BM25 scores differ a little between the engines
    reached_a = {i: v for i, v in cit["embedded"].items() if v}
    reached_b = {i: v for i, v in cit["opensearch"].items() if v}
    assert reached_a.keys() == reached_b.keys() and reached_a
    assert all(reached_a[i] == pytest.approx(reached_b[i], rel=0.02) for i in reached_a)
    auth = {n: {h.id: h.components.get("authority") for h in r.hits} for n, r in got.items()}
    common = set(auth["embedded"]) & set(auth["opensearch"])
    assert all(auth["embedded"][i] == auth["opensearch"][i] for i in common)
    for h in b.hits:
        assert math.isclose(sum(h.contributions.values()), h.score, abs_tol=1e-12)
    assert reached <= {h.id for h in b.hits[:5]}, [h.id for h in b.hits]
