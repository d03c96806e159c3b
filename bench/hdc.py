"""HDC channel benchmarks; prints a table per part.

    python bench/hdc.py encode  [--data ../shared/data/scifact]
    python bench/hdc.py million [--n 1000000] [--queries 200]
    python bench/hdc.py quality [--data ../shared/data/scifact ../shared/data/cacm]

`encode` times one encoder cold, then warm, then the warm encoder forked into two processes (each
child inherits the parent's token cache). `million` builds its codes by encoding synthetic
documents drawn from a Zipf vocabulary with SciFact-like lengths (random bits have no
neighbourhood structure, so no graph index could find their neighbours): exact IndexBinaryFlat and
IndexBinaryHNSW top-100 latency and HNSW recall@10, where a hit counts when its exact Hamming
distance is at most the exact 10th distance (any of the codes tied there is a right answer).
`quality` runs `hybridsearch eval`'s code path: BM25 alone, HDC alone, agreement fusion escalated
(the kb-balanced profile) and always on (bm25+hdc:agreement), with and without character 3-grams.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
from _common import dataset_dir, positive_int, run_main

from hybridsearch.analysis import default_analyzer
from hybridsearch.hdc import NBYTES, HdcEncoder
from hybridsearch.hdc.algebra import _hv_bytes, majority
from hybridsearch.metrics import percentile
from indexer.loaders import BeirLoader, LoadReport

SCIFACT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "scifact"


_DOCS: list = []
_ENC: HdcEncoder | None = None  # the parent's warm encoder, inherited by forked children


def _encode_part(args: tuple[int, int]) -> float:
    start, stop = args
    assert _ENC is not None
    t = time.perf_counter()
    for d in _DOCS[start:stop]:
        _ENC.encode_document(d)
    return time.perf_counter() - t


def bench_encode(data: Path) -> None:
    global _DOCS, _ENC
    docs = _DOCS = list(BeirLoader().load(data, LoadReport()))
    n = len(docs)
    print(f"\n## encode: {n} documents of {data.name}, 4 fields each, analysis included\n")
    print("| encoder | processes | caches | docs/s | ms/doc |\n|---|---|---|---|---|")
    for ngrams in (False, True):
        name = "3-grams" if ngrams else "tokens"
        enc = HdcEncoder(ngrams=ngrams)
        for caches in ("cold", "warm"):
            t = time.perf_counter()
            for d in docs:
                enc.encode_document(d)
            dt = time.perf_counter() - t
            print(f"| {name} | 1 | {caches} | {n / dt:,.0f} | {dt / n * 1000:.3f} |")
        _ENC = enc  # warm: forked children inherit its token cache and the HV and analysis caches
        with multiprocessing.get_context("fork").Pool(2) as pool:
            dt = max(pool.map(_encode_part, [(0, n // 2), (n // 2, n)]))
        print(f"| {name} | 2 | warm (forked) | {n / dt:,.0f} | {dt / n * 1000:.3f} |")
    per_doc = 4 * NBYTES
    print(f"\nmemory per document: 4 field codes = {per_doc} B = {per_doc / 1024:.1f} KiB (before index overhead)")


# -- one million synthetic codes ----------------------------------------------------------------
VOCAB = 50_000
_TOKEN_BITS: np.ndarray | None = None
_KEY_BITS: np.ndarray | None = None


def _init_worker() -> None:
    global _TOKEN_BITS, _KEY_BITS
    _TOKEN_BITS = np.frombuffer(b"".join(_hv_bytes(f"tok:w{i}") for i in range(VOCAB)),
                                dtype=np.uint8).reshape(VOCAB, NBYTES)
    _KEY_BITS = np.unpackbits(np.frombuffer(_hv_bytes("field:claim"), dtype=np.uint8)).astype(bool)


def _synthetic_tokens(start: int, stop: int, seed: int) -> list[np.ndarray]:
    """Distinct Zipf tokens of docs [start, stop), lengths like SciFact's (distinct analysed
    tokens per abstract, lognormal fit)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.07
    p /= p.sum()
    lengths = np.clip(rng.lognormal(mean=4.55, sigma=0.45, size=stop - start), 5, 400).astype(int)
    return [np.unique(rng.choice(VOCAB, size=n, p=p)) for n in lengths]


def _bundle_claim(toks: np.ndarray) -> np.ndarray:
    """Bundle and bind to the claim key, exactly as HdcEncoder.encode_tokens does."""
    assert _TOKEN_BITS is not None and _KEY_BITS is not None
    counts = np.unpackbits(_TOKEN_BITS[toks], axis=1).sum(axis=0, dtype=np.int32)
    return majority(np.where(_KEY_BITS, len(toks) - counts, counts), len(toks))


def _encode_synthetic(args: tuple[int, int, int]) -> np.ndarray:
    start, stop, seed = args
    return np.vstack([_bundle_claim(t) for t in _synthetic_tokens(start, stop, seed)])


def bench_million(n: int, nq: int, m: int, query_tokens: float) -> None:
    t = time.perf_counter()
    chunk = 20_000
    jobs = [(s, min(s + chunk, n), s) for s in range(0, n, chunk)]
    with multiprocessing.Pool(os.cpu_count() or 1, initializer=_init_worker) as pool:
        codes = np.vstack(pool.map(_encode_synthetic, jobs))
    t_enc = time.perf_counter() - t
    # queries drawn from one indexed document each: `query_tokens` of its tokens (>= 1: a count,
    # like a short claim about it; < 1: a fraction, like a related document); the exact top-10
    # then holds that document and others that share its words
    _init_worker()
    rng = np.random.default_rng(7)
    docs0 = _synthetic_tokens(0, min(chunk, n), 0)
    picks = rng.choice(len(docs0), size=nq, replace=False)

    def sample(toks: np.ndarray) -> np.ndarray:
        size = int(query_tokens) if query_tokens >= 1 else max(1, round(query_tokens * len(toks)))
        return np.sort(rng.choice(toks, size=min(size, len(toks)), replace=False))

    queries = np.vstack([_bundle_claim(sample(docs0[i])) for i in picks])
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    flat = faiss.IndexBinaryFlat(NBYTES * 8)
    flat.add(codes)
    lat, tenth = [], []
    for q in queries:
        t = time.perf_counter()
        dist, _ = flat.search(q.reshape(1, -1), 100)
        lat.append((time.perf_counter() - t) * 1000)
        tenth.append(dist[0][9])
    t = time.perf_counter()
    hnsw = faiss.IndexBinaryHNSW(NBYTES * 8, m)
    hnsw.hnsw.efConstruction = 100
    hnsw.add(codes)
    t_build = time.perf_counter() - t
    kind = f"{int(query_tokens)} tokens" if query_tokens >= 1 else f"{query_tokens:.0%} of the tokens"
    print(f"\n## {n:,} synthetic codes (one field), {nq} queries of {kind} of an indexed document; "
          f"synthetic encoding {t_enc:.0f}s, HNSW build {t_build:.0f}s\n")
    print("| index | efSearch | p50 ms | p95 ms | recall@10 vs exact (a hit at most the exact 10th Hamming distance "
          "counts: ties) |\n|---|---|---|---|---|")
    print(f"| exact IndexBinaryFlat | - | {percentile(lat, 50):.2f} | {percentile(lat, 95):.2f} | 1.000 |")
    for ef in (64, 128, 256, 512):
        hnsw.hnsw.efSearch = ef
        lat_h, rec = [], []
        for q, limit in zip(queries, tenth, strict=True):
            t = time.perf_counter()
            _, ids = hnsw.search(q.reshape(1, -1), 100)
            lat_h.append((time.perf_counter() - t) * 1000)
            top = ids[0][:10]
            top = top[top >= 0]
            exact = np.unpackbits(codes[top] ^ q, axis=1).sum(axis=1)  # recomputed, not taken from the index
            rec.append(int((exact <= limit).sum()) / 10)
        print(f"| IndexBinaryHNSW M={m} | {ef} | {percentile(lat_h, 50):.2f} | {percentile(lat_h, 95):.2f} | "
              f"{np.mean(rec):.3f} |")
    graph = hnsw.hnsw.neighbors.size() * 4 + hnsw.hnsw.levels.size() * 4 + hnsw.hnsw.offsets.size() * 8
    print(f"\nmemory: codes {codes.nbytes / n:.0f} B/doc per field (4 fields: {4 * codes.nbytes / n / 1024:.1f} KiB);"
          f" HNSW graph {graph / n:.0f} B/doc per field")


def bench_quality(datasets: list[Path]) -> None:
    from query_service.evaluate import format_table, run_eval, run_specs

    for ds in datasets:
        for ngrams in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                from hybridsearch.engines.embedded.store import Store

                store = Store(Path(tmp) / "store.sqlite")
                store.hdc_options(ngrams=ngrams)
                store.close()
                specs = run_specs("bm25,hdc,bm25+hdc", "agreement", "kb-balanced")
                res = run_eval(ds, specs, target=Path(tmp), progress=False, log=lambda m: None)
            print(f"\n## {ds.name}, HDC {'with character 3-grams' if ngrams else 'tokens only'}\n")
            print(format_table(res))


def query_tokens(value: str) -> float:
    """An argparse type: a number above 0."""
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"a number above 0, got {value!r}")
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["encode", "million", "quality"])
    ap.add_argument("--data", type=dataset_dir, nargs="+", help=f"BEIR datasets (default: {SCIFACT})")
    ap.add_argument("--n", type=positive_int, default=1_000_000)
    ap.add_argument("--queries", type=positive_int, default=200)
    ap.add_argument("--m", type=positive_int, default=32, help="HNSW graph degree")
    ap.add_argument("--query-tokens", type=query_tokens, default=9,
                    help="tokens per query taken from an indexed document (< 1: a fraction of them)")
    args = ap.parse_args()
    if args.part == "million":
        if args.n < 100:
            ap.error(f"--n {args.n}: million searches the top 100, so it needs at least 100 codes")
        if args.queries > min(args.n, 20_000):
            ap.error(f"--queries {args.queries}: each query is drawn from a different one of the first "
                     f"{min(args.n, 20_000)} documents, so at most {min(args.n, 20_000)}")
    elif args.data is None:
        try:
            args.data = [dataset_dir(str(SCIFACT))]
        except argparse.ArgumentTypeError as e:
            ap.error(f"--data (default): {e}")
    default_analyzer()
    if args.part == "encode":
        bench_encode(args.data[0])
    elif args.part == "million":
        bench_million(args.n, args.queries, args.m, args.query_tokens)
    else:
        bench_quality(args.data)


if __name__ == "__main__":
    run_main(main)
