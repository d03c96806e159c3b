"""Load on `hybridsearch serve`: a load generator in a second process sends POST /retrieve on
loopback at 1, 8 and 32 concurrent clients; prints QPS and p50/p95/p99 per profile and corpus.

    python bench/http_load.py [--scifact DIR] [--synthetic 100000] [--seconds 20] [--workers N]

`--workers`: the service's processes (default: serve's own, one per usable core).

Corpora:
- SciFact (`--scifact`, default ../shared/data/scifact): ingested with real MiniLM vectors and
  HDC codes (cached under .hybridsearch/bench/http-<dataset>, built again when the cached index
  holds another corpus: its content digest differs); the queries are its test queries. Rows are
  labelled with the dataset's name and the number of documents the index holds.
- Synthetic (`--synthetic N`, 0 to skip): N documents made from SciFact's own titles and words
  (a random title and 40..200 words from the corpus's word stream, seed 0), with synthetic
  vectors: each document's vector is the normalised mean of fixed random unit vectors of its
  title's words (seed 0), so that documents sharing title words lie near each other. HDC codes
  are real. Queries are SciFact's test queries; the service embeds them with the real model.

Each run: the service with one API key (rights open and restricted, rate limit off in effect),
`--seconds` of load per concurrency level after a warm-up of 20 requests, requests cycling
through the queries. Errors are any status other than 200 (or no response); QPS and the
percentiles count successful requests only, and errors are reported beside them. Each row gets a
verdict on the RFC SLO (p50 <= 1500 ms and p95 <= 4000 ms, no errors).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import count, dataset_dir, positive_int, run_main, verdict

from hybridsearch.cli import seconds as seconds_type
from hybridsearch.embeddings import usable_cores
from hybridsearch.errors import EngineError

EXE = str(Path(sys.executable).with_name("hybridsearch"))
ROOT = Path(__file__).resolve().parents[1]
SLO_P50_MS, SLO_P95_MS = 1500.0, 4000.0


def _clients(url: str, key: str, profile: str, queries: list[str], clients: int, seconds: float,
             out: mp.Queue) -> None:  # type: ignore[type-arg]
    """The load generator (its own process): `clients` threads, each one request at a time; the
    latencies of the successful requests and the number of failed ones."""
    import threading

    import httpx

    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def run(i: int) -> None:
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as c:
            n = i
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                try:
                    r = c.post(url + "/retrieve", json={"query": queries[n % len(queries)], "profile": profile})
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                dt = time.perf_counter() - t
                with lock:
                    if ok:
                        lat.append(dt)
                    else:
                        errors[0] += 1
                n += clients

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out.put((lat, errors[0], time.perf_counter() - start))


def load(url: str, key: str, profile: str, queries: list[str], clients: int, seconds: float) -> dict[str, float]:
    q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    p = mp.Process(target=_clients, args=(url, key, profile, queries, clients, seconds, q))
    p.start()
    try:
        lat, errors, wall = q.get(timeout=seconds + 120)
    except queue.Empty:
        p.kill()
        raise EngineError(f"the load generator sent no result {seconds + 120:.0f} s after it started") from None
    p.join()
    ms = sorted(x * 1000 for x in lat)

    def pct(v: float) -> float:
        return ms[min(len(ms) - 1, int(round(v / 100 * (len(ms) - 1))))] if ms else float("nan")

    return {"ok": len(ms), "errors": errors, "qps": len(ms) / wall, "p50": pct(50), "p95": pct(95),
            "p99": pct(99), "mean": statistics.fmean(ms) if ms else float("nan")}


def slo(r: dict[str, float]) -> str:
    """The row's verdict on the RFC SLO, naming what missed it."""
    missed = [what for what, ok in (("p50", r["p50"] <= SLO_P50_MS), ("p95", r["p95"] <= SLO_P95_MS),
                                    (f"{r['errors']:.0f} errors", not r["errors"])) if not ok]
    return verdict(not missed) + (f" ({', '.join(missed)})" if missed else "")


def serve(idx: Path, keys: Path, workers: int | None, env: dict[str, str]) -> tuple[subprocess.Popen, str]:  # type: ignore[type-arg]
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [EXE, "serve", "--index-dir", str(idx), "--keys", str(keys), "--port", str(port)]
    proc = subprocess.Popen(cmd + (["--workers", str(workers)] if workers else []), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: the service exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("error: the service did not become ready in 600 s")


def synthetic(scifact: Path, n: int, idx: Path) -> None:
    from hybridsearch.engines.embedded import EmbeddedEngine
    from hybridsearch.models import Document

    rows = [json.loads(line) for line in (scifact / "corpus.jsonl").open()]
    words = " ".join(r["text"] for r in rows).split()
    titles = [r.get("title") or "untitled" for r in rows]
    rng = random.Random(0)
    vrng = np.random.default_rng(0)
    basis: dict[str, np.ndarray] = {}

    def vec(title: str) -> np.ndarray:
        vs = []
        for w in title.lower().split():
            if w not in basis:
                v = vrng.normal(size=384).astype(np.float32)
                basis[w] = v / np.linalg.norm(v)
            vs.append(basis[w])
        m = np.mean(vs, axis=0) if vs else vrng.normal(size=384).astype(np.float32)
        return (m / np.linalg.norm(m)).astype(np.float32)

    engine = EmbeddedEngine(idx)
    enc = engine.hdc_encoder()
    batch: list[Document] = []
    for i in range(n):
        k, at = rng.randint(40, 200), rng.randrange(len(words) - 200)
        batch.append(Document(id=f"s{i}", title=rng.choice(titles), text=" ".join(words[at:at + k]),
                              license="CC-BY-4.0"))
        if len(batch) == 2000 or i == n - 1:
            engine.write(batch, np.stack([vec(d.title) for d in batch]), [enc.encode_document(d) for d in batch])
            batch = []
    engine.close()


def scifact_index(dataset: Path, env: dict[str, str]) -> tuple[Path, int]:
    """The dataset's index with vectors and codes, cached under .hybridsearch/bench/http-<name> and
    keyed by the corpus's content digest (a cached index of another corpus is built again); and the
    number of documents it holds."""
    from hybridsearch.engines.embedded import EmbeddedEngine
    from query_service.evaluate import corpus_fingerprint

    fp = corpus_fingerprint(dataset)
    cache = ROOT / ".hybridsearch" / "bench" / f"http-{dataset.resolve().name}"
    if (cache / "store.sqlite").exists():
        with EmbeddedEngine(cache) as e:
            if e.get_meta("corpus") == fp:
                return cache, e.count()
    shutil.rmtree(cache, ignore_errors=True)
    out = subprocess.run([EXE, "ingest", str(dataset), "--index-dir", str(cache), "-q"], env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise EngineError(f"hybridsearch ingest {dataset} failed: {out.stderr.strip()[-500:]}")
    with EmbeddedEngine(cache) as e:
        e.set_meta("corpus", fp)  # only once the index is complete
        return cache, e.count()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scifact", type=dataset_dir, default=str(ROOT.parent / "shared" / "data" / "scifact"))
    ap.add_argument("--synthetic", type=count, default=100_000)
    ap.add_argument("--seconds", type=seconds_type, default=20.0)
    ap.add_argument("--workers", type=positive_int, help="server processes (default: serve's own, the usable cores)")
    args = ap.parse_args()
    queries = [json.loads(line)["text"] for line in (args.scifact / "queries.jsonl").open()][:300]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HYBRIDSEARCH_QUERY_LOG": "false",
           "HYBRIDSEARCH_HTTP_RATE_LIMIT": "1000000", "HYBRIDSEARCH_HTTP_RATE_BURST": "1000000"}
    cache, docs = scifact_index(args.scifact, env)
    corpora: list[tuple[str, Path]] = [(f"{args.scifact.resolve().name} ({docs} docs)", cache)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.synthetic:
            t = time.perf_counter()
            synthetic(args.scifact, args.synthetic, Path(tmp) / "synthetic")
            print(f"built the synthetic corpus of {args.synthetic} documents in {time.perf_counter() - t:.0f} s",
                  file=sys.stderr)
            corpora.append((f"synthetic ({args.synthetic} docs)", Path(tmp) / "synthetic"))
        keys = Path(tmp) / "keys.json"
        key = subprocess.run([EXE, "keys", "add", "bench", "--file", str(keys), "--rights", "open,restricted"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        for name, idx in corpora:
            proc, url = serve(idx, keys, args.workers, env)
            try:
                for profile in ("hybrid", "kb-fast"):
                    load(url, key, profile, queries, 1, 3.0)  # warm-up
                    for clients in (1, 8, 32):
                        r = load(url, key, profile, queries, clients, args.seconds)
                        rows.append((name, profile, clients, r))
                        print(f"  {name:<26} {profile:<8} {clients:>3} clients: {r['qps']:7.1f} QPS, p50 "
                              f"{r['p50']:7.1f} ms, p95 {r['p95']:7.1f} ms, errors {r['errors']}", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(timeout=120)
    print(f"\nPOST /retrieve on loopback, {os.cpu_count()} cores, {args.workers or usable_cores()} server worker(s), "
          f"{args.seconds:g} s per row; QPS and latencies of successful requests only")
    print(f"  {'corpus':<26} {'profile':<8} {'clients':>7} {'ok':>8} {'errors':>6} {'QPS':>8} "
          f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  RFC SLO (p50 <= {SLO_P50_MS:.0f} ms, p95 <= "
          f"{SLO_P95_MS:.0f} ms, no errors)")
    for name, profile, clients, r in rows:
        print(f"  {name:<26} {profile:<8} {clients:>7} {r['ok']:>8} {r['errors']:>6} {r['qps']:>8.1f} "
              f"{r['p50']:>8.1f} {r['p95']:>8.1f} {r['p99']:>8.1f}  {slo(r)}")
    if rows:
        met = sum(slo(r) == "met" for *_, r in rows)
        print(f"  RFC SLO met by {met} of {len(rows)} rows")


if __name__ == "__main__":
    run_main(main)
