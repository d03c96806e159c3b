"""The citation graph of a BEIR dataset with links (CACM): built inline, by a Celery worker, and on
OpenSearch when a node is configured; prints the graph and the times.

    python bench/graph.py DATASET [--runs 5]

The dataset is ingested once without embeddings into a temporary index directory (its graph is
built then). Inline: `graph_at(dir, force=True)` `--runs` times (median). Celery: one worker
worker (2 processes) on a redis-server started on a free loopback port; `hybridsearch ingest --executor celery
--no-embed` into a second directory, whose graph job is timed from its creation to its last
state change in Redis (the job runs beside the HDC job, one process each). OpenSearch (HYBRIDSEARCH_OPENSEARCH_URL
set): the dataset ingested without embeddings into index `bench-graph`, then `graph_at(url,
force=True)`, which reads every chunk's links and partially updates every chunk; then the
neighbour lists of 5, 10 and 20 random chunks read from `graph.lists` and from `_source`, once
each chunk holds a (random) vector, as an index ingested with embeddings does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXE = str(Path(sys.executable).with_name("hybridsearch"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from celery_ingest import free_port, stop, timed

    from hybridsearch.engines.embedded import EmbeddedEngine
    from indexer.pipeline import graph_at

    port = free_port()
    redis = subprocess.Popen([str(shutil.which("redis-server")), "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HYBRIDSEARCH_REDIS_URL": f"redis://127.0.0.1:{port}/0",
           "HYBRIDSEARCH_QUERY_LOG": "false"}
    rows: list[tuple[str, float]] = []
    reads: list[tuple[int, float, float]] = []
    worker = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            inline = Path(tmp) / "inline"
            timed([EXE, "ingest", str(args.dataset), "--index-dir", str(inline), "--no-embed", "-q"], env)
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                summary, built = graph_at(str(inline), force=True)
                times.append(time.perf_counter() - t)
            rows.append(("inline (graph_at, median)", statistics.median(times)))
            engine = EmbeddedEngine(inline)
            top = sorted(engine.store.conn.execute("SELECT work_id, pagerank, authority, json_array_length(cited_by)"
                                                   " FROM graph ORDER BY pagerank DESC LIMIT 5"))
            authority = [a for (a,) in engine.store.conn.execute("SELECT authority FROM graph")]
            engine.close()

            worker = subprocess.Popen([EXE, "worker", "--concurrency", "2", "--loglevel", "WARNING"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(3)
            celery = Path(tmp) / "celery"
            timed([EXE, "ingest", str(args.dataset), "--index-dir", str(celery), "--executor", "celery",
                   "--no-embed", "-q"], env)
            listed = json.loads(subprocess.run([EXE, "jobs", "--json"], env=env, capture_output=True,
                                               text=True).stdout)
            job = next(j for j in listed if j["kind"] == "graph" and j["target"] == str(celery.resolve()))
            rows.append(("celery (graph job, queued to done)", job["seconds"]))
            if os.environ.get("HYBRIDSEARCH_OPENSEARCH_URL"):
                url = os.environ["HYBRIDSEARCH_OPENSEARCH_URL"]
                timed([EXE, "ingest", str(args.dataset), "--url", url, "--index", "bench-graph", "--no-embed", "-q"],
                      env)
                t = time.perf_counter()
                os_summary, _ = graph_at(url, "bench-graph", force=True)
                rows.append(("opensearch (graph_at, every chunk updated)", time.perf_counter() - t))
                assert os_summary.hash == summary.hash
                reads = neighbour_reads(url, "bench-graph")
    finally:
        stop(worker, redis)

    print(f"\ncitation graph of {args.dataset.name}")
    print(f"  works {summary.works}, edges {summary.edges} ({summary.oriented} links oriented by date), "
          f"missing targets {summary.missing}, dangling nodes {summary.dangling}")
    print(f"  PageRank sum {summary.pagerank_sum:.12f} (|1 - sum| = {abs(1 - summary.pagerank_sum):.1e}); "
          f"works with authority > 0: {sum(a > 0 for a in authority)}, = 1: {sum(a == 1 for a in authority)}")
    print(f"  {'build':<44} {'seconds':>8}")
    for name, secs in rows:
        print(f"  {name:<44} {secs:>8.3f}")
    if reads:
        print(f"  neighbour lists on OpenSearch, p50 of {READS} reads each, interleaved:")
        print(f"  {'seeds':>5} {'graph.lists (doc values) ms':>28} {'_source ms':>11}")
        for n, dv, src in reads:
            print(f"  {n:>5} {dv:>28.2f} {src:>11.2f}")
    print("  highest PageRank: " + ", ".join(f"{w} ({pr:.4f}, cited by {n})" for w, pr, _, n in
                                              sorted(top, key=lambda r: -r[1])))


READS = 300


def neighbour_reads(url: str, index: str) -> list[tuple[int, float, float]]:
    """`neighbors` for random chunks (what the citation stage reads for its seeds), against the same
    lists read from `_source`, the way it is done for a graph built before `graph.lists`."""
    import random

    import numpy as np

    from hybridsearch.engines.opensearch.engine import OpenSearchEngine

    engine = OpenSearchEngine(url, index=index)
    ids = [i for i, _ in engine._scan({"match_all": {}}, ())]
    # `_source` holds each chunk's vector, as in an index ingested with embeddings (random here)
    vectors = np.random.default_rng(1).standard_normal((len(ids), engine.dim)).astype(np.float32)
    engine.set_vectors(ids, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    engine.client.indices.refresh(index=index)
    rnd = random.Random(1)
    out = []
    for n in (5, 10, 20):
        dv, src = [], []
        for _ in range(READS):
            some = rnd.sample(ids, n)
            t = time.perf_counter()
            got = engine.neighbors(some)
            dv.append(time.perf_counter() - t)
            t = time.perf_counter()
            old = engine._source_neighbors(some)
            src.append(time.perf_counter() - t)
            assert got == old
        out.append((n, 1000 * statistics.median(dv), 1000 * statistics.median(src)))
    engine.close()
    return out


if __name__ == "__main__":
    main()
