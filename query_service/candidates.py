"""The one value the Searcher's stages pass along: the candidates, best first, each with its score
and the additive contributions that sum to it, plus what later stages read (the channel lists,
citation-expansion scores)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from hybridsearch.models import DocInfo, RankedList

if TYPE_CHECKING:
    from hybridsearch.engines import Reader


class SeedConfig(BaseModel):
    """How an expansion stage picks its seeds (`Candidates.strongest`)."""

    model_config = ConfigDict(extra="forbid")
    seeds: int = Field(default=5, ge=1, le=100, description="fused candidates the expansion starts from, at most")
    seed_ratio: float = Field(default=0.5, ge=0.0, le=1.0, allow_inf_nan=False,
                              description="a seed scores at least this times the top score")


def past_budget(t0: float, budget_ms: float, diag: dict[str, Any], then: str) -> bool:
    """Whether a stage begun at `t0` (perf_counter) has run past its budget; if so, says so under
    diag["degraded"], with what happens `then`."""
    if (time.perf_counter() - t0) * 1000 <= budget_ms:
        return False
    diag["degraded"] = f"time budget {budget_ms} ms exceeded; {then}"
    return True


@dataclass(slots=True)
class Candidate:
    """`contributions` sum to `score`. `components`: the reranker's features, each in [0, 1]
    (empty before reranking)."""

    id: str
    score: float
    contributions: dict[str, float]
    components: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Candidates:
    """`items` best first. `lists`: every channel's result (for explanations and features).
    `citation`: citation-expansion scores in [0, 1] by id (absent: 0). `symbolic`: symbolic
    closure weights in [0, 1] by id, and `via`: the chain of facts that reached each. `seeds`: the ids
    expansion started from. `infos`: DocInfo fetched so far, shared by the stages (one engine
    request per stage at most, for the ids not fetched before). `cosines`: raw query cosines the
    stages have learnt (semantic floor, reranker), so none is asked for twice."""

    items: list[Candidate]
    lists: dict[str, RankedList]
    citation: dict[str, float] = field(default_factory=dict)
    symbolic: dict[str, float] = field(default_factory=dict)
    via: dict[str, str] = field(default_factory=dict)
    seeds: list[str] = field(default_factory=list)
    infos: dict[str, DocInfo] = field(default_factory=dict)
    cosines: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, ids: Iterable[str], scores: Iterable[float], contributions: Iterable[dict[str, float]],
           lists: Mapping[str, RankedList]) -> Candidates:
        return cls([Candidate(i, s, c) for i, s, c in zip(ids, scores, contributions, strict=True)], dict(lists))

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.items]

    @property
    def scores(self) -> list[float]:
        return [c.score for c in self.items]

    def strongest(self, n: int, ratio: float) -> dict[str, float]:
        """The seeds an expansion starts from: the first `n` candidates scoring at least `ratio`
        times the top score, each with its strength, its score over the top score."""
        top = self.items[0].score if self.items else 0.0
        return {c.id: c.score / top for c in self.items[:n] if top > 0 and c.score >= ratio * top}

    def keep(self, positions: Iterable[int]) -> Candidates:
        """The candidates at these positions, in this order."""
        return self.replace([self.items[i] for i in positions])

    def head(self, n: int) -> Candidates:
        return self.replace(self.items[:n])

    def replace(self, items: list[Candidate], **changes: Any) -> Candidates:
        """These items instead, with everything else carried over (or changed)."""
        kept = {"lists": self.lists, "citation": self.citation, "symbolic": self.symbolic, "via": self.via,
                "seeds": self.seeds, "infos": self.infos, "cosines": self.cosines}
        return Candidates(items, **{**kept, **changes})

    def doc_info(self, engine: Reader) -> dict[str, DocInfo]:
        """DocInfo of every candidate (and of what else is known), fetching only what is not known yet."""
        missing = [i for i in self.ids if i not in self.infos]
        if missing:
            self.infos.update(engine.doc_info(missing))
        return self.infos

    def __len__(self) -> int:
        return len(self.items)
