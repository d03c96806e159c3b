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
import orjson
from scipy import sparse

from hybridsearch.config import get_settings
from hybridsearch.engines import GraphSummary, Neighbors, Progress, WorkLinks, named_work

_log = logging.getLogger("hybridsearch.graph")
TOLERANCE = 1e-12
MAX_ROUNDS = 1000
CAP_QUANTILE = 0.99
_COCITATION_PRODUCTS = 1 << 20  # co-citation products computed together (a block's memory: about 50 MB)


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
    # transposed once, to rows of cited nodes (a product with a CSC transpose was slower every round)
    inflow = (sparse.diags(np.divide(1.0, out, out=np.zeros(n), where=~dangling)) @ a).T.tocsr()
    pr = np.full(n, 1.0 / n)
    for _ in range(MAX_ROUNDS):
        nxt = damping * (inflow @ pr) + (damping * pr[dangling].sum() + 1.0 - damping) / n
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
    dumps = orjson.dumps  # a million works: 1 s, against 4 with the json module
    for w in links:
        h.update(dumps([w.work_id, w.ym, sorted(w.cites)] + ([sorted(w.chunks)] if w.chunks else [])))
    return h.hexdigest()[:32]


def build(links: Sequence[WorkLinks], *, damping: float | None = None, cocited_max: int | None = None,
          progress: Progress | None = None) -> tuple[dict[str, Neighbors], GraphSummary]:
    """The graph of `links`: every indexed work's Neighbors, and the summary. `progress`, when
    given, is called as progress(phase, done, total) during the long phase: ("citation graph:
    co-citations", works done, works) after each block of works."""
    s = get_settings()
    damping = s.graph_damping if damping is None else damping
    cocited_max = s.graph_cocited_max if cocited_max is None else cocited_max
    return _build(links, damping, cocited_max, links_hash(links, damping, cocited_max), progress)


def _build(links: Sequence[WorkLinks], damping: float, cocited_max: int, digest: str, progress: Progress | None
           ) -> tuple[dict[str, Neighbors], GraphSummary]:
    """`build`, given the hash of its input (`links_hash`)."""
    start = time.perf_counter()
    works = sorted({w.work_id for w in links})
    node = {w: i for i, w in enumerate(works)}
    chunk_of = {c: node[w.work_id] for w in links for c in w.chunks}  # chunk ids that do not name their work
    ym = {w.work_id: w.ym for w in links}
    names = list(works)
    citing: list[int] = []
    cited: list[int] = []
    for w in links:
        a = node[w.work_id]
        for target in w.cites:
            t = _resolve(target, node, chunk_of)
            if t is None:  # a missing work; a missing `work#n` is the missing work `work`, whichever comes first
                target = named_work(target)
                node[target] = t = len(names)
                names.append(target)
            if t != a:
                citing.append(a)
                cited.append(t)
    n, n_works = len(names), len(works)
    keys = np.sort(np.array(citing, dtype=np.int64) * n + np.array(cited, dtype=np.int64))  # edge: citing * n + cited
    keys = keys[np.diff(keys, prepend=-1) != 0]
    dates = [ym[w] for w in works]
    keys, oriented = _orient(keys, n, np.array([d or 0 for d in dates] + [0] * (n - n_works), dtype=np.int64),
                             np.array([d is not None for d in dates] + [False] * (n - n_works), dtype=bool))
    src, dst = keys // n, keys % n  # the distinct edges, in (citing, cited) order
    pr = pagerank(n, src, dst, damping)
    auth = authority(pr, np.arange(n) < n_works)
    order = sorted(range(n), key=names.__getitem__)
    rank = np.empty(n, dtype=np.int64)  # each node's place in name order
    rank[order] = np.arange(n)
    named = np.array(names, dtype=object)
    cites = _by_name(src, dst, n_works, named[order], rank)
    cited_by = _by_name(dst, src, n_works, named[order], rank)
    cocited = _grouped(*_cocitation(n, src, dst, n_works, cocited_max, progress), named)
    prs, auths = pr.tolist(), auth.tolist()
    out = {names[i]: Neighbors(cites[i], cited_by[i], cocited[i], prs[i], auths[i]) for i in range(n_works)}
    has_out = np.zeros(n, dtype=bool)
    has_out[src] = True
    summary = GraphSummary(hash=digest, works=n_works, edges=len(keys), oriented=oriented, missing=n - n_works,
                           dangling=int((~has_out).sum()), pagerank_sum=float(pr.sum()),
                           seconds=round(time.perf_counter() - start, 3))
    return out, summary


def _orient(keys: np.ndarray, n: int, ym: np.ndarray, dated: np.ndarray) -> tuple[np.ndarray, int]:
    """The edges `keys` (citing * n + cited, sorted, distinct) less the older -> newer one of each
    pair of dated works citing each other, and how many pairs lost one (see the module docstring)."""
    a, b = keys // n, keys % n
    ahead = np.flatnonzero((a < b) & dated[a] & dated[b])  # a -> b, whose b -> a is looked for
    back = b[ahead] * n + a[ahead]
    order = np.argsort(back)  # looked up in order: much faster than at random
    at = np.empty(len(back), dtype=np.int64)
    at[order] = np.searchsorted(keys, back[order])
    found = at < len(keys)
    found[found] = keys[at[found]] == back[found]
    ahead, at = ahead[found], at[found]
    ya, yb = ym[a[ahead]], ym[b[ahead]]
    alone = (ya % 100 == 0) | (yb % 100 == 0)  # a year alone: the order within that year is unknown
    ya, yb = np.where(alone, ya // 100, ya), np.where(alone, yb // 100, yb)
    older_cites_newer = np.where(ya < yb, ahead, at)[ya != yb]
    keep = np.ones(len(keys), dtype=bool)
    keep[older_cites_newer] = False
    return keys[keep], len(older_cites_newer)


def _grouped(ptr: np.ndarray, cols: np.ndarray, names: np.ndarray) -> list[tuple[str, ...]]:
    """Row i of a compressed sparse layout, cols[ptr[i]:ptr[i + 1]], as a tuple of node names
    (`names`: an object array)."""
    named = names[cols].tolist()
    bounds = ptr.tolist()
    return [tuple(named[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def _by_name(row: np.ndarray, col: np.ndarray, rows: int, by_name: np.ndarray, rank: np.ndarray
             ) -> list[tuple[str, ...]]:
    """For each node below `rows`, the names of the `col`s of the edges whose `row` it is, sorted
    by name (`by_name`: the names in order, an object array; `rank`: each node's place there)."""
    n = len(rank)
    key = np.sort(row * n + rank[col])  # one number per edge, sorted by row, then by name
    return _grouped(np.searchsorted(key // n, np.arange(rows + 1)), key % n, by_name)


def _resolve(target: str, node: Mapping[str, int], chunk_of: Mapping[str, int]) -> int | None:
    """The node a cited id names: a work, the work of one of its chunks, or that of `work#n`."""
    if target in node:
        return node[target]
    if target in chunk_of:
        return chunk_of[target]
    return node.get(named_work(target))


def _cocitation(n: int, src: np.ndarray, dst: np.ndarray, n_works: int, limit: int,
                progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each indexed work, the indexed works most often cited together with it (ties by id
    order), at most `limit`: work i's are cols[ptr[i]:ptr[i + 1]] of the returned (ptr, cols)."""
    ptr = np.zeros(n_works + 1, dtype=np.int64)
    if limit <= 0 or len(src) == 0:
        return ptr, np.zeros(0, dtype=np.int64)
    keep = dst < n_works
    a = sparse.csr_matrix((np.ones(int(keep.sum()), dtype=np.int32), (src[keep], dst[keep])), shape=(n, n_works))
    at = a.T.tocsr()  # converted once (a block's columns of a CSC matrix were converted at every block)
    # a block of works at a time: the whole co-citation matrix grows with the square of the longest
    # reference list (a survey citing 6,000 works took 0.9 GB), a block's rows only linearly. A
    # work's row costs one product per work cited by each of its citers; a block holds at most
    # _COCITATION_PRODUCTS of them (or one work, if its row alone costs more), and few enough works
    # that a pair's sort key below fits in 64 bits
    cost = np.cumsum(at @ np.diff(a.indptr).astype(np.int64))
    top = int(np.diff(at.indptr).max())  # the most works can share: the most citers of one work
    span = (top + 1) * n_works
    max_rows = (2**63 - 1) // span
    taken = np.zeros(n_works, dtype=np.int64)
    parts: list[np.ndarray] = []
    lo = 0
    while lo < n_works:
        hi = int(np.searchsorted(cost, (cost[lo - 1] if lo else 0) + _COCITATION_PRODUCTS, "right"))
        hi = min(max(lo + 1, hi), lo + max_rows)
        co = at[lo:hi] @ a
        row = np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(co.indptr))
        cols = co.indices.astype(np.int64)
        off = cols != row + lo  # a work is not co-cited with itself
        # one number per pair, sorted: by work, most shared citers first, ties by id order
        key = np.sort(row[off] * span + (top - co.data[off].astype(np.int64)) * n_works + cols[off])
        row = key // span
        per_row = np.bincount(row, minlength=hi - lo)
        first = np.arange(len(row)) - np.repeat(np.cumsum(per_row) - per_row, per_row) < limit
        parts.append(key[first] % n_works)
        taken[lo:hi] = np.minimum(per_row, limit)
        lo = hi
        if progress is not None:
            progress("citation graph: co-citations", hi, n_works)
    np.cumsum(taken, out=ptr[1:])
    return ptr, np.concatenate(parts)


def update_graph(holder: GraphHolder, *, force: bool = False, progress: Progress | None = None
                 ) -> tuple[GraphSummary, bool]:
    """Build and store the graph unless the stored one was built from the same input; returns the
    graph's summary and whether it was built now. `progress` is as `build` calls it."""
    s = get_settings()
    links = holder.citation_links()
    old = holder.graph_summary()
    digest = links_hash(links, s.graph_damping, s.graph_cocited_max)
    if not force and old is not None and old.hash == digest:
        return old, False
    works, summary = _build(links, s.graph_damping, s.graph_cocited_max, digest, progress)
    holder.set_graph(works, summary)
    return summary, True
