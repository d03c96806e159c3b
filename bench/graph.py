"""The citation graph of a BEIR dataset with links (CACM): built inline, by a Celery worker, and on
OpenSearch when a node is configured; prints the graph and the times.

    python bench/graph.py DATASET [--runs 5]

The dataset is ingested once without embeddings into a temporary index directory (its graph is
built then). Inline: `graph_at(dir, force=True)` `--runs` times (median). Celery: one worker
worker (2 processes) on a redis-server started on a free loopback port; `hybridsearch ingest --executor celery
--no-embed` into a second directory, whose graph job is timed from its creation to its last
state change in Redis (the job runs beside the HDC job, one process each). OpenSearch (HYBRIDSEARCH_OPENSEARCH_URL
set): the dataset ingested without embeddings into a fresh index `bench-graph-<random>`, then
`graph_at(url, force=True)`, which reads every chunk's links and writes the graph index (a
document per work whose graph changed; no chunk is written), timed once into a fresh graph index
and once more with nothing changed; then the neighbour lists of 5, 10 and 20 random chunks read
from the graph index, once each chunk holds a (random) vector, as an index ingested with embeddings
does. The index (its versions, graph index, aliases and template) is dropped at the end, whatever
happened.

A graph on OpenSearch that differs from the inline one, or neighbour lists that differ from the
inline engine's, is reported after the tables as an error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cleanup, dataset_dir, node_version, positive_int, program, run_main  # noqa: E402
from celery_ingest import free_port, start_redis, start_worker, stop, timed  # noqa: E402

from hybridsearch.errors import HybridSearchError  # noqa: E402

EXE = str(Path(sys.executable).with_name("hybridsearch"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=dataset_dir)
    ap.add_argument("--runs", type=positive_int, default=5)
    args = ap.parse_args()
    url = os.environ.get("HYBRIDSEARCH_OPENSEARCH_URL")
    if url:
        node_version(url)
    program("redis-server")
    from hybridsearch.engines.embedded import EmbeddedEngine
    from indexer.pipeline import graph_at

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HYBRIDSEARCH_REDIS_URL": f"redis://127.0.0.1:{port}/0",
           "HYBRIDSEARCH_QUERY_LOG": "false"}
    index = f"bench-graph-{uuid.uuid4().hex[:8]}"
    rows: list[tuple[str, float]] = []
    reads: list[tuple[int, float]] = []
    problems: list[str] = []
    redis = start_redis(port)
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

            log = Path(tmp) / "worker.log"
            worker = start_worker(env, 2, log)
            celery = Path(tmp) / "celery"
            timed([EXE, "ingest", str(args.dataset), "--index-dir", str(celery), "--executor", "celery",
                   "--no-embed", "-q"], env, worker=worker, log=log)
            out = subprocess.run([EXE, "jobs", "--json"], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                raise HybridSearchError(f"hybridsearch jobs --json failed: {out.stderr.strip()[-500:]}")
            job = next((j for j in json.loads(out.stdout)
                        if j["kind"] == "graph" and j["target"] == str(celery.resolve())), None)
            if job is None:
                raise HybridSearchError(f"no graph job for {celery} in `hybridsearch jobs`")
            rows.append(("celery (graph job, queued to done)", job["seconds"]))
            if url:
                timed([EXE, "ingest", str(args.dataset), "--url", url, "--index", index, "--no-embed", "-q"], env)
                t = time.perf_counter()
                os_summary, _ = graph_at(url, index, force=True)
                rows.append(("opensearch (graph_at, a new graph index)", time.perf_counter() - t))
                t = time.perf_counter()
                graph_at(url, index, force=True)
                rows.append(("opensearch (graph_at again, nothing changed)", time.perf_counter() - t))
                if os_summary.hash != summary.hash:
                    problems.append(f"the graph built on OpenSearch index {index} ({os_summary.works} works, "
                                    f"{os_summary.edges} edges, hash {os_summary.hash}) differs from the inline one "
                                    f"({summary.works} works, {summary.edges} edges, hash {summary.hash})")
                reads, differ = neighbour_reads(url, index, inline)
                if differ:
                    problems.append(f"{differ} neighbour reads from the graph index differ from the inline engine's")
    finally:
        stop(worker, redis)
        if url:
            drop(url, index)

    print(f"\ncitation graph of {args.dataset.name}")
    print(f"  works {summary.works}, edges {summary.edges} ({summary.oriented} links oriented by date), "
          f"missing targets {summary.missing}, dangling nodes {summary.dangling}")
    print(f"  PageRank sum {summary.pagerank_sum:.12f} (|1 - sum| = {abs(1 - summary.pagerank_sum):.1e}); "
          f"works with authority > 0: {sum(a > 0 for a in authority)}, = 1: {sum(a == 1 for a in authority)}")
    print(f"  {'build':<44} {'seconds':>8}")
    for name, secs in rows:
        print(f"  {name:<44} {secs:>8.3f}")
    if reads:
        print(f"  neighbour lists on OpenSearch, p50 of {READS} reads each:")
        print(f"  {'seeds':>5} {'graph index ms':>15}")
        for n, ms in reads:
            print(f"  {n:>5} {ms:>15.2f}")
    print("  highest PageRank: " + ", ".join(f"{w} ({pr:.4f}, cited by {n})" for w, pr, _, n in
                                              sorted(top, key=lambda r: -r[1])))
    if problems:
        raise HybridSearchError("; ".join(problems))


def drop(url: str, index: str) -> None:
    """Drop the bench's OpenSearch index (versions, aliases, template); a failure is a warning."""
    from hybridsearch.engines.opensearch.engine import OpenSearchEngine

    engine = OpenSearchEngine(url, index=index)
    cleanup(f"drop OpenSearch index {index}", engine.drop)
    cleanup("close the OpenSearch client", engine.close)


READS = 300


def neighbour_reads(url: str, index: str, inline: Path) -> tuple[list[tuple[int, float]], int]:
    """`neighbors` for random chunks (what the citation stage reads for its seeds), timed, and how
    many reads differed from the inline engine's for the same chunks."""
    import random

    import numpy as np

    from hybridsearch.engines.embedded import EmbeddedEngine
    from hybridsearch.engines.opensearch.engine import OpenSearchEngine

    engine = OpenSearchEngine(url, index=index)
    local = EmbeddedEngine(inline)
    try:
        ids = [i for i, _ in engine._scan({"match_all": {}}, ())]
        # `_source` holds each chunk's vector, as in an index ingested with embeddings (random here)
        vectors = np.random.default_rng(1).standard_normal((len(ids), engine.dim)).astype(np.float32)
        engine.set_vectors(ids, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        engine.client.indices.refresh(index=index)
        rnd = random.Random(1)
        out = []
        differ = 0
        for n in (5, 10, 20):
            times = []
            for _ in range(READS):
                some = rnd.sample(ids, n)
                t = time.perf_counter()
                got = engine.neighbors(some)
                times.append(time.perf_counter() - t)
                differ += got != local.neighbors(some)
            out.append((n, 1000 * statistics.median(times)))
    finally:
        engine.close()
        local.close()
    return out, differ


if __name__ == "__main__":
    run_main(main)
