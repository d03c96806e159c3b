"""Retrieval channels (plugins, group `hybridsearch.channels`)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hybridsearch.analysis import default_analyzer
from hybridsearch.embeddings import Encoder, default_encoder
from hybridsearch.engines import BinarySearch, Bm25Options, LexicalSearch, Reader, VectorSearch, check_bm25_fields
from hybridsearch.errors import QueryError, UnsupportedCapabilityError
from hybridsearch.hdc import HdcWeights, combine
from hybridsearch.models import BM25_FIELD_WEIGHTS, Bm25Mode, Filters, RankedList
from query_service.intent import Intent
from query_service.stages import decompose, idf_filter, merge_subqueries


class ChannelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class QueryContext:
    """One query as the channels see it; the embedding is computed once, on first use."""

    def __init__(self, text: str, filters: Filters | None = None, encoder: Encoder | None = None, *,
                 role: str | None = None, acts: str | None = None, variants: Sequence[str] = (),
                 intent: Intent | None = None, vectorless: bool = False) -> None:
        self.text = text
        # the index held no vector when the search began: no model is loaded for the query, whose
        # "vector" is a fixed unit vector (nothing stored to compare it with; a vector written while
        # this one search runs gets a meaningless cosine from it, and the next search embeds)
        self.vectorless = vectorless
        self.intent = intent  # query understanding's verdict (query_service.intent)
        self.filters = filters
        self.variants = list(variants)  # expansion: other phrasings of the same query
        self.role = role  # set by query understanding, when it knows them
        self.acts = acts
        self._encoder = encoder
        self._vector: np.ndarray | None = None
        self.embed_ms: float | None = None  # what embedding the query took, once it is embedded

    @property
    def vector(self) -> np.ndarray:
        if self._vector is None:
            t = time.perf_counter()
            encoder = self._encoder or default_encoder()
            self._vectors = (np.eye(1 + len(self.variants), encoder.dim, dtype=np.float32) if self.vectorless
                             else encoder.encode([self.text, *self.variants], query=True))
            self.embed_ms = round((time.perf_counter() - t) * 1000, 3)
            self._vector = self._vectors[0]
        return self._vector

    @property
    def vectors(self) -> np.ndarray:
        """The query and its variants, embedded in one batch."""
        _ = self.vector
        return self._vectors


@runtime_checkable
class Channel(Protocol):
    name: ClassVar[str]

    def retrieve(self, query: QueryContext, engine: Reader, k: int) -> RankedList: ...


class Bm25Config(ChannelConfig):
    mode: Bm25Mode = "most_fields"
    tie_breaker: float = Field(default=0.2, ge=0.0, le=1.0)  # tuned on SciFact train
    role_boost: float = Field(default=1.0, ge=0.0)
    k1: float = Field(default=1.2, ge=0.0, description="other than 1.2 (with b 0.75) rescoring candidates")
    b: float = Field(default=0.75, ge=0.0, le=1.0)
    min_idf: float | None = Field(default=None, ge=0.0, description="AICO's IDF filter (0.6 there)")
    expand_discount: float = Field(default=0.35, ge=0.0, le=1.0,
                                   description="weight of expansion terms (terms only the variants have)")
    decompose: bool = False
    decompose_threshold: int = Field(default=4, ge=2)
    intersection_bonus: float = Field(default=0.25, ge=0.0)
    fields: dict[str, float] = Field(default_factory=lambda: dict(BM25_FIELD_WEIGHTS))

    @field_validator("fields")
    @classmethod
    def _fields(cls, v: dict[str, float]) -> dict[str, float]:
        try:
            check_bm25_fields(v)  # the rule the engines apply
        except QueryError as e:
            raise ValueError(str(e)) from None
        return v


class Bm25Channel:
    """Field-boosted BM25 over the engine's lexical capability."""

    name: ClassVar[str] = "bm25"
    Config = Bm25Config

    def __init__(self, config: Bm25Config | None = None) -> None:
        self.config = config or Bm25Config()

    def retrieve(self, query: QueryContext, engine: Reader, k: int) -> RankedList:
        if not isinstance(engine, LexicalSearch):
            raise UnsupportedCapabilityError("the bm25 channel needs an engine with lexical search")
        c = self.config
        parts = decompose(query.text, c.decompose_threshold) if c.decompose else [query.text]
        if len(parts) == 1:
            return self._one(query.text, query, engine, k)
        return merge_subqueries([self._one(p, query, engine, k) for p in parts], k, c.intersection_bonus, "bm25")

    def _one(self, text: str, query: QueryContext, engine: LexicalSearch, k: int) -> RankedList:
        c = self.config
        an = default_analyzer()
        terms = an.analyze(text)
        if c.min_idf is not None and terms:
            terms = idf_filter(terms, engine.term_stats(list(dict.fromkeys(terms))), c.min_idf)
        weighted = [(t, 1.0) for t in terms]
        seen = set(terms)
        for variant in query.variants:
            for t in an.analyze(variant):
                if t not in seen:
                    seen.add(t)
                    weighted.append((t, c.expand_discount))
        options = Bm25Options(c.mode, c.tie_breaker, c.role_boost, c.k1, c.b)
        return engine.bm25(weighted, c.fields, k, query.filters, options)


class DenseConfig(ChannelConfig):
    pass


class DenseChannel:
    """kNN over all-MiniLM-L6-v2 vectors; scores are raw cosine."""

    name: ClassVar[str] = "dense"
    Config = DenseConfig

    def __init__(self, config: DenseConfig | None = None) -> None:
        self.config = config or DenseConfig()

    def retrieve(self, query: QueryContext, engine: Reader, k: int) -> RankedList:
        if not isinstance(engine, VectorSearch):
            raise UnsupportedCapabilityError("the dense channel needs an engine with vector search")
        if not query.variants:
            return engine.knn(query.vector, k, query.filters)
        # a chunk found by several variants keeps its best score (no intersection bonus)
        return merge_subqueries([engine.knn(v, k, query.filters) for v in query.vectors], k, 0.0, "dense")


class HdcConfig(ChannelConfig):
    weights: HdcWeights = Field(default_factory=HdcWeights)
    candidate_factor: int = Field(default=4, ge=1, le=100)


class HdcChannel:
    """The MRP-VM associative channel: candidates are the union of the per-field top
    (candidate_factor * k) codes by Hamming distance; each is rescored exactly with
    0.35 topic + 0.35 claim + 0.20 role + 0.10 acts over the fields present on both sides."""

    name: ClassVar[str] = "hdc"
    Config = HdcConfig

    def __init__(self, config: HdcConfig | None = None) -> None:
        self.config = config or HdcConfig()

    def retrieve(self, query: QueryContext, engine: Reader, k: int) -> RankedList:
        if not isinstance(engine, BinarySearch):
            raise UnsupportedCapabilityError("the hdc channel needs an engine with binary (Hamming) search")
        codes = engine.hdc_encoder().encode_query(query.text, role=query.role, acts=query.acts)
        fetch = k * self.config.candidate_factor
        candidates: set[str] = set()
        for hits in engine.hamming(codes, fetch, query.filters).values():
            candidates.update(hits.ids)
        sims = engine.hamming_score(codes, sorted(candidates))
        scores = {}
        for id_ in candidates:
            score = combine({f: s[id_] for f, s in sims.items() if id_ in s}, self.config.weights)
            if score > 0:
                scores[id_] = score
        order = sorted(scores, key=lambda d: (-scores[d], d))[:k]
        return RankedList.of("hdc", order, [scores[d] for d in order])
