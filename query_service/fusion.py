"""Fusers (plugins, group `hybridsearch.fusers`): many ranked lists in, one explained ranking out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from hybridsearch.models import RankedList


class Fused(BaseModel):
    """A fused ranking with, per id, the additive contribution of each channel."""

    ids: list[str]
    scores: list[float]
    contributions: list[dict[str, float]]


@runtime_checkable
class Fuser(Protocol):
    name: ClassVar[str]

    def fuse(self, lists: Mapping[str, RankedList], k: int) -> Fused: ...
    def max_score(self, channels: Iterable[str]) -> float: ...


def best_per_id(rl: RankedList) -> dict[str, int]:
    """1-based rank of each id; a duplicate id keeps its best (highest-scored) position."""
    best: dict[str, tuple[float, int]] = {}
    for i, (id_, s) in enumerate(rl.items()):
        if id_ not in best or s > best[id_][0]:
            best[id_] = (s, i)
    order = sorted(best, key=lambda d: (-best[d][0], best[d][1]))
    return {d: r for r, d in enumerate(order, 1)}


class RrfConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rrf_k: int = Field(default=60, ge=1)
    weights: dict[str, float] = Field(default_factory=dict)


class RrfFuser:
    """Reciprocal rank fusion: score(d) = sum over lists of w / (rrf_k + rank), ranks 1-based.
    Ties break by id so the result never depends on the order of the input lists."""

    name: ClassVar[str] = "rrf"
    Config = RrfConfig

    def __init__(self, config: RrfConfig | None = None) -> None:
        self.config = config or RrfConfig()

    def fuse(self, lists: Mapping[str, RankedList], k: int) -> Fused:
        contrib: dict[str, dict[str, float]] = {}
        for channel in sorted(lists):
            w = self.config.weights.get(channel, 1.0)
            for id_, rank in best_per_id(lists[channel]).items():
                contrib.setdefault(id_, {})[channel] = w / (self.config.rrf_k + rank)
        totals = {d: sum(c.values()) for d, c in contrib.items()}
        order = sorted(totals, key=lambda d: (-totals[d], d))[:k]
        return Fused(ids=order, scores=[totals[d] for d in order],
                     contributions=[contrib[d] for d in order])

    def max_score(self, channels: Iterable[str]) -> float:
        """Rank 1 in every list."""
        return sum(self.config.weights.get(c, 1.0) / (self.config.rrf_k + 1) for c in channels)


class AgreementConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    primary: str = "bm25"
    secondary: str = "hdc"
    primary_weight: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    secondary_weight: float = Field(default=0.7, ge=0.0, allow_inf_nan=False)
    bonus: float = Field(default=0.15, ge=0.0, allow_inf_nan=False)


class AgreementFuser:
    """MRP-VM agreement fusion: each list is normalised by its maximum; a unit found by both
    scores 1.0 * primary_n + 0.7 * secondary_n + 0.15, a unit found by one only its own term.
    Contributions: the two terms and `agreement` (the bonus). Ties break by id."""

    name: ClassVar[str] = "agreement"
    Config = AgreementConfig

    def __init__(self, config: AgreementConfig | None = None) -> None:
        self.config = config or AgreementConfig()

    def fuse(self, lists: Mapping[str, RankedList], k: int) -> Fused:
        c = self.config
        unknown = set(lists) - {c.primary, c.secondary}
        if unknown:
            raise ValueError(f"the agreement fuser combines {c.primary!r} and {c.secondary!r}; "
                             f"got also {sorted(unknown)}")
        contrib: dict[str, dict[str, float]] = {}
        for channel, weight in ((c.primary, c.primary_weight), (c.secondary, c.secondary_weight)):
            rl = lists.get(channel)
            if rl is None or not rl.scores:
                continue
            best: dict[str, float] = {}
            for id_, s in rl.items():
                best[id_] = max(s, best.get(id_, s))
            top = max(best.values())
            for id_, s in best.items():
                contrib.setdefault(id_, {})[channel] = weight * (s / top if top > 0 else 0.0)
        for parts in contrib.values():
            if len(parts) == 2:
                parts["agreement"] = c.bonus
        totals = {d: sum(p.values()) for d, p in contrib.items()}
        order = sorted(totals, key=lambda d: (-totals[d], d))[:k]
        return Fused(ids=order, scores=[totals[d] for d in order], contributions=[contrib[d] for d in order])

    def max_score(self, channels: Iterable[str]) -> float:
        """Top of both lists plus the bonus."""
        return self.config.primary_weight + self.config.secondary_weight + self.config.bonus
