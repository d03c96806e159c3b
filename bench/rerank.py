"""Cost of citation expansion and the math reranker on real searches; prints a table.

    python bench/rerank.py [DATASET ...] [--index-root DIR] [--queries 200] [--rights open]

For each dataset (default: the demo corpus) the `hybrid` profile runs its test queries on the
embedded index `hybridsearch eval` builds (under --index-root, default .hybridsearch/eval); the
table gives, per dataset, the candidates the reranker saw and the p50/p95 of the expand and
rerank stages (each timed once by the Searcher), of the two together, and of the whole search.
The model is loaded and every stage warmed before timing. `--rights open` searches as an HTTP key
with `open` rights does (a licence filter in every channel and in citation expansion).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import dataset_dir, positive_int, run_main  # noqa: E402

from hybridsearch.cli import demo_dir  # noqa: E402
from hybridsearch.embeddings import default_encoder  # noqa: E402
from hybridsearch.metrics import percentile  # noqa: E402
from indexer.loaders import load_qrels, load_queries  # noqa: E402
from query_service.evaluate import prepare_index  # noqa: E402
from query_service.searcher import Searcher  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("datasets", nargs="*", type=dataset_dir)
    ap.add_argument("--index-root", type=Path, default=Path(".hybridsearch/eval"))
    ap.add_argument("--queries", type=positive_int, default=200)
    ap.add_argument("--rights", help="comma-separated licence classes of the caller (default: sees everything)")
    args = ap.parse_args()
    rights = None if args.rights is None else set(args.rights.split(","))
    enc = default_encoder()
    print("| dataset | queries | candidates p50 | expand p50 / p95 ms | rerank p50 / p95 ms "
          "| expand + rerank p50 / p95 ms | search p50 / p95 ms |")
    print("|---|---|---|---|---|---|---|")
    for data in args.datasets or [demo_dir()]:
        engine = prepare_index(data, args.index_root / data.resolve().name, need_vectors=True, encoder=enc,
                               progress=False, log=lambda m: None)
        qrels = load_qrels(data)
        queries = [q for q in load_queries(data) if q.id in qrels][:args.queries]
        searcher = Searcher(engine, encoder=enc)
        try:
            for q in queries[:5]:
                searcher.search(q.text, "hybrid", k=10, rights=rights)
            seen, expand, rerank, both, total = [], [], [], [], []
            for q in queries:
                st = searcher.search(q.text, "hybrid", k=10, rights=rights).diagnostics
                stages = st["stages"]
                if "rerank" not in stages:  # out of domain: nothing to rerank
                    continue
                e = stages.get("expand", {}).get("ms", 0.0)
                seen.append(stages["rerank"]["hits"])
                expand.append(e)
                rerank.append(stages["rerank"]["ms"])
                both.append(e + stages["rerank"]["ms"])
                total.append(st["ms"])
        finally:
            searcher.close()
            engine.close()

        def pair(xs: list[float]) -> str:
            return f"{percentile(xs, 50):.2f} / {percentile(xs, 95):.2f}"

        name = data.resolve().name + ("" if rights is None else f" (rights {args.rights})")
        if not total:
            print(f"| {name} | 0 | no query of {len(queries)} reached the reranker (out of domain) | | | | |")
            continue
        print(f"| {name} | {len(total)} | {percentile([float(s) for s in seen], 50):.0f} | "
              f"{pair(expand)} | {pair(rerank)} | {pair(both)} | {pair(total)} |")


if __name__ == "__main__":
    run_main(main)
