"""`hybridsearch eval`: build or reuse an index for a BEIR dataset, run each run's queries, score."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from hybridsearch.embeddings import Encoder, default_encoder
from hybridsearch.engines import Engine, open_engine
from hybridsearch.errors import QueryError, ValidationError
from hybridsearch.metrics import evaluate, percentile
from indexer.loaders import load_qrels, load_queries
from indexer.pipeline import IngestSummary, embed_missing, encode_hdc_missing, ingest
from query_service.profiles import Profile
from query_service.searcher import Searcher, adhoc_profile, get_profile

DEPTH = 100


@dataclass
class RunSpec:
    name: str
    profile: Profile


def run_specs(channels: str | None, fuser: str, profiles: str | None) -> list[RunSpec]:
    """`a,b` = separate runs; `a+b` = one fused run named `a+b:fuser`; profiles by name."""
    specs: list[RunSpec] = []
    for item in (channels or "").split(","):
        item = item.strip()
        if item:
            names = [c.strip() for c in item.split("+") if c.strip()]
            if not names:
                raise QueryError(f"--channels: {item!r} names no channel")
            prof = adhoc_profile(names, fuser, DEPTH)
            specs.append(RunSpec(prof.name, prof))
    for name in (profiles or "").split(","):
        name = name.strip()
        if name:
            base = get_profile(name)
            update: dict[str, object] = {"max_results": DEPTH}
            if base.escalation is not None and base.escalation.min_acceptable is None:
                # evaluating to depth 100 must not change when the profile escalates
                update["escalation"] = base.escalation.model_copy(update={"min_acceptable": base.max_results})
            specs.append(RunSpec(name, base.model_copy(update=update)))
    if not specs:
        raise QueryError(f"--channels {channels!r} and --profiles {profiles!r} name no run; e.g. --channels "
                         "bm25,dense,bm25+dense or --profiles hybrid")
    return specs


def ablation_specs() -> list[RunSpec]:
    """RFC-0003 §8.3's five runs: lexical only; vector only; hybrid without citation (fused, no
    reranker); hybrid with citation (expansion, reranked on lexical, semantic and citation
    alone); hybrid with citation and the whole reranker (the `hybrid` profile)."""
    from query_service.rerank import COMPONENTS, MathConfig, Weights

    hybrid = get_profile("hybrid").model_copy(update={"max_results": DEPTH})
    kept = ("lexical", "semantic", "citation")
    weights = {}
    for intent, w in MathConfig().weights.items():
        part = {c: (getattr(w, c) if c in kept else 0.0) for c in COMPONENTS}
        total = sum(part.values())
        weights[intent] = Weights(**{c: v / total for c, v in part.items()})
    citation_only = hybrid.model_copy(update={"reranker_config": {"weights": weights}})
    no_citation = hybrid.model_copy(update={"citation": None, "reranker": None})
    return [RunSpec("lexical", get_profile("lexical").model_copy(update={"max_results": DEPTH})),
            RunSpec("vector", get_profile("semantic").model_copy(update={"max_results": DEPTH})),
            RunSpec("hybrid-no-citation", no_citation), RunSpec("hybrid+citation", citation_only),
            RunSpec("hybrid+citation+reranker", hybrid)]


def corpus_fingerprint(dataset: Path) -> str:
    """The corpus's identity: a digest of `corpus.jsonl`'s bytes, so a copy of the dataset (another
    path, another mtime) is the same corpus and an edited one is another."""
    with (dataset / "corpus.jsonl").open("rb") as f:
        return "c:" + hashlib.file_digest(f, "blake2b").hexdigest()[:16]


def _path_fingerprint(dataset: Path) -> str:
    """What indices built before content digests hold: path, size and mtime."""
    corpus = dataset / "corpus.jsonl"
    st = corpus.stat()
    return hashlib.sha256(f"{corpus.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def eval_index_name(dataset: Path) -> str:
    """The OpenSearch logical index `eval` uses for a dataset: one per dataset, like directories."""
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in dataset.resolve().name.lower())
    return f"eval-{name.strip('-_') or 'dataset'}"


def prepare_index(dataset: Path, target: str | Path, *, need_vectors: bool, encoder: Encoder | None,
                  need_codes: bool = False, progress: bool = True, log: Callable[[str], None] = print,
                  engine_options: Mapping[str, str] | None = None) -> Engine:
    """Open the index for `dataset` (a directory, or a URL with engine options such as `index`),
    building it on first use and embedding what is missing."""
    if not (dataset / "corpus.jsonl").exists():
        raise ValidationError("not a BEIR dataset (no corpus.jsonl)", source=str(dataset))
    engine = open_engine(str(target), **(engine_options or {}))
    try:
        fp, old = corpus_fingerprint(dataset), _path_fingerprint(dataset)
        held = {key: engine.get_meta(key) for key in ("corpus", "corpus_building")}
        for key, value in held.items():
            if value == old:  # written before content digests, of this very file
                engine.set_meta(key, fp)
                held[key] = fp
        if held["corpus"] != fp:
            # an interrupted build of this corpus (marked before it began) is resumed: ingest is
            # idempotent; anything else in the index is another corpus
            if engine.count() and held["corpus_building"] != fp:
                raise ValidationError(
                    "the index holds another corpus; choose another index" if held["corpus"] or
                    held["corpus_building"] else "eval did not build this index (it cannot tell which corpus "
                    "`ingest` put there); give an index of its own, one that does not exist yet", source=str(target))
            engine.set_meta("corpus_building", fp)
            summary: IngestSummary = ingest(engine, dataset, loader="beir", progress=progress)
            engine.set_meta("corpus", fp)
            log(f"indexed {dataset}: " + summary.lines()[0])
        stats = engine.stats()
        if need_codes and stats.codes < stats.documents:
            t = time.perf_counter()
            n = encode_hdc_missing(engine, progress=progress)
            log(f"HDC-encoded {n} documents in {time.perf_counter() - t:.1f}s")
        if need_vectors and stats.vectors < stats.documents:
            t = time.perf_counter()
            n = embed_missing(engine, encoder or default_encoder(), progress=progress)
            log(f"embedded {n} documents in {time.perf_counter() - t:.1f}s")
    except BaseException:
        engine.close()
        raise
    return engine


def run_eval(dataset: Path, specs: Sequence[RunSpec], *, target: str | Path, split: str = "test",
             encoder: Encoder | None = None, progress: bool = True, log: Callable[[str], None] = print,
             engine_options: Mapping[str, str] | None = None) -> dict[str, dict[str, float]]:
    """Evaluate each run on `dataset`'s `split`; the index is the directory or URL `target`.
    Where queries carry `metadata.intent`, each run also gets one row per intent, `<run>@<intent>`
    (the searches themselves classify intent as they would for anyone)."""
    qrels = load_qrels(dataset, split)
    queries = [q for q in load_queries(dataset) if q.id in qrels]
    if not queries:
        raise ValidationError(f"no queries of split {split!r} found", source=str(dataset))
    unknown = sorted(set(qrels) - {q.id for q in queries})
    if unknown:  # judged but never searched: scoring them 0 would lower every run alike, silently
        log(f"warning: {len(unknown)} judged queries of split {split!r} are not in queries.jsonl "
            f"(first: {unknown[0]!r}); they are left out of the scores")
        qrels = {q.id: qrels[q.id] for q in queries}
    if not any(g > 0 for rels in qrels.values() for g in rels.values()):
        raise ValidationError(f"no query of split {split!r} has a relevant document (a grade above 0)",
                              source=str(dataset))
    need_vectors = any(s.profile.embeds_query() for s in specs)
    need_codes = any(s.profile.uses_channel("hdc") for s in specs)
    engine = prepare_index(dataset, target, need_vectors=need_vectors, encoder=encoder,
                           need_codes=need_codes, progress=progress, log=log, engine_options=engine_options)
    enc = encoder or (default_encoder() if need_vectors else None)
    searcher = Searcher(engine, encoder=enc)
    results: dict[str, dict[str, float]] = {}
    try:
        if need_vectors and queries:
            searcher.search(queries[0].text, adhoc_profile(["dense"], k=1))  # load the model first
        for spec in specs:
            run: dict[str, list[str]] = {}
            latencies: list[float] = []
            for q in tqdm(queries, desc=spec.name, unit="q", disable=not progress, leave=False):
                t = time.perf_counter()
                res = searcher.search(q.text, spec.profile, k=DEPTH)
                latencies.append((time.perf_counter() - t) * 1000)
                run[q.id] = [h.id for h in res.hits]
            metrics = evaluate(run, qrels)
            metrics["p50_ms"] = percentile(latencies, 50)
            metrics["p95_ms"] = percentile(latencies, 95)
            results[spec.name] = metrics
            by_intent: dict[str, list[int]] = {}
            for n, q in enumerate(queries):
                if q.intent:
                    by_intent.setdefault(q.intent, []).append(n)
            for intent, members in sorted(by_intent.items()):
                part = evaluate({queries[n].id: run[queries[n].id] for n in members},
                                {queries[n].id: qrels[queries[n].id] for n in members})
                part["p50_ms"] = percentile([latencies[n] for n in members], 50)
                part["p95_ms"] = percentile([latencies[n] for n in members], 95)
                results[f"{spec.name}@{intent}"] = part
    finally:
        searcher.close()
        engine.close()
    return results


def plot(results: Mapping[str, Mapping[str, float]], out: Path, title: str = "") -> None:
    """nDCG@10 as grouped bars: one group for all queries and one per intent, one bar per run;
    written as PNG to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results if "@" not in r]
    groups = ["all"] + sorted({r.partition("@")[2] for r in results if "@" in r})
    width = 0.8 / max(1, len(runs))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 + 0.3 * len(groups) * max(1, len(runs))), 4.5))
    for n, run in enumerate(runs):
        keys = [run if g == "all" else f"{run}@{g}" for g in groups]
        values = [results[k]["ndcg@10"] if k in results else 0.0 for k in keys]
        bars = ax.bar([g + n * width for g in range(len(groups))], values, width, label=run)
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
    ax.set_xticks([g + width * (len(runs) - 1) / 2 for g in range(len(groups))], groups)
    ax.set_ylabel("nDCG@10")
    ax.set_ylim(0, 1.05)
    ax.set_title(title or "nDCG@10 per run and intent")
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    try:
        fig.savefig(out, format="png", dpi=120)
    except OSError as e:
        raise ValidationError(f"cannot write the plot: {e.strerror or e}", source=str(out)) from None
    finally:
        plt.close(fig)


def format_table(results: dict[str, dict[str, float]]) -> str:
    cols = ["ndcg@10", "recall@20", "recall@100", "mrr@10", "p50_ms", "p95_ms"]
    width = max([len("run")] + [len(n) for n in results])
    lines = [f"{'run':<{width}}  " + "  ".join(f"{c:>10}" for c in cols)]
    for name, m in results.items():
        lines.append(f"{name:<{width}}  " + "  ".join(
            f"{m[c]:>10.2f}" if c.endswith("_ms") else f"{m[c]:>10.4f}" for c in cols))
    return "\n".join(lines)
