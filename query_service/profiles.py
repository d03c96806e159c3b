"""Retrieval profiles (plugins, group `hybridsearch.profiles`): which channels, how many
candidates each, and how to fuse them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field

from hybridsearch.errors import ConfigError, ValidationError
from hybridsearch.models import BM25_FIELD_WEIGHTS, JOINED_FIELDS, error_message, validate_record
from query_service.citation import CitationConfig
from query_service.evidence import EvidenceConfig
from query_service.symbolic import SymbolicConfig

EXPANSIONS = ("aliases", "voicevault", "symbolic")  # the Searcher's query expansion stages


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


class DiversityConfig(BaseModel):
    """See query_service.diversity; `None` turns a rule off."""

    model_config = ConfigDict(extra="forbid")
    by_work: bool = True
    near_duplicate: float | None = Field(default=0.82, ge=0.0, le=1.0, allow_inf_nan=False)
    per_page: int | None = Field(default=2, ge=1)
    per_author: int | None = Field(default=None, ge=1)
    per_venue: int | None = Field(default=None, ge=1)
    mmr_lambda: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)


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
    semantic_floor: float | None = Field(
        default=None, ge=-1.0, le=1.0, allow_inf_nan=False,
        description="raw cosine: when no candidate reaches it the query is out of domain (empty result)")
    domain_check: float | None = Field(
        default=None, ge=-1.0, le=1.0, allow_inf_nan=False,
        description="raw cosine: when the best candidate is below it, the query must also lie within the index: "
        "no farther from the centroid of its vectors than its farthest document, else it is out of domain")
    min_semantic: float | None = Field(
        default=None, ge=-1.0, le=1.0, allow_inf_nan=False,
        description="raw cosine: candidates below it are dropped before fusion (AICO's min_semantic_score)")
    diversity: DiversityConfig | None = None
    evidence: EvidenceConfig | None = None
    citation: CitationConfig | None = Field(default=None, description="citation one-hop expansion from the "
                                            "top fused candidates (query_service.citation)")
    reranker: str | None = Field(default=None, description="a registered reranker plugin (group "
                                 "hybridsearch.rerankers), run on the fused top candidates")
    reranker_config: dict[str, Any] = Field(default_factory=dict)
    rerank_top: int = Field(default=100, ge=1, le=1000, description="fused candidates the reranker sees")
    expansion: str | None = Field(default=None, description="a query expansion stage by name: aliases, "
                                  "voicevault, or symbolic (the bounded symbolic closure over facts)")
    symbolic: SymbolicConfig = Field(default_factory=SymbolicConfig,
                                     description="the symbolic closure's bounds, when expansion is symbolic")

    @pydantic.field_validator("expansion")
    @classmethod
    def _known_expansion(cls, v: str | None) -> str | None:
        if v is not None and v not in EXPANSIONS:
            raise ValueError(f"unknown expansion {v!r}; valid: {', '.join(EXPANSIONS)}")
        return v

    def uses_channel(self, channel: str) -> bool:
        """Whether the channel runs, among the profile's channels or as its escalation."""
        return channel in self.channels or (self.escalation is not None and self.escalation.channel == channel)

    def embeds_query(self) -> bool:
        """Whether a search embeds its query: a dense channel, the tfidf-multisignal channel (its
        cosine rerank), a semantic rule, or a reranker (the built-in `math` weighs the query's
        cosine for every intent)."""
        return (self.uses_channel("dense") or self.uses_channel("tfidf-multisignal") or self.reranker is not None
                or any(x is not None for x in (self.semantic_floor, self.domain_check, self.min_semantic)))

    def with_overrides(self, overrides: Mapping[str, Any]) -> Profile:
        """A copy with request-time overrides: `max_results`, `min_score`, `gap`, `<channel>.k`,
        `<channel>.<param>` (the channel plugin's Config), `fuser.<param>` (the fuser's Config),
        `escalation.<param>`, `diversity.<param>`, `evidence.<param>`, `symbolic.<param>`. Every
        value is validated; an error names the parameter and its range. `fuser.weights` merges
        into the profile's weights (a channel it does not name keeps its weight)."""
        if not overrides:
            return self
        data = self.model_dump()
        for key, value in overrides.items():
            head, _, param = key.partition(".")
            if not param and head in ("max_results", "min_score", "gap", "semantic_floor", "domain_check",
                                      "min_semantic"):
                data[head] = value
            elif head in data["channels"] and param == "k":
                data["channels"][head]["k"] = value
            elif head in data["channels"] and param:
                data["channels"][head]["config"][param] = value
            elif head == "fuser" and param:
                if len(data["channels"]) == 1 and data["escalation"] is None:
                    raise ValidationError("this profile has one channel and so no fuser", field=key)
                old = data["fuser_config"].get(param)
                # a mapping (fuser.weights) merges into the profile's: a channel it does not name
                # keeps its weight, never falling back to the default 1 (hybrid's HDC weight is 0)
                data["fuser_config"][param] = {**old, **value} if isinstance(old, dict) and isinstance(
                    value, dict) else value
            elif head == "escalation" and param and data["escalation"] is not None:
                data["escalation"][param] = value
            elif head in ("diversity", "evidence", "symbolic") and param:
                data[head] = {**(data[head] or {}), param: value}
            else:
                valid = ["max_results", "min_score", "gap", "semantic_floor", "domain_check", "min_semantic",
                         "fuser.<param>", "escalation.<param>", "diversity.<param>", "evidence.<param>",
                         "symbolic.<param>"] + [f"{c}.<param>" for c in data["channels"]]
                raise ValidationError(f"unknown parameter; valid: {', '.join(valid)}", field=key)
        try:
            prof: Profile = validate_record(Profile, data, strict=True)
        except ValidationError as e:
            param = (e.field or "").removeprefix("channels.")  # a profile keeps `<channel>.k` under channels
            if param != e.field and param in overrides:
                raise ValidationError(e.message, field=param) from None  # named as it was given
            raise
        prof.check_plugins(strict=True)
        return prof

    def check_plugins(self, *, strict: bool = False) -> None:
        """Validate channel and fuser configs against the plugins' Config models now, not mid-search
        (`strict`: no value converted, as for request-time overrides: `true` is not 1, nor "3" 3)."""
        from hybridsearch import plugins

        for name, spec in self.channels.items():
            _validate_config(plugins.load("channels", name), spec.config, name, strict)
        if len(self.channels) > 1 or self.escalation is not None:
            _validate_config(plugins.load("fusers", self.fuser), self.fuser_config, "fuser", strict)
            # channel names the fuser is given must be this profile's (else a weight is silently lost)
            known = set(self.channels) | ({self.escalation.channel} if self.escalation is not None else set())
            named = {f"fuser.{key}": [value] if isinstance(value, str) else list(value)
                     for key, value in self.fuser_config.items() if key in ("weights", "primary", "secondary")}
            if self.escalation is not None:
                named["escalation.after"] = [self.escalation.after]
            for field, names in named.items():
                unknown = sorted(set(names) - known)
                if unknown:
                    raise ValidationError(f"names no channel of this search: {', '.join(unknown)} (its channels: "
                                          f"{', '.join(sorted(known))})", field=field)
            weights = self.fuser_config.get("weights")
            if isinstance(weights, dict) and all(weights.get(c, 1.0) == 0 for c in known):
                raise ValidationError("every channel's weight is 0, so every score would be 0 (ranked by id); "
                                      "give one a weight above 0", field="fuser.weights")
        if self.reranker is not None:
            _validate_config(plugins.load("rerankers", self.reranker), self.reranker_config, "reranker", strict)

    @classmethod
    def from_yaml(cls, path: Path) -> Profile:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"cannot read profile {path}: not UTF-8 text (byte {e.start})") from e
        except yaml.YAMLError as e:  # one line: the message itself spans several
            mark = getattr(e, "problem_mark", None)
            where = "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}: "
            raise ConfigError(f"cannot read profile {path}: {where}{getattr(e, 'problem', None) or e}") from e
        except OSError as e:
            raise ConfigError(f"cannot read profile {path}: {e}") from e
        result: Profile = validate_record(cls, data, source=str(path))
        result.check_plugins()
        return result


def _validate_config(plugin: Any, config: Mapping[str, Any], prefix: str, strict: bool) -> None:
    try:
        plugin.Config.model_validate(dict(config), strict=strict or None)  # None: the model's own setting
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        field = ".".join([prefix, *(str(p) for p in err["loc"])])
        raise ValidationError(error_message(err), field=field) from None


def _single(name: str, channel: str, description: str, **config: Any) -> Profile:
    return Profile(name=name, description=description,
                   channels={channel: ChannelSpec(k=100, config=config)})


# Lucene's multi_match default: every scored field weighs 1. The seeds' field weights (title 1.5 ...)
# stay in the seed profiles; with them BM25 alone scores SciFact nDCG@10 0.651, with these 0.670.
EQUAL_FIELDS = {f: 1.0 for f in BM25_FIELD_WEIGHTS}
LEXICAL = _single("lexical", "bm25", "BM25 alone, most_fields (sum over fields, each weighing 1)",
                  fields=EQUAL_FIELDS)
LEXICAL_BEST = _single("lexical-best", "bm25", "BM25 alone, best_fields (dis_max, tie_breaker 0.2)",
                       mode="best_fields", tie_breaker=0.2)
SEMANTIC = _single("semantic", "dense", "all-MiniLM-L6-v2 cosine alone")
HDC = _single("hdc", "hdc", "HDC/VSA hypervectors alone (Hamming, MRP-VM field weights)")
KB_FAST = Profile(name="kb-fast", description="MRP-VM kb-fast: BM25 only, max precision",
                  channels={"bm25": ChannelSpec(k=100)}, max_results=3, min_score=0.35, gap=0.5)
KB_THINKINGDB = Profile(
    name="kb-thinkingdb",
    description="MRP-VM kb-thinkingdb: BM25, bounded symbolic expansion over facts, the math reranker",
    channels={"bm25": ChannelSpec(k=100)}, max_results=8, min_score=0.12, gap=0.25, expansion="symbolic",
    reranker="math")
KB_BALANCED = Profile(
    name="kb-balanced", description="MRP-VM kb-balanced: BM25, HDC escalation, agreement fusion",
    channels={"bm25": ChannelSpec(k=100)}, fuser="agreement",
    escalation=Escalation(channel="hdc", after="bm25", k=100), max_results=7, min_score=0.15, gap=0.35)
# MiniLM's semantic floor, calibrated on the demo corpus: its out-of-domain queries reach at most
# cosine 0.246 with any unit; every in-domain query's best relevant unit reaches at least 0.350.
SEMANTIC_FLOOR = 0.30
# Everyday queries that share one word with the corpus ("ring sizes for engagement rings") can pass
# the floor on that word alone (cosine 0.418 with an algebra unit), but they lie outside the corpus:
# farther from its centroid than any of its documents (demo: 0.002 and -0.013 against 0.068 for the
# farthest unit). Below DOMAIN_CHECK the Searcher asks that too. On the demo, SciFact and CACM no
# judged query whose best cosine is below 0.45 lies outside its corpus that way.
DOMAIN_CHECK = 0.45
# tuned on SciFact train (809 queries, 0.05 grid) with bench/tune_hybrid.py: BM25 best_fields beat
# most_fields there (nDCG@10 0.7212 against 0.7138), and every grid point that gives HDC weight scored
# lower, so HDC's tuned weight is 0 (and the Searcher does not run a channel weighted 0). BM25's
# fields weigh alike (the reranker's field_match carries the exact-name boost, so the title need not
# count twice): over SciFact train and the demo pooled by query, nDCG@10 0.7391 against 0.7354 with
# the seeds' weights (SciFact train 0.7262 / 0.7217, demo 0.8697 / 0.8738, the reranker refitted).
# No alias expansion: the analyser already maps notation variants to one form, and expanding changed
# nDCG@10 by at most 0.0001 on SciFact train, the demo and CACM
HYBRID_WEIGHTS = {"bm25": 0.5, "dense": 0.5, "hdc": 0.0}
# BM25 over title and text as one field (JOINED_FIELDS: BEIR's "flat" index), each other field apart:
# a term's frequency and the length then count over the whole abstract, and a title term found again
# in the text counts once more instead of losing to dis_max. nDCG@10 of `hybrid` against title and
# text apart: SciFact train 0.7267 / 0.7262, demo 0.8693 / 0.8696 (the tuning sets: even); untuned,
# SciFact test 0.7344 / 0.7316 and CACM 0.5867 / 0.5834
HYBRID_FIELDS = {"title_text": 1.0, **{f: 1.0 for f in BM25_FIELD_WEIGHTS if f not in JOINED_FIELDS["title_text"]}}
HYBRID = Profile(
    name="hybrid", description="quality default: BM25 + dense + HDC, weighted (min-max, arithmetic mean)",
    channels={"bm25": ChannelSpec(k=100, config={"mode": "best_fields", "fields": HYBRID_FIELDS}),
              "dense": ChannelSpec(k=100),
              "hdc": ChannelSpec(k=100)},
    fuser="weighted", fuser_config={"norm": "minmax", "mean": "arithmetic", "weights": HYBRID_WEIGHTS},
    max_results=100, semantic_floor=SEMANTIC_FLOOR, domain_check=DOMAIN_CHECK,
    citation=CitationConfig(),
    reranker="math")
VOICEVAULT = Profile(
    name="voicevault", description="VoiceVault: 3 query variants, BM25 + dense, best score per chunk, RRF k=60, "
    "top 20 reranked by a cross-encoder where HYBRIDSEARCH_CROSS_ENCODER_MODEL_DIR names one, at most 2 chunks per "
    "(source, page), top 5",
    channels={"bm25": ChannelSpec(k=20), "dense": ChannelSpec(k=20)}, fuser="rrf", fuser_config={"rrf_k": 60},
    expansion="voicevault", max_results=5, reranker="cross-encoder", rerank_top=20,
    diversity=DiversityConfig(by_work=False, near_duplicate=None, per_page=2))
AICO = Profile(
    name="aico", description="AICO: BM25 (k1=1.5, b=0.75) with the IDF filter (min_idf 0.6), semantic floor, "
    "adaptive RRF, min_similarity 0.4",
    channels={"bm25": ChannelSpec(k=100, config={"min_idf": 0.6, "k1": 1.5}), "dense": ChannelSpec(k=100)},
    fuser="rrf", fuser_config={"rrf_k": 0}, semantic_floor=SEMANTIC_FLOOR, min_semantic=SEMANTIC_FLOOR,
    min_score=0.4, max_results=10)
AICO_LEGACY = AICO.model_copy(update={
    "name": "aico-legacy", "description": "AICO legacy fusion: weighted 0.7 semantic / 0.3 BM25",
    "fuser": "weighted", "fuser_config": {"norm": "minmax", "mean": "arithmetic",
                                          "weights": {"dense": 0.7, "bm25": 0.3}}})
KHIVE = Profile(
    name="khive", description="khive: multi-signal TF-IDF with embedding rerank, and dense ANN, RRF k=60",
    channels={"tfidf-multisignal": ChannelSpec(k=100), "dense": ChannelSpec(k=100)},
    fuser="rrf", fuser_config={"rrf_k": 60}, max_results=10)
