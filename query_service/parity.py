"""Engine parity: the same corpus on two engines, the same queries, and how far their answers agree
(per channel top-10 identity and overlap, nDCG@10, exact HDC scores, a fused profile)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
from tqdm import tqdm

from hybridsearch.embeddings import Encoder
from hybridsearch.engines import BinarySearch, Engine, GraphStore, VectorSearch
from hybridsearch.errors import UnsupportedCapabilityError
from hybridsearch.metrics import evaluate
from hybridsearch.models import Document, Query
from indexer.graph import update_graph
from indexer.loaders import LoadReport, load_qrels, load_queries
from indexer.pipeline import load_documents
from query_service.channels import HdcChannel, QueryContext
from query_service.searcher import Searcher, adhoc_profile, get_profile


def copy_corpus(dataset: Path, source: Engine, dest: Engine, *, batch: int = 500, progress: bool = False,
                log: Callable[[str], None] = print, graph: bool = True) -> float:
    """Write `dataset`'s documents into `dest` with the vectors and passage vectors `source` holds
    for them (no re-embedding) and HDC codes from `dest`'s encoder, then (with `graph`) build
    `dest`'s citation graph; returns the seconds the writes took."""
    if not isinstance(source, VectorSearch) or not isinstance(dest, BinarySearch):
        raise UnsupportedCapabilityError("copying a corpus needs vectors in the source and HDC in the destination")
    docs: Iterable[Document] = load_documents(dataset, "beir", LoadReport())
    enc = dest.hdc_encoder()
    seconds = 0.0
    bar = tqdm(desc="copy", unit="doc", disable=not progress, leave=False)
    it = iter(docs)
    while chunk := list(islice(it, batch)):
        vecs = source.vectors([d.id for d in chunk])
        passages = source.passage_vectors([d.id for d in chunk])
        with_vec = [d for d in chunk if d.id in vecs]
        codes = dict(zip([d.id for d in chunk], enc.encode_documents(chunk), strict=True))
        t = time.perf_counter()
        for part in ([d for d in with_vec if d.id in passages], [d for d in with_vec if d.id not in passages]):
            if part:
                dest.write(part, np.vstack([vecs[d.id] for d in part]), [codes[d.id] for d in part],
                           [passages[d.id] for d in part] if part[0].id in passages else None)
        rest = [d for d in chunk if d.id not in vecs]
        if rest:
            dest.write(rest, None, [codes[d.id] for d in rest])
        seconds += time.perf_counter() - t
        bar.update(len(chunk))
    bar.close()
    if graph and isinstance(dest, GraphStore):
        update_graph(dest, force=True)  # citation expansion and authority read it
    log(f"copied {dest.count()} documents in {seconds:.1f}s of writes")
    return seconds


def overlap(a: list[str], b: list[str]) -> float:
    """|a ∩ b| over the longer list's length, the same whichever engine comes first (1 when both
    are empty: they agree)."""
    longer = max(len(a), len(b))
    return len(set(a) & set(b)) / longer if longer else 1.0


@dataclass
class ChannelParity:
    queries: int = 0
    identical_top10: float = 0.0  # share of queries whose top-10 ids are identical, in order
    overlap_top10: float = 0.0  # mean overlap() of the two top 10s
    ndcg: dict[str, float] = field(default_factory=dict)  # engine -> nDCG@10

    @property
    def ndcg_diff(self) -> float:
        a, b = self.ndcg.values()
        return abs(a - b)


@dataclass
class ParityReport:
    channels: dict[str, ChannelParity] = field(default_factory=dict)
    hdc_max_abs_diff: float = 0.0  # exact HDC channel scores, same candidates on both engines
    hdc_scored: int = 0

    def table(self) -> str:
        names = list(next(iter(self.channels.values())).ndcg)
        lines = [f"{'run':<10} {'top-10 identical':>17} {'top-10 overlap':>15} "
                 + " ".join(f"{'nDCG@10 ' + n:>20}" for n in names) + f" {'|diff|':>8}"]
        for ch, p in self.channels.items():
            lines.append(f"{ch:<10} {p.identical_top10:>16.1%} {p.overlap_top10:>15.3f} "
                         + " ".join(f"{p.ndcg[n]:>20.4f}" for n in names) + f" {p.ndcg_diff:>8.4f}")
        lines.append(f"HDC exact scores: {self.hdc_scored} compared, max |diff| {self.hdc_max_abs_diff:.2e}")
        return "\n".join(lines)


def compare(dataset: Path, engines: dict[str, Engine], *, runs: Sequence[str] = ("bm25", "dense", "hybrid"),
            split: str = "test", encoder: Encoder | None = None, hdc_queries: int = 50) -> ParityReport:
    """Run each of `runs` (a channel alone, or a profile name) on both engines over `dataset`'s
    queries and compare the rankings; compare exact HDC scores on the first `hdc_queries`."""
    if len(engines) != 2:
        raise ValueError("compare takes exactly two engines")
    qrels = load_qrels(dataset, split)
    queries = [q for q in load_queries(dataset) if q.id in qrels]
    searchers = {n: Searcher(e, encoder=encoder) for n, e in engines.items()}
    report = ParityReport()
    try:
        for run in runs:
            profile = adhoc_profile([run], k=100) if run in ("bm25", "dense", "hdc") else get_profile(run)
            rankings: dict[str, dict[str, list[str]]] = {n: {} for n in engines}
            for q in queries:
                for n, s in searchers.items():
                    rankings[n][q.id] = [h.id for h in s.search(q.text, profile, k=100).hits]
            p = ChannelParity(queries=len(queries))
            a, b = rankings.values()
            p.identical_top10 = sum(a[q][:10] == b[q][:10] for q in a) / max(1, len(a))
            p.overlap_top10 = sum(overlap(a[q][:10], b[q][:10]) for q in a) / max(1, len(a))
            p.ndcg = {n: evaluate(r, qrels)["ndcg@10"] for n, r in rankings.items()}
            report.channels[run] = p
        _compare_hdc(report, queries[:hdc_queries], engines)
    finally:
        for s in searchers.values():
            s.close()
    return report


def _compare_hdc(report: ParityReport, queries: Sequence[Query], engines: dict[str, Engine]) -> None:
    """The HDC channel's exact scores for the union of both engines' candidates."""
    left, right = engines.values()
    if not isinstance(left, BinarySearch) or not isinstance(right, BinarySearch):
        return
    a, b = left.hdc_encoder(), right.hdc_encoder()
    if (a.ngrams, a.ties) != (b.ngrams, b.ties):  # the indexes' codes differ by design: nothing to compare
        return
    for q in queries:
        text = q.text
        codes = a.encode_query(text)
        cand = set(HdcChannel().retrieve(QueryContext(text), left, 50).ids)
        cand |= set(HdcChannel().retrieve(QueryContext(text), right, 50).ids)
        scores_a, scores_b = left.hamming_score(codes, sorted(cand)), right.hamming_score(codes, sorted(cand))
        for f in codes:
            sa, sb = scores_a[f], scores_b[f]
            if set(sa) != set(sb):
                report.hdc_max_abs_diff = float("inf")
            for i in sa.keys() & sb.keys():
                report.hdc_max_abs_diff = max(report.hdc_max_abs_diff, abs(sa[i] - sb[i]))
                report.hdc_scored += 1
