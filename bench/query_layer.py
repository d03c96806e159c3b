"""Query-layer benchmarks; prints tables.

    python bench/query_layer.py stages                 # fusion, pruning, dedup, diversity, packing
    python bench/query_layer.py eval DATASET [DATASET ...] [--index-root DIR]

`stages` times the pure stages on 100 candidates per channel from three channels (no engine):
every fuser, then pruning, diversity (work, near-duplicate on 384-d vectors, per page) and an
evidence pack. `eval` runs every profile and every fuser through `hybridsearch eval`'s code path.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import dataset_dir, run_main  # noqa: E402

from hybridsearch.metrics import percentile  # noqa: E402
from hybridsearch.models import DocInfo, Document, RankedList  # noqa: E402
from query_service.diversity import diversify  # noqa: E402
from query_service.evidence import EvidenceConfig, pack  # noqa: E402
from query_service.fusion import AgreementFuser, RrfFuser, WeightedConfig, WeightedFuser  # noqa: E402
from query_service.pruning import prune  # noqa: E402


def bench_stages(reps: int = 300) -> None:
    rng = np.random.default_rng(0)
    pool = [f"d{i}" for i in range(250)]
    docs = {d: Document(id=d, title=f"unit {d}", text="word " * int(rng.integers(40, 120)), kind="theorem",
                        subjects=[f"s{int(rng.integers(5))}"], source=f"f{int(rng.integers(30))}.pdf",
                        page=int(rng.integers(1, 4))) for d in pool}
    info = {d: DocInfo.of(x) for d, x in docs.items()}
    vecs = rng.normal(size=(len(pool), 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    vmap = dict(zip(pool, vecs, strict=True))

    def lists() -> dict[str, RankedList]:
        out = {}
        for ch in ("bm25", "dense", "hdc"):
            ids = list(rng.choice(pool, size=100, replace=False))
            scores = sorted(rng.random(100).tolist(), reverse=True)
            out[ch] = RankedList.of(ch, ids, scores)
        return out

    fusers = {"rrf": RrfFuser(), "weighted minmax/arith": WeightedFuser(),
              "weighted zscore/geo": WeightedFuser(WeightedConfig(norm="zscore", mean="geometric")),
              "agreement": AgreementFuser()}
    print("\n## query-layer stages, 100 candidates per channel, 3 channels (agreement: 2)\n")
    print("| stage | p50 ms | p95 ms |\n|---|---|---|")
    for name, f in fusers.items():
        lat = []
        for _ in range(reps):
            ls = lists()
            if name == "agreement":
                ls = {"bm25": ls["bm25"], "hdc": ls["hdc"]}
            t = time.perf_counter()
            f.fuse(ls, 100)
            lat.append((time.perf_counter() - t) * 1000)
        print(f"| fuse: {name} | {percentile(lat, 50):.3f} | {percentile(lat, 95):.3f} |")
    totals, lp, ld, le = [], [], [], []
    for _ in range(reps):
        ls = lists()
        t0 = time.perf_counter()
        fused = WeightedFuser().fuse(ls, 300)
        t1 = time.perf_counter()
        keep = prune(fused.scores, ceiling=1.0, min_score=0.1, gap=0.2)
        ids = [fused.ids[i] for i in keep]
        scores = [fused.scores[i] for i in keep]
        t2 = time.perf_counter()
        kept, _ = diversify(ids, info, vectors={i: vmap[i] for i in ids}, limit=100)
        ids = [ids[i] for i in kept][:100]
        scores = [scores[i] for i in kept][:100]
        t3 = time.perf_counter()
        pack("unit theorem", ids, scores, docs, EvidenceConfig())
        t4 = time.perf_counter()
        lp.append((t2 - t1) * 1000)
        ld.append((t3 - t2) * 1000)
        le.append((t4 - t3) * 1000)
        totals.append((t4 - t0) * 1000)
    print(f"| prune (min_score + gap) | {percentile(lp, 50):.3f} | {percentile(lp, 95):.3f} |")
    print(f"| diversity (work, near-duplicate, per page) | {percentile(ld, 50):.3f} | {percentile(ld, 95):.3f} |")
    print(f"| evidence pack | {percentile(le, 50):.3f} | {percentile(le, 95):.3f} |")
    print(f"| **all: weighted fusion + prune + diversity + pack** | {percentile(totals, 50):.3f} | "
          f"{percentile(totals, 95):.3f} |")


PROFILES = ("lexical,lexical-best,semantic,hdc,hybrid,kb-fast,kb-balanced,kb-thinkingdb,"
            "voicevault,aico,aico-legacy,khive")


def bench_eval(datasets: list[Path], index_root: Path | None) -> None:
    from query_service.evaluate import format_table, run_eval, run_specs

    for ds in datasets:
        specs = (run_specs("bm25+dense", "rrf", None) + run_specs("bm25+dense", "weighted", None)
                 + run_specs("bm25+hdc", "agreement", PROFILES))
        index_dir = (index_root or Path(".hybridsearch/eval")) / ds.resolve().name
        res = run_eval(ds, specs, target=index_dir, progress=False, log=lambda m: None)
        print(f"\n## {ds.name}: every fuser and profile (depth 100)\n")
        print(format_table(res))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["stages", "eval"])
    ap.add_argument("datasets", type=dataset_dir, nargs="*")
    ap.add_argument("--index-root", type=Path)
    args = ap.parse_args()
    if args.part == "eval" and not args.datasets:
        ap.error("eval needs at least one DATASET")
    if args.part == "stages" and (args.datasets or args.index_root):
        ap.error("stages takes no DATASET or --index-root (it runs without an engine)")
    if args.part == "stages":
        bench_stages()
    else:
        bench_eval(args.datasets, args.index_root)


if __name__ == "__main__":
    run_main(main)
