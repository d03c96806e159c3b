"""The one place for scoring formulas: Lucene's BM25 idf, exact BM25 rescoring, min-max and top-k.

Both engines call `rescore_bm25` for BM25 with k1/b other than the index's (1.2/0.75): the engine
supplies candidate token lists and its corpus statistics, this module supplies the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from hybridsearch.analysis import Analyzer
from hybridsearch.errors import QueryError
from hybridsearch.models import JOINED_FIELDS, SCORED_FIELDS, Bm25Mode, Document

# An empty scored field is indexed as this one token on both engines, so that every document has
# every field: Lucene then counts documents and average lengths per field over all documents, as
# tantivy does (Lucene counts only the documents that have the field). It is never a query term.
EMPTY_FIELD_TOKEN = "\ue000"
K = TypeVar("K", bound=Hashable)


def document_joined(analyzer: Analyzer, doc: Document, fields: Sequence[str] = SCORED_FIELDS
                    ) -> dict[str, tuple[str, int]]:
    """A chunk's analysed tokens per scored field, joined by single spaces, and how many: what both
    engines index and BM25 counts. A joined field (JOINED_FIELDS) holds its parts' tokens, one
    after the other. An empty field is ("", 0) (`indexed_joined` gives what is indexed for it)."""
    own: dict[str, tuple[str, int]] = {}

    def joined(f: str) -> tuple[str, int]:
        got = own.get(f)
        if got is None:
            if f in JOINED_FIELDS:
                parts = [p for p in map(joined, JOINED_FIELDS[f]) if p[1]]
                got = (" ".join(s for s, _ in parts), sum(n for _, n in parts))
            else:
                s = (" ".join(j for j in map(analyzer.joined, doc.subjects) if j) if f == "subjects"
                     else analyzer.joined(getattr(doc, f)))
                got = (s, s.count(" ") + 1 if s else 0)
            own[f] = got
        return got

    return {f: joined(f) for f in fields}


def indexed_joined(joined: str, n: int) -> tuple[str, int]:
    """What an engine indexes for one scored field of `n` tokens joined by spaces, and its length:
    the tokens, or the placeholder alone when there are none."""
    return (joined, n) if n else (EMPTY_FIELD_TOKEN, 1)


def document_tokens(analyzer: Analyzer, doc: Document, fields: Sequence[str] = SCORED_FIELDS) -> dict[str, list[str]]:
    """document_joined's tokens as lists (BM25 rescoring counts them)."""
    return {f: s.split(" ") if n else [] for f, (s, n) in document_joined(analyzer, doc, fields).items()}


def bm25_idf(num_docs: int, df: int) -> float:
    """Lucene's BM25 idf: ln(1 + (N - df + 0.5) / (df + 0.5)); 0 for an empty corpus."""
    return math.log(1 + (num_docs - df + 0.5) / (df + 0.5)) if num_docs else 0.0


def merge_term_weights(terms: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Query terms with weights; a repeated term adds its weights (the placeholder is dropped)."""
    weights: dict[str, float] = {}
    for t, w in terms:
        if t != EMPTY_FIELD_TOKEN:
            weights[t] = weights.get(t, 0.0) + w
    return weights


def rescore_bm25(terms: Sequence[tuple[str, float]], fields: Mapping[str, float],
                 tokens: Mapping[str, Mapping[str, Sequence[str]]], num_docs: int,
                 avg_len: Mapping[str, float], doc_freq: Callable[[str, str], int], k: int,
                 mode: Bm25Mode, tie_breaker: float, k1: float, b: float) -> list[tuple[str, float]]:
    """Exact BM25 of candidates, in the (k1+1) scale of Lucene's classic BM25 and tantivy: per field,
    sum_t w_t idf(t) tf (k1+1) / (tf + k1 (1 - b + b dl/avgdl)); `most_fields` sums the weighted
    fields, `best_fields` takes the best plus tie_breaker times the rest. `tokens` maps candidate id
    to its analysed tokens per field; `doc_freq(field, term)` and `avg_len` are corpus statistics
    over `num_docs` documents. Returns the top k (id, score) with score > 0, ties by id."""
    weights = merge_term_weights(terms)
    active = {f: fw for f, fw in fields.items() if fw > 0 and avg_len.get(f, 0.0) > 0}
    idf = {(f, t): bm25_idf(num_docs, doc_freq(f, t)) for f in active for t in weights}
    out: dict[str, float] = {}
    for id_, per_doc in tokens.items():
        per_field = []
        for f, fw in active.items():
            toks = per_doc.get(f) or ()
            if not toks:
                continue
            counts: dict[str, int] = {}
            for tok in toks:
                if tok in weights:
                    counts[tok] = counts.get(tok, 0) + 1
            norm = k1 * (1 - b + b * len(toks) / avg_len[f])
            per_field.append(fw * sum(weights[t] * idf[(f, t)] * tf * (k1 + 1) / (tf + norm)
                                      for t, tf in counts.items()))
        if per_field:
            best = max(per_field)
            out[id_] = best + tie_breaker * (sum(per_field) - best) if mode == "best_fields" else sum(per_field)
    if not all(math.isfinite(s) for s in out.values()):  # a NaN would fail `s > 0` and drop the best hits
        raise QueryError("these BM25 parameters make a score overflow (not a finite number); use smaller values "
                         "(bm25.k1, field weights)")
    return top_k([(i, s) for i, s in out.items() if s > 0], k)


def minmax(scores: Mapping[K, float]) -> dict[K, float]:
    """(s - min) / (max - min) over the values; 1.0 for all when they are equal (a single one included)."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    return {d: 1.0 if hi == lo else (s - lo) / (hi - lo) for d, s in scores.items()}


def unzip(pairs: Sequence[tuple[str, float]]) -> tuple[list[str], list[float]]:
    """(ids, scores) from (id, score) pairs."""
    return [p[0] for p in pairs], [p[1] for p in pairs]


def top_k(items: Sequence[tuple[str, float]], k: int) -> list[tuple[str, float]]:
    """The k best (id, score) pairs, ties broken by id."""
    return sorted(items, key=lambda x: (-x[1], x[0]))[:k]
