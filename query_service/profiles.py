"""Retrieval profiles (plugins, group `hybridsearch.profiles`): which channels, how many
candidates each, and how to fuse them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from hybridsearch.errors import ConfigError
from hybridsearch.models import validate_record


class ChannelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = Field(default=100, ge=1, le=10_000)
    config: dict[str, Any] = Field(default_factory=dict)


class Escalation(BaseModel):
    """Run `channel` only when `after` returned fewer than `min_acceptable` hits (default: the
    profile's max_results)."""

    model_config = ConfigDict(extra="forbid")
    channel: str
    after: str = "bm25"
    k: int = Field(default=100, ge=1, le=10_000)
    min_acceptable: int | None = Field(default=None, ge=0)
    config: dict[str, Any] = Field(default_factory=dict)


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    channels: dict[str, ChannelSpec]
    fuser: str = "rrf"
    fuser_config: dict[str, Any] = Field(default_factory=dict)
    escalation: Escalation | None = None
    max_results: int = Field(default=10, ge=1, le=10_000)
    min_score: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False,
                             description="on the fused score divided by its maximum attainable value")
    gap: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False,
                       description="confidence-gap pruning: drop hits below top score x gap")

    @classmethod
    def from_yaml(cls, path: Path) -> Profile:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read profile {path}: {e}") from e
        result: Profile = validate_record(cls, data, source=str(path))
        return result


def _single(name: str, channel: str, description: str, **config: Any) -> Profile:
    return Profile(name=name, description=description,
                   channels={channel: ChannelSpec(k=100, config=config)})


LEXICAL = _single("lexical", "bm25", "BM25 alone, most_fields (sum over fields)")
LEXICAL_BEST = _single("lexical-best", "bm25", "BM25 alone, best_fields (dis_max, tie_breaker 0.2)",
                       mode="best_fields", tie_breaker=0.2)
SEMANTIC = _single("semantic", "dense", "all-MiniLM-L6-v2 cosine alone")
HDC = _single("hdc", "hdc", "HDC/VSA hypervectors alone (Hamming, MRP-VM field weights)")
KB_BALANCED = Profile(
    name="kb-balanced", description="MRP-VM kb-balanced: BM25, HDC escalation, agreement fusion",
    channels={"bm25": ChannelSpec(k=100)}, fuser="agreement",
    escalation=Escalation(channel="hdc", after="bm25", k=100), max_results=7, min_score=0.15, gap=0.35)
HYBRID = Profile(name="hybrid", description="BM25 + dense, RRF k=60",
                 channels={"bm25": ChannelSpec(k=100), "dense": ChannelSpec(k=100)},
                 fuser="rrf", fuser_config={"rrf_k": 60}, max_results=100)
