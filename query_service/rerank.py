"""Rerankers (plugins, group `hybridsearch.rerankers`) and `math`, RFC-0003's transparent
math-aware reranker:

    final = w1 lexical + w2 semantic + w3 citation + w4 field_match + w5 freshness + w6 authority

Each component lies in [0, 1]; the weights of an intent sum to 1, so the final score does too,
and a hit's contributions (w_i x component_i) sum to its score.

- lexical: the BM25 channel's score, min-max normalised over its list (0 when BM25 did not find it)
- semantic: (1 - passage_share) x the chunk's cosine + passage_share x its best passage's cosine
  (`passage_score`: the title or one sentence of the text, embedded alone), each min-max
  normalised by the dense list's range and clipped (cosines of candidates the dense channel did
  not return come from `vector_score`; 0 without a vector; a chunk without passage vectors counts
  its own cosine for both)
- citation: relational evidence: the citation-expansion score (query_service.citation) or, under
  symbolic expansion, the closure's weight (query_service.symbolic: seed strength x 0.35 per hop),
  the larger where both ran
- field_match: 1 when the chunk's title, as analysed tokens, occurs in the query (an exact name
  match; the analyser maps notation variants to one form, so "C-star algebra" matches
  "C*-algebra"); otherwise the share of the query's tokens among its subjects' tokens
- freshness: 2^-(age / half_life), age in years behind the newest candidate (0 when undated);
  recency is query-dependent: no intent's row weights it, and a query that asks for recent work
  (Intent.recency: "latest", "in the last five years") moves the share `recency` of every weight
  onto it, so the weights still sum to 1
- authority: the work's PageRank authority (indexer.graph: log scale, capped at the 99th percentile)
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hybridsearch.analysis import default_analyzer
from hybridsearch.engines import Neighborhood, VectorSearch
from hybridsearch.errors import ConfigError
from hybridsearch.models import DocInfo
from hybridsearch.scoring import minmax
from query_service.candidates import Candidate, Candidates, past_budget
from query_service.channels import QueryContext
from query_service.fusion import best_scores

COMPONENTS = ("lexical", "semantic", "citation", "field_match", "freshness", "authority")


@runtime_checkable
class Reranker(Protocol):
    """Reorders candidates. Returns them with new scores and contributions (that still sum to the
    scores), and a diagnostics dict (`degraded`: why the input order was kept, if it was)."""

    name: ClassVar[str]

    def rerank(self, query: QueryContext, cands: Candidates, engine: Any) -> tuple[Candidates, dict[str, Any]]: ...


class Weights(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lexical: float = Field(ge=0, le=1, allow_inf_nan=False)
    semantic: float = Field(ge=0, le=1, allow_inf_nan=False)
    citation: float = Field(ge=0, le=1, allow_inf_nan=False)
    field_match: float = Field(ge=0, le=1, allow_inf_nan=False)
    freshness: float = Field(ge=0, le=1, allow_inf_nan=False)
    authority: float = Field(ge=0, le=1, allow_inf_nan=False)

    def check_sum(self) -> Weights:
        total = sum(self.as_dict().values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"weights must sum to 1, got {total:g}")
        return self

    def as_dict(self) -> dict[str, float]:
        return {c: getattr(self, c) for c in COMPONENTS}


# The one table of weights, per intent (lexical, semantic, citation, field_match, freshness,
# authority), fitted by bench/tune_rerank.py on SciFact's train split and the demo corpus only
# (0.05 grid, lexical = semantic, authority at most 0.15 so popularity cannot dominate, RFC-0003
# §10.2). Foundational bias: no row rewards recency (freshness 0; neither tuning set dates its
# answers; a query that asks for recent work gets MathConfig.recency), and prereq leans on what
# the seeds cite and on authority.
WEIGHTS: dict[str, tuple[float, float, float, float, float, float]] = {
    "lookup":  (0.35, 0.35, 0.15, 0.15, 0.00, 0.00),
    "compare": (0.25, 0.25, 0.40, 0.05, 0.00, 0.05),
    "survey":  (0.30, 0.30, 0.25, 0.15, 0.00, 0.00),
    "prereq":  (0.10, 0.10, 0.65, 0.00, 0.00, 0.15),
    "related": (0.20, 0.20, 0.55, 0.05, 0.00, 0.00),
}


# The semantic component's share for a chunk's best passage. A long chunk's one vector blurs what
# each of its sentences says (and MiniLM reads at most 256 word pieces); its best sentence does not.
PASSAGE_SHARE = 0.5


def _default_weights() -> dict[str, Weights]:
    return {intent: Weights(**dict(zip(COMPONENTS, w, strict=True))) for intent, w in WEIGHTS.items()}


class MathConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weights: dict[str, Weights] = Field(default_factory=_default_weights)
    half_life: float = Field(default=10.0, gt=0, allow_inf_nan=False, description="years; freshness halves")
    recency: float = Field(default=0.25, ge=0, le=1, allow_inf_nan=False,
                           description="the share of the score that freshness takes when the query asks "
                           "for recent work (each weight scaled by 1 - recency)")
    budget_ms: float = Field(default=100.0, gt=0, allow_inf_nan=False,
                             description="past it the fused order stays, flagged degraded")
    low_cosine: float = Field(default=0.40, ge=-1, le=1, allow_inf_nan=False,
                              description="a top hit whose raw cosine with the query is below it is low "
                              "confidence (components are relative to the candidates; this is not)")
    low_margin: float = Field(default=0.02, ge=0, le=1, allow_inf_nan=False,
                              description="a relative margin (s1 - s2) / s1 below it is low confidence")
    passage_share: float = Field(default=PASSAGE_SHARE, ge=0, le=1, allow_inf_nan=False,
                                 description="the share of the semantic component that the best passage's "
                                 "cosine takes (the rest is the whole chunk's)")

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: dict[str, Weights]) -> dict[str, Weights]:
        merged = {**_default_weights(), **v}
        for intent, w in merged.items():
            if intent not in WEIGHTS:
                raise ValueError(f"unknown intent {intent!r}; valid: {', '.join(WEIGHTS)}")
            try:
                w.check_sum()
            except ValueError as e:
                raise ValueError(f"{intent}: {e}") from None
        return merged


class MathReranker:
    name: ClassVar[str] = "math"
    Config = MathConfig

    def __init__(self, config: MathConfig | None = None) -> None:
        self.config = config or MathConfig()
        self._titles: dict[str, tuple[str, ...]] = {}  # analysed titles and subjects, by chunk id

    def rerank(self, query: QueryContext, cands: Candidates, engine: Any) -> tuple[Candidates, dict[str, Any]]:
        cfg = self.config
        intent = query.intent.name if query.intent is not None else "lookup"
        weights = cfg.weights.get(intent, cfg.weights["lookup"]).as_dict()
        recency = query.intent.recency if query.intent is not None and cfg.recency > 0 else None
        if recency is not None:
            weights = {c: (1 - cfg.recency) * w + (cfg.recency if c == "freshness" else 0.0)
                       for c, w in weights.items()}
        if weights["semantic"] > 0 and isinstance(engine, VectorSearch):
            _ = query.vector  # embedding the query is the dense channel's cost, not the reranker's budget
        t0 = time.perf_counter()
        diag: dict[str, Any] = {"intent": intent, "weights": weights}
        if recency is not None:
            diag["recency"] = recency
        # the budget is checked after each step that asks the engine, so that a slow one stops the
        # stage there instead of running every step first
        late = partial(past_budget, t0, cfg.budget_ms, diag, "the fused order stands")
        infos = cands.doc_info(engine)
        if late():
            return cands, diag
        cosines = self._cosines(query, cands, engine)
        if late():
            return cands, diag
        passages = (engine.passage_score(query.vector, cands.ids) if weights["semantic"] > 0 and cfg.passage_share > 0
                    and isinstance(engine, VectorSearch) else {})
        if late():
            return cands, diag
        comps: dict[str, dict[str, float]] = {}
        for name in COMPONENTS:
            if weights[name] > 0:
                comps[name] = self._component(name, query, cands, engine, infos, cosines, passages)
                if late():
                    return cands, diag
        items = []
        for c in cands.items:
            parts = {name: values.get(c.id, 0.0) for name, values in comps.items()}
            contrib = {name: weights[name] * x for name, x in parts.items()}
            items.append(Candidate(c.id, math.fsum(contrib.values()), contrib, parts))
        items.sort(key=lambda c: (-c.score, c.id))
        scores = [c.score for c in items]
        low = _low_confidence(scores, cosines.get(items[0].id) if items else None, cfg.low_cosine, cfg.low_margin)
        if low is not None:
            diag["low_confidence"] = low
        return cands.replace(items), diag

    def _component(self, name: str, query: QueryContext, cands: Candidates, engine: Any,
                   infos: Mapping[str, DocInfo], cosines: Mapping[str, float],
                   passages: Mapping[str, float]) -> dict[str, float]:
        ids = cands.ids
        if name == "lexical":
            rl = cands.lists.get("bm25")
            return minmax(best_scores(rl)) if rl is not None else {}
        if name == "semantic":
            chunk = _semantic(cands, cosines)
            best = _semantic(cands, {i: passages.get(i, c) for i, c in cosines.items()})
            share = self.config.passage_share
            return {i: (1 - share) * s + share * best[i] for i, s in chunk.items()}
        if name == "citation":
            return {i: max(cands.citation.get(i, 0.0), cands.symbolic.get(i, 0.0))
                    for i in cands.citation.keys() | cands.symbolic.keys()}
        if name == "field_match":
            return self._field_match(query, ids, infos)
        if name == "freshness":
            years = {i: info.year for i, info in infos.items() if info.year is not None}
            newest = max(years.values(), default=0)
            return {i: 2.0 ** (-(newest - y) / self.config.half_life) for i, y in years.items()}
        if not isinstance(engine, Neighborhood):  # authority
            return {}
        return engine.authority(ids)

    @staticmethod
    def _cosines(query: QueryContext, cands: Candidates, engine: Any) -> dict[str, float]:
        """Raw cosines: the dense channel's, those earlier stages learnt, and `vector_score` for the
        other candidates (recorded on `cands` for the stages after)."""
        rl = cands.lists.get("dense")
        cos = {**cands.cosines, **(best_scores(rl) if rl is not None else {})}
        others = [i for i in cands.ids if i not in cos]
        if others and isinstance(engine, VectorSearch):
            got = engine.vector_score(query.vector, others)
            cands.cosines.update(got)
            cos.update(got)
        return cos

    def _field_match(self, query: QueryContext, ids: list[str], infos: Mapping[str, DocInfo]) -> dict[str, float]:
        an = default_analyzer()
        q = an.analyze(query.text)
        if not q:
            return {}
        qset = set(q)
        joined = " " + " ".join(_parts(q)) + " "
        out: dict[str, float] = {}
        for i in ids:
            info = infos.get(i)
            if info is None:
                continue
            key = i + "\x00" + info.title
            entry = self._titles.get(key)  # one read: another search's thread may clear the cache meanwhile
            if entry is None:
                if len(self._titles) > 100_000:
                    self._titles.clear()
                entry = self._titles[key] = (" ".join(_parts(an.analyze(info.title))),
                                             *an.analyze_many(list(info.subjects)))
            title_text, *subjects = entry
            if title_text and f" {title_text} " in joined:
                out[i] = 1.0
            elif subjects:
                out[i] = len(qset & set(subjects)) / len(qset)
        return out


def _parts(tokens: list[str]) -> list[str]:
    """Tokens without the whole hyphenated terms, whose parts follow them: so that a title written
    "Gauss–Bonnet theorem" and a query "Gauss Bonnet theorem" meet (and the other way round)."""
    return [t for t in tokens if "-" not in t]


def _semantic(cands: Candidates, cos: Mapping[str, float]) -> dict[str, float]:
    """Cosines min-max normalised by the dense list's range (its scale in fusion), clipped to [0, 1]."""
    if not cos:
        return {}
    rl = cands.lists.get("dense")
    base = list(rl.scores) if rl is not None and rl.scores else list(cos.values())
    lo, hi = min(base), max(base)
    if hi <= lo:
        return {i: 1.0 if c >= hi else 0.0 for i, c in cos.items()}
    return {i: min(1.0, max(0.0, (c - lo) / (hi - lo))) for i, c in cos.items()}


def _low_confidence(scores: list[float], top_cosine: float | None, low_cosine: float,
                    low_margin: float) -> str | None:
    if not scores:
        return None
    s1 = scores[0]
    if top_cosine is not None and top_cosine < low_cosine:
        return f"top hit's cosine {top_cosine:.3f} below {low_cosine}"
    if len(scores) > 1 and s1 > 0 and (s1 - scores[1]) / s1 < low_margin:
        return f"top two within {100 * low_margin:g}% ({s1:.3f}, {scores[1]:.3f})"
    return None


class CrossEncoderConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top: int = Field(default=20, ge=1, le=1000, description="fused candidates scored (VoiceVault: the top 20)")
    budget_ms: float = Field(default=2000.0, gt=0, allow_inf_nan=False,
                             description="past it the fused order stays, flagged degraded")
    batch_size: int = Field(default=16, ge=1, description="pairs per model call (the budget is checked after each)")


class CrossEncoderReranker:
    """VoiceVault's step: a cross-encoder (a local model directory, HYBRIDSEARCH_CROSS_ENCODER_MODEL_DIR,
    loaded once) scores (query, chunk text) for the top `top` fused candidates; its score, the
    sigmoid of the model's logit, is the hit's score and its one contribution (`cross_encoder`).
    Past `budget_ms` the fused order stands, flagged degraded; without a model configured it stands
    too, and the diagnostics say so."""

    name: ClassVar[str] = "cross-encoder"
    Config = CrossEncoderConfig

    def __init__(self, config: CrossEncoderConfig | None = None) -> None:
        self.config = config or CrossEncoderConfig()
        self._models: dict[str, Any] = {}

    def _model(self, model_dir: Any) -> Any:
        key = str(model_dir)
        if key not in self._models:
            try:
                from sentence_transformers import CrossEncoder
            except ImportError as e:
                raise ConfigError(f"the cross-encoder reranker needs {e.name}: pip install sentence-transformers"
                                  ) from e
            try:
                self._models[key] = CrossEncoder(key, device="cpu")
            except (OSError, ValueError) as e:
                raise ConfigError(f"HYBRIDSEARCH_CROSS_ENCODER_MODEL_DIR: cannot load a cross-encoder from {key}: "
                                  f"{e}".splitlines()[0]) from e
        return self._models[key]

    def rerank(self, query: QueryContext, cands: Candidates, engine: Any) -> tuple[Candidates, dict[str, Any]]:
        from hybridsearch.config import get_settings

        model_dir = get_settings().cross_encoder_model_dir
        if model_dir is None:
            return cands, {"skipped": "no cross-encoder model configured (HYBRIDSEARCH_CROSS_ENCODER_MODEL_DIR): "
                                      "the fused order stands"}
        model = self._model(model_dir)
        cfg = self.config
        t0 = time.perf_counter()
        diag: dict[str, Any] = {"model": str(model_dir), "scored": 0}
        head = cands.items[:cfg.top]
        docs = engine.get([c.id for c in head])
        pairs = [(query.text, docs[c.id].dense_text if c.id in docs else "") for c in head]
        logits: list[float] = []
        for i in range(0, len(pairs), cfg.batch_size):
            part = pairs[i:i + cfg.batch_size]
            scores = np.asarray(model.predict(part, convert_to_numpy=True), dtype=np.float64)
            logits += scores.reshape(len(part), -1)[:, 0].tolist()
            if past_budget(t0, cfg.budget_ms, diag, "the fused order stands"):
                return cands, diag
        if not all(math.isfinite(x) for x in logits):
            diag["degraded"] = "the cross-encoder gave a non-finite score; the fused order stands"
            return cands, diag
        items = [Candidate(c.id, s, {"cross_encoder": s}, {"cross_encoder": s})
                 for c, s in zip(head, (1.0 / (1.0 + math.exp(-x)) for x in logits), strict=True)]
        items.sort(key=lambda c: (-c.score, c.id))
        diag["scored"] = len(items)
        return cands.replace(items + cands.items[cfg.top:]), diag
