"""Lucene's English stop set (`EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`), OpenSearch's `_english_`."""

ENGLISH_STOPWORDS: frozenset[str] = frozenset([
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
])
