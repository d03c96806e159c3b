"""The one value the Searcher's stages pass along: the candidates, best first, each with its score
and the additive contributions that sum to it, plus what later stages read (the channel lists,
citation-expansion scores)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hybridsearch.models import RankedList


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
    `citation`: citation-expansion scores in [0, 1] by id (absent: 0). `seeds`: the ids
    expansion started from."""

    items: list[Candidate]
    lists: dict[str, RankedList]
    citation: dict[str, float] = field(default_factory=dict)
    seeds: list[str] = field(default_factory=list)

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

    def keep(self, positions: Iterable[int]) -> Candidates:
        """The candidates at these positions, in this order."""
        return Candidates([self.items[i] for i in positions], self.lists, self.citation, self.seeds)

    def head(self, n: int) -> Candidates:
        return Candidates(self.items[:n], self.lists, self.citation, self.seeds)

    def __len__(self) -> int:
        return len(self.items)
