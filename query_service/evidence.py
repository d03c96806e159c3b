"""Evidence packing (khive's fold, MathFoundry's evidence pack): a greedy knapsack under a token
budget.

Candidates are taken in order of score x category_weight x epistemic_weight, where the category
is a passage's first subject and the epistemic weight comes from its kind (definitions and
theorems outrank remarks). Each candidate's priority is multiplied by (1 - diversity_bias) for
every already packed passage of the same category. Constraints: at most `max_per_work` passages
per work; before anything else, one passage from each of the best `min_unique_works` works
(budget allowing); and, when a candidate is an exact match (every token of its title appears in
the query), the best such one is packed first. Token counts are words x 4/3, a common estimate
for English under subword tokenizers. Each item carries a `[Source: file, p.N]` marker (the work
id when there is no file); the pack carries the citation map.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hybridsearch.analysis import Analyzer, default_analyzer
from hybridsearch.models import Document

EPISTEMIC_DEFAULTS = {"definition": 1.0, "theorem": 1.0, "lemma": 0.95, "procedure": 0.95, "survey": 0.9,
                      "example": 0.85, "counterexample": 0.85, "history": 0.7, "remark": 0.7}


class EvidenceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_budget: int = Field(default=1200, ge=1)
    candidates: int = Field(default=40, ge=1, description="how many of the top hits the packer considers")
    max_per_work: int = Field(default=2, ge=1)
    min_unique_works: int = Field(default=3, ge=0)
    diversity_bias: float = Field(default=0.15, ge=0.0, le=1.0, allow_inf_nan=False)
    category_weights: dict[str, float] = Field(default_factory=dict)
    epistemic_weights: dict[str, float] = Field(default_factory=lambda: dict(EPISTEMIC_DEFAULTS))

    @field_validator("category_weights", "epistemic_weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        for k, w in v.items():
            if not math.isfinite(w) or w < 0:
                raise ValueError(f"weight of {k!r} must be a finite number >= 0")
        return v


class EvidenceItem(BaseModel):
    id: str
    work_id: str
    citation: int
    marker: str
    score: float
    priority: float
    tokens: int
    exact_match: bool
    text: str


class Citation(BaseModel):
    index: int
    id: str
    work_id: str
    title: str
    source: str | None
    page: int | None


class EvidencePack(BaseModel):
    items: list[EvidenceItem]
    citation_map: list[Citation]
    tokens: int
    budget: int


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.split()) * 4 / 3)


def marker(d: Document) -> str:
    where = d.source or d.work_id
    return f"[Source: {where}, p.{d.page}]" if d.page is not None else f"[Source: {where}]"


def pack(query: str, ids: Sequence[str], scores: Sequence[float], docs: Mapping[str, Document],
         config: EvidenceConfig | None = None, analyzer: Analyzer | None = None) -> EvidencePack:
    c = config or EvidenceConfig()
    an = analyzer or default_analyzer()
    q_tokens = set(an.analyze(query))
    cands = []
    for id_, score in list(zip(ids, scores, strict=True))[:c.candidates]:
        d = docs.get(id_)
        if d is None:
            continue
        category = d.subjects[0].lower() if d.subjects else ""
        title_tokens = set(an.analyze(d.title))
        exact = bool(title_tokens) and title_tokens <= q_tokens
        prio = (score * c.category_weights.get(category, 1.0)
                * c.epistemic_weights.get((d.kind or "").lower(), 1.0))
        text = f"{d.title}\n{d.text}".strip()
        cands.append((id_, d, score, prio, category, exact, text, estimate_tokens(text)))
    picked: list[int] = []
    used = 0
    per_work: Counter[str] = Counter()
    per_cat: Counter[str] = Counter()

    def take(i: int) -> bool:
        nonlocal used
        _, d, _, _, cat, _, _, n = cands[i]
        if i in picked or used + n > c.token_budget or per_work[d.work_id] >= c.max_per_work:
            return False
        picked.append(i)
        used += n
        per_work[d.work_id] += 1
        per_cat[cat] += 1
        return True

    def order() -> list[int]:
        left = [i for i in range(len(cands)) if i not in picked]
        return sorted(left, key=lambda i: (-cands[i][3] * (1 - c.diversity_bias) ** per_cat[cands[i][4]], i))

    exacts = [i for i in order() if cands[i][5]]
    if exacts:
        take(exacts[0])
    while len(per_work) < c.min_unique_works:
        fresh = [i for i in order() if cands[i][1].work_id not in per_work]
        if not any(take(i) for i in fresh):
            break
    while True:
        if not any(take(i) for i in order()):
            break
    picked.sort(key=lambda i: -cands[i][3])
    items, cmap = [], []
    for n, i in enumerate(picked, 1):
        id_, d, score, prio, _, ex, text, toks = cands[i]
        items.append(EvidenceItem(id=id_, work_id=d.work_id, citation=n, marker=marker(d), score=score,
                                  priority=prio, tokens=toks, exact_match=ex, text=text))
        cmap.append(Citation(index=n, id=id_, work_id=d.work_id, title=d.title, source=d.source, page=d.page))
    return EvidencePack(items=items, citation_map=cmap, tokens=used, budget=c.token_budget)
