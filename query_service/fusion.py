"""Fusers (plugins, group `hybridsearch.fusers`): many ranked lists in, one explained ranking out."""

from __future__ import annotations

from collections.abc import Mapping
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
