"""Golden analysis output: pins the tokenizer, the Porter stemmer and math normalisation."""

from __future__ import annotations

import hashlib
import json

import pytest

from hybridsearch.analysis import ANALYSIS_RULES, ENGLISH_STOPWORDS, Analyzer, Lexicon, analyze
from tests.conftest import DEMO

GOLDEN = [
    # seed steps: lowercase, whitespace split, edge punctuation, possessives, stopwords, Porter
    ("The Ponies' caresses, and running generalizations!", ["poni", "caress", "run", "gener"]),
    ("Euler's formula (e^{i pi}).", ["euler", "formula", "e^{i", "pi"]),
    ("relational databases are: conditionally effective", ["relat", "databas", "condition", "effect"]),
    # hyphenated: whole term kept, parts indexed too (whole first)
    ("self-adjoint operators", ["self-adjoint", "self", "adjoint", "oper"]),
    ("state-of-the-art IL-6", ["state-of-the-art", "state", "art", "il-6", "il", "6"]),
    # en dash and other dashes are unified with the hyphen
    ("Heine–Borel theorem", ["heine-borel", "hein", "borel", "theorem"]),
    ("Gauss—Bonnet", ["gauss-bonnet", "gauss", "bonnet"]),
    # diacritics folded
    ("Gödel and Erdős", ["godel", "erdo"]),
    ("Hölder’s inequality", ["holder", "inequ"]),
    ("Poincaré conjecture", ["poincar", "conjectur"]),
    # notation variants made equal
    ("C*-algebra", ["cstar-algebra", "cstar", "algebra"]),
    ("C^*-algebras", ["cstar-algebra", "cstar", "algebra"]),
    ("C-star algebra", ["cstar-algebra", "cstar", "algebra"]),
    ("L^2 and L2 and $L^2$ and L²", ["l2", "l2", "l2", "l2"]),
    (r"$\mathbb{R}^n$ vs R^n vs ℝⁿ", ["rn", "v", "rn", "v", "rn"]),
    ("Möbius strip, Moebius band", ["mobiu", "strip", "mobiu", "band"]),
    # edge punctuation only: internal punctuation stays
    ("cells/ml p<0.05", ["cells/ml", "p<0.05"]),
    ("", []),
    ("the of and", []),
    # the same TeX written several ways meets in one token
    (r"$L^\infty$ $L^{\infty}$ L^∞", ["linfti", "linfti", "linfti"]),
    (r"$\ell^2$ $\ell_2$ ℓ^2", ["l2", "l2", "l2"]),
    (r"C^\ast-algebra", ["cstar-algebra", "cstar", "algebra"]),
    # Porter stems a lone "s" to nothing: no empty token
    ("'s s’s s", []),
    ("vitamin s-adenosyl", ["vitamin", "s-adenosyl", "adenosyl"]),
    # invisible characters pasted from PDFs and web pages do not split or stick to words
    ("Brouwer\u200bHei\u00adne-Borel \ufeffcompact\u200e", ["brouwer", "heine-borel", "hein", "borel", "compact"]),
    # PDF asterisks, braced subscripts, unbraced \mathbb, capital sharp s
    ("C∗-algebra C⋆-algebra", ["cstar-algebra", "cstar", "algebra", "cstar-algebra", "cstar", "algebra"]),
    (r"$L_{p}$ $\ell_{2}$ x_{ij}", ["lp", "l2", "x_ij"]),
    (r"$\mathbb R^n$ and \mathrm dx", ["rn", "dx"]),
    ("STRAẞE Straße", ["strass", "strass"]),
    # a lexicon variant wrapped across lines is still the variant
    ("commutative C-star\nalgebra, real  n-space", ["commut", "cstar-algebra", "cstar", "algebra", "rn"]),
]


@pytest.mark.parametrize(("text", "expected"), GOLDEN)
def test_golden(text: str, expected: list[str]) -> None:
    assert analyze(text) == expected


# Texts whose tokens stand for the analysis rules: the demo corpus and its queries, and these. An
# index records ANALYSIS_RULES; when a change to analysis alters the digest, bump the rules (in
# hybridsearch/analysis/tokenizer.py) and pin the new digest under the new version.
RULES_SAMPLE = [text for text, _ in GOLDEN[:24]] + [
    r"$\ell^p$ spaces, \ell_\infty and $L^{p}$", r"$\mathcal{O}(n \log n)$ and O(n log n)", "x² + y² = z²",
    "ＦＵＬＬＷＩＤＴＨ Ｌ２", "zero\u200bwidth", "Cohen–Macaulay ring's depth", "p-adic Hodge theory", "SL(2,ℤ)",
    "Navier–Stokes existence", "1e-5 mg/kg", "Erdős–Rényi G(n, p)", r"$\sigma$-algebra and σ-algebras",
]
RULES_DIGESTS = {2: "9cdde4e7eb16e553", 3: "89af038ed3ad75f2"}


def test_a_change_to_the_analysis_rules_bumps_their_version() -> None:
    texts = list(RULES_SAMPLE)
    for name in ("corpus.jsonl", "queries.jsonl"):
        for line in (DEMO / name).read_text().splitlines():
            r = json.loads(line)
            texts += [r.get("title", ""), r["text"]]
    tokens = json.dumps([analyze(t) for t in texts], ensure_ascii=False)
    assert hashlib.sha256(tokens.encode()).hexdigest()[:16] == RULES_DIGESTS.get(ANALYSIS_RULES), (
        "analysis gives other tokens than these rules did: bump ANALYSIS_RULES and pin the digest")


def test_normalising_twice_is_normalising_once() -> None:
    # a query's focus is normalised text that is analysed again
    from hybridsearch.analysis.normalize import prenormalize

    for text in [t for t, _ in GOLDEN] + RULES_SAMPLE + [r"x_{i}^{2} bounds", r"\mathbb \ell^2", r"$\mathbb{R}^{n}$"]:
        once = prenormalize(text)
        assert prenormalize(once) == once, text
        assert analyze(once) == analyze(text), text


def test_stopwords_are_lucene_english_set() -> None:
    assert len(ENGLISH_STOPWORDS) == 33
    assert {"a", "the", "such", "will", "with", "into"} <= ENGLISH_STOPWORDS
    assert "which" not in ENGLISH_STOPWORDS


def test_documents_and_queries_share_analysis() -> None:
    a = Analyzer()
    assert a.analyze("C-star algebra") == a.analyze("C*-algebra") == a.analyze("C^*-algebra")


def test_user_lexicon_extends_the_default(tmp_path) -> None:
    extra = tmp_path / "mine.txt"
    extra.write_text("# my variants\nzfc = Zermelo-Fraenkel with choice\n")
    a = Analyzer(Lexicon.load([extra]))
    assert a.analyze("Zermelo-Fraenkel with choice") == ["zfc"]
    assert a.analyze("C-star algebra") == ["cstar-algebra", "cstar", "algebra"]


def test_bad_lexicon_line_names_file_and_line(tmp_path) -> None:
    from hybridsearch.errors import ConfigError

    bad = tmp_path / "bad.txt"
    bad.write_text("ok = fine\nno equals sign here\n")
    with pytest.raises(ConfigError, match=r"bad.txt:2"):
        Lexicon.load([bad])


def test_user_lexicons_as_people_write_them(tmp_path) -> None:
    """A BOM, a canonical form spelt with diacritics, a chain of entries, Greek letters whose case
    folding differs: each either works or is one error naming the file and line, never a
    traceback mid-ingest."""
    from hybridsearch.errors import ConfigError

    f = tmp_path / "mine.txt"
    f.write_bytes("\ufeff# saved by an editor that writes a BOM\nGödel = Goedel | Kurt-Goedel\n".encode())
    a = Analyzer(Lexicon.load([f], include_default=False))
    assert a.analyze("Gödel") == a.analyze("Goedel") == a.analyze("Kurt-Goedel") == ["godel"]
    f.write_text("a1 = foo\nfoo = bar\n")  # bar means foo, which means a1: all three meet
    lex = Lexicon.load([f], include_default=False)
    assert Analyzer(lex).analyze("a1 foo bar") == ["a1", "a1", "a1"]
    f.write_text("sigmaalg = σ-algebra\n")
    a = Analyzer(Lexicon.load([f], include_default=False))
    assert a.analyze("a σ-algebra and a ς-algebra") == ["sigmaalg", "sigmaalg"]
    assert a.analyze("a ς-algebra") == ["sigmaalg"]  # alone, too
    # a user's file overrides the bundled lexicon; within one file a variant has one canonical form
    f.write_text("lspace2 = L_2\n")
    assert Analyzer(Lexicon.load([f])).analyze("L_2") == ["lspace2"]
    f.write_text("x = foo\ny = foo\n")
    with pytest.raises(ConfigError, match=r"mine.txt:2: 'foo' is a variant of 'x' already \(.*mine.txt:1\)"):
        Lexicon.load([f], include_default=False)
    f.write_text("a = b\nb = a\n")
    with pytest.raises(ConfigError, match="lexicon entries form a cycle"):
        Lexicon.load([f], include_default=False)
    f.write_bytes(b"godel = G\xf6del\n")
    with pytest.raises(ConfigError, match=r"mine.txt: not UTF-8 \(byte 9"):
        Lexicon.load([f], include_default=False)


def test_joined_tokens_are_the_analysis_and_the_newest_texts_stay_remembered() -> None:
    from hybridsearch.analysis.tokenizer import _TEXTS_LIMIT

    a = Analyzer()
    for text, expected in GOLDEN:
        assert a.joined(text) == " ".join(expected) and Analyzer().analyze(text) == expected
    assert a.joined("") == "" and a.analyze("the of and") == []
    # tokens analysed elsewhere (the ingest's helper process) are taken as they were given
    for i in range(_TEXTS_LIMIT + 10):
        a.remember(f"text {i}", f"given{i} tokens")
    assert a.analyze(f"text {_TEXTS_LIMIT + 9}") == [f"given{_TEXTS_LIMIT + 9}", "tokens"]
    assert a.joined(f"text {_TEXTS_LIMIT - 100}") == f"given{_TEXTS_LIMIT - 100} tokens"  # the newer half kept
    assert a.joined("text 0") == "text 0" and len(a._texts) <= _TEXTS_LIMIT  # the oldest analysed again


def test_each_scored_field_as_both_engines_index_it() -> None:
    from hybridsearch.models import SCORED_FIELDS, Document
    from hybridsearch.scoring import EMPTY_FIELD_TOKEN, document_joined, document_tokens, indexed_joined

    a = Analyzer()
    doc = Document(id="x", title="Heine–Borel", text="Compact sets, running.", subjects=["Topology"])
    joined = document_joined(a, doc)
    assert list(joined) == list(SCORED_FIELDS)
    assert joined["title"] == ("heine-borel hein borel", 3) and joined["text"] == ("compact set run", 3)
    # a joined field holds its parts' tokens in order; an empty part adds nothing
    assert joined["title_text"] == ("heine-borel hein borel compact set run", 6)
    assert joined["subjects"] == ("topologi", 1) and joined["role"] == ("", 0)
    assert indexed_joined(*joined["role"]) == (EMPTY_FIELD_TOKEN, 1)
    assert indexed_joined(*joined["text"]) == joined["text"]
    assert document_joined(a, Document(id="y", text="Compact."))["title_text"] == ("compact", 1)
    assert document_tokens(a, doc, ("title_text", "role")) == {
        "title_text": ["heine-borel", "hein", "borel", "compact", "set", "run"], "role": []}
