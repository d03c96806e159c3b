"""Text analysis shared by documents and queries on every engine."""

from hybridsearch.analysis.normalize import Lexicon, fold_diacritics, normalize
from hybridsearch.analysis.stopwords import ENGLISH_STOPWORDS
from hybridsearch.analysis.tokenizer import RULES as ANALYSIS_RULES
from hybridsearch.analysis.tokenizer import Analyzer, analyze, default_analyzer

__all__ = ["ANALYSIS_RULES", "ENGLISH_STOPWORDS", "Analyzer", "Lexicon", "analyze", "default_analyzer",
           "fold_diacritics", "normalize"]
