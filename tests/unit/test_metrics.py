"""Our metrics against trec_eval (pytrec_eval) and ir-measures on a real run over the demo corpus."""

from __future__ import annotations

import ir_measures
import pytest
import pytrec_eval
from ir_measures import RR, R, nDCG

from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.metrics import evaluate, mrr_at, ndcg_at, percentile, recall_at
from indexer.loaders import load_qrels, load_queries
from tests.conftest import DEMO


def test_hand_computed_values() -> None:
    qrels = {"a": 2, "b": 1, "c": 0}
    assert ndcg_at(["a", "b"], qrels, 10) == pytest.approx(1.0)
    # ranking b, x, a: dcg = 1/log2(2) + 2/log2(4) = 2; idcg = 2 + 1/log2(3)
    assert ndcg_at(["b", "x", "a"], qrels, 10) == pytest.approx(2 / (2 + 1 / 1.5849625007211562))
    assert recall_at(["c", "b"], qrels, 20) == 0.5
    assert mrr_at(["c", "x", "b"], qrels, 10) == pytest.approx(1 / 3)
    assert mrr_at(["c"] * 10 + ["a"], qrels, 10) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([], 95) == 0.0
    # a document ranked twice counts once, where it first appears: nDCG never passes 1
    assert ndcg_at(["a", "a", "a"], {"a": 1}, 10) == pytest.approx(1.0)
    assert ndcg_at(["x", "x", "b", "a"], qrels, 3) == ndcg_at(["x", "b", "a"], qrels, 3)
    assert evaluate({"q": ["a", "a", "b"]}, {"q": qrels})["ndcg@10"] == pytest.approx(1.0)


def test_cross_check_against_trec_eval_on_a_real_run(demo_index) -> None:
    qrels = load_qrels(DEMO)
    with EmbeddedEngine(demo_index) as engine:
        run = {q.id: engine.bm25(q.text, k=100).ids for q in load_queries(DEMO) if q.id in qrels}
    ours = evaluate(run, qrels)
    # strictly decreasing scores so that trec_eval's tie-breaking cannot reorder the run
    scored = {q: {d: float(len(ids) - i) for i, d in enumerate(ids)} for q, ids in run.items()}
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.20", "recall.100"})
    per_q = ev.evaluate(scored)
    mean = {m: sum(v[m] for v in per_q.values()) / len(per_q)
            for m in ("ndcg_cut_10", "recall_20", "recall_100")}
    assert ours["ndcg@10"] == pytest.approx(mean["ndcg_cut_10"], abs=1e-9)
    assert ours["recall@20"] == pytest.approx(mean["recall_20"], abs=1e-9)
    assert ours["recall@100"] == pytest.approx(mean["recall_100"], abs=1e-9)
    agg = ir_measures.calc_aggregate([nDCG @ 10, R @ 100, RR @ 10], qrels, scored)
    assert ours["mrr@10"] == pytest.approx(agg[RR @ 10], abs=1e-9)
    assert ours["ndcg@10"] == pytest.approx(agg[nDCG @ 10], abs=1e-9)
    assert 0.3 < ours["ndcg@10"] < 1.0


def test_parity_overlap_is_the_same_whichever_engine_comes_first() -> None:
    from query_service.parity import overlap

    full = [f"d{i}" for i in range(10)]
    assert overlap(["d0"], full) == overlap(full, ["d0"]) == 0.1
    assert overlap(full, full[::-1]) == 1.0 and overlap([], []) == 1.0 and overlap([], full) == 0.0
