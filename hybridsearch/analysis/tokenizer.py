"""The MRP-VM tokenizer: lowercase, whitespace split, edge punctuation, possessives, stopwords,
Porter stemming; hyphenated terms are kept whole and their parts are indexed too.

Field length: every emitted token counts, so "heat-kernel" adds three tokens (the whole term
and its two parts). Both engines index this exact token stream (OpenSearch through a
whitespace-only analyzer), so lengths and therefore BM25 scores agree. A term longer than the
whitespace tokenizer's 255 UTF-16 code units is emitted in the pieces that tokenizer cuts it into.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from itertools import chain, islice

import Stemmer

from hybridsearch.analysis.normalize import Lexicon, normalize
from hybridsearch.analysis.stopwords import ENGLISH_STOPWORDS

EDGE_PUNCTUATION = string.punctuation + "\u201c\u201d\u2018\u2019\u00ab\u00bb\u2026\u00b7\u2022\u00bf\u00a1"
_CACHE_LIMIT = 400_000
# texts whose tokens are kept (the older half dropped when full): an ingest batch analyses each of its texts
# twice, for the HDC codes and for BM25, and a few thousand texts span a batch
_TEXTS_LIMIT = 8192
# Lucene's whitespace tokenizer (OpenSearch's `max_token_length`, default 255) ends a token once
# it holds this many UTF-16 code units, and goes on with the rest of the word as the next token
MAX_TOKEN_UNITS = 255
# The version of these rules. An index records the version its tokens and HDC codes were made with;
# bump it whenever analyze() gives other tokens for some text. 1: before indexes recorded it;
# 2: TeX \ell, \ast, \infty and braced superscripts meet their plain forms, and no token is empty;
# 3: invisible characters (soft hyphen, zero-width joiners, direction marks) dropped and a zero-width
# space read as a space, braced subscripts and unbraced \mathbb R unwrapped, ∗ and ⋆ read as *,
# ẞ folded, lexicon variants matched across line breaks.
RULES = 3


class Analyzer:
    """Shared analysis for documents and queries. Thread-safe for reads; caches per raw token."""

    def __init__(self, lexicon: Lexicon | None = None) -> None:
        self.lexicon = lexicon if lexicon is not None else Lexicon.from_env()
        self._stemmer = Stemmer.Stemmer("porter")
        self._cache: dict[str, list[str]] = {}
        self._texts: dict[str, str] = {}  # text -> its tokens joined by single spaces

    def normalize(self, text: str) -> str:
        return normalize(text, self.lexicon).lower()

    def analyze(self, text: str) -> list[str]:
        """Text -> the token stream the BM25 index holds (a new list each call)."""
        joined = self.joined(text)
        return joined.split(" ") if joined else []

    def joined(self, text: str) -> str:
        """The tokens of `text` joined by single spaces (no token holds whitespace), as an engine
        indexes them: the form this analyzer keeps for the texts it analysed last."""
        done = self._texts.get(text)
        if done is None:
            words = self.normalize(text).split()
            cache = self._cache
            if len(cache) > _CACHE_LIMIT:
                cache.clear()
            for raw in set(words).difference(cache):
                cache[raw] = self._token(raw)
            try:
                done = " ".join(chain.from_iterable(map(cache.__getitem__, words)))
            except KeyError:  # another thread emptied the cache meanwhile
                done = " ".join(t for w in words for t in self._token(w))
            self.remember(text, done)
        return done

    def remember(self, text: str, joined: str) -> None:
        """Keep `joined` (tokens joined by single spaces) as the analysis of `text` (analyze and
        joined give it without analysing again): for tokens analysed elsewhere, by this analyzer's
        rules."""
        texts = self._texts
        if len(texts) >= _TEXTS_LIMIT:
            # the older half dropped at once: popping the oldest one at a time scans the slots
            # emptied before it, thousands once the dict is full
            try:
                texts = self._texts = dict(islice(texts.items(), _TEXTS_LIMIT // 2, None))
            except RuntimeError:  # another thread changed the dict meanwhile
                texts = self._texts = {}
        texts[text] = joined

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
        # Porter stems "s" to nothing: no empty token (OpenSearch's whitespace split drops it, so
        # field lengths would differ between engines, and the HDC channel would encode it)
        return [p for t in terms if t not in ENGLISH_STOPWORDS
                for p in _pieces(self._stemmer.stemWord(t)) if p]


def _pieces(term: str) -> list[str]:
    """The term as Lucene's whitespace tokenizer cuts it: a piece ends when it reaches
    MAX_TOKEN_UNITS UTF-16 code units (256 when a surrogate pair crosses the mark)."""
    if 2 * len(term) < MAX_TOKEN_UNITS:
        return [term]
    out: list[str] = []
    start = units = 0
    for i, ch in enumerate(term):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units >= MAX_TOKEN_UNITS:
            out.append(term[start:i + 1])
            start, units = i + 1, 0
    if start < len(term):
        out.append(term[start:])
    return out


_default: Analyzer | None = None


def default_analyzer() -> Analyzer:
    """The process-wide analyzer with the bundled lexicon plus HYBRIDSEARCH_LEXICON files."""
    global _default
    if _default is None:
        _default = Analyzer()
    return _default


def analyze(text: str) -> list[str]:
    return default_analyzer().analyze(text)
