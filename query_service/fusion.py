"""Fusers (plugins, group `hybridsearch.fusers`): many ranked lists in, one explained ranking out."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hybridsearch.errors import QueryError
from hybridsearch.models import RankedList
from hybridsearch.scoring import minmax


class Fused(BaseModel):
    """A fused ranking with, per id, the additive contribution of each channel."""

    ids: list[str]
    scores: list[float]
    contributions: list[dict[str, float]]


@runtime_checkable
class Fuser(Protocol):
    name: ClassVar[str]

    def fuse(self, lists: Mapping[str, RankedList], k: int) -> Fused: ...
    def max_score(self, lists: Mapping[str, RankedList]) -> float: ...


def best_scores(rl: RankedList) -> dict[str, float]:
    """Each id's score; a duplicate id keeps its best score, never the one that came first."""
    best: dict[str, float] = {}
    for id_, s in rl.items():
        best[id_] = max(s, best.get(id_, s))
    return best


def best_per_id(rl: RankedList) -> dict[str, int]:
    """1-based rank of each id by its best score (a duplicate id keeps its best), equal scores
    ranked by id."""
    order = sorted(best_scores(rl).items(), key=lambda x: (-x[1], x[0]))
    return {d: r for r, (d, _) in enumerate(order, 1)}


def _check_weights(v: dict[str, float]) -> dict[str, float]:
    """Each weight finite and >= 0, and so their sum (the weighted mean divides by it: a sum that
    overflows scored every hit 0)."""
    for c, w in v.items():
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"weight of {c!r} must be a finite number >= 0, got {w!r}")
    if not math.isfinite(sum(v.values())):
        shown = ", ".join(f"{c}: {w!r}" for c, w in v.items())
        raise ValueError(f"the weights sum to more than a float holds ({shown})")
    return v


class RrfConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rrf_k: int = Field(default=60, ge=0, le=1_000_000, description="0 = adaptive: 60 x longest list / 1000, at least 1 "
                       "(at most a million: past it 1 / (rrf_k + rank) no longer tells neighbouring ranks apart)")
    weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        return _check_weights(v)


def adaptive_rrf_k(lengths: Iterable[int]) -> int:
    """AICO's adaptive constant (rrf_k=0): scale Cormack's k=60, set for lists of about 1000, to
    the longest input list, so that short lists still separate their top ranks."""
    return max(1, round(60 * max(lengths, default=0) / 1000))


class RrfFuser:
    """Reciprocal rank fusion: score(d) = sum over lists of w / (rrf_k + rank), ranks 1-based.
    Ties break by id so the result never depends on the order of the input lists."""

    name: ClassVar[str] = "rrf"
    Config = RrfConfig

    def __init__(self, config: RrfConfig | None = None) -> None:
        self.config = config or RrfConfig()

    def _k(self, lists: Mapping[str, RankedList]) -> int:
        return self.config.rrf_k or adaptive_rrf_k(len(rl) for rl in lists.values())

    def fuse(self, lists: Mapping[str, RankedList], k: int) -> Fused:
        contrib: dict[str, dict[str, float]] = {}
        rrf_k = self._k(lists)
        for channel in sorted(lists):
            w = self.config.weights.get(channel, 1.0)
            for id_, rank in best_per_id(lists[channel]).items():
                contrib.setdefault(id_, {})[channel] = w / (rrf_k + rank)
        totals = {d: sum(c.values()) for d, c in contrib.items()}
        order = sorted(totals, key=lambda d: (-totals[d], d))[:k]
        return Fused(ids=order, scores=[totals[d] for d in order],
                     contributions=[contrib[d] for d in order])

    def weight(self, channel: str) -> float:
        return self.config.weights.get(channel, 1.0)

    def max_score(self, lists: Mapping[str, RankedList]) -> float:
        """Rank 1 in every list."""
        rrf_k = self._k(lists)
        return sum(self.config.weights.get(c, 1.0) / (rrf_k + 1) for c in lists)


class AgreementConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    primary: str = "bm25"
    secondary: str = "hdc"
    primary_weight: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)  # finite: no NaN/inf
    secondary_weight: float = Field(default=0.7, ge=0.0, allow_inf_nan=False)
    bonus: float = Field(default=0.15, ge=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _weights(self) -> AgreementConfig:
        if self.primary_weight == 0 and self.secondary_weight == 0:
            raise ValueError("primary_weight and secondary_weight are both 0, so every score would be the bonus or 0 "
                             "(ranked by id); give one a weight above 0")
        if not math.isfinite(self.primary_weight + self.secondary_weight + self.bonus):
            raise ValueError("primary_weight + secondary_weight + bonus is more than a float holds (the score "
                             "ceiling min_score and gap divide by)")
        return self


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
            raise QueryError(f"the agreement fuser combines {c.primary!r} and {c.secondary!r} (fuser.primary, "
                             f"fuser.secondary); this search also has {', '.join(sorted(unknown))}")
        contrib: dict[str, dict[str, float]] = {}
        for channel, weight in ((c.primary, c.primary_weight), (c.secondary, c.secondary_weight)):
            rl = lists.get(channel)
            if rl is None or not rl.scores:
                continue
            best = best_scores(rl)
            top = max(best.values())
            for id_, s in best.items():
                contrib.setdefault(id_, {})[channel] = weight * (s / top if top > 0 else 0.0)
        for parts in contrib.values():
            if len(parts) == 2:
                parts["agreement"] = c.bonus
        totals = {d: sum(p.values()) for d, p in contrib.items()}
        order = sorted(totals, key=lambda d: (-totals[d], d))[:k]
        return Fused(ids=order, scores=[totals[d] for d in order], contributions=[contrib[d] for d in order])

    def max_score(self, lists: Mapping[str, RankedList]) -> float:
        """Top of both lists plus the bonus."""
        return self.config.primary_weight + self.config.secondary_weight + self.config.bonus


Norm = Literal["minmax", "zscore", "l2"]
Mean = Literal["arithmetic", "geometric", "harmonic"]


def normalize(scores: Mapping[str, float], how: Norm) -> dict[str, float]:
    """Scores to [0, 1]. minmax: (s - min) / (max - min), and 1.0 when all are equal (a single hit
    included); zscore: the logistic of (s - mean) / std, 0.5 when std is 0; l2: max(s, 0) / ||s||."""
    if not scores:
        return {}
    vals = list(scores.values())
    if how == "minmax":
        return minmax(scores)
    if how == "zscore":
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        return {d: 0.5 if std == 0 else 1.0 / (1.0 + math.exp(-(s - mean) / std)) for d, s in scores.items()}
    norm = math.sqrt(sum(max(v, 0.0) ** 2 for v in vals))
    return {d: 0.0 if norm == 0 else max(s, 0.0) / norm for d, s in scores.items()}


class WeightedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    norm: Norm = "minmax"
    mean: Mean = "arithmetic"
    weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        return _check_weights(v)


class WeightedFuser:
    """Normalise each list, then combine with per-channel weights (default 1).

    A document missing from a list scores 0 there. The arithmetic mean counts that 0 with its
    weight (sum w_i s_i / sum w_i over all lists). The geometric and harmonic means are taken over
    the lists where the document scores above 0, with their weights renormalised, as OpenSearch's
    normalization processor does. Contributions: w_i s_i / sum w for the arithmetic mean; for the
    other two, the score shared out in proportion to w_i s_i."""

    name: ClassVar[str] = "weighted"
    Config = WeightedConfig

    def __init__(self, config: WeightedConfig | None = None) -> None:
        self.config = config or WeightedConfig()

    def fuse(self, lists: Mapping[str, RankedList], k: int) -> Fused:
        c = self.config
        normed: dict[str, dict[str, float]] = {}
        for channel in sorted(lists):
            normed[channel] = normalize(best_scores(lists[channel]), c.norm)
        weights = {ch: c.weights.get(ch, 1.0) for ch in normed}
        total_w = sum(weights.values()) or 1.0
        ids = {d for n in normed.values() for d in n}
        totals: dict[str, float] = {}
        contrib: dict[str, dict[str, float]] = {}
        for d in ids:
            present = {ch: n[d] for ch, n in normed.items() if d in n}
            if c.mean == "arithmetic":
                parts = {ch: weights[ch] * s / total_w for ch, s in present.items()}
                totals[d] = sum(parts.values())
                contrib[d] = parts
                continue
            pos = {ch: s for ch, s in present.items() if s > 0 and weights[ch] > 0}
            wsum = sum(weights[ch] for ch in pos)
            if not pos or wsum == 0:
                score = 0.0
            elif c.mean == "geometric":
                score = math.exp(sum(weights[ch] * math.log(s) for ch, s in pos.items()) / wsum)
            else:
                score = wsum / sum(weights[ch] / s for ch, s in pos.items())
            shares = {ch: weights[ch] * s for ch, s in pos.items()}
            share_sum = sum(shares.values())
            contrib[d] = {ch: score * v / share_sum for ch, v in shares.items()} if share_sum else {}
            totals[d] = score
        order = sorted(totals, key=lambda d: (-totals[d], d))[:k]
        return Fused(ids=order, scores=[totals[d] for d in order], contributions=[contrib[d] for d in order])

    def weight(self, channel: str) -> float:
        return self.config.weights.get(channel, 1.0)

    def max_score(self, lists: Mapping[str, RankedList]) -> float:
        """Every normalised score is at most 1, so is any weighted mean of them."""
        return 1.0
