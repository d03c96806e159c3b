"""Parity of the two engines on the demo corpus: the same documents, vectors and codes in the
embedded engine and in OpenSearch, the same queries, and the issue's targets."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import DEMO

pytestmark = [pytest.mark.opensearch, pytest.mark.integration]


@pytest.fixture(scope="module")
def report(demo_index, opensearch_url, encoder):
    from hybridsearch.engines import open_engine
    from hybridsearch.engines.opensearch import OpenSearchEngine
    from query_service.parity import compare, copy_corpus

    embedded = open_engine(str(demo_index))
    remote = OpenSearchEngine(opensearch_url, index=f"parity-demo-{uuid.uuid4().hex[:8]}")
    try:
        copy_corpus(DEMO, embedded, remote, log=lambda m: None)
        assert remote.count() == embedded.count() == 242
        yield compare(DEMO, {"embedded": embedded, "opensearch": remote}, encoder=encoder)
    finally:
        remote.drop()
        remote.close()
        embedded.close()


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
