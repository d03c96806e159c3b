"""Dense vectors on OpenSearch 3.x at each `opensearch_vector_compression`: the memory a kNN search
keeps hot per million chunks, disk, and recall@10 against exact, on the scale benchmark's vectors;
prints a table, 1x (float32) the anchor of the same run.

    python bench/vector_compression.py --docs 100000 [--url URL] [--work-dir DIR] [--levels 1x,4x,32x]

The vectors and queries are bench/scale.py's (`prepare_data`: real all-MiniLM-L6-v2 vectors up to
--real-vectors-max works, "near real" ones above; --work-dir shares them with its runs). For each
level a fresh logical index `bench-vectors-<level>-<random>` gets --docs chunks holding only their
vectors (no text or HDC codes: every k-NN file is a dense one), written through OpenSearchEngine,
then force-merged to one segment. Each chunk holds two vectors, as a one-passage chunk does: its own
(`dense`) and its passage's (`passages.v`). Hot memory is what a search walks: the HNSW graph
(.vex) and the vectors it scores (.vec, float32, at 1x; .veq, the quantised ones, otherwise; the
float32 .vec stays on disk for the rescoring of 3 x k candidates), from the index's segment file
sizes. Recall: a hit counts when its exact cosine reaches the exact 10th's (ties), over --queries
queries through `engine.knn`, and its p50, after 10 warm-up queries. The indices are dropped at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cleanup, cpu_line, node_version, positive_int, run_main, verdict  # noqa: E402
from scale import Clock, doc_id, prepare_data, work_dir_for  # noqa: E402

from hybridsearch.config import get_settings  # noqa: E402
from hybridsearch.engines.opensearch import queries as Q  # noqa: E402
from hybridsearch.errors import ConfigError  # noqa: E402
from hybridsearch.metrics import percentile  # noqa: E402
from hybridsearch.models import Document  # noqa: E402

LEVELS = ("1x", "4x", "32x")
BATCH = 2000


def measure(url: str, level: str, vectors: np.ndarray, queries: Any, measured: int, factors: list[float],
            clock: Clock) -> list[dict[str, Any]]:
    """One index at `level`: written, merged, its file sizes read, then `measured` queries (the
    first ones of `queries`, whose exact top-10 it holds) after the others as warm-up, once per
    rescoring oversample factor in `factors` (a compressed level; 1x is not rescored)."""
    from hybridsearch.engines.opensearch import OpenSearchEngine

    settings = get_settings().model_copy(update={"opensearch_vector_compression": level})
    engine = OpenSearchEngine(url, index=f"bench-vectors-{level}-{uuid.uuid4().hex[:6]}", settings=settings)
    n = len(vectors)
    try:
        t = time.perf_counter()
        for start in range(0, n, BATCH):
            rows = range(start, min(start + BATCH, n))
            engine.write([Document(id=doc_id(i), title=doc_id(i)) for i in rows],
                         np.asarray(vectors[start:rows.stop], dtype=np.float32))
        write_s = time.perf_counter() - t
        live = engine.stats().details["concrete_index"]
        t = time.perf_counter()
        engine.client.indices.forcemerge(index=live, max_num_segments=1, request_timeout=3600)
        merge_s = time.perf_counter() - t
        clock.log(f"{level}: {n:,} vectors written in {write_s:.0f}s, merged to one segment in {merge_s:.0f}s")
        got = engine.client.indices.stats(index=live, metric="segments,store",
                                          params={"include_segment_file_sizes": "true"})
        prim = got["indices"][live]["primaries"]
        files = {ext: int(v["size_in_bytes"]) for ext, v in prim["segments"].get("file_sizes", {}).items()}
        hot = files.get("vex", 0) + files.get("vec" if level == "1x" else "veq", 0)
        qv, tenth = queries["vectors"], queries["scores"][:, -1]
        out = []
        for factor in factors if level != "1x" else [None]:
            if factor is not None:
                Q.COMPRESSED_SEARCH[level] = (factor, Q.COMPRESSED_SEARCH[level][1])
            for v in qv[measured:]:
                engine.knn(v, 10)
            found, lat = 0, []
            for i in range(measured):
                t = time.perf_counter()
                hits = engine.knn(qv[i], 10)
                lat.append(1000 * (time.perf_counter() - t))
                found += sum(float(vectors[int(h[1:])] @ qv[i]) >= tenth[i] - 1e-6 for h in hits.ids)
            out.append({"level": level, "oversample": factor, "hot_mb_per_m": hot / n * 1e6 / 2 ** 20,
                        "files": files, "disk_mb": prim["store"]["size_in_bytes"] / 2 ** 20, "write_s": write_s,
                        "merge_s": merge_s, "recall": found / (10 * measured), "p50_ms": percentile(lat, 50)})
        return out
    finally:
        cleanup(f"drop {engine.index}", engine.drop)
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=positive_int, required=True, help="vectors in each index")
    ap.add_argument("--url", help="OpenSearch URL, 3.x (default $HYBRIDSEARCH_OPENSEARCH_URL)")
    ap.add_argument("--work-dir", type=Path, help="bench/scale.py's work directory to take the vectors from "
                    "(made when missing); default: a temporary one")
    ap.add_argument("--levels", default=",".join(LEVELS), help="compressions to measure, 1x first (1x,4x,32x)")
    ap.add_argument("--queries", type=positive_int, default=200, help="measured queries (200)")
    ap.add_argument("--oversample", help="rescoring oversample factors to measure, comma-separated (default: "
                    "the engine's own for each level, COMPRESSED_SEARCH)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real-vectors-max", type=int, default=20_000)
    ap.add_argument("--centres", type=positive_int, default=2000)
    ap.add_argument("--noise", type=float, default=0.04)
    args = ap.parse_args()
    levels = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    if not levels or any(lv not in LEVELS for lv in levels):
        raise ConfigError(f"--levels: {args.levels!r} is not a list of {', '.join(LEVELS)}")
    try:
        factors = [float(f) for f in args.oversample.split(",")] if args.oversample else []
    except ValueError:
        factors = [0.0]
    if any(not 1.0 <= f <= 100.0 for f in factors):
        raise ConfigError(f"--oversample: {args.oversample!r} is not a list of factors from 1 to 100")
    url = args.url or get_settings().opensearch_url
    if not url:
        raise ConfigError("no OpenSearch URL: pass --url or set HYBRIDSEARCH_OPENSEARCH_URL")
    version = node_version(url)
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="bench-vectors-") as tmp:
        work = work_dir_for(args.work_dir) if args.work_dir else Path(tmp)
        data = prepare_data(work, args, clock)
        vectors = np.load(data["vectors"], mmap_mode="r")
        queries = np.load(data["queries"])  # --queries measured (their exact top-10), then 10 to warm up
        rows = [row for lv in levels for row in measure(url, lv, vectors, queries, args.queries,
                                                         factors or [Q.COMPRESSED_SEARCH.get(lv, (1.0, 1))[0]], clock)]
    anchor = next((r for r in rows if r["level"] == "1x"), None)
    print(f"\nOpenSearch {version} at {url}; {args.docs:,} chunks ({'real' if data['real'] else 'near real'}, 384-d)"
          f"; {cpu_line()}")
    print(f"{'compression':<12}{'oversample':>11}{'hot MB / 1M chunks':>19}"
          f"{'vs 1x':>8}{'disk MB':>10}{'recall@10':>11}{'knn p50 ms':>12}"
          f"{'write s':>9}{'merge s':>9}")
    for r in rows:
        ratio = f"{r['hot_mb_per_m'] / anchor['hot_mb_per_m']:.3f}" if anchor else "-"
        print(f"{r['level']:<12}{r['oversample'] or '-':>11}{r['hot_mb_per_m']:>19,.0f}"
              f"{ratio:>8}{r['disk_mb']:>10,.0f}{r['recall']:>11.3f}"
              f"{r['p50_ms']:>12.2f}{r['write_s']:>9.0f}{r['merge_s']:>9.0f}")
    print("hot: the HNSW graph (.vex) and the vectors a search scores (.vec at 1x, .veq otherwise); "
          "recall against exact numpy search over the same vectors")
    for r in rows:
        print(f"recall@10 at {r['level']} (oversample {r['oversample'] or '-'}) >= 0.95: "
              f"{verdict(r['recall'] >= 0.95)}")


if __name__ == "__main__":
    run_main(main)
