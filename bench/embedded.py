"""Benchmark the embedded engine on a BEIR dataset and print a table.

    python bench/embedded.py ../shared/data/scifact [--index-dir DIR] [--json OUT]

Figures: indexing throughput without embeddings, corpus embedding throughput, BM25 and dense
latency (single thread, query analysis / embedding included, top-100 ids), peak RSS of a process
serving BM25+dense, and retrieval quality through `hybridsearch eval`'s code path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hybridsearch.embeddings import default_encoder  # noqa: E402
from hybridsearch.engines.embedded import EmbeddedEngine  # noqa: E402
from hybridsearch.metrics import percentile  # noqa: E402
from indexer.loaders import load_qrels, load_queries  # noqa: E402
from indexer.pipeline import embed_missing, ingest  # noqa: E402
from query_service.evaluate import corpus_fingerprint, format_table, run_eval, run_specs  # noqa: E402

SERVE = """
import os, resource, sys, json
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from hybridsearch.engines.embedded import EmbeddedEngine
from indexer.loaders import load_queries
from query_service.searcher import Searcher, adhoc_profile
e = EmbeddedEngine(sys.argv[1]); s = Searcher(e); p = adhoc_profile(["bm25", "dense"])
for q in load_queries(__import__("pathlib").Path(sys.argv[2]))[:200]:
    s.search(q.text, p, k=100)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--index-dir", type=Path, help="keep the built index here (default: a temp dir)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    ds: Path = args.dataset
    tmp = Path(tempfile.mkdtemp(prefix="hs-bench-"))
    index_dir = args.index_dir or tmp / "index"
    if index_dir.exists():
        shutil.rmtree(index_dir)
    fig: dict[str, float] = {}

    bm25_only = tmp / "bm25-only"
    with EmbeddedEngine(bm25_only) as e:
        plain = ingest(e, ds, loader="beir", hdc=False, progress=False)
    fig["index_bm25_docs_per_s"] = plain.indexed / plain.seconds
    engine = EmbeddedEngine(index_dir)
    summary = ingest(engine, ds, loader="beir", progress=False)
    n = summary.indexed
    fig["index_docs_per_s"] = n / summary.seconds
    engine.store.set_meta("corpus", corpus_fingerprint(ds))
    enc = default_encoder()
    enc.encode(["warm up"], query=True)  # loads the model and makes the query session before anything is timed
    t = time.perf_counter()
    embed_missing(engine, enc, progress=True)
    fig["embed_docs_per_s"] = n / (time.perf_counter() - t)
    engine.checkpoint()

    qrels = load_qrels(ds)
    queries = [q for q in load_queries(ds) if q.id in qrels]
    # each channel in its own loop: right after a torch call its OpenMP threads still spin for a
    # while, and interleaving would charge that to BM25
    lat_bm25, lat_dense = [], []
    for q in queries:
        t = time.perf_counter()
        engine.bm25(q.text, k=100)
        lat_bm25.append((time.perf_counter() - t) * 1000)
    for q in queries:
        t = time.perf_counter()
        engine.knn(enc.encode([q.text], query=True)[0], 100)
        lat_dense.append((time.perf_counter() - t) * 1000)
    fig["bm25_p50_ms"], fig["bm25_p95_ms"] = percentile(lat_bm25, 50), percentile(lat_bm25, 95)
    fig["dense_p50_ms"], fig["dense_p95_ms"] = percentile(lat_dense, 50), percentile(lat_dense, 95)
    engine.close()

    out = subprocess.run([sys.executable, "-c", SERVE, str(index_dir), str(ds)], capture_output=True,
                         text=True, check=True)
    fig["serve_peak_rss_mb"] = float(out.stdout.strip().splitlines()[-1])

    specs = run_specs("bm25,dense,bm25+dense", "rrf", "lexical-best")
    results = run_eval(ds, specs, target=index_dir, encoder=enc, progress=False, log=lambda m: None)

    print(f"\n## {ds.name}: {n} documents, {len(queries)} test queries\n")
    print("| figure | value |\n|---|---|")
    print(f"| indexing without embeddings: SQLite + BM25 | {fig['index_bm25_docs_per_s']:,.0f} docs/s |")
    print(f"| indexing without embeddings: SQLite + BM25 + HDC codes | {fig['index_docs_per_s']:,.0f} docs/s |")
    print(f"| corpus embedding ({getattr(enc, 'precision', '?')}) | {fig['embed_docs_per_s']:.1f} docs/s |")
    print(f"| BM25 p50 / p95 (analysis + engine, top-100) | {fig['bm25_p50_ms']:.3f} / {fig['bm25_p95_ms']:.3f} ms |")
    print(f"| dense p50 / p95 (query embedding + kNN, top-100) | {fig['dense_p50_ms']:.2f} / "
          f"{fig['dense_p95_ms']:.2f} ms |")
    print(f"| peak RSS serving BM25+dense | {fig['serve_peak_rss_mb']:.0f} MB |")
    print(f"| peak RSS of this benchmark | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB |")
    print()
    print(format_table(results))
    if args.json:
        args.json.write_text(json.dumps({"figures": fig, "runs": results}, indent=2))
    if args.index_dir is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
