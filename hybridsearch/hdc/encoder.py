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
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hybridsearch.analysis import Analyzer, default_analyzer
from hybridsearch.hdc.algebra import NBYTES, TIE_BREAK, _hv_bytes, _tie_bytes, bit_counts, majority, random_hv
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


_COMPILED_MIN = 512  # fields in a batch from which encode_analysed counts votes in compiled code
_VOCAB_MAX = 1 << 18  # token vectors kept in a documents' encoder's table (128 MB), emptied past it


class _Vocab(dict[str, int]):
    """Token -> its row in `table`, the tokens' packed hypervectors; a token met for the first
    time is given the next row (its vector from `vector_of`)."""

    def __init__(self, vector_of: Callable[[str], bytes]) -> None:
        super().__init__()
        self._vector_of = vector_of
        self.table = np.zeros((1024, NBYTES), dtype=np.uint8)

    def __missing__(self, token: str) -> int:
        row = len(self)
        if row == len(self.table):
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
        self.table[row] = np.frombuffer(self._vector_of(token), dtype=np.uint8)
        self[token] = row
        return row


class HdcEncoder:
    def __init__(self, analyzer: Analyzer | None = None, *, ngrams: bool = False, ties: str = "content") -> None:
        if ties not in TIES:
            raise ValueError(f"ties {ties!r}; valid: {', '.join(TIES)}")
        self.analyzer = analyzer or default_analyzer()
        self.ngrams = ngrams
        self.ties = ties
        self._keys = {f: random_hv(f"field:{f}") for f in FIELDS}
        self._key_bits = {f: np.unpackbits(k).astype(bool) for f, k in self._keys.items()}
        self._key_matrix = np.vstack([self._key_bits[f] for f in FIELDS]).astype(np.uint8)
        self._token_cache: dict[str, bytes] = {}
        self._vocab = _Vocab(self._token_vector)
        self._vocab_lock = threading.Lock()

    def _token_vector(self, token: str) -> bytes:
        """The token's hypervector: its random HV, or the bundle of its 3-grams' HVs."""
        if not self.ngrams:
            return _hv_bytes("tok:" + token)
        padded = f"#{token}#"
        grams = [padded[i:i + 3] for i in range(max(len(padded) - 2, 1))]
        mat = np.frombuffer(b"".join(_hv_bytes("gram:" + g) for g in grams), dtype=np.uint8)
        tie = "tie:#" + token if self.ties == "content" else None
        return majority(bit_counts(mat.reshape(-1, NBYTES)), len(grams), tie).tobytes()

    def _token_bytes(self, token: str) -> bytes:
        """The token's hypervector, cached for encode_tokens."""
        value = self._token_vector(token)
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
        return majority(counts, n, self._tie_key(distinct))

    def _tie_key(self, distinct: Collection[str]) -> str | None:
        """The key of the vector that breaks a bundle's ties: its tokens' own with `ties="content"`
        and an even count, else None (TIE_BREAK; an odd bundle has no ties)."""
        return "tie:" + "\x1f".join(sorted(distinct)) if self.ties == "content" and len(distinct) % 2 == 0 else None

    def encode_document(self, doc: Document) -> dict[str, np.ndarray]:
        return self.encode_documents([doc])[0]

    def encode_documents(self, docs: Sequence[Document]) -> list[dict[str, np.ndarray]]:
        """The codes of each document's FIELDS (an empty field has none)."""
        return self.encode_analysed([self.analyse_texts(document_texts(d)) for d in docs])

    def analyse_texts(self, texts: Sequence[str | None]) -> list[list[str] | None]:
        """Each of a document's FIELDS texts analysed (None for an empty one)."""
        return [self.analyzer.analyze(t) if t else None for t in texts]

    def encode_analysed(self, docs: Sequence[Sequence[Sequence[str] | None]]) -> list[dict[str, np.ndarray]]:
        """The codes of documents' FIELDS texts, analysed (analyse_texts): the codes encode_tokens
        gives field by field, the votes of all the documents' fields counted in one compiled pass
        (a batch of fewer than _COMPILED_MIN fields goes field by field: numba's import and the
        compiled code's load cost more than half a second, a small ingest's whole run)."""
        if sum(1 for tokens in docs for toks in tokens if toks) < _COMPILED_MIN:
            return [{f: code for f, toks in zip(FIELDS, tokens, strict=True)
                     if toks and (code := self.encode_tokens(f, list(toks))) is not None} for tokens in docs]
        from hybridsearch.hdc.kernel import bind_and_bundle  # numba, compiled (or loaded) on first use

        out: list[dict[str, np.ndarray]] = [{} for _ in docs]
        with self._vocab_lock:
            if len(self._vocab) > _VOCAB_MAX:
                self._vocab.clear()
            ids: list[int] = []
            starts, fields, ties = [0], [], []
            for tokens in docs:
                for f, toks in enumerate(tokens):
                    if not toks:
                        continue
                    distinct = dict.fromkeys(toks)
                    ids.extend(map(self._vocab.__getitem__, distinct))
                    starts.append(len(ids))
                    fields.append(f)
                    key = self._tie_key(distinct)
                    ties.append(TIE_BREAK if key is None else _tie_bytes(key))
            if not fields:
                return out
            codes = bind_and_bundle(self._vocab.table, np.array(ids), np.array(starts), np.array(fields),
                                    self._key_matrix, np.vstack(ties))
        row = 0
        for d, tokens in enumerate(docs):
            for f, toks in enumerate(tokens):
                if toks:
                    out[d][FIELDS[f]] = codes[row]
                    row += 1
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
