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

An index that keeps the last build's state (the embedded engine) is updated from it: the works
whose chunks changed since are read, their links replace theirs, and the lists of the works whose
cites, citers or co-citations that changes are computed again; PageRank runs over every edge
again, starting from the last ranks. It stores what a whole build stores (tests/unit/
test_graph_update.py compares the two): at a million works a 1 % update takes seconds where a
build takes half a minute and reads every work's links.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import orjson
from scipy import sparse

from hybridsearch.config import get_settings
from hybridsearch.engines import (
    GRAPH_ALIASED,
    GRAPH_DATED,
    GRAPH_INDEXED,
    GraphState,
    GraphSummary,
    IncrementalGraphStore,
    Neighbors,
    Progress,
    WorkLinks,
    named_work,
)

_log = logging.getLogger("hybridsearch.graph")
TOLERANCE = 1e-12
MAX_ROUNDS = 1000
CAP_QUANTILE = 0.99
_COCITATION_PRODUCTS = 1 << 20  # co-citation products computed together (a block's memory: about 50 MB)
_SHIFT = 32  # an edge's key: citing << _SHIFT | cited
_LOW = (1 << _SHIFT) - 1
FULL_SHARE = 0.25  # an update changing more works than this share of the nodes builds the whole graph


class GraphHolder(Protocol):
    """Where a graph is read from and stored: an engine, or an embedded index's store."""

    def citation_links(self) -> list[WorkLinks]: ...
    def set_graph(self, works: Mapping[str, Neighbors], summary: GraphSummary) -> None: ...
    def graph_summary(self) -> GraphSummary | None: ...


def pagerank(n: int, src: np.ndarray, dst: np.ndarray, damping: float = 0.85, start: np.ndarray | None = None
             ) -> np.ndarray:
    """PageRank of n nodes over the edges src[i] -> dst[i] (duplicates count once): uniform
    teleport, dangling nodes' rank spread uniformly; sums to 1. `start`: where the iteration
    begins (the last build's ranks make an update converge in fewer rounds), else uniform."""
    if n == 0:
        return np.zeros(0)
    a = sparse.coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    a.data[:] = 1.0  # duplicate edges were summed
    out = np.asarray(a.sum(axis=1)).ravel()
    dangling = out == 0
    # transposed once, to rows of cited nodes (a product with a CSC transpose was slower every round)
    inflow = (sparse.diags(np.divide(1.0, out, out=np.zeros(n), where=~dangling)) @ a).T.tocsr()
    pr = np.full(n, 1.0 / n) if start is None or not start.sum() > 0 else start / start.sum()
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


def work_digest(w: WorkLinks) -> bytes:
    """A work's input to the graph (id, date, cites, chunks not naming it), digested in 16 bytes."""
    record = [w.work_id, w.ym, sorted(w.cites)] + ([sorted(w.chunks)] if w.chunks else [])
    return hashlib.blake2b(orjson.dumps(record), digest_size=16).digest()  # orjson: 4x the json module


def _digests(links: Sequence[WorkLinks]) -> np.ndarray:
    """Each work's work_digest, as a (works, 2) uint64 array."""
    return np.frombuffer(b"".join(map(work_digest, links)), dtype=np.uint64).reshape(-1, 2)


def _input_hash(digests: np.ndarray, damping: float, cocited_max: int) -> str:
    """What a build depends on: the set of the works' digests (their XOR, so that an update can
    take a work's old digest out and put its new one in), and the parameters."""
    h = hashlib.sha256(json.dumps({"damping": damping, "cocited_max": cocited_max, "cap": CAP_QUANTILE,
                                   "authority": "float32", "cap_fallback": "max", "year_alone": True,
                                   "missing_chunk": "work", "digest": "xor"}).encode())
    h.update(np.bitwise_xor.reduce(digests, axis=0).tobytes() if len(digests) else b"")
    return h.hexdigest()[:32]


def links_hash(links: Sequence[WorkLinks], damping: float, cocited_max: int) -> str:
    """What a build depends on: every work's links and date, and the parameters."""
    return _input_hash(_digests(links), damping, cocited_max)


def build(links: Sequence[WorkLinks], *, damping: float | None = None, cocited_max: int | None = None,
          progress: Progress | None = None) -> tuple[dict[str, Neighbors], GraphSummary]:
    """The graph of `links`: every indexed work's Neighbors, and the summary. `progress`, when
    given, is called as progress(phase, done, total) during the long phase: ("citation graph:
    co-citations", works done, works) after each block of works."""
    s = get_settings()
    damping = s.graph_damping if damping is None else damping
    cocited_max = s.graph_cocited_max if cocited_max is None else cocited_max
    works, summary, _ = _build(links, damping, cocited_max, progress)
    return works, summary


def _build(links: Sequence[WorkLinks], damping: float, cocited_max: int, progress: Progress | None,
           digests: np.ndarray | None = None) -> tuple[dict[str, Neighbors], GraphSummary, GraphState]:
    """`build`, and the state an update starts from (its `seq` is the caller's to set);
    `digests`: the links' `_digests`, when the caller has them."""
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
    keys = _distinct(np.array(citing, dtype=np.int64) << _SHIFT | np.array(cited, dtype=np.int64))
    flags = np.zeros(n, dtype=np.uint8)
    flags[:n_works] = GRAPH_INDEXED
    dates = np.zeros(n, dtype=np.int64)
    for i, work in enumerate(works):
        if (date := ym[work]) is not None:
            flags[i] |= GRAPH_DATED
            dates[i] = date
    for w in links:
        if w.chunks:
            flags[node[w.work_id]] |= GRAPH_ALIASED
    keys, away = _orient(keys, dates, flags)
    src, dst = keys >> _SHIFT, keys & _LOW  # the distinct edges, in (citing, cited) order
    indexed = np.arange(n) < n_works
    pr = pagerank(n, src, dst, damping)
    auth = authority(pr, indexed)
    order = sorted(range(n), key=names.__getitem__)
    rank = np.empty(n, dtype=np.int64)  # each node's place in name order
    rank[order] = np.arange(n)
    prs, auths = pr.tolist(), auth.tolist()
    # a block of works at a time: a work's co-citations cost one product per work cited by each
    # of its citers (a survey citing 6,000 works makes each of them cost 6,000); a block holds at
    # most _COCITATION_PRODUCTS of them, or one work whose products alone are more
    cost = np.cumsum(np.bincount(dst, weights=np.bincount(src, minlength=n)[src], minlength=n)[:n_works])
    out: dict[str, Neighbors] = {}
    ptr, named = _starts(keys, n), np.array(names, dtype=object)
    lo = 0
    while lo < n_works:
        hi = int(np.searchsorted(cost, (cost[lo - 1] if lo else 0) + _COCITATION_PRODUCTS, "right"))
        hi = max(lo + 1, hi)
        block = np.arange(lo, hi)
        lists = _lists(keys, ptr, block, indexed, named, rank, cocited_max)
        for i, cites, cited_by, cocited in zip(block.tolist(), *lists, strict=True):
            out[names[i]] = Neighbors(cites, cited_by, cocited, prs[i], auths[i])
        lo = hi
        if progress is not None:
            progress("citation graph: co-citations", hi, n_works)
    by_node = np.zeros((n, 2), dtype=np.uint64)
    by_node[[node[w.work_id] for w in links]] = _digests(links) if digests is None else digests
    state = GraphState(-1, (damping, cocited_max), names, rank, flags, dates, by_node, keys, away, pr, auth)
    return out, _summary(state, np.ones(n, dtype=bool), start), state


def _summary(state: GraphState, live: np.ndarray, start: float) -> GraphSummary:
    """The summary of the graph `state` holds (`live`: its nodes that count), built since `start`."""
    has_out = np.zeros(len(live), dtype=bool)
    has_out[state.edges >> _SHIFT] = True
    indexed = (state.flags & GRAPH_INDEXED).astype(bool)
    works = int(indexed.sum())
    return GraphSummary(hash=_input_hash(state.digests[indexed], *state.params), works=works,
                        edges=len(state.edges), oriented=len(state.away), missing=int(live.sum()) - works,
                        dangling=int((live & ~has_out).sum()), pagerank_sum=float(state.pagerank[live].sum()),
                        seconds=round(time.perf_counter() - start, 3))


def _orient(keys: np.ndarray, ym: np.ndarray, flags: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edges `keys` (citing << _SHIFT | cited, sorted, distinct) less the older -> newer one of
    each pair of dated works citing each other, and the links so dropped (see the module docstring)."""
    a, b = keys >> _SHIFT, keys & _LOW
    dated = (flags & GRAPH_DATED).astype(bool)
    ahead = np.flatnonzero((a < b) & dated[a] & dated[b])  # a -> b, whose b -> a is looked for
    back = b[ahead] << _SHIFT | a[ahead]
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
    return keys[keep], keys[~keep]


def _resolve(target: str, node: Mapping[str, int], chunk_of: Mapping[str, int]) -> int | None:
    """The node a cited id names: a work, the work of one of its chunks, or that of `work#n`."""
    if target in node:
        return node[target]
    if target in chunk_of:
        return chunk_of[target]
    return node.get(named_work(target))


def update_graph(holder: GraphHolder, *, force: bool = False, progress: Progress | None = None
                 ) -> tuple[GraphSummary, bool]:
    """Build and store the graph unless the stored one was built from the same input; returns the
    graph's summary and whether it was built now. `progress` is as `build` calls it. A holder that
    keeps the last build's state (IncrementalGraphStore) is updated from it: only the works
    changed since, and the works whose lists they change, are read and written (PageRank, over
    every edge, is computed again from the last ranks); a change of more than FULL_SHARE of the
    nodes, of the parameters, or of chunks that do not name their work builds the whole graph."""
    s = get_settings()
    old = holder.graph_summary()
    seq, state = -1, None
    if isinstance(holder, IncrementalGraphStore):
        if old is not None and not force:
            state = holder.graph_state()
            if state is not None and state.params == (s.graph_damping, s.graph_cocited_max):
                done = _update(holder, state, old, progress)
                if done is not None:
                    return done
        seq = holder.graph_changes(None)[0]  # read before the links: what is written after is the next update's
    links = holder.citation_links()
    digests = _digests(links)
    digest = _input_hash(digests, s.graph_damping, s.graph_cocited_max)
    if not force and old is not None and old.hash == digest:
        if isinstance(holder, IncrementalGraphStore) and state is not None:  # the changes read are taken
            holder.update_graph_rows({}, [], [], dataclasses.replace(state, seq=seq), old)
        return old, False
    works, summary, state = _build(links, s.graph_damping, s.graph_cocited_max, progress, digests)
    if isinstance(holder, IncrementalGraphStore):
        holder.set_graph(works, summary, dataclasses.replace(state, seq=seq))
    else:
        holder.set_graph(works, summary)
    return summary, True


def _update(holder: IncrementalGraphStore, state: GraphState, old: GraphSummary, progress: Progress | None
            ) -> tuple[GraphSummary, bool] | None:
    """Bring the stored graph up to date from `state` (see update_graph); None where the whole
    graph must be built instead. `progress` is called as ("citation graph: update", step, 3)."""
    start = time.perf_counter()
    step = progress or (lambda what, done, total: None)
    seq, changed = holder.graph_changes(state.seq)
    live = old.works + old.missing
    if len(changed) > FULL_SHARE * len(state.names) or len(state.names) > (1 + FULL_SHARE) * live:
        return None  # a build costs less, or numbers the nodes afresh
    step("citation graph: update", 0, 3)
    done = _changed(state, changed, holder.work_links(changed), holder.chunk_works)
    if done is None:
        return None
    linked, dirty, flipped = done
    if not len(dirty):  # nothing that the graph depends on changed: only the journal moved on
        holder.update_graph_rows({}, [], [], dataclasses.replace(state, seq=seq), old)
        return old, False
    step("citation graph: update", 1, 3)
    works, nodes, gone, state, alive = _relinked(state, linked, dirty, flipped)
    summary = _summary(state, alive, start)
    step("citation graph: update", 2, 3)
    holder.update_graph_rows(works, nodes, gone, dataclasses.replace(state, seq=seq), summary)
    step("citation graph: update", 3, 3)
    return summary, True


def _changed(state: GraphState, changed: Sequence[str], links: Sequence[WorkLinks],
             chunk_works: Callable[[Sequence[str]], dict[str, str]]
             ) -> tuple[GraphState, np.ndarray, np.ndarray] | None:
    """`state` with the works `changed` (their current `links`; the others of them left the index)
    taken in: their nodes, flags, dates, digests and links resolved as _build resolves them,
    the links kept as the edges (not yet oriented); with the nodes whose input did change, and
    those whose indexed flag did. None where a chunk not naming its work comes or goes, or a work
    whose id looks like a chunk's (`work#n`): then a citation elsewhere may name another node,
    and only a full build sees it."""
    names = list(state.names)
    node = {name: i for i, name in enumerate(names)}
    if any(w.chunks for w in links) or any(named_work(w) != w or (i := node.get(w)) is not None
                                           and state.flags[i] & GRAPH_ALIASED for w in changed):
        return None
    for w in links:  # a new work takes a node (a missing target's of its name, if there is one)
        if w.work_id not in node:
            node[w.work_id] = len(names)
            names.append(w.work_id)
    unknown = [t for w in links for t in w.cites if t not in node]
    via_chunk = chunk_works(unknown) if unknown else {}
    citing: list[int] = []
    cited: list[int] = []
    for w in links:
        a = node[w.work_id]
        for target in w.cites:
            t = node.get(target)
            if t is None:
                t = node.get(via_chunk.get(target, ""))
            if t is None:
                missing = named_work(target)
                t = node.get(missing)
                if t is None:
                    node[missing] = t = len(names)
                    names.append(missing)
            if t != a:
                citing.append(a)
                cited.append(t)
    n = len(names)
    grow = n - len(state.names)
    rank = state.rank
    if grow:  # the new names take their places in name order
        order = np.argsort(state.rank)
        ordered = [names[i] for i in order.tolist()]
        new = sorted(range(len(state.names), n), key=names.__getitem__)
        order = np.insert(order, [bisect.bisect_left(ordered, names[i]) for i in new], new)
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
    flags = np.concatenate([state.flags, np.zeros(grow, dtype=np.uint8)])
    dates = np.concatenate([state.ym, np.zeros(grow, dtype=np.int64)])
    digests = np.concatenate([state.digests, np.zeros((grow, 2), dtype=np.uint64)])
    was, old_digests = flags.copy(), digests.copy()
    at = np.array([node[w] for w in changed if w in node], dtype=np.int64)
    flags[at], dates[at], digests[at] = 0, 0, 0  # left the index, unless its links say otherwise
    for w in links:
        i = node[w.work_id]
        flags[i] = GRAPH_INDEXED | (GRAPH_DATED if w.ym is not None else 0)
        dates[i] = w.ym or 0
    if links:
        digests[[node[w.work_id] for w in links]] = _digests(links)
    # the digest covers a work's date and cites: equal digests and flags, equal edges
    dirty = at[(flags[at] != was[at]) | (digests[at] != old_digests[at]).any(axis=1)]
    flipped = at[(flags[at] & GRAPH_INDEXED) != (was[at] & GRAPH_INDEXED)]
    if not len(dirty):
        return state, dirty, flipped
    raw = np.sort(np.concatenate([state.edges, state.away]))
    mask = _mask(n, dirty)
    raw = raw[~mask[raw >> _SHIFT]]
    links_now = _distinct(np.array(citing, dtype=np.int64) << _SHIFT | np.array(cited, dtype=np.int64))
    links_now = links_now[mask[links_now >> _SHIFT]]
    raw = np.insert(raw, np.searchsorted(raw, links_now), links_now)
    return (GraphState(state.seq, state.params, names, rank, flags, dates, digests, raw, state.away[:0],
                       np.concatenate([state.pagerank, np.zeros(grow)]), np.concatenate([state.authority,
                                                                                         np.zeros(grow)])),
            dirty, flipped)


def _relinked(old: GraphState, linked: GraphState, dirty: np.ndarray, flipped: np.ndarray
              ) -> tuple[dict[str, Neighbors], list[int], list[str], GraphState, np.ndarray]:
    """From `linked` (what _changed made of `old`: its `edges` the links, not yet oriented) and
    its nodes `dirty` and `flipped`: the new lists of every work whose lists they change and
    their node numbers, the works no longer indexed, the oriented state with its ranks, and its
    live nodes (indexed or cited)."""
    n = len(linked.names)
    edges, away = _orient(linked.edges, linked.ym, linked.flags)
    indexed = (linked.flags & GRAPH_INDEXED).astype(bool)
    live = indexed.copy()
    live[edges & _LOW] = True
    # an edge can only change where it touches a changed node: its links, date or being indexed
    touch = _mask(n, dirty)
    near_old = old.edges[touch[old.edges >> _SHIFT] | touch[old.edges & _LOW]]
    both, count = np.unique(np.concatenate([near_old, edges[touch[edges >> _SHIFT] | touch[edges & _LOW]]]),
                            return_counts=True)
    changed = both[count == 1]  # in one of the two: each holds an edge once
    citers = _distinct(changed >> _SHIFT)
    # a work's co-cited list changes where one of its citers cites otherwise, or where a work
    # cited with it comes into the index or leaves it
    into_flipped = _mask(n, flipped)
    citing = [_mask(n, citers),
              _mask(n, np.concatenate([keys[into_flipped[keys & _LOW]] >> _SHIFT for keys in (old.edges, edges)]))]
    redo = np.concatenate([dirty, citers, *(_targets(keys, mask) for keys in (old.edges, edges) for mask in citing)])
    rows = _distinct(redo)
    rows = rows[indexed[rows]]
    names = linked.names
    cites, cited_by, cocited = _lists(edges, _starts(edges, n), rows, indexed, np.array(names, dtype=object),
                                      linked.rank, linked.params[1])
    pr, auth = np.zeros(n), np.zeros(n)
    at = np.flatnonzero(live)
    number = np.full(n, -1, dtype=np.int64)
    number[at] = np.arange(len(at))
    pr[at] = pagerank(len(at), number[edges >> _SHIFT], number[edges & _LOW], linked.params[0], linked.pagerank[at])
    auth[at] = authority(pr[at], indexed[at])
    works = {names[i]: Neighbors(cites[k], cited_by[k], cocited[k], float(pr[i]), float(auth[i]))
             for k, i in enumerate(rows.tolist())}
    gone = [names[i] for i in flipped.tolist() if not indexed[i]]
    state = dataclasses.replace(linked, edges=edges, away=away, pagerank=pr, authority=auth)
    return works, rows.tolist(), gone, state, live


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (np.unique without counts hashes: 15 to 60 times slower at a
    million values on numpy 2.4)."""
    out = np.sort(values)
    return out[np.diff(out, prepend=out[:1] - 1) != 0] if len(out) else out


def _mask(n: int, nodes: np.ndarray) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[nodes] = True
    return out


def _targets(keys: np.ndarray, citing: np.ndarray) -> np.ndarray:
    """The cited nodes of the edges `keys` whose citing node is in the mask `citing`."""
    return keys[citing[keys >> _SHIFT]] & _LOW


def _starts(edges: np.ndarray, n: int) -> np.ndarray:
    """Where each of n nodes' edges start in `edges` (sorted keys): node i's are ptr[i]:ptr[i + 1]."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(edges >> _SHIFT, minlength=n), out=ptr[1:])
    return ptr


def _lists(edges: np.ndarray, ptr: np.ndarray, rows: np.ndarray, indexed: np.ndarray, names: np.ndarray,
           rank: np.ndarray, limit: int) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]], list[tuple[str, ...]]]:
    """The cites, cited-by and co-cited lists of the nodes `rows` (sorted) over the oriented
    `edges` (`ptr`: their _starts; `names`: an object array), as _build makes them: names sorted;
    co-cited indexed works, most shared citers first, ties in name order (`rank`: each node's
    place in it), at most `limit`."""
    n = len(indexed)
    targets = edges & _LOW
    out = targets[_ranges(ptr[rows], ptr[rows + 1])]
    out_row = np.repeat(np.arange(len(rows)), ptr[rows + 1] - ptr[rows])
    out = out[_ordered(out_row, rank[out])]
    inbound = edges[_mask(n, rows)[targets]]  # citer -> a row
    inbound = inbound[_ordered(inbound & _LOW, rank[inbound >> _SHIFT])]
    row_of, citer = inbound & _LOW, inbound >> _SHIFT
    # co-citations: each (row, citer) pair spread over the citer's own targets, counted per pair
    spans = ptr[citer + 1] - ptr[citer]
    row, other = np.repeat(row_of, spans), targets[_ranges(ptr[citer], ptr[citer + 1])]
    keep = (other != row) & indexed[other]
    pair, count = np.unique(row[keep] << _SHIFT | other[keep], return_counts=True)
    row, other = pair >> _SHIFT, pair & _LOW
    order = _ordered(row, (int(count.max(initial=0)) - count) << int(rank.max(initial=0)).bit_length() | rank[other])
    row, other = row[order], other[order]
    lo, hi = np.searchsorted(row, rows), np.searchsorted(row, rows, side="right")
    hi = np.minimum(hi, lo + max(limit, 0))
    return (_named(out, ptr[rows + 1] - ptr[rows], names),
            _named(citer, np.searchsorted(row_of, rows, side="right") - np.searchsorted(row_of, rows), names),
            _named(other[_ranges(lo, hi)], hi - lo, names))


def _ordered(major: np.ndarray, minor: np.ndarray) -> np.ndarray:
    """The order of pairs (major, minor) of distinct non-negative integers: one sort of one key
    where both fit in 63 bits (a third of the time of lexsort's two)."""
    bits = int(minor.max(initial=0)).bit_length()
    if int(major.max(initial=0)).bit_length() + bits > 63:
        return np.lexsort((minor, major))
    return np.argsort(major << bits | minor)


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The indices lo[0]:hi[0], then lo[1]:hi[1], and so on, in one array."""
    spans = hi - lo
    return np.repeat(lo - np.cumsum(spans) + spans, spans) + np.arange(int(spans.sum()))


def _named(nodes: np.ndarray, sizes: np.ndarray, names: np.ndarray) -> list[tuple[str, ...]]:
    """`nodes` cut into consecutive groups of `sizes`, as tuples of names (an object array)."""
    named = names[nodes].tolist()
    ends = np.cumsum(sizes).tolist()
    return [tuple(named[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
