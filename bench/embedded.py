"""Benchmark the embedded engine on a BEIR dataset and print a table.

    python bench/embedded.py ../shared/data/scifact [--index-dir DIR [--overwrite]] [--json OUT]

Figures: indexing throughput without embeddings (the citation graph built after, timed apart),
corpus embedding throughput, BM25 and dense latency (single thread, query analysis / embedding
included, top-100 ids), peak RSS of a process serving BM25+dense, and retrieval quality through
`hybridsearch eval`'s code path.

`--index-dir` keeps the built index. The directory is emptied first only when it is empty, missing
or an index an earlier run of this script built (it holds the marker file `MARKER`); any other
directory is refused unless `--overwrite`.
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

from _common import dataset_dir, run_main  # noqa: E402

from hybridsearch.embeddings import default_encoder  # noqa: E402
from hybridsearch.engines.embedded import EmbeddedEngine  # noqa: E402
from hybridsearch.errors import ConfigError  # noqa: E402
from hybridsearch.metrics import percentile  # noqa: E402
from indexer.graph import update_graph  # noqa: E402
from indexer.loaders import load_qrels, load_queries  # noqa: E402
from indexer.pipeline import embed_missing, ingest  # noqa: E402
from query_service.evaluate import corpus_fingerprint, format_table, run_eval, run_specs  # noqa: E402

MARKER = "bench-embedded-index"

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


def index_dir_for(path: Path, overwrite: bool) -> Path:
    """`--index-dir`, emptied for a fresh build: refused when it holds anything but an index an earlier
    run built, unless `overwrite`; never a directory that holds the working directory or this checkout."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--index-dir {path}: a file, not a directory")
    if not path.exists() or not any(path.iterdir()):
        return path
    resolved = path.resolve()
    for inside in (Path.cwd().resolve(), Path(__file__).resolve()):
        if inside == resolved or resolved in inside.parents:
            raise ConfigError(f"--index-dir {path}: holds {inside}; choose a directory of its own")
    if not (path / MARKER).is_file() and not overwrite:
        raise ConfigError(f"--index-dir {path}: not empty, and not an index this benchmark built (no {MARKER} "
                          "file); choose another directory, or pass --overwrite to delete what it holds")
    shutil.rmtree(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", type=dataset_dir)
    ap.add_argument("--index-dir", type=Path, help="keep the built index here (default: a temp dir)")
    ap.add_argument("--overwrite", action="store_true",
                    help="delete what --index-dir holds even when it is not an index this benchmark built")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    ds: Path = args.dataset
    if args.index_dir is not None:
        index_dir_for(args.index_dir, args.overwrite)
    tmp = Path(tempfile.mkdtemp(prefix="hs-bench-"))
    try:
        bench(ds, args.index_dir or tmp / "index", tmp, args.json)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench(ds: Path, index_dir: Path, tmp: Path, json_out: Path | None) -> None:
    fig: dict[str, float] = {}
    bm25_only = tmp / "bm25-only"
    with EmbeddedEngine(bm25_only) as e:
        plain = ingest(e, ds, loader="beir", hdc=False, graph=False, progress=False)
    fig["index_bm25_docs_per_s"] = plain.indexed / plain.seconds
    index_dir.mkdir(parents=True, exist_ok=True)
    (index_dir / MARKER).write_text("an index built by bench/embedded.py; its next run with this --index-dir "
                                    "deletes and rebuilds it\n")
    with EmbeddedEngine(index_dir) as engine:
        summary = ingest(engine, ds, loader="beir", graph=False, progress=False)
        n = summary.indexed
        fig["index_docs_per_s"] = n / summary.seconds
        t = time.perf_counter()
        update_graph(engine)
        fig["graph_s"] = time.perf_counter() - t
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

    out = subprocess.run([sys.executable, "-c", SERVE, str(index_dir), str(ds)], capture_output=True,
                         text=True, check=True)
    fig["serve_peak_rss_mb"] = float(out.stdout.strip().splitlines()[-1])

    specs = run_specs("bm25,dense,bm25+dense", "rrf", "lexical-best")
    results = run_eval(ds, specs, target=index_dir, encoder=enc, progress=False, log=lambda m: None)

    print(f"\n## {ds.name}: {n} documents, {len(queries)} test queries\n")
    print("| figure | value |\n|---|---|")
    print(f"| indexing without embeddings: SQLite + BM25 | {fig['index_bm25_docs_per_s']:,.0f} docs/s |")
    print(f"| indexing without embeddings: SQLite + BM25 + HDC codes | {fig['index_docs_per_s']:,.0f} docs/s |")
    print(f"| citation graph build, after indexing (not in the rows above) | {fig['graph_s']:.2f} s |")
    print(f"| corpus embedding ({getattr(enc, 'precision', '?')}) | {fig['embed_docs_per_s']:.1f} docs/s |")
    print(f"| BM25 p50 / p95 (analysis + engine, top-100) | {fig['bm25_p50_ms']:.3f} / {fig['bm25_p95_ms']:.3f} ms |")
    print(f"| dense p50 / p95 (query embedding + kNN, top-100) | {fig['dense_p50_ms']:.2f} / "
          f"{fig['dense_p95_ms']:.2f} ms |")
    print(f"| peak RSS serving BM25+dense | {fig['serve_peak_rss_mb']:.0f} MB |")
    print(f"| peak RSS of this benchmark | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB |")
    print()
    print(format_table(results))
    if json_out:
        json_out.write_text(json.dumps({"figures": fig, "runs": results}, indent=2))


if __name__ == "__main__":
    run_main(main)
