"""Query-side stages: math-alias variants, the IDF filter, and decomposition into sub-queries."""

from __future__ import annotations

import re
from collections.abc import Sequence

from hybridsearch.analysis import ENGLISH_STOPWORDS, Analyzer, default_analyzer
from hybridsearch.analysis.normalize import prenormalize
from hybridsearch.engines import TermStats
from hybridsearch.models import RankedList


def alias_variants(query: str, analyzer: Analyzer | None = None, limit: int = 2) -> list[str]:
    """Up to `limit` rewrites of the query, each swapping one matched notation variant for another
    form of it from the lexicon ("C-star algebra" -> "C*-algebra", ...). Lexical channels see the
    same canonical tokens either way; the dense channel sees different text."""
    an = analyzer or default_analyzer()
    text = prenormalize(query)
    out: list[str] = []
    for start, end, canonical in an.lexicon.find(text):
        for form in [*an.lexicon.variants_of(canonical), canonical]:
            if form != text[start:end].lower():
                candidate = text[:start] + form + text[end:]
                if candidate not in out:
                    out.append(candidate)
            if len(out) >= limit:
                return out
    return out


def keyword_variant(query: str) -> str:
    """The query without stopwords and edge punctuation, lowercased (VoiceVault's keyword form)."""
    words = [w.strip(".,;:!?()[]{}\"'") for w in query.lower().split()]
    return " ".join(w for w in words if w and w not in ENGLISH_STOPWORDS)


def idf_filter(terms: Sequence[str], stats: TermStats, min_idf: float) -> list[str]:
    """AICO: drop a term whose idf is below `min_idf`; keep terms the corpus has never seen."""
    info = stats.terms
    return [t for t in terms if t not in info or info[t].df == 0 or info[t].idf >= min_idf]


_SPLIT = re.compile(r"\s*(?:,|;|\band\b|\bvs\.?|\bversus\b|\bor\b|\bwith\b)\s*", re.IGNORECASE)


def decompose(query: str, threshold: int = 4, analyzer: Analyzer | None = None) -> list[str]:
    """Sub-queries of a query with at least `threshold` non-stop terms: its clauses (split on
    commas, semicolons, and/or/with/vs), or, with no such split, two halves of its terms."""
    an = analyzer or default_analyzer()
    terms = [w for w in query.split() if an.analyze(w)]
    if len(terms) < threshold:
        return [query]
    parts = [p for p in _SPLIT.split(query) if p and an.analyze(p)]
    if len(parts) >= 2:
        return parts
    half = len(terms) // 2
    return [" ".join(terms[:half]), " ".join(terms[half:])]


def merge_subqueries(results: Sequence[RankedList], k: int, bonus: float, channel: str) -> RankedList:
    """khive: sub-queries score on their own; a unit found by m of them keeps its best score times
    (1 + bonus * (m - 1)). With bonus 0 it is the best score per unit over several lists."""
    best: dict[str, float] = {}
    found: dict[str, int] = {}
    for rl in results:
        for id_, s in rl.items():
            best[id_] = max(s, best.get(id_, s))
            found[id_] = found.get(id_, 0) + 1
    scores = {d: s * (1 + bonus * (found[d] - 1)) for d, s in best.items()}
    order = sorted(scores, key=lambda d: (-scores[d], d))[:k]
    return RankedList.of(channel, order, [scores[d] for d in order])
