"""Full ingest of a BEIR dataset with embeddings and HDC codes: the inline executor against the
Celery executor with N worker processes; prints a table.

    python bench/celery_ingest.py DATASET [--workers 2] [--hdc-docs 100000] [--skip-ingest] [--timeout 3600]

Both runs are whole `hybridsearch ingest` commands into fresh index directories, timed from start
to the last vector applied, model loading included (inline loads it once; each worker process
loads it on its first task). The workers run one torch thread each (HYBRIDSEARCH_TORCH_THREADS=1)
so that N processes share N cores; the inline run uses torch's default threads. A redis-server is
started on a free loopback port for the run and stopped after it. The worker is used once it
answers a ping; a worker that exits, or a step that runs past `--timeout` seconds, ends the run
with one error line (the worker's log tail included).

Second table: the ceiling, the embedding model alone on the same texts (the first 384 of the
dataset's documents, or all of a smaller one; the encoder's own batches, after a warm-up): one
process with torch's default threads against N one-thread processes at once. The Celery
executor cannot embed faster than the second row. `--skip-ingest` runs only this table and the
next.

Third table: an HDC backfill of `--hdc-docs` synthetic documents made from the dataset's own
titles and abstracts (each a random title and 40..200 words drawn from the corpus's word stream,
seed 0), ingested without codes into two directories, then encoded inline
(`encode_hdc_missing`) and by the workers (an `hdc` job, batches of 256), timed to the last code
applied.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import count, dataset_dir, positive_int, program, run_main

from hybridsearch.cli import seconds
from hybridsearch.errors import EngineError, HybridSearchError

EXE = str(Path(sys.executable).with_name("hybridsearch"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(*procs: subprocess.Popen | None) -> None:  # type: ignore[type-arg]
    """Terminate the processes (a worker, the redis-server) and wait for each."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def tail(log: Path, chars: int = 800) -> str:
    text = log.read_text(errors="replace").strip() if log.exists() else ""
    return " ".join(text[-chars:].split()) or "(no output)"


def start_redis(port: int, timeout: float = 30.0) -> subprocess.Popen:  # type: ignore[type-arg]
    """A redis-server on loopback `port`, once it answers PING."""
    from workers.celery_app import check_broker

    proc = subprocess.Popen([program("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise EngineError(f"redis-server exited with status {proc.returncode}: {err[-500:] or '(no output)'}")
        try:
            check_broker(f"redis://127.0.0.1:{port}/0", timeout=1.0)
            return proc
        except EngineError:
            if time.monotonic() > deadline:
                stop(proc)
                raise
        time.sleep(0.2)


def start_worker(env: dict[str, str], concurrency: int, log: Path,
                 timeout: float = 120.0) -> subprocess.Popen:  # type: ignore[type-arg]
    """`hybridsearch worker` with `concurrency` processes, its output in `log`, once it answers a
    ping; an EngineError (with the log's tail) when it exits or stays silent for `timeout` s."""
    from kombu.exceptions import OperationalError

    from workers.celery_app import make_app

    with log.open("wb") as out:
        worker = subprocess.Popen([EXE, "worker", "--concurrency", str(concurrency), "--loglevel", "WARNING"],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    app = make_app(env["HYBRIDSEARCH_REDIS_URL"])
    deadline = time.monotonic() + timeout
    try:
        while True:
            check_alive(worker, log)
            try:
                if app.control.ping(timeout=1.0):
                    return worker
            except (OperationalError, OSError):
                time.sleep(0.5)
            if time.monotonic() > deadline:
                raise EngineError(f"the Celery worker did not answer a ping in {timeout:.0f} s: {tail(log)}")
    except BaseException:
        stop(worker)
        raise
    finally:
        app.close()


def check_alive(worker: subprocess.Popen | None, log: Path | None) -> None:  # type: ignore[type-arg]
    """An EngineError, with the worker's log tail, when the worker has exited."""
    if worker is not None and worker.poll() is not None:
        raise EngineError(f"the Celery worker exited with status {worker.returncode}"
                          + (f": {tail(log)}" if log is not None else ""))


def timed(cmd: list[str], env: dict[str, str], timeout: float = 3600.0,
          worker: subprocess.Popen | None = None, log: Path | None = None) -> float:  # type: ignore[type-arg]
    """Seconds `cmd` ran; a HybridSearchError when it fails, runs past `timeout` seconds, or the
    worker it needs exits meanwhile."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            while proc.poll() is None:
                check_alive(worker, log)
                if time.perf_counter() - t > timeout:
                    raise HybridSearchError(f"{' '.join(cmd)} ran past --timeout {timeout:g} s")
                time.sleep(0.2)
        finally:
            stop(proc)
        if proc.returncode != 0:
            err.seek(0)
            raise HybridSearchError(f"{' '.join(cmd)} failed: {err.read().decode(errors='replace').strip()[-500:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=dataset_dir)
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--hdc-docs", type=count, default=100_000,
                    help="synthetic documents for the HDC backfill (0: skip)")
    ap.add_argument("--skip-ingest", action="store_true", help="only the embedding ceiling and the HDC backfill")
    ap.add_argument("--timeout", type=seconds, default=3600.0, help="seconds each step may take (default: 3600)")
    args = ap.parse_args()
    program("redis-server")
    docs = sum(1 for _ in (args.dataset / "corpus.jsonl").open())
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HYBRIDSEARCH_REDIS_URL": f"redis://127.0.0.1:{port}/0",
           "HYBRIDSEARCH_QUERY_LOG": "false"}
    os.environ.update(env)  # before workers.celery_app is imported: its app takes the broker URL then
    redis = start_redis(port)
    worker = None
    hdc = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if not args.skip_ingest:
                inline_s = timed([EXE, "ingest", str(args.dataset), "--index-dir", f"{tmp}/inline", "-q"], env,
                                 args.timeout)
            log = Path(tmp) / "worker.log"
            worker = start_worker({**env, "HYBRIDSEARCH_TORCH_THREADS": "1"}, args.workers, log)
            if not args.skip_ingest:
                celery_s = timed([EXE, "ingest", str(args.dataset), "--index-dir", f"{tmp}/celery", "--executor",
                                  "celery", "-q"], env, args.timeout, worker, log)
                table(args.dataset.name, docs, inline_s, celery_s, args.workers)
            ceiling(args.dataset, args.workers, env)
            if args.hdc_docs:
                hdc = hdc_backfill(args.dataset, args.hdc_docs, Path(tmp), args.timeout, worker, log)
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
print(len(texts), len(texts) / (time.perf_counter() - t))
"""


def ceiling(dataset: Path, workers: int, env: dict[str, str]) -> None:
    """The embedding model's rate alone: one process with default threads, then `workers`
    one-thread processes at once (their rates summed)."""
    texts = 0

    def encode(threads: str, n: int) -> float:
        nonlocal texts
        procs = [subprocess.Popen([sys.executable, "-c", _ENCODE, str(dataset / "corpus.jsonl"), threads], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
        rate = 0.0
        for p in procs:
            out, err = p.communicate()
            if p.returncode != 0 or not out.strip():
                raise HybridSearchError(f"the embedding run failed: {err.strip()[-500:]}")
            done, per_s = out.split()[-2:]
            texts, rate = int(done), rate + float(per_s)
        return rate

    one, many = encode("default", 1), encode("1", workers)
    print(f"\nembedding alone (all-MiniLM-L6-v2, {texts} documents), {os.cpu_count()} cores")
    print(f"  {'processes':<40} {'docs/s':>8}")
    print(f"  {'one, default torch threads':<40} {one:>8.1f}")
    print(f"  {f'{workers} one-thread processes at once':<40} {many:>8.1f}")
    print(f"  ceiling of celery / inline: {many / one:.2f}x", flush=True)


def hdc_backfill(dataset: Path, n: int, tmp: Path, timeout: float, worker: subprocess.Popen,  # type: ignore[type-arg]
                 log: Path) -> tuple[int, float, float]:
    import json
    import random

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
            st = jobs.follow(jobs.client(redis_url()), job, lambda st: check_alive(worker, log), timeout=timeout)
            if st.status == "running":
                raise HybridSearchError(f"the hdc job {job} ran past --timeout {timeout:g} s")
            engine.stats()  # the owner applies the journaled codes
        out.append(time.perf_counter() - t)
        codes = engine.stats().codes
        engine.close()
        if codes != n:
            raise HybridSearchError(f"{name}: {codes} of {n} documents have HDC codes after the backfill")
    return n, out[0], out[1]


if __name__ == "__main__":
    run_main(main)
