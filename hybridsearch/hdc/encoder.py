"""Per-field HDC encoding and the MRP-VM scoring formula.

A unit gets one code per field: topic (title), claim (text), role and acts (utility_acts). A field
code bundles the field's distinct tokens (from the shared analysis), each bound to the field's key
vector (random_hv("field:<name>")). With `ngrams=True` a token's vector is itself the bundle of
its character 3-grams ("#godel#" -> "#go", "god", ...), so spelling and notation variants land
close together. An empty field has no code; it never matches anything, not even another empty
field.

Ties in a bundle of an even number of tokens (`ties="content"`, the default) take the bits of a
random vector keyed by the bundle's own tokens, so unrelated bundles agree on about half their
tied bits, as on the others: their similarity is about 0.50, which the scoring formula's 0.50
removes, and equal token sets still give equal codes. Indexes encoded before kept `ties="fixed"`:
one tie-break vector for every bundle, so two unrelated 2-token fields have similarity about 0.625
(4 tokens: 0.57, 10: 0.53). Odd bundles have no ties.

Scoring: fieldScore = max(0, (sim - 0.5) * 2); final = sum(w_f * fieldScore_f) / sum(w_f) over the
fields present on both sides (default weights topic 0.35, claim 0.35, role 0.20, acts 0.10).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hybridsearch.analysis import Analyzer, default_analyzer
from hybridsearch.hdc.algebra import NBYTES, _hv_bytes, bit_counts, majority, random_hv
from hybridsearch.models import Document

FIELDS: tuple[str, ...] = ("topic", "claim", "role", "acts")
DOC_FIELD = {"topic": "title", "claim": "text", "role": "role", "acts": "utility_acts"}
QUERY_FIELDS: tuple[str, ...] = ("topic", "claim")


class HdcWeights(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic: float = Field(default=0.35, ge=0.0)
    claim: float = Field(default=0.35, ge=0.0)
    role: float = Field(default=0.20, ge=0.0)
    acts: float = Field(default=0.10, ge=0.0)

    @field_validator("*")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


def field_score(sim: float) -> float:
    return max(0.0, (sim - 0.5) * 2.0)


def combine(sims: Mapping[str, float], weights: HdcWeights) -> float:
    """Weighted field scores, renormalised over the fields present (those in `sims`)."""
    total = sum(getattr(weights, f) for f in sims)
    if total <= 0:
        return 0.0
    return sum(getattr(weights, f) * field_score(s) for f, s in sims.items()) / total


TIES = ("content", "fixed")  # how a bundle breaks ties; "fixed" is that of indexes encoded before
DEFAULT_NGRAMS = False  # character 3-grams: see bench/hdc.py for the measurement behind it


def index_options(stored: Mapping[str, Any] | None, *, ngrams: bool | None = None) -> dict[str, Any]:
    """HdcEncoder's keyword arguments for an index: those it stored, or (`stored` None: it stored
    none yet) those a new index records, with `ngrams` when given. Options stored before the tie
    rule was recorded mean the fixed vector the index's codes were encoded with."""
    if stored is None:
        return {"ngrams": DEFAULT_NGRAMS if ngrams is None else ngrams, "ties": "content"}
    return {"ngrams": bool(stored.get("ngrams", DEFAULT_NGRAMS)), "ties": stored.get("ties", "fixed")}


def document_texts(doc: Document) -> tuple[str | None, ...]:
    """The texts of a document that its FIELDS encode, in FIELDS order."""
    return tuple(getattr(doc, DOC_FIELD[f]) for f in FIELDS)


class HdcEncoder:
    def __init__(self, analyzer: Analyzer | None = None, *, ngrams: bool = False, ties: str = "content") -> None:
        if ties not in TIES:
            raise ValueError(f"ties {ties!r}; valid: {', '.join(TIES)}")
        self.analyzer = analyzer or default_analyzer()
        self.ngrams = ngrams
        self.ties = ties
        self._keys = {f: random_hv(f"field:{f}") for f in FIELDS}
        self._key_bits = {f: np.unpackbits(k).astype(bool) for f, k in self._keys.items()}
        self._token_cache: dict[str, bytes] = {}

    def _token_bytes(self, token: str) -> bytes:
        """The token's hypervector (cached): its random HV, or the bundle of its 3-grams' HVs."""
        if self.ngrams:
            padded = f"#{token}#"
            grams = [padded[i:i + 3] for i in range(max(len(padded) - 2, 1))]
            mat = np.frombuffer(b"".join(_hv_bytes("gram:" + g) for g in grams), dtype=np.uint8)
            tie = "tie:#" + token if self.ties == "content" else None
            value = majority(bit_counts(mat.reshape(-1, NBYTES)), len(grams), tie).tobytes()
        else:
            value = _hv_bytes("tok:" + token)
        if len(self._token_cache) > 500_000:
            self._token_cache.clear()
        self._token_cache[token] = value
        return value

    def encode_tokens(self, field: str, tokens: list[str]) -> np.ndarray | None:
        """Bundle of the distinct tokens, each bound (XOR) to the field key; None when empty."""
        distinct = list(dict.fromkeys(tokens))
        if not distinct:
            return None
        cache = self._token_cache
        mat = np.frombuffer(b"".join([cache.get(t) or self._token_bytes(t) for t in distinct]), dtype=np.uint8)
        counts = bit_counts(mat.reshape(-1, NBYTES))
        n = len(distinct)
        # binding flips the bits where the key is 1, so the vote counts flip there too
        counts = np.where(self._key_bits[field], n - counts, counts)
        tie = "tie:" + "\x1f".join(sorted(distinct)) if self.ties == "content" and n % 2 == 0 else None
        return majority(counts, n, tie)

    def encode_document(self, doc: Document) -> dict[str, np.ndarray]:
        return self.encode_texts(document_texts(doc))

    def encode_texts(self, texts: Sequence[str | None]) -> dict[str, np.ndarray]:
        """The codes of a document's FIELDS texts (document_texts); an empty field has none."""
        return self.encode_analysed(self.analyse_texts(texts))

    def analyse_texts(self, texts: Sequence[str | None]) -> list[list[str] | None]:
        """Each of a document's FIELDS texts analysed (None for an empty one)."""
        return [self.analyzer.analyze(t) if t else None for t in texts]

    def encode_analysed(self, tokens: Sequence[Sequence[str] | None]) -> dict[str, np.ndarray]:
        """The codes of a document's FIELDS texts, analysed."""
        out = {}
        for f, toks in zip(FIELDS, tokens, strict=True):
            code = self.encode_tokens(f, list(toks)) if toks else None
            if code is not None:
                out[f] = code
        return out

    def encode_query(self, text: str, *, role: str | None = None, acts: str | None = None) -> dict[str, np.ndarray]:
        """A query is a topic and a claim vector; role/acts only when query understanding gives them."""
        tokens = self.analyzer.analyze(text)
        out = {}
        for f, toks in (("topic", tokens), ("claim", tokens),
                        ("role", self.analyzer.analyze(role) if role else []),
                        ("acts", self.analyzer.analyze(acts) if acts else [])):
            code = self.encode_tokens(f, toks)
            if code is not None:
                out[f] = code
        return out
