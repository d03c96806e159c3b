"""Benchmark the OpenSearch engine beside the embedded engine on a BEIR dataset; prints tables.

    python bench/opensearch.py DATASET [--url URL] [--queries N] [--keep]

One run, both engines: ingest without embeddings (documents, vectors and HDC codes written into a
fresh index; write time only; OpenSearch first into a scratch index, then warm), engine parity
(`query_service.parity.compare`), latency one query at a time after warm-up (BM25, dense kNN, the
HDC channel, the `hybrid` profile end to end), our fusion against OpenSearch's own hybrid query and
search pipelines on the same node and index, and the node's memory after the run. The embedded
index is built once and cached in `.hybridsearch/bench/<dataset>`; the OpenSearch index
`bench-<dataset>-<random>` is created fresh and dropped at the end unless `--keep`.

The node is asked for its version before any work (an unreachable one is one error line). Each
cleanup step runs on its own: one that fails is a warning and hides neither the error that ended
the run nor the steps after it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import cleanup, dataset_dir, node_version, positive_int, run_main, verdict  # noqa: E402

from hybridsearch.analysis import default_analyzer  # noqa: E402
from hybridsearch.config import get_settings  # noqa: E402
from hybridsearch.embeddings import Encoder, default_encoder  # noqa: E402
from hybridsearch.engines import Bm25Options, Engine  # noqa: E402
from hybridsearch.engines.embedded import EmbeddedEngine  # noqa: E402
from hybridsearch.engines.opensearch import queries as Q  # noqa: E402
from hybridsearch.engines.opensearch.engine import OpenSearchEngine  # noqa: E402
from hybridsearch.metrics import evaluate, percentile  # noqa: E402
from hybridsearch.models import BM25_FIELD_WEIGHTS, Query  # noqa: E402
from hybridsearch.scoring import merge_term_weights  # noqa: E402
from indexer.loaders import load_qrels, load_queries  # noqa: E402
from query_service.channels import Bm25Config, HdcChannel, QueryContext  # noqa: E402
from query_service.evaluate import prepare_index  # noqa: E402
from query_service.fusion import WeightedConfig, WeightedFuser  # noqa: E402
from query_service.http import freeze_loaded  # noqa: E402
from query_service.parity import compare, copy_corpus  # noqa: E402
from query_service.profiles import Profile  # noqa: E402
from query_service.searcher import Searcher, adhoc_profile, get_profile  # noqa: E402

DEPTH = 100
WARMUP = 20
PIPELINES = ("hybridsearch-minmax", "hybridsearch-rrf")
OURS_WEIGHTED = "ours bm25+dense:weighted (min-max, arithmetic 0.5/0.5)"
OURS_RRF = "ours bm25+dense:rrf (k=60)"
PEER = "peer: hybrid query + pipeline "
Qrels = dict[str, dict[str, int]]
T = TypeVar("T")
R = TypeVar("R")


class CachedEncoder:
    """Query embeddings computed once, so that the fusion comparison leaves embedding out of both
    sides; `misses` counts texts it had to embed (0 during a timed pass)."""

    def __init__(self, inner: Encoder) -> None:  # keyed by text alone: every text here is a query
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.cache: dict[str, np.ndarray] = {}
        self.misses = 0

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None, progress: bool = False,
               query: bool = False) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            self.misses += len(missing)
            self.cache.update(zip(missing, self.inner.encode(missing, query=query), strict=True))
        return np.vstack([self.cache[t] for t in texts])


def index_name(dataset: Path) -> str:
    """A fresh index of this run's own: never one another run (or a user) is working with."""
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in dataset.resolve().name.lower())
    return f"bench-{name.strip('-_') or 'dataset'}-{uuid.uuid4().hex[:6]}"


def timed(fn: Callable[[T], R], items: Sequence[T], warmup: int = WARMUP) -> tuple[list[float], list[R]]:
    """Latencies (ms) of `fn` one item (query) at a time, after `warmup` untimed calls; and the results."""
    for x in items[:warmup]:
        fn(x)
    lat, out = [], []
    for x in items:
        t = time.perf_counter()
        out.append(fn(x))
        lat.append((time.perf_counter() - t) * 1000)
    return lat, out


def p50_p95(lat: Sequence[float]) -> str:
    return f"{percentile(lat, 50):.2f} / {percentile(lat, 95):.2f} ms"


# -- 1. ingest --------------------------------------------------------------------------------------
def bench_ingest(dataset: Path, source: Engine, dest: OpenSearchEngine, tmp: Path) -> dict[str, tuple[int, float]]:
    """(documents, write seconds) per engine: the dataset with the vectors `source` holds and HDC
    codes, written into a fresh index (created before the clock starts; codes are encoded outside
    the timed writes). OpenSearch writes twice: first into a scratch index, dropped after (the first
    writes the node has seen since it started, if the bench runs first), then into `dest` with the
    node's JIT warm: the rate a long ingest settles at."""
    out: dict[str, tuple[int, float]] = {}
    with EmbeddedEngine(tmp / "embedded-copy") as copy:
        seconds = copy_corpus(dataset, source, copy, log=lambda m: None)
        out["embedded"] = (copy.count(), seconds)
    first = OpenSearchEngine(dest.url, index=f"{dest.index}-first", settings=dest.settings)
    try:
        first.drop()
        first.ensure_index()
        seconds = copy_corpus(dataset, source, first, log=lambda m: None, graph=False)
        out["opensearch, first"] = (first.count(), seconds)
    finally:
        cleanup(f"drop the scratch index {first.index}", first.drop)
        cleanup("close the scratch index's client", first.close)
    dest.ensure_index()
    seconds = copy_corpus(dataset, source, dest, log=lambda m: None)
    out["opensearch"] = (dest.count(), seconds)
    return out


def print_ingest(fig: dict[str, tuple[int, float]]) -> None:
    (ne, se), (nf, sf), (no, so) = fig["embedded"], fig["opensearch, first"], fig["opensearch"]
    print("\n## 1. Ingest without embeddings (precomputed vectors + HDC codes; write time only, "
          "batches of 500, searchable on return; OpenSearch: a first pass into a scratch index, "
          "then again into the bench index)\n")
    print("| figure | embedded | opensearch, first | opensearch, again | target (OpenSearch) |\n|---|---|---|---|---|")
    print(f"| documents written | {ne:,} | {nf:,} | {no:,} | |")
    print(f"| write seconds | {se:.2f} s | {sf:.2f} s | {so:.2f} s | |")
    print(f"| throughput | {ne / se:,.0f} docs/s | {nf / sf:,.0f} docs/s | {no / so:,.0f} docs/s | "
          f"≥ 2,000 docs/s: first {verdict(nf / sf >= 2000)}, again {verdict(no / so >= 2000)} |")
    if len({ne, nf, no}) > 1:
        print(f"\nwarning: the indices hold different document counts ({ne}, {nf}, {no})")


# -- 3. latency -------------------------------------------------------------------------------------
def bench_latency(engines: dict[str, EmbeddedEngine | OpenSearchEngine], queries: Sequence[Query],
                  enc: Encoder) -> None:
    """BM25, dense kNN (query embedded beforehand), the HDC channel and the `hybrid` profile end to
    end, per engine, the heap frozen as the service freezes it. Each figure in its own loop:
    torch's OpenMP threads spin for a while after an embedding, and interleaving would charge that
    to the next call."""
    texts = [q.text for q in queries]
    rows: dict[str, dict[str, list[float]]] = {n: {} for n in engines}
    freeze_loaded()  # as `hybridsearch serve` does once it has loaded the model
    for n, e in engines.items():
        rows[n]["bm25"] = timed(partial(e.bm25, k=DEPTH), texts)[0]
    search = engines["opensearch"]
    assert isinstance(search, OpenSearchEngine)
    took = [float(r["took"]) for r in timed(partial(bm25_request, search), texts)[1]]
    enc.encode([texts[0]], query=True)
    embed_lat, vectors = timed(partial(embed_one, enc), texts, warmup=0)
    for n, e in engines.items():
        rows[n]["dense"] = timed(partial(e.knn, k=DEPTH), vectors)[0]
    hdc = HdcChannel()
    for n, e in engines.items():
        rows[n]["hdc"] = timed(lambda text, e=e: hdc.retrieve(QueryContext(text), e, DEPTH), texts)[0]
    hybrid = get_profile("hybrid")
    for n, e in engines.items():
        s = Searcher(e, encoder=enc)
        try:
            rows[n]["hybrid"] = timed(partial(s.search, profile=hybrid, k=DEPTH), texts)[0]
        finally:
            s.close()
    emb, osr = rows["embedded"], rows["opensearch"]
    print(f"\n## 3. Latency, one query at a time after {min(WARMUP, len(queries))} warm-up queries "
          f"({len(queries)} queries, top-{DEPTH}, p50 / p95; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at the end)\n")
    print("| figure | embedded | opensearch | target (OpenSearch) |\n|---|---|---|---|")
    bm25_p50 = percentile(osr["bm25"], 50)
    print(f"| BM25 (query analysis + engine call; OpenSearch over HTTP) | {p50_p95(emb['bm25'])} | "
          f"{p50_p95(osr['bm25'])} | p50 ≤ 5 ms: {verdict(bm25_p50 <= 5)} |")
    print(f"| BM25, OpenSearch server-side `took` of the same request (integer ms) | | {p50_p95(took)} | |")
    print(f"| query embedding (all-MiniLM-L6-v2, one query; engine-independent) | {p50_p95(embed_lat)} | "
          "(same) | |")
    print(f"| dense kNN (query embedded beforehand) | {p50_p95(emb['dense'])} | {p50_p95(osr['dense'])} | |")
    print(f"| HDC channel (query codes, per-field Hamming kNN of {DEPTH * hdc.config.candidate_factor}, exact "
          f"rescoring; OpenSearch: one `_msearch` each) | {p50_p95(emb['hdc'])} | {p50_p95(osr['hdc'])} | |")
    hyb_p50 = percentile(osr["hybrid"], 50)
    print(f"| `hybrid` profile end to end (Searcher, embedding included) | {p50_p95(emb['hybrid'])} | "
          f"{p50_p95(osr['hybrid'])} | p50 ≤ 30 ms: {verdict(hyb_p50 <= 30)} |")


def embed_one(enc: Encoder, text: str) -> np.ndarray:
    return enc.encode([text], query=True)[0]


def bm25_request(engine: OpenSearchEngine, text: str) -> dict[str, Any]:
    """The request `engine.bm25(text, k=DEPTH)` sends, sent directly (for the server's `took`)."""
    terms = merge_term_weights([(t, 1.0) for t in engine.analyzer.analyze(text)])
    opt = Bm25Options()
    body = Q.bm25_query(terms, BM25_FIELD_WEIGHTS, DEPTH, None, opt.mode, opt.tie_breaker)
    result: dict[str, Any] = engine.client.search(index=engine.index, body=body)
    return result


# -- 4. the peer: OpenSearch's own hybrid search -----------------------------------------------------
def put_pipelines(engine: OpenSearchEngine) -> None:
    for pid in PIPELINES:
        engine.client.search_pipeline.put(id=pid, body=Q.template(f"pipelines/{pid}"))


def peer_search(engine: OpenSearchEngine, pipeline: str, bm25: Bm25Config, enc: Encoder, text: str
                ) -> dict[str, Any]:
    """OpenSearch's hybrid query over our BM25 sub-query (the bm25 channel's analysed terms, fields
    and mode) and the dense kNN sub-query of the query's embedding, fused by `pipeline`; the raw
    response."""
    vector = enc.encode([text], query=True)[0]
    terms = merge_term_weights([(t, 1.0) for t in default_analyzer().analyze(text)])
    body = Q.hybrid_query(terms, bm25.fields, vector.tolist(), DEPTH, None, bm25.mode, bm25.tie_breaker,
                           get_settings().opensearch_ef_search)
    if not terms:  # an empty bool would match every document; our channel returns nothing
        body["query"]["hybrid"]["queries"][0] = {"match_none": {}}
    body["track_total_hits"] = False  # as our channels' requests (accepted by the hybrid query in 2.19)
    result: dict[str, Any] = engine.client.search(index=engine.index, body=body, params={"search_pipeline": pipeline})
    return result


def bench_fusion(engine: OpenSearchEngine, queries: Sequence[Query], qrels: Qrels, enc: Encoder) -> None:
    cached = CachedEncoder(enc)
    texts = [q.text for q in queries]
    for text in texts:  # embedded one at a time, as in the latency section
        cached.encode([text], query=True)
    weighted = adhoc_profile(["bm25", "dense"], "weighted", DEPTH)
    cfg = WeightedConfig(**weighted.fuser_config)
    fuser = WeightedFuser(cfg)
    if (cfg.norm, cfg.mean) != ("minmax", "arithmetic") or fuser.weight("bm25") != fuser.weight("dense"):
        weighted = weighted.model_copy(update={"fuser_config": {"norm": "minmax", "mean": "arithmetic",
                                                                "weights": {"bm25": 0.5, "dense": 0.5}}})
    ours: dict[str, Profile] = {OURS_WEIGHTED: weighted,
                                OURS_RRF: adhoc_profile(["bm25", "dense"], "rrf", DEPTH),
                                "ours `hybrid` profile": get_profile("hybrid")}
    runs: dict[str, dict[str, list[str]]] = {}
    lats: dict[str, list[float]] = {}
    searcher = Searcher(engine, encoder=cached)
    try:
        for name, prof in ours.items():
            # the warm-up pass runs every query once, so that expansion variants are embedded too
            lat, res = timed(partial(searcher.search, profile=prof, k=DEPTH), texts, warmup=len(texts))
            runs[name] = {q.id: [h.id for h in r.hits] for q, r in zip(queries, res, strict=True)}
            lats[name] = lat
    finally:
        searcher.close()
    misses = cached.misses
    put_pipelines(engine)
    bm25 = Bm25Config()  # the bm25 channel's defaults: fields, most_fields
    responses: dict[str, list[dict[str, Any]]] = {}
    for pid in PIPELINES:
        name = f"{PEER}{pid}"
        lat, peer = timed(partial(peer_search, engine, pid, bm25, cached), texts, warmup=len(texts))
        runs[name] = {q.id: [Q.hit_id(h) for h in r["hits"]["hits"]] for q, r in zip(queries, peer, strict=True)}
        lats[name] = lat
        responses[pid] = peer
    peer_of = {f"{PEER}hybridsearch-minmax": OURS_WEIGHTED, f"{PEER}hybridsearch-rrf": OURS_RRF}
    print(f"\n## 4. Our fusion vs OpenSearch's hybrid search, same node and index ({len(queries)} queries, "
          f"depth {DEPTH}; query embedding EXCLUDED from both sides: embedded once beforehand; "
          f"one query at a time after a full warm-up pass; load average {os.getloadavg()[0]:.2f} at the end)\n")
    print("| run | nDCG@10 | Recall@100 | p50 ms | p95 ms | top-10 overlap with ours (same fusion) |")
    print("|---|---|---|---|---|---|")
    for name, run in runs.items():
        m = evaluate(run, qrels)
        overlap = ""
        if name in peer_of:
            mine = runs[peer_of[name]]
            overlap = f"{np.mean([len(set(run[q][:10]) & set(mine[q][:10])) / 10 for q in run]):.3f}"
        print(f"| {name} | {m['ndcg@10']:.4f} | {m['recall@100']:.4f} | {percentile(lats[name], 50):.2f} | "
              f"{percentile(lats[name], 95):.2f} | {overlap} |")
    extra = misses - len(queries)
    print(f"\nquery texts embedded outside the timed passes: {len(queries)} queries + {extra} expansion variants; "
          f"embedded during timed passes: {cached.misses - misses}")
    check_peer(responses, runs, queries)


def check_peer(responses: dict[str, list[dict[str, Any]]], runs: dict[str, dict[str, list[str]]],
               queries: Sequence[Query]) -> None:
    """The peer's scores are fused scores (min-max in [0, 1], RRF at most 2/61), on every query, and
    the top hits of the first two queries."""
    mm = [h["_score"] for r in responses["hybridsearch-minmax"] for h in r["hits"]["hits"]]
    rrf = [h["_score"] for r in responses["hybridsearch-rrf"] for h in r["hits"]["hits"]]
    empty = {pid: sum(not r["hits"]["hits"] for r in res) for pid, res in responses.items()}
    print("\nPeer checks over all queries:")
    print(f"- hybridsearch-minmax: {len(mm)} hits, scores in [{min(mm, default=0):.4f}, {max(mm, default=0):.4f}] "
          f"(fused min-max: within [0, 1]: {verdict(all(0 <= s <= 1 + 1e-6 for s in mm))}); "
          f"queries with no hit: {empty['hybridsearch-minmax']}")
    print(f"- hybridsearch-rrf: {len(rrf)} hits, scores in [{min(rrf, default=0):.5f}, {max(rrf, default=0):.5f}] "
          f"(RRF k=60 over 2 lists: at most 2/61 = {2 / 61:.5f}: {verdict(all(s <= 2 / 61 + 1e-6 for s in rrf))}); "
          f"queries with no hit: {empty['hybridsearch-rrf']}")
    for i, q in enumerate(queries[:2]):
        print(f"\nquery {q.id}: {q.text!r}")
        for pid, res in responses.items():
            top = ", ".join(f"{Q.hit_id(h)} {h['_score']:.4f}" for h in res[i]["hits"]["hits"][:3])
            print(f"  peer {pid:<20} top-3: {top}")
        for name in (OURS_WEIGHTED, OURS_RRF):
            print(f"  {name.split(' (')[0]:<25} top-3 ids: {', '.join(runs[name][q.id][:3])}")


# -- 5. node memory ---------------------------------------------------------------------------------
def print_node_memory(engine: OpenSearchEngine) -> None:
    """RSS of the node we talk to (when it runs on this machine) and its JVM heap."""
    client = engine.client
    info = client.nodes.info(node_id="_local", metric="process")["nodes"]
    (node_id, node), = info.items()
    pid = node.get("process", {}).get("id")
    stats = client.nodes.stats(node_id="_local", metric="jvm")["nodes"][node_id]["jvm"]["mem"]
    rss = "n/a"
    host = urlsplit(engine.url).hostname or ""
    proc = Path(f"/proc/{pid}")
    if pid is not None and host in ("127.0.0.1", "localhost", "::1") and proc.exists():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            if "opensearch" in cmdline.lower():
                kb = next(int(line.split()[1]) for line in (proc / "status").read_text().splitlines()
                          if line.startswith("VmRSS:"))
                rss = f"{kb / 1024:,.0f} MB"
        except (OSError, StopIteration, ValueError):
            rss = "n/a"
    try:
        knn = client.transport.perform_request("GET", f"/_plugins/_knn/{node_id}/stats/graph_memory_usage")  # KB
        graph = f"{knn['nodes'][node_id]['graph_memory_usage'] / 1024:,.1f} MB"
    except Exception:  # an optional figure: a cluster without the k-NN stats API
        graph = "n/a"
    print("\n## 5. OpenSearch node memory after the run (index still present)\n")
    print("| figure | value |\n|---|---|")
    print(f"| node PID (GET _nodes/_local → process.id) | {pid if pid is not None else 'n/a'} |")
    print(f"| node RSS (/proc/<pid>/status VmRSS) | {rss} |")
    print(f"| JVM heap used / committed / max | {stats['heap_used_in_bytes'] / 2**20:,.0f} / "
          f"{stats['heap_committed_in_bytes'] / 2**20:,.0f} / {stats['heap_max_in_bytes'] / 2**20:,.0f} MB |")
    print(f"| JVM non-heap used | {stats['non_heap_used_in_bytes'] / 2**20:,.0f} MB |")
    print(f"| k-NN native graph memory (Faiss/nmslib only; Lucene graphs live in the JVM / page cache) | {graph} |")


# -- main ---------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", type=dataset_dir)
    ap.add_argument("--url", default=os.environ.get("HYBRIDSEARCH_OPENSEARCH_URL"),
                    help="OpenSearch URL (default $HYBRIDSEARCH_OPENSEARCH_URL)")
    ap.add_argument("--queries", type=positive_int,
                    help="use the first N test queries for latency and fusion (default all)")
    ap.add_argument("--keep", action="store_true", help="keep the OpenSearch index at the end")
    args = ap.parse_args()
    if not args.url:
        ap.error("no OpenSearch URL: pass --url or set HYBRIDSEARCH_OPENSEARCH_URL")
    version = node_version(args.url)  # before the model loads: an unreachable node is one error line
    ds: Path = args.dataset
    enc = default_encoder()
    enc.encode(["warm up"])  # loads the model (and settles its precision) before anything is timed
    qrels_all = load_qrels(ds)
    queries = [q for q in load_queries(ds) if q.id in qrels_all][:args.queries]
    qrels = {q.id: qrels_all[q.id] for q in queries}
    embedded = prepare_index(ds, Path(".hybridsearch/bench") / ds.resolve().name, need_vectors=True,
                             need_codes=True, encoder=enc, progress=False, log=lambda m: print(m, file=sys.stderr))
    assert isinstance(embedded, EmbeddedEngine)
    search = OpenSearchEngine(args.url, index=index_name(ds))
    tmp = Path(tempfile.mkdtemp(prefix="hs-bench-os-"))
    try:
        ingest = bench_ingest(ds, embedded, search, tmp)
        (settings,) = search.client.indices.get_settings(index=search.index, name="index.number_of_shards").values()
        shards = settings["settings"]["index"]["number_of_shards"]
        details = search.stats().details
        print(f"\n# {ds.name}: {ingest['opensearch'][0]:,} documents, {len(queries)} test queries; "
              f"OpenSearch {version} at {search.url}, index {search.index} (knn engine {details['knn_engine']}, "
              f"space {details['space_type']}, {shards} shard(s)); "
              f"embedding precision {getattr(enc, 'precision', '?')}")
        print_ingest(ingest)
        report = compare(ds, {"embedded": embedded, "opensearch": search}, encoder=enc)
        print(f"\n## 2. Parity, embedded vs OpenSearch (all {next(iter(report.channels.values())).queries} "
              "test queries, top-100; `hybrid` is the profile)\n")
        print(report.table())
        bench_latency({"embedded": embedded, "opensearch": search}, queries, enc)
        bench_fusion(search, queries, qrels, enc)
        print_node_memory(search)
    finally:
        if args.keep:
            print(f"\nkept OpenSearch index {search.index!r} at {search.url}")
        else:
            cleanup(f"drop OpenSearch index {search.index}", search.drop)
        cleanup("close the OpenSearch client", search.close)
        cleanup("close the embedded index", embedded.close)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
