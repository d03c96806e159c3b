"""Math-aware text normalisation that runs before tokenizing (documents and queries alike)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from hybridsearch.errors import ConfigError

_DASHES = re.compile("[\u2010-\u2015\u2212\ufe58\ufe63\uff0d]")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "\u2032": "'", "\uff07": "'"})
_FOLD = str.maketrans({"ß": "ss", "ẞ": "SS", "ø": "o", "Ø": "O", "ł": "l", "Ł": "L", "æ": "ae", "Æ": "AE",
                       "œ": "oe", "Œ": "OE", "đ": "d", "Đ": "D", "ı": "i", "þ": "th", "ð": "d"})
_COMBINING = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
# invisible characters that text pasted from PDFs and web pages carries inside words: soft hyphen,
# zero-width joiners, direction marks and embeddings, word joiner, byte order mark; the zero-width
# space marks a break between words, so it is a space
_INVISIBLE = re.compile("[\u00ad\u200c-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]")
# \mathbb{R} or \mathbb R (an unbraced argument is one character, as in TeX): the argument alone
_TEX_WRAP = re.compile(r"\\(?:mathbb|mathrm|mathcal|mathbf|mathfrak|mathsf|mathit|operatorname"
                       r"|text|textrm|textbf|textit|emph)(?:\s*\{([^{}]*)\}|\s+([A-Za-z0-9]))")
_TEX_WORDS = re.compile(r"\\(ell|infty|alpha|beta|gamma|delta|epsilon|lambda|mu|pi|sigma|omega|zeta|ast)"
                        r"(?![A-Za-z])")
# a TeX word as the text spells it: \ell is ℓ (which NFKC makes l), \ast is *
_TEX_SPELT = {"ell": "l", "ast": "*"}
# L^∞ is L^\infty; the asterisk operator and the star operator (as PDFs write C*) are *
_SYMBOLS = str.maketrans({"\u221e": "infty", "\u2217": "*", "\u22c6": "*"})
_SUPERSCRIPT = re.compile(r"(?<![A-Za-z0-9])([A-Za-z])\^(?:\{([A-Za-z0-9*]{1,6})\}|([A-Za-z0-9*]))")
_BRACED_SUBSCRIPT = re.compile(r"(?<![A-Za-z0-9])([A-Za-z])_\{([A-Za-z0-9]{1,6})\}")  # L_{p} is L_p
_DEFAULT_LEXICON = "math_lexicon.txt"
_SPACES = re.compile(r"[^\S ]|  ")  # whitespace other than one space


def _translated(text: str, table: dict[int, str]) -> str:
    """text.translate(table), skipped when no character of the table is in the text (translate
    looks every character up: most of the time of normalising a long non-ASCII text)."""
    return text.translate(table) if any(chr(c) in text for c in table) else text


def unify_dashes(text: str) -> str:
    """Every dash and minus as "-" (one character for one)."""
    return _DASHES.sub("-", text)


def fold_diacritics(text: str) -> str:
    """Gödel -> Godel, Erdős -> Erdos, Łoś -> Los."""
    if text.isascii():
        return text
    text = _translated(text, _FOLD)
    return unicodedata.normalize("NFC", _COMBINING.sub("", unicodedata.normalize("NFKD", text)))


def _generic(text: str) -> str:
    if not text.isascii():  # ASCII is its own NFKC form and holds no dash, quote, letter or symbol to fold
        text = _INVISIBLE.sub("", text).replace("\u200b", " ")
        text = unicodedata.normalize("NFKC", text)
        text = _translated(unify_dashes(text), _QUOTES)
        text = _translated(fold_diacritics(text), _SYMBOLS)
    # each step's output is left alone by the steps before it, so that normalising twice gives
    # what normalising once does (a query's focus is normalised text analysed again)
    if "\\" in text:
        text = _TEX_WORDS.sub(lambda m: _TEX_SPELT.get(m.group(1), m.group(1)), text)
        text = _TEX_WRAP.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    if "$" in text:
        text = text.replace("$", "")
    if "_{" in text:
        text = _BRACED_SUBSCRIPT.sub(r"\1_\2", text)
    if "^" in text:
        text = _SUPERSCRIPT.sub(lambda m: m.group(1) + (m.group(2) or m.group(3)), text)
    return text


class Lexicon:
    """Variant -> canonical replacements, compiled into one case-insensitive regex."""

    def __init__(self, entries: dict[str, str]) -> None:
        """`entries`: variant, case-folded (as the regex compares: "ς" is "σ") -> canonical form."""
        self.entries = entries
        if entries:
            alternatives = sorted(entries, key=len, reverse=True)
            # a variant's words may be apart by any whitespace (text wrapped across lines)
            body = "|".join(re.escape(v).replace(r"\ ", r"\s+") for v in alternatives)
            self._regex: re.Pattern[str] | None = re.compile(
                rf"(?<![\w*])(?:{body})(?=s?(?![\w*]))", re.IGNORECASE)
            # a match needs a variant as a substring of the lowered text: testing that first is much
            # cheaper than the regex scan, which then runs only on texts that may match
            self._anchors = tuple(entries)
        else:
            self._regex = None

    @classmethod
    def load(cls, paths: Iterable[Path | str] = (), *, include_default: bool = True) -> Lexicon:
        texts: list[tuple[str, str]] = []
        if include_default:
            ref = resources.files("hybridsearch.analysis") / "data" / _DEFAULT_LEXICON
            texts.append((_DEFAULT_LEXICON, ref.read_text(encoding="utf-8")))
        for p in paths:
            try:
                texts.append((str(p), Path(p).read_text(encoding="utf-8-sig")))  # a BOM is not text
            except OSError as e:
                raise ConfigError(f"cannot read lexicon {p}: {e.strerror}") from e
            except UnicodeDecodeError as e:
                raise ConfigError(f"lexicon {p}: not UTF-8 (byte {e.start}: {e.reason})") from e
        entries: dict[str, str] = {}
        where: dict[str, tuple[str, int]] = {}  # variant -> the file and line that made it one
        for name, text in texts:
            for lineno, line in enumerate(text.splitlines(), 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                canonical, sep, variants = line.partition("=")
                canonical = _generic(canonical.strip()).lower()  # spelt as the text it replaces is
                if not sep or not canonical or not variants.strip():
                    raise ConfigError(f"{name}:{lineno}: expected 'canonical = variant | variant'")
                for v in variants.split("|"):
                    v = _generic(v.strip()).casefold()  # as the regex compares: "ς" is "σ"
                    if v and v != canonical:
                        # a later file overrides an earlier one (a user's lexicon, the bundled one);
                        # within one file a variant has one canonical form
                        if entries.get(v, canonical) != canonical and where[v][0] == name:
                            raise ConfigError(f"{name}:{lineno}: {v!r} is a variant of {entries[v]!r} already "
                                              f"({name}:{where[v][1]}); a variant has one canonical form")
                        entries[v], where[v] = canonical, (name, lineno)
        return cls(_chained(entries, where))

    @classmethod
    def from_env(cls) -> Lexicon:
        """The bundled lexicon plus the files HYBRIDSEARCH_LEXICON names (os.pathsep-separated)."""
        from hybridsearch.config import get_settings

        return cls.load([p for p in get_settings().lexicon.split(os.pathsep) if p])

    @property
    def fingerprint(self) -> str:
        """A short hash of the entries: an index records the one it was analysed with."""
        return hashlib.sha256(json.dumps(sorted(self.entries.items())).encode()).hexdigest()[:16]

    def apply(self, text: str) -> str:
        if self._regex is None:
            return text
        low = text.casefold()
        if _SPACES.search(low):  # the words of a variant may be apart by other whitespace
            low = " ".join(low.split())
        if not any(a in low for a in self._anchors):
            return text
        return self._regex.sub(lambda m: self.entries.get(_key(m.group(0)), m.group(0)), text)

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, canonical) of each variant in a pre-normalised text."""
        if self._regex is None:
            return []
        return [(m.start(), m.end(), c) for m in self._regex.finditer(text)
                if (c := self.entries.get(_key(m.group(0)))) is not None]

    def variants_of(self, canonical: str) -> list[str]:
        return sorted(v for v, c in self.entries.items() if c == canonical)


def _key(matched: str) -> str:
    """The entry a regex match stands for: case-folded, its words one space apart."""
    return " ".join(matched.casefold().split())


def _chained(entries: dict[str, str], where: dict[str, tuple[str, int]]) -> dict[str, str]:
    """Entries whose canonical form is itself a variant (`a = foo`, `foo = bar`) go to the end of
    the chain (bar -> a), so that every variant meets in one token and normalising is idempotent;
    a cycle is an error naming its lines."""
    out = {}
    for v, c in entries.items():
        seen = [v]
        while c in entries:
            if c in seen:
                raise ConfigError(f"lexicon entries form a cycle: {' -> '.join(seen + [c])} "
                                  f"({', '.join(f'{where[x][0]}:{where[x][1]}' for x in seen)})")
            seen.append(c)
            c = entries[c]
        out[v] = c
    return out


def prenormalize(text: str) -> str:
    """The generic rules alone (NFKC, dashes, quotes, diacritics, TeX, superscripts), no lexicon."""
    return _generic(text)


def normalize(text: str, lexicon: Lexicon) -> str:
    """NFKC, unified dashes and quotes, folded diacritics, unwrapped TeX, then the lexicon."""
    return lexicon.apply(_generic(text))
