"""Citation one-hop expansion (RFC-0003 §5.2.3): from the strongest fused candidates (the seeds),
follow the citation graph one hop and score every work reached by the seeds that reach it.

A seed's strength is its fused score over the top score. A work w reached from seeds S_w scores
citation(w) = sum(strength(s) for s in S_w) / sum(strength(s) for every seed): 1 when every
seed points to it, more for more and stronger seeds. Which links count follows the intent:
prereq follows what the seeds cite; related follows co-citation and what cites the seeds;
survey both directions of citation; lookup and compare every link. Chunks of reached works that
are not yet candidates join (at most `max_new`), if they pass the query's filters, licence
included: a document the caller may not see is never reached. Nor does it link what the caller
sees, or count it: with a licence filter, only works the caller may see are followed (cited,
citing or co-cited), and co-citation counts only through citing works it may see (the stored
lists are built from every work's citations)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field

from hybridsearch.engines import Neighborhood, Neighbors
from hybridsearch.models import Filters
from query_service.candidates import Candidate, Candidates, SeedConfig, past_budget

DIRECTIONS: dict[str, tuple[str, ...]] = {
    "prereq": ("cites",),
    "related": ("cocited", "cited_by"),
    "survey": ("cites", "cited_by"),
    "lookup": ("cites", "cited_by", "cocited"),
    "compare": ("cites", "cited_by", "cocited"),
}


class CitationConfig(SeedConfig):
    fan_out: int = Field(default=20, ge=1, le=1000, description="links followed per seed and direction")
    max_new: int = Field(default=50, ge=0, le=10_000, description="chunks expansion may add")
    budget_ms: float = Field(default=100.0, gt=0, allow_inf_nan=False,
                             description="past it the unexpanded candidates go on, flagged degraded")


def expand(cands: Candidates, intent: str, engine: Any, filters: Filters | None, config: CitationConfig
           ) -> tuple[Candidates, dict[str, Any]]:
    """The candidates with citation scores (and the chunks reached, appended with score 0), and
    what happened, for diagnostics."""
    directions = DIRECTIONS.get(intent, DIRECTIONS["lookup"])
    diag: dict[str, Any] = {"directions": list(directions), "cited": 0}  # cited: candidates given a citation score
    has_graph = isinstance(engine, Neighborhood)
    if not has_graph or not cands.items:
        diag["skipped"] = "the engine has no citation graph" if cands.items else "no candidates"
        return cands, diag
    # the candidates' DocInfo serves the reranker and diversity as well: a cost of the search, not
    # of this stage's budget (on OpenSearch it is most of the stage's time)
    infos = cands.doc_info(engine)
    t0 = time.perf_counter()
    strength = cands.strongest(config.seeds, config.seed_ratio)
    neighbors = engine.neighbors(list(strength))
    if filters is not None and filters.license:
        neighbors = _as_seen(engine, neighbors, Filters(license=filters.license), directions)
    reached: dict[str, float] = {}  # work id -> summed seed strength
    for seed, nb in neighbors.items():
        works = {w for d in directions for w in getattr(nb, d)[:config.fan_out]}
        works.discard(infos[seed].work_id if seed in infos else seed)
        for w in works:
            reached[w] = reached.get(w, 0.0) + strength[seed]
    diag.update(seeds=list(strength), works=len(reached))
    if not reached:
        return cands.replace(cands.items, citation={}, seeds=list(strength)), diag
    total = sum(strength.values())
    by_work = {w: s / total for w, s in reached.items()}
    if _over(t0, config, diag):
        return cands, diag
    citation = {c.id: by_work[infos[c.id].work_id] for c in cands.items
                if c.id in infos and infos[c.id].work_id in by_work}
    have = set(cands.ids)
    new: list[str] = []
    if config.max_new:
        reached_chunks = engine.work_chunks(sorted(by_work), filters)
        if _over(t0, config, diag):
            return cands, diag
        cands.infos.update(reached_chunks)  # what the reranker and diversity read of them too
        work_of = {i: info.work_id for i, info in reached_chunks.items() if i not in have}
        new = sorted(work_of, key=lambda i: (-by_work.get(work_of[i], 0.0), i))[:config.max_new]
        citation.update({i: by_work[work_of[i]] for i in new})
    diag.update(added=len(new), cited=len(citation))
    items = cands.items + [Candidate(i, 0.0, {}) for i in new]
    return cands.replace(items, citation=citation, seeds=list(strength)), diag


def _as_seen(engine: Any, neighbors: dict[str, Neighbors], licences: Filters,
             directions: tuple[str, ...]) -> dict[str, Neighbors]:
    """The seeds' links in `directions` as a caller limited to some licences may see them: only
    works it may see, so that a hidden work neither takes a `fan_out` place nor counts among the
    works reached; and co-citation only through citing works it may see (the stored order, most
    shared citers first, kept among equals). Unchanged, after one request, when the caller may see
    every linked work."""
    linked = sorted({w for nb in neighbors.values() for d in directions for w in getattr(nb, d)}
                    | ({w for nb in neighbors.values() for w in nb.cited_by} if "cocited" in directions else set()))
    if not linked:
        return neighbors
    chunks = engine.work_chunks(linked, licences)  # in id order
    seen: dict[str, str] = {}  # visible linked work -> its first chunk
    for chunk, info in chunks.items():
        seen.setdefault(info.work_id, chunk)
    if len(seen) == len(linked):
        return neighbors
    citers = sorted({w for nb in neighbors.values() for w in nb.cited_by if w in seen})
    cites = {chunks[c].work_id: nb.cites for c, nb in engine.neighbors([seen[w] for w in citers]).items()
             } if citers and "cocited" in directions else {}
    out = {}
    for seed, nb in neighbors.items():
        by = tuple(w for w in nb.cited_by if w in seen)
        shared = {w: sum(w in cites.get(c, ()) for c in by) for w in nb.cocited if w in seen}
        cocited = tuple(sorted((w for w in shared if shared[w]), key=lambda w: -shared[w]))
        out[seed] = Neighbors(tuple(w for w in nb.cites if w in seen), by, cocited, nb.pagerank, nb.authority)
    return out


def _over(t0: float, config: CitationConfig, diag: dict[str, Any]) -> bool:
    return past_budget(t0, config.budget_ms, diag, "the unexpanded candidates went on")
