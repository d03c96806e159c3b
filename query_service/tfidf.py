"""khive's multi-signal TF-IDF scorer as a lexical channel, `tfidf-multisignal`.

score = sum over query terms t of idf(t) * (5.0 exact(t, name) + 3.0 tf(t, name)
        + 1.5 tf(t, description) + 1.25 tf(t, tags) + 1.0 tf(t, content) + 2.0 bigram(t, name))
        * coverage ^ 0.5

Our fields: name = title, description = text, tags = subjects, content = the other text fields
(procedure, condition, utility_acts, utility_note, role). tf is the term's count over the field's
length; exact(t, name) is 1 when the name's tokens are exactly the query's; bigram(t, name) is 1
when t and the next query term stand next to each other in the name; idf = ln((N+1)/(df+1)) + 1
over the whole corpus; coverage is the share of query terms the unit contains. Expansion terms
(from query variants) count with weight `expand_discount`. Candidates are the top `candidates`
BM25 units. With `rerank` and dense vectors: final = 0.7 * score / max score + 0.3 * cosine.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, ClassVar

from pydantic import Field

from hybridsearch.analysis import default_analyzer
from hybridsearch.engines import LexicalSearch, Reader, VectorSearch
from hybridsearch.errors import UnsupportedCapabilityError
from hybridsearch.models import Document, RankedList
from query_service.channels import ChannelConfig, QueryContext
from query_service.stages import decompose, merge_subqueries

CONTENT_FIELDS = ("procedure", "condition", "utility_acts", "utility_note", "role")


class TfidfConfig(ChannelConfig):
    w_exact_name: float = Field(default=5.0, ge=0.0)
    w_name: float = Field(default=3.0, ge=0.0)
    w_description: float = Field(default=1.5, ge=0.0)
    w_tags: float = Field(default=1.25, ge=0.0)
    w_content: float = Field(default=1.0, ge=0.0)
    w_bigram: float = Field(default=2.0, ge=0.0)
    coverage_alpha: float = Field(default=0.5, ge=0.0)
    expand_discount: float = Field(default=0.35, ge=0.0, le=1.0)
    candidates: int = Field(default=200, ge=1, le=10_000)
    rerank: bool = True
    rerank_alpha: float = Field(default=0.7, ge=0.0, le=1.0)
    decompose: bool = False
    decompose_threshold: int = Field(default=4, ge=2)
    intersection_bonus: float = Field(default=0.25, ge=0.0)


def _tf(counts: Counter[str], length: int, t: str) -> float:
    return counts[t] / length if length else 0.0


class TfidfChannel:
    name: ClassVar[str] = "tfidf-multisignal"
    Config = TfidfConfig

    def __init__(self, config: TfidfConfig | None = None) -> None:
        self.config = config or TfidfConfig()

    def retrieve(self, query: QueryContext, engine: Reader, k: int) -> RankedList:
        if not isinstance(engine, LexicalSearch):
            raise UnsupportedCapabilityError("the tfidf-multisignal channel needs an engine with lexical search")
        c = self.config
        parts = decompose(query.text, c.decompose_threshold) if c.decompose else [query.text]
        if len(parts) == 1:
            rl = self._one(query.text, query, engine, k)
        else:
            rl = merge_subqueries([self._one(p, query, engine, k) for p in parts], k, c.intersection_bonus,
                                  self.name)
        if c.rerank and rl.ids and isinstance(engine, VectorSearch):
            cos = engine.vector_score(query.vector, rl.ids)
            if cos:
                top = rl.scores[0] or 1.0
                final = {d: c.rerank_alpha * s / top + (1 - c.rerank_alpha) * cos.get(d, 0.0) for d, s in rl.items()}
                order = sorted(final, key=lambda d: (-final[d], d))
                return RankedList.of(self.name, order, [final[d] for d in order])
        return rl

    def _one(self, text: str, query: QueryContext, engine: Any, k: int) -> RankedList:
        c = self.config
        an = default_analyzer()
        q_terms = an.analyze(text)
        weights = {t: 1.0 for t in q_terms}
        for v in query.variants:
            for t in an.analyze(v):
                weights.setdefault(t, c.expand_discount)
        if not weights:
            return RankedList.of(self.name, [], [])
        cand = engine.bm25(list(weights.items()), None, c.candidates, query.filters).ids
        docs: dict[str, Document] = engine.get(cand)
        stats = engine.term_stats(list(weights))
        n = stats.num_docs
        idf = {t: math.log((n + 1) / (s.df + 1)) + 1 for t, s in stats.terms.items()}
        bigrams = set(zip(q_terms, q_terms[1:], strict=False))
        scores: dict[str, float] = {}
        for id_, d in docs.items():
            name = an.analyze(d.title)
            fields = {"name": name, "description": an.analyze(d.text), "tags": an.analyze_many(d.subjects),
                      "content": an.analyze_many(getattr(d, f) for f in CONTENT_FIELDS)}
            counts = {f: Counter(v) for f, v in fields.items()}
            lengths = {f: len(v) for f, v in fields.items()}
            exact = 1.0 if name and name == q_terms else 0.0
            name_pairs = set(zip(name, name[1:], strict=False))
            present = set().union(*counts.values())
            total = 0.0
            for t, w in weights.items():
                bigram = 1.0 if any(a == t and (a, b) in name_pairs for a, b in bigrams) else 0.0
                total += w * idf[t] * (c.w_exact_name * exact + c.w_name * _tf(counts["name"], lengths["name"], t)
                                       + c.w_description * _tf(counts["description"], lengths["description"], t)
                                       + c.w_tags * _tf(counts["tags"], lengths["tags"], t)
                                       + c.w_content * _tf(counts["content"], lengths["content"], t)
                                       + c.w_bigram * bigram)
            coverage = sum(1 for t in weights if t in present) / len(weights)
            score = total * coverage ** c.coverage_alpha
            if score > 0:
                scores[id_] = score
        order = sorted(scores, key=lambda d: (-scores[d], d))[:k]
        return RankedList.of(self.name, order, [scores[d] for d in order])
