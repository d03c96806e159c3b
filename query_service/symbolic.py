"""Symbolic expansion (MRP-VM kb-thinkingdb): a bounded closure over facts.

Facts are (subject, relation, object) statements of the units (indexer.facts: given under
`metadata.facts`, or read from conditions, procedures and claims). The closure starts from the
seeds, the strongest fused candidates as in citation expansion: at hop 0 stand each seed's topic
(its title) and every phrase of a seed's facts that the query names, weighted by the seed's
strength (its score over the top score). A fact linking a phrase at hop h to a phrase not yet
reached, in either direction, puts that phrase at hop h + 1 with weight x `discount` (0.35): a
phrase reached at hop h weighs strength x 0.35^h.

Each hop looks its new phrases up among unit titles: one BM25 request on the title field, with
the search's filters (licence included, so a unit the caller may not see is never reached). A
unit whose title names a phrase (the same analysed tokens, or for phrases of two tokens or more a
Jaccard overlap above 0.5) is reached with the phrase's weight, its `symbolic` score, and
its facts feed the next hop. The closure is bounded by depth, nodes and time; past the time
budget it stops where it is, flagged `degraded`.

The reached phrases are the expansion terms (diagnostics `terms`: hop, weight and the chain of
facts), and every unit reached carries its chain in the explanation (`via`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from hybridsearch.engines import LexicalSearch, Reader
from hybridsearch.models import Fact, Filters
from indexer.facts import facts_of, node_key
from query_service.candidates import Candidate, Candidates, SeedConfig, past_budget

Key = frozenset[str]


class SymbolicConfig(SeedConfig):
    depth: int = Field(default=2, ge=1, le=5, description="hops the closure takes, at most")
    max_nodes: int = Field(default=32, ge=1, le=1000, description="phrases the closure reaches, at most")
    fan_out: int = Field(default=3, ge=1, le=100, description="units looked up per new phrase")
    discount: float = Field(default=0.35, gt=0.0, le=1.0, allow_inf_nan=False, description="weight kept per hop")
    max_new: int = Field(default=20, ge=0, le=10_000, description="units the closure may add as candidates")
    budget_ms: float = Field(default=250.0, gt=0, allow_inf_nan=False,
                             description="past it the closure stops where it is, flagged degraded")


@dataclass(frozen=True, slots=True)
class _Node:
    phrase: str
    hop: int
    weight: float
    chain: tuple[str, ...]  # the facts that led here, as text

    def explain(self) -> str:
        return f"{'; '.join(self.chain)} (hop {self.hop}, weight {self.weight:.3f})"


def names(title: Key, phrase: Key) -> bool:
    """Whether a unit's title names a phrase: the same tokens, or, for a phrase of two tokens or
    more, a Jaccard overlap above one half ("Urysohn's lemma" names "Urysohn lemma repeatedly", but
    "Fermat's last theorem" does not name "Fermat's little theorem")."""
    if title == phrase:
        return True
    return len(phrase) >= 2 and len(title & phrase) * 2 > len(title | phrase)


def expand(cands: Candidates, query: str, engine: Any, filters: Filters | None, config: SymbolicConfig
           ) -> tuple[Candidates, dict[str, Any]]:
    """The candidates with symbolic scores and chains (units reached that were not candidates
    appended with score 0, at most `max_new`), and what happened, for diagnostics."""
    t0 = time.perf_counter()
    diag: dict[str, Any] = {}
    reader: Reader = engine  # every engine reads documents
    if not isinstance(engine, LexicalSearch) or not cands.items:
        diag["skipped"] = "the engine has no lexical search" if cands.items else "no candidates"
        return cands, diag
    strength = cands.strongest(config.seeds, config.seed_ratio)
    docs = reader.get(list(strength))  # the units read so far: their titles name phrases, their facts link them
    facts = {i: facts_of(d) for i, d in docs.items()}
    nodes: dict[Key, _Node] = {}
    asked = node_key(query)
    for seed, s in strength.items():
        if seed in docs:
            _reach(nodes, _Node(docs[seed].title, 0, s, ()))
        for phrase in (p for f in facts.get(seed, ()) for p in (f.subject, f.object)):
            if len(node_key(phrase)) >= 2 and node_key(phrase) <= asked:
                _reach(nodes, _Node(phrase, 0, s, ()))
    if len(nodes) > config.max_nodes:  # the seeds' phrases count too; their titles go first
        seed_titles = {node_key(d.title) for d in docs.values()}
        nodes = dict(_room(sorted(nodes.items(), key=lambda kv: (kv[0] not in seed_titles, -kv[1].weight,
                                                                 kv[1].phrase)), {}, config, diag))
    frontier = set(nodes)
    scores: dict[str, float] = {}
    via: dict[str, str] = {}
    hops = 0
    for hop in range(1, config.depth + 1):
        new = _room(_step(nodes, frontier, facts, hop, config.discount), nodes, config, diag)
        if not new:
            break
        nodes.update(new)
        hops = hop
        if _over(t0, config, diag):
            break
        terms = sorted({t for key, _ in new for t in key})
        rl = engine.bm25([(t, 1.0) for t in terms], {"title": 1.0}, config.fan_out * len(new), filters)
        unread = [i for i in rl.ids if i not in docs]
        if unread:
            docs.update(reader.get(unread))
        titles: dict[Key, _Node] = {}  # a unit a phrase names goes on under its own title, which its facts use
        for uid in rl.ids:
            title = node_key(docs[uid].title) if uid in docs else frozenset()
            for key, node in new:
                if not names(title, key):
                    continue
                if node.weight > scores.get(uid, 0.0):
                    scores[uid], via[uid] = node.weight, node.explain()
                if title not in nodes and (title not in titles or node.weight > titles[title].weight):
                    titles[title] = _Node(docs[uid].title, hop, node.weight, node.chain)
        facts.update({u: facts_of(docs[u]) for u in scores if u not in facts and u in docs})
        named = _room(sorted(titles.items(), key=lambda kv: (-kv[1].weight, kv[1].phrase)), nodes, config, diag)
        nodes.update(named)
        frontier = {key for key, _ in new} | {key for key, _ in named}
        if _over(t0, config, diag):
            break
    reached = sorted((n for n in nodes.values() if n.hop > 0), key=lambda n: (-n.weight, n.phrase))
    diag.update(seeds=list(strength), hops=hops, nodes=len(nodes),
                terms=[{"term": n.phrase, "hop": n.hop, "weight": round(n.weight, 4), "via": "; ".join(n.chain)}
                       for n in reached[:20]])
    have = set(cands.ids)
    added = sorted((u for u in scores if u not in have), key=lambda u: (-scores[u], u))[:config.max_new]
    diag.update(units=len(scores), added=len(added))
    keep = have | set(added)
    items = cands.items + [Candidate(u, 0.0, {}) for u in added]
    return cands.replace(items, symbolic={u: s for u, s in scores.items() if u in keep},
                         via={u: v for u, v in via.items() if u in keep}), diag


def _step(nodes: dict[Key, _Node], frontier: set[Key], facts: dict[str, list[Fact]], hop: int,
          discount: float) -> list[tuple[Key, _Node]]:
    """The phrases one fact away from the frontier and not reached before, strongest first."""
    out: dict[Key, _Node] = {}
    for unit_facts in facts.values():
        for f in unit_facts:
            for a, b in ((f.subject, f.object), (f.object, f.subject)):
                ka, kb = node_key(a), node_key(b)
                if ka in frontier and kb not in nodes:
                    node = _Node(b, hop, nodes[ka].weight * discount, (*nodes[ka].chain, str(f)))
                    if kb not in out or node.weight > out[kb].weight:
                        out[kb] = node
    return sorted(out.items(), key=lambda kv: (-kv[1].weight, kv[1].phrase))


def _room(items: list[tuple[Key, _Node]], nodes: Mapping[Key, _Node], config: SymbolicConfig,
          diag: dict[str, Any]) -> list[tuple[Key, _Node]]:
    """The first of `items` (strongest first) that fit beside `nodes` within max_nodes; a cut is
    flagged in the diagnostics."""
    room = max(0, config.max_nodes - len(nodes))
    if len(items) > room:
        diag["truncated"] = f"node limit {config.max_nodes} reached"
    return items[:room]


def _reach(nodes: dict[Key, _Node], node: _Node) -> None:
    key = node_key(node.phrase)
    if key and (key not in nodes or node.weight > nodes[key].weight):
        nodes[key] = node


def _over(t0: float, config: SymbolicConfig, diag: dict[str, Any]) -> bool:
    return past_budget(t0, config.budget_ms, diag, "the closure stopped at what it had reached")
