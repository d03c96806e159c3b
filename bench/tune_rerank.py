"""Fit the math reranker's weight table, only on what the project may tune on: SciFact's train
split (lookup queries) and the demo corpus (every intent); prints a table per grid point.

    python bench/tune_rerank.py [--scifact DIR] [--index-root DIR] [--report DATASET ...]

Each grid point is a candidate row of query_service.rerank.WEIGHTS for one intent (the other
rows stay as they are); the score is nDCG@10 of `hybrid` over the queries the rule classifier
gives that intent (the row those searches use). Components do not depend on the weights, so each
query is searched once and reranked per grid point from its cached components.
`--report` adds untuned figures of the chosen table on other collections (e.g. CACM's test
split), for information only: they never choose a row.
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import dataset_dir, grid_step, run_main  # noqa: E402

from hybridsearch.cli import demo_dir  # noqa: E402
from hybridsearch.embeddings import default_encoder  # noqa: E402
from hybridsearch.metrics import evaluate  # noqa: E402
from indexer.loaders import load_qrels, load_queries  # noqa: E402
from query_service.evaluate import prepare_index  # noqa: E402
from query_service.intent import RuleIntentClassifier  # noqa: E402
from query_service.profiles import HYBRID  # noqa: E402
from query_service.rerank import COMPONENTS, WEIGHTS, Weights  # noqa: E402
from query_service.searcher import Searcher  # noqa: E402


def grid(step: float = 0.05) -> list[tuple[float, ...]]:
    """Rows (lexical, semantic, citation, field_match, freshness, authority) summing to 1, with
    lexical = semantic (the fused default weighs them alike), freshness 0 and authority <= 0.15."""
    n = round(1 / step)
    rows = []
    for cit, fm, auth in itertools.product(range(n + 1), range(0, 5), range(0, 4)):
        rest = n - cit - fm - auth
        if rest < 0 or rest % 2:
            continue
        rows.append((rest / 2 * step, rest / 2 * step, cit * step, fm * step, 0.0, auth * step))
    return rows


def components(searcher: Searcher, queries) -> dict[str, list[tuple[str, dict[str, float]]]]:
    """Per query, every candidate the reranker saw with its components (computed once, with
    every weight above 0: components do not depend on the weights)."""
    even = Weights(**{c: 1 / len(COMPONENTS) for c in COMPONENTS})
    prof = HYBRID.model_copy(update={"reranker_config": {"weights": {i: even for i in WEIGHTS}}})
    out = {}
    for q in queries:
        hits = searcher.search(q.text, prof, k=300).hits
        out[q.id] = [(h.id, h.components) for h in hits if h.components]
    return out


def ndcg(cached: dict[str, list[tuple[str, dict[str, float]]]], qrels, row: tuple[float, ...]) -> float:
    w = dict(zip(COMPONENTS, row, strict=True))
    run = {}
    for qid, cands in cached.items():
        scored = sorted(((sum(w[c] * x for c, x in comps.items()), i) for i, comps in cands),
                        key=lambda t: (-t[0], t[1]))
        run[qid] = [i for _, i in scored[:100]]
    return evaluate(run, {q: qrels[q] for q in cached})["ndcg@10"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scifact", type=dataset_dir, default="../shared/data/scifact")
    ap.add_argument("--index-root", type=Path, default=Path(".hybridsearch/eval"))
    ap.add_argument("--report", nargs="*", type=dataset_dir, default=[])
    ap.add_argument("--step", type=grid_step, default=0.05)
    args = ap.parse_args()
    enc = default_encoder()
    classify = RuleIntentClassifier().classify
    table = dict(WEIGHTS)
    sets = []  # (name, searcher, queries by intent, qrels)
    for data, split in ((args.scifact, "train"), (demo_dir(), "test")):
        engine = prepare_index(data, args.index_root / data.resolve().name, need_vectors=True, encoder=enc,
                               progress=False, log=lambda m: None)
        qrels = load_qrels(data, split)
        by_intent: dict[str, list] = {}
        for q in load_queries(data):
            if q.id in qrels:
                by_intent.setdefault(classify(q.text).name, []).append(q)  # as the search will
        sets.append((f"{data.resolve().name}:{split}", Searcher(engine, encoder=enc), by_intent, qrels))
    print("| intent | tuned on | queries | lexical, semantic, citation, field_match, freshness, authority | "
          "nDCG@10 | current row |\n|---|---|---|---|---|---|")
    for intent in WEIGHTS:
        members = [(name, components(srch, by[intent]), qr) for name, srch, by, qr in sets if by.get(intent)]
        if not members:
            continue
        n = sum(len(cached) for _, cached, _ in members)

        def total(row: tuple[float, ...], members=members, n=n) -> float:
            return sum(ndcg(cached, qr, row) * len(cached) for _, cached, qr in members) / n

        current = total(table[intent])
        best, best_row = current, table[intent]
        for row in grid(args.step):
            got = total(row)
            if got > best + 1e-9:
                best, best_row = got, row
        table[intent] = best_row
        print(f"| {intent} | {', '.join(m[0] for m in members)} | {n} | "
              f"{', '.join(f'{w:.2f}' for w in best_row)} | {best:.4f} | {current:.4f} |", flush=True)
    for data in args.report:
        engine = prepare_index(data, args.index_root / data.resolve().name, need_vectors=True, encoder=enc,
                               progress=False, log=lambda m: None)
        qrels = load_qrels(data)
        queries = [q for q in load_queries(data) if q.id in qrels]
        s = Searcher(engine, encoder=enc)
        by: dict[str, list] = {}
        for q in queries:
            by.setdefault(classify(q.text).name, []).append(q)
        cached = {i: components(s, qs) for i, qs in by.items()}

        def overall(tab: dict[str, tuple[float, ...]], cached=cached, qrels=qrels) -> float:
            return sum(ndcg(c, qrels, tab[i]) * len(c) for i, c in cached.items()) / sum(map(len, cached.values()))

        print(f"untuned {data.resolve().name}: nDCG@10 {overall(table):.4f} "
              f"(current table {overall(dict(WEIGHTS)):.4f})")
        s.close()
        engine.close()
    for _, s, _, _ in sets:
        s.close()


if __name__ == "__main__":
    run_main(main)
