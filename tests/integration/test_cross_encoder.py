"""The cross-encoder reranker (the voicevault profile's step) with a tiny cross-encoder built here:
it reorders the top fused candidates by its scores, which explain the hits; past its time budget,
or without a model, the fused order stands and the diagnostics say why."""

from __future__ import annotations

import math

import pytest

from hybridsearch.engines import open_engine
from query_service.searcher import Searcher, get_profile
from tests.conftest import tiny_cross_encoder


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    return tiny_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


@pytest.fixture
def searcher(demo_copy):
    engine = open_engine(str(demo_copy))
    s = Searcher(engine)
    yield s
    s.close()
    engine.close()


QUERY = "fixed point theorem for continuous maps"


def test_voicevault_reranks_its_top_20_with_the_cross_encoder(searcher, cross_encoder, monkeypatch) -> None:
    from sentence_transformers import CrossEncoder

    fused = searcher.search(QUERY, "voicevault", k=5)
    assert fused.diagnostics["stages"]["rerank"]["skipped"].startswith("no cross-encoder model configured")
    monkeypatch.setenv("HYBRIDSEARCH_CROSS_ENCODER_MODEL_DIR", str(cross_encoder))
    res = searcher.search(QUERY, "voicevault", k=5, with_documents=True)
    stage = res.diagnostics["stages"]["rerank"]
    assert stage["reranker"] == "cross-encoder" and stage["scored"] == 20 and "degraded" not in stage
    scores = [h.score for h in res.hits]
    assert scores == sorted(scores, reverse=True) and len(res.hits) == 5
    model = CrossEncoder(str(cross_encoder), device="cpu")
    for h in res.hits:  # the hit's score is the model's, and it is the explanation
        assert h.contributions == {"cross_encoder": pytest.approx(h.score)}
        logit = float(model.predict([(QUERY, h.document.dense_text)])[0])
        assert h.score == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-5)


def test_past_its_budget_the_fused_order_stands(searcher, cross_encoder, monkeypatch) -> None:
    fused = [h.id for h in searcher.search(QUERY, "voicevault", k=5).hits]
    monkeypatch.setenv("HYBRIDSEARCH_CROSS_ENCODER_MODEL_DIR", str(cross_encoder))
    slow = get_profile("voicevault").model_copy(update={"reranker_config": {"budget_ms": 0.001}})
    res = searcher.search(QUERY, slow, k=5)
    stage = res.diagnostics["stages"]["rerank"]
    assert stage["degraded"].startswith("time budget 0.001 ms exceeded; the fused order stands")
    assert [h.id for h in res.hits] == fused and "cross_encoder" not in res.hits[0].contributions


def test_a_directory_without_a_model_is_one_error(searcher, tmp_path, monkeypatch) -> None:
    from hybridsearch.errors import ConfigError

    monkeypatch.setenv("HYBRIDSEARCH_CROSS_ENCODER_MODEL_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="cannot load a cross-encoder from"):
        searcher.search(QUERY, "voicevault", k=5)
