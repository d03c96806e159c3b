"""Full ingest of a BEIR dataset with embeddings and HDC codes: the inline executor against the
Celery executor with N worker processes; prints a table.

    python bench/celery_ingest.py DATASET [--workers 2] [--hdc-docs 100000] [--skip-ingest]

Both runs are whole `hybridsearch ingest` commands into fresh index directories, timed from start
to the last vector applied, model loading included (inline loads it once; each worker process
loads it on its first task). The workers run one torch thread each (HYBRIDSEARCH_TORCH_THREADS=1)
so that N processes share N cores; the inline run uses torch's default threads. A redis-server is
started on a free loopback port for the run and stopped after it.

Second table: the ceiling, the embedding model alone on the same texts (384 of the dataset's
documents, the encoder's own batches, after a warm-up): one process with torch's default threads
against N one-thread processes at once. The Celery executor cannot embed faster than the second
row. `--skip-ingest` runs only this table and the next.

Third table: an HDC backfill of `--hdc-docs` synthetic documents made from the dataset's own
titles and abstracts (each a random title and 40..200 words drawn from the corpus's word stream,
seed 0), ingested without codes into two directories, then encoded inline
(`encode_hdc_missing`) and by the workers (an `hdc` job, batches of 256), timed to the last code
applied.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXE = str(Path(sys.executable).with_name("hybridsearch"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(*procs: subprocess.Popen | None) -> None:  # type: ignore[type-arg]
    """Terminate the processes (a worker, the redis-server) and wait for each."""
    for proc in procs:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed: {out.stderr.strip()[-500:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--hdc-docs", type=int, default=100_000, help="synthetic documents for the HDC backfill (0: skip)")
    ap.add_argument("--skip-ingest", action="store_true", help="only the embedding ceiling and the HDC backfill")
    args = ap.parse_args()
    docs = sum(1 for _ in (args.dataset / "corpus.jsonl").open())
    port = free_port()
    redis = subprocess.Popen([str(shutil.which("redis-server")), "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HYBRIDSEARCH_REDIS_URL": f"redis://127.0.0.1:{port}/0",
           "HYBRIDSEARCH_QUERY_LOG": "false"}
    worker = None
    hdc = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if not args.skip_ingest:
                inline_s = timed([EXE, "ingest", str(args.dataset), "--index-dir", f"{tmp}/inline", "-q"], env)
            worker = subprocess.Popen([EXE, "worker", "--concurrency", str(args.workers), "--loglevel", "WARNING"],
                                      env={**env, "HYBRIDSEARCH_TORCH_THREADS": "1"}, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            time.sleep(3)  # the worker connects
            if not args.skip_ingest:
                celery_s = timed([EXE, "ingest", str(args.dataset), "--index-dir", f"{tmp}/celery", "--executor",
                                  "celery", "-q"], env)
                table(args.dataset.name, docs, inline_s, celery_s, args.workers)
            ceiling(args.dataset, args.workers, env)
            hdc = hdc_backfill(args.dataset, args.hdc_docs, Path(tmp), env) if args.hdc_docs else None
    finally:
        stop(worker, redis)
    if hdc is not None:
        n, inline_hdc, celery_hdc = hdc
        print(f"\nHDC backfill of {n} synthetic documents")
        print(f"  {'executor':<40} {'seconds':>8} {'docs/s':>8}")
        print(f"  {'inline (encode_hdc_missing)':<40} {inline_hdc:>8.1f} {n / inline_hdc:>8.0f}")
        print(f"  {f'celery ({args.workers} worker processes)':<40} {celery_hdc:>8.1f} {n / celery_hdc:>8.0f}")
        print(f"  celery / inline rate: {inline_hdc / celery_hdc:.0%}")


def table(name: str, docs: int, inline_s: float, celery_s: float, workers: int) -> None:
    print(f"\nfull ingest of {name} ({docs} documents, MiniLM vectors and HDC codes), {os.cpu_count()} cores")
    print(f"  {'executor':<40} {'seconds':>8} {'docs/s':>8}")
    print(f"  {'inline (one process)':<40} {inline_s:>8.1f} {docs / inline_s:>8.1f}")
    print(f"  {f'celery ({workers} one-thread worker processes)':<40} {celery_s:>8.1f} {docs / celery_s:>8.1f}")
    print(f"  celery / inline: {inline_s / celery_s:.2f}x", flush=True)


_ENCODE = """
import json, sys, time
import torch
if sys.argv[2] != "default":
    torch.set_num_threads(int(sys.argv[2]))
from hybridsearch.embeddings import default_encoder
texts = []
for line in open(sys.argv[1]):
    d = json.loads(line)
    texts.append((d.get("title", "") + " " + d.get("text", "")).strip())
    if len(texts) == 384:
        break
enc = default_encoder()
enc.encode(texts[:64])
t = time.perf_counter()
enc.encode(texts)
print(len(texts) / (time.perf_counter() - t))
"""


def ceiling(dataset: Path, workers: int, env: dict[str, str]) -> None:
    """The embedding model's rate alone: one process with default threads, then `workers`
    one-thread processes at once (their rates summed)."""
    def run(threads: str, n: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", _ENCODE, str(dataset / "corpus.jsonl"), threads], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(n)]
        return sum(float(p.communicate()[0].strip().splitlines()[-1]) for p in procs)

    one, many = run("default", 1), run("1", workers)
    print(f"\nembedding alone (all-MiniLM-L6-v2, 384 documents), {os.cpu_count()} cores")
    print(f"  {'processes':<40} {'docs/s':>8}")
    print(f"  {'one, default torch threads':<40} {one:>8.1f}")
    print(f"  {f'{workers} one-thread processes at once':<40} {many:>8.1f}")
    print(f"  ceiling of celery / inline: {many / one:.2f}x", flush=True)


def hdc_backfill(dataset: Path, n: int, tmp: Path, env: dict[str, str]) -> tuple[int, float, float]:
    import json
    import random

    os.environ.update(env)
    from hybridsearch.engines.embedded import EmbeddedEngine
    from hybridsearch.models import Document
    from indexer.pipeline import encode_hdc_missing, ingest
    from workers import jobs
    from workers.celery_app import redis_url
    from workers.tasks import start

    rows = [json.loads(line) for line in (dataset / "corpus.jsonl").open()]
    words = " ".join(r["text"] for r in rows).split()
    titles = [r.get("title") or "untitled" for r in rows]
    rng = random.Random(0)
    with (tmp / "synthetic.jsonl").open("w") as f:
        for i in range(n):
            k, start_at = rng.randint(40, 200), rng.randrange(len(words) - 200)
            f.write(json.dumps(Document(id=f"s{i}", title=rng.choice(titles),
                                        text=" ".join(words[start_at:start_at + k])).model_dump(exclude_defaults=True))
                    + "\n")
    out = []
    for name in ("hdc-inline", "hdc-celery"):
        engine = EmbeddedEngine(tmp / name)
        ingest(engine, tmp / "synthetic.jsonl", loader="jsonl", encoder=None, hdc=False, graph=False, progress=False)
        t = time.perf_counter()
        if name == "hdc-inline":
            encode_hdc_missing(engine, progress=False)
        else:
            job = start("hdc", str((tmp / name).resolve()), None, [i for i, _ in engine.missing_codes()], 256)
            jobs.follow(jobs.client(redis_url()), job, lambda st: None)
            engine.stats()  # the owner applies the journaled codes
        out.append(time.perf_counter() - t)
        assert engine.stats().codes == n
        engine.close()
    return n, out[0], out[1]


if __name__ == "__main__":
    main()
