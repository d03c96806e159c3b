"""Tune the `hybrid` profile's channel weights on a training split (never the test split).

    python bench/tune_hybrid.py ../shared/data/scifact --split train [--index-dir DIR] [--step 0.05]

Runs BM25, dense and HDC once per query (k=100), then scores every weight triple on a `--step`
grid (a step that divides 1 evenly, so that each triple sums to 1) with the weighted fuser
(min-max, arithmetic mean) and prints the best by nDCG@10.
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import dataset_dir, grid_step, run_main  # noqa: E402

from hybridsearch.embeddings import default_encoder  # noqa: E402
from hybridsearch.errors import ValidationError  # noqa: E402
from hybridsearch.metrics import evaluate  # noqa: E402
from indexer.loaders import load_qrels, load_queries  # noqa: E402
from query_service.channels import Bm25Channel, Bm25Config, DenseChannel, HdcChannel, QueryContext  # noqa: E402
from query_service.evaluate import prepare_index  # noqa: E402
from query_service.fusion import WeightedConfig, WeightedFuser  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", type=dataset_dir)
    ap.add_argument("--split", default="train")
    ap.add_argument("--index-dir", type=Path)
    ap.add_argument("--step", type=grid_step, default=0.05)
    ap.add_argument("--bm25-mode", choices=["most_fields", "best_fields"], default="most_fields")
    args = ap.parse_args()
    if args.split == "test":
        ap.error("tune on a training split, never on test")
    qrels = load_qrels(args.dataset, args.split)  # before the index is built: a missing split is one line
    queries = [q for q in load_queries(args.dataset) if q.id in qrels]
    if not queries:
        raise ValidationError(f"no queries of split {args.split!r}", source=str(args.dataset))
    index_dir = args.index_dir or Path(".hybridsearch/eval") / args.dataset.resolve().name
    enc = default_encoder()
    engine = prepare_index(args.dataset, index_dir, need_vectors=True, need_codes=True, encoder=enc)
    channels = {"bm25": Bm25Channel(Bm25Config(mode=args.bm25_mode)), "dense": DenseChannel(), "hdc": HdcChannel()}
    lists = {}
    for q in queries:
        ctx = QueryContext(q.text, encoder=enc)
        lists[q.id] = {name: ch.retrieve(ctx, engine, 100) for name, ch in channels.items()}
    engine.close()
    steps = round(1 / args.step)
    results = []
    for a, b in itertools.product(range(steps + 1), repeat=2):
        if a + b > steps:
            continue
        w = {"bm25": a * args.step, "dense": b * args.step, "hdc": (steps - a - b) * args.step}
        fuser = WeightedFuser(WeightedConfig(weights=w))
        run = {qid: fuser.fuse({c: rl for c, rl in ls.items() if w[c] > 0}, 100).ids for qid, ls in lists.items()}
        results.append((evaluate(run, qrels)["ndcg@10"], w))
    results.sort(key=lambda r: -r[0])
    print(f"{args.dataset.name} {args.split}: {len(queries)} queries, BM25 {args.bm25_mode}; best weights by nDCG@10")
    for ndcg, w in results[:10]:
        print(f"  {ndcg:.4f}  bm25 {w['bm25']:.2f}  dense {w['dense']:.2f}  hdc {w['hdc']:.2f}")


if __name__ == "__main__":
    run_main(main)
