"""Retrieval metrics, trec_eval conventions: graded gains, log2 discount, queries with no relevant
document are skipped. Cross-checked against pytrec_eval and ir-measures in the tests."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def ndcg_at(ranking: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """A document ranked twice counts once, where it first appears (trec_eval reads a run as one
    score per document)."""
    gains = [qrels.get(d, 0) for d in list(dict.fromkeys(ranking))[:k]]
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains) if g > 0)
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranking: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    relevant = {d for d, g in qrels.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranking[:k])) / len(relevant)


def mrr_at(ranking: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    for i, d in enumerate(ranking[:k]):
        if qrels.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default), 0 for an empty list."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = (len(s) - 1) * p / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def evaluate(run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """Mean nDCG@10, Recall@20, Recall@100 and MRR@10 over the judged queries that have a
    relevant document (a query missing from `run` scores 0)."""
    judged = [q for q, rels in qrels.items() if any(g > 0 for g in rels.values())]
    if not judged:
        return {"ndcg@10": 0.0, "recall@20": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    sums = {"ndcg@10": 0.0, "recall@20": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    for q in judged:
        ranking, rels = run.get(q, []), qrels[q]
        sums["ndcg@10"] += ndcg_at(ranking, rels, 10)
        sums["recall@20"] += recall_at(ranking, rels, 20)
        sums["recall@100"] += recall_at(ranking, rels, 100)
        sums["mrr@10"] += mrr_at(ranking, rels, 10)
    return {m: v / len(judged) for m, v in sums.items()}
