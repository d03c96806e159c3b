"""The citation graph: neighbour lists and authority, built from every work's `cites` (which holds
the `links.tsv` pairs too, when the BEIR loader read them). The same functions run inline after an
ingest and as the workers' `graph` job.

- Nodes are works. A cited id that names a chunk stands for its work; one that names nothing
  indexed is kept as a missing node (it cites nothing we know, so it is dangling) and counted,
  never dropped. Self-citations are dropped.
- Edges point from citing to cited. A pair citing each other (what an undirected `links.tsv` pair
  becomes) between dated works of different dates keeps only newer -> older; otherwise both stay
  (a date that is a year alone is compared by year: 2001 and 2001-06 are not ordered).
- Co-citation: the works cited together with a work by the same citing work, most such citers
  first, at most `graph_cocited_max` (missing nodes are not listed: they cannot be retrieved).
- PageRank: damping `graph_damping` (0.85), uniform teleport, the rank of dangling nodes spread
  over all nodes, power iteration until the L1 change is below 1e-12; the values sum to 1.
- Authority: ln(N*pr) / ln(N*p99), clipped to [0, 1], where N*pr is a work's rank relative to the
  average node and p99 the 99th percentile of the indexed works' PageRank (their maximum when
  the 99th percentile is not above the average: at most 1 % stand out): 0 at or below the
  average, 1 from the 99th percentile up, so a few much-cited works cannot outweigh the rest
  (the RFC's "cap authority").
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
from scipy import sparse

from hybridsearch.config import get_settings
from hybridsearch.engines import GraphSummary, Neighbors, WorkLinks, named_work

_log = logging.getLogger("hybridsearch.graph")
TOLERANCE = 1e-12
MAX_ROUNDS = 1000
CAP_QUANTILE = 0.99
_COCITATION_BLOCK = 256  # works whose co-citation rows are computed together


class GraphHolder(Protocol):
    """Where a graph is read from and stored: an engine, or an embedded index's store."""

    def citation_links(self) -> list[WorkLinks]: ...
    def set_graph(self, works: Mapping[str, Neighbors], summary: GraphSummary) -> None: ...
    def graph_summary(self) -> GraphSummary | None: ...


def pagerank(n: int, src: np.ndarray, dst: np.ndarray, damping: float = 0.85) -> np.ndarray:
    """PageRank of n nodes over the edges src[i] -> dst[i] (duplicates count once): uniform
    teleport, dangling nodes' rank spread uniformly; sums to 1."""
    if n == 0:
        return np.zeros(0)
    a = sparse.coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    a.data[:] = 1.0  # duplicate edges were summed
    out = np.asarray(a.sum(axis=1)).ravel()
    dangling = out == 0
    transition = sparse.diags(np.divide(1.0, out, out=np.zeros(n), where=~dangling)) @ a
    pr = np.full(n, 1.0 / n)
    for _ in range(MAX_ROUNDS):
        nxt = damping * (transition.T @ pr) + (damping * pr[dangling].sum() + 1.0 - damping) / n
        nxt /= nxt.sum()
        change = np.abs(nxt - pr).sum()
        pr = nxt
        if change < TOLERANCE:
            break
    else:  # damping near 1 converges slowly: say so rather than pass an unfinished rank as final
        _log.warning("PageRank did not converge in %d rounds (damping %s; L1 change %.1e): the ranks are "
                     "approximate; a lower HYBRIDSEARCH_GRAPH_DAMPING converges faster", MAX_ROUNDS, damping, change)
    return pr


def authority(pr: np.ndarray, indexed: np.ndarray) -> np.ndarray:
    """PageRank on a log scale relative to the average node, capped: see the module docstring.
    Held at 32-bit precision, as OpenSearch's `float` field (and its doc values, which the
    reranker reads) holds it, so that every engine serves the same number."""
    n = len(pr)
    if n == 0 or not indexed.any():
        return np.zeros(n)
    cap = np.log(n * np.quantile(pr[indexed], CAP_QUANTILE))
    if cap <= 1e-9:  # at most 1 % stand above the average (a few classics, most works uncited): cap at the top
        cap = np.log(n * pr[indexed].max())
    if cap <= 1e-9:  # no work stands out (no citations, or all alike)
        return np.zeros(n)
    return np.clip(np.log(np.maximum(n * pr, 1e-300)) / cap, 0.0, 1.0).astype(np.float32).astype(np.float64)


def links_hash(links: Sequence[WorkLinks], damping: float, cocited_max: int) -> str:
    """What a build depends on: every work's links and date, and the parameters."""
    h = hashlib.sha256(json.dumps({"damping": damping, "cocited_max": cocited_max, "cap": CAP_QUANTILE,
                                   "authority": "float32", "cap_fallback": "max", "year_alone": True,
                                   "missing_chunk": "work"}).encode())
    for w in links:
        h.update(json.dumps([w.work_id, w.ym, sorted(w.cites)] + ([sorted(w.chunks)] if w.chunks else [])).encode())
    return h.hexdigest()[:32]


def build(links: Sequence[WorkLinks], *, damping: float | None = None, cocited_max: int | None = None
          ) -> tuple[dict[str, Neighbors], GraphSummary]:
    """The graph of `links`: every indexed work's Neighbors, and the summary."""
    start = time.perf_counter()
    s = get_settings()
    damping = s.graph_damping if damping is None else damping
    cocited_max = s.graph_cocited_max if cocited_max is None else cocited_max
    works = sorted({w.work_id for w in links})
    node = {w: i for i, w in enumerate(works)}
    chunk_of = {c: node[w.work_id] for w in links for c in w.chunks}  # chunk ids that do not name their work
    ym = {w.work_id: w.ym for w in links}
    pairs: set[tuple[int, int]] = set()
    names = list(works)
    for w in links:
        a = node[w.work_id]
        for target in w.cites:
            t = _resolve(target, node, chunk_of)
            if t is None:  # a missing work; a missing `work#n` is the missing work `work`, whichever comes first
                target = named_work(target)
                node[target] = t = len(names)
                names.append(target)
            if t != a:
                pairs.add((a, t))
    oriented = 0
    for a, b in list(pairs):
        if a < b and (b, a) in pairs:
            ya, yb = ym.get(names[a]), ym.get(names[b])
            if ya is None or yb is None:
                continue
            if ya % 100 == 0 or yb % 100 == 0:
                ya, yb = ya // 100, yb // 100  # a year alone: the order within that year is unknown
            if ya != yb:
                pairs.discard((a, b) if ya < yb else (b, a))  # the older one cannot cite the newer
                oriented += 1
    n, n_works = len(names), len(works)
    edges = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    src, dst = edges[:, 0], edges[:, 1]
    pr = pagerank(n, src, dst, damping)
    indexed = np.arange(n) < n_works
    auth = authority(pr, indexed)
    cites: list[list[str]] = [[] for _ in range(n)]
    cited_by: list[list[str]] = [[] for _ in range(n)]
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        cites[a].append(names[b])
        cited_by[b].append(names[a])
    cocited = _cocitation(n, src, dst, n_works, cocited_max)
    out = {names[i]: Neighbors(tuple(sorted(cites[i])), tuple(sorted(cited_by[i])),
                               tuple(names[j] for j in cocited.get(i, ())), float(pr[i]), float(auth[i]))
           for i in range(n_works)}
    has_out = np.zeros(n, dtype=bool)
    has_out[src] = True
    summary = GraphSummary(hash=links_hash(links, damping, cocited_max), works=n_works, edges=len(pairs),
                           oriented=oriented, missing=n - n_works, dangling=int((~has_out).sum()),
                           pagerank_sum=float(pr.sum()), seconds=round(time.perf_counter() - start, 3))
    return out, summary


def _resolve(target: str, node: Mapping[str, int], chunk_of: Mapping[str, int]) -> int | None:
    """The node a cited id names: a work, the work of one of its chunks, or that of `work#n`."""
    if target in node:
        return node[target]
    if target in chunk_of:
        return chunk_of[target]
    return node.get(named_work(target))


def _cocitation(n: int, src: np.ndarray, dst: np.ndarray, n_works: int, limit: int) -> dict[int, list[int]]:
    """For each indexed work, the indexed works most often cited together with it (ties by id order)."""
    if limit <= 0 or len(src) == 0:
        return {}
    a = sparse.csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    a = a[:, :n_works].tocsc()
    out: dict[int, list[int]] = {}
    # a block of works at a time: the whole co-citation matrix grows with the square of the longest
    # reference list (a survey citing 6,000 works took 0.9 GB), a block's rows only linearly
    for start in range(0, n_works, _COCITATION_BLOCK):
        stop = min(start + _COCITATION_BLOCK, n_works)
        co = (a[:, start:stop].T @ a).tocsr()
        for i in range(start, stop):
            lo, hi = co.indptr[i - start], co.indptr[i - start + 1]
            cols, counts = co.indices[lo:hi], co.data[lo:hi]
            keep = cols != i
            cols, counts = cols[keep], counts[keep]
            if len(cols):
                out[i] = cols[np.lexsort((cols, -counts))[:limit]].tolist()
    return out


def update_graph(holder: GraphHolder, *, force: bool = False) -> tuple[GraphSummary, bool]:
    """Build and store the graph unless the stored one was built from the same input; returns the
    graph's summary and whether it was built now."""
    s = get_settings()
    links = holder.citation_links()
    old = holder.graph_summary()
    if not force and old is not None and old.hash == links_hash(links, s.graph_damping, s.graph_cocited_max):
        return old, False
    works, summary = build(links)
    holder.set_graph(works, summary)
    return summary, True
