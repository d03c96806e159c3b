"""The MRP-VM tokenizer: lowercase, whitespace split, edge punctuation, possessives, stopwords,
Porter stemming; hyphenated terms are kept whole and their parts are indexed too.

Field length: every emitted token counts, so "heat-kernel" adds three tokens (the whole term
and its two parts). Both engines index this exact token stream (OpenSearch through a
whitespace-only analyzer), so lengths and therefore BM25 scores agree.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

import Stemmer

from hybridsearch.analysis.normalize import Lexicon, normalize
from hybridsearch.analysis.stopwords import ENGLISH_STOPWORDS

EDGE_PUNCTUATION = string.punctuation + "\u201c\u201d\u2018\u2019\u00ab\u00bb\u2026\u00b7\u2022\u00bf\u00a1"
_CACHE_LIMIT = 400_000


class Analyzer:
    """Shared analysis for documents and queries. Thread-safe for reads; caches per raw token."""

    def __init__(self, lexicon: Lexicon | None = None) -> None:
        self.lexicon = lexicon if lexicon is not None else Lexicon.from_env()
        self._stemmer = Stemmer.Stemmer("porter")
        self._cache: dict[str, list[str]] = {}

    def normalize(self, text: str) -> str:
        return normalize(text, self.lexicon).lower()

    def analyze(self, text: str) -> list[str]:
        """Text -> the token stream the BM25 index holds."""
        out: list[str] = []
        cache = self._cache
        for raw in self.normalize(text).split():
            toks = cache.get(raw)
            if toks is None:
                if len(cache) > _CACHE_LIMIT:
                    cache.clear()
                toks = cache[raw] = self._token(raw)
            out.extend(toks)
        return out

    def analyze_many(self, texts: Iterable[str]) -> list[str]:
        out: list[str] = []
        for t in texts:
            out.extend(self.analyze(t))
        return out

    def _token(self, raw: str) -> list[str]:
        tok = raw.strip(EDGE_PUNCTUATION)
        if tok.endswith("'s"):
            tok = tok[:-2].rstrip(EDGE_PUNCTUATION)
        if not tok:
            return []
        terms = [tok]
        if "-" in tok:
            parts = [p.strip(EDGE_PUNCTUATION) for p in tok.split("-")]
            terms.extend(p for p in parts if p)
        return [self._stemmer.stemWord(t) for t in terms if t not in ENGLISH_STOPWORDS]


_default: Analyzer | None = None


def default_analyzer() -> Analyzer:
    """The process-wide analyzer with the bundled lexicon plus HYBRIDSEARCH_LEXICON files."""
    global _default
    if _default is None:
        _default = Analyzer()
    return _default


def analyze(text: str) -> list[str]:
    return default_analyzer().analyze(text)
