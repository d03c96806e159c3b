"""Rule-based intent: 30 phrasings pinned, with the focus that finds citation seeds."""

from __future__ import annotations

import pytest

from hybridsearch.errors import QueryError
from query_service.intent import RuleIntentClassifier, given

TABLE = [
    # lookup: names, statements, how-to questions
    ("Heine-Borel theorem statement", "lookup", "Heine-Borel theorem statement"),
    ("fundamental group of the circle $S^1$ is the integers", "lookup", None),
    ("Poincare conjecture proof by Perelman using Ricci flow", "lookup", None),
    ("how to compute Gaussian curvature of a parametrized surface", "lookup", None),
    ("C-star algebra definition and examples", "lookup", None),
    ("a bounded entire function must be constant", "lookup", None),
    ("Godel incompleteness theorem", "lookup", None),
    # survey
    ("foundational results on compactness", "survey", "compactness"),
    ("overview of the different notions of curvature on Riemannian manifolds", "survey",
     "the different notions of curvature on Riemannian manifolds"),
    ("main tools of algebraic topology for telling spaces apart", "survey",
     "algebraic topology for telling spaces apart"),
    ("a survey of spectral graph theory", "survey", "spectral graph theory"),
    ("introduction to measure theory", "survey", "measure theory"),
    ("overview of methods for testing whether a number is prime", "survey", None),
    # compare: the focus keeps both sides
    ("Gaussian curvature vs Ricci curvature", "compare", "Gaussian curvature vs Ricci curvature"),
    ("difference between connected and path connected spaces", "compare", None),
    ("simplicial homology versus singular homology", "compare", None),
    ("de Rham cohomology compared with singular cohomology", "compare", None),
    ("how does a Hilbert space differ from a Banach space", "compare", None),
    ("Markov inequality vs. Chebyshev inequality", "compare", None),
    # prereq
    ("what to read before the Gauss-Bonnet theorem", "prereq", "the Gauss-Bonnet theorem"),
    ("what do I need before the Tietze extension theorem", "prereq", "the Tietze extension theorem"),
    ("background needed for Urysohn lemma and Tietze extension", "prereq", "Urysohn lemma and Tietze extension"),
    ("prerequisites for the Seifert van Kampen theorem", "prereq", "the Seifert van Kampen theorem"),
    ("What should I know before Galois theory?", "prereq", "Galois theory"),
    ("what to learn before the central limit theorem", "prereq", "the central limit theorem"),
    ("background needed to understand RSA encryption", "prereq", "RSA encryption"),
    # related
    ("results similar to Brouwer fixed point theorem", "related", "Brouwer fixed point theorem"),
    ("theorems related to Lagrange's theorem on subgroup orders", "related", "Lagrange's theorem on subgroup orders"),
    ("consequences of the Cauchy integral formula", "related", "the Cauchy integral formula"),
    ("statements equivalent to the axiom of choice", "related", "the axiom of choice"),
    ("papers similar to Shannon's mathematical theory of communication", "related",
     "Shannon's mathematical theory of communication"),
    # everyday openings: an article, a question, a width or dash the keyboard chose
    ("what should I know about the Brouwer fixed point theorem", "lookup", None),
    ("What do I need to know about compactness", "lookup", None),
    ("what should I read to understand the Nash embedding theorem", "prereq", "the Nash embedding theorem"),
    ("An introduction to knot invariants", "survey", "knot invariants"),
    ("The history of the four colour theorem", "survey", "the four colour theorem"),
    ("a brief overview of ergodic theory", "survey", "ergodic theory"),
    ("What are the main results of Hodge theory?", "survey", "Hodge theory"),
    ("Which papers are similar to Turing's paper on computable numbers?", "related",
     "Turing's paper on computable numbers"),
    ("Lebesgue integral ｖｓ Riemann integral", "compare", "Lebesgue integral vs Riemann integral"),
    ("\ufb01nd papers similar to the Banach fixed point theorem", "related", "the Banach fixed point theorem"),
    ("show me the papers similar to the Banach fixed point theorem", "related", "the Banach fixed point theorem"),
    ("list the generalizations of Brouwer's fixed point theorem", "related", "Brouwer's fixed point theorem"),
    ("please list the corollaries of the Baire category theorem", "related", "the Baire category theorem"),
    ("The variants of BRCA1 increase cancer risk", "lookup", None),  # a statement, not a framing
    ("the papers related to BRCA1", "related", "BRCA1"),
    ("The results similar to Fermat's little theorem", "related", "Fermat's little theorem"),
    ("related to $x_{i}^{2}$ bounds", "related", "$x_{i}^{2}$ bounds"),  # the focus as typed
    ("trade\u2011offs of direct and iterative solvers", "compare", None),
]


def test_the_table_has_at_least_thirty_phrasings_and_every_intent() -> None:
    assert len(TABLE) >= 30
    assert {row[1] for row in TABLE} == {"lookup", "survey", "compare", "prereq", "related"}


@pytest.mark.parametrize(("query", "intent", "focus"), TABLE, ids=[row[0][:40] for row in TABLE])
def test_rule_intent(query: str, intent: str, focus: str | None) -> None:
    got = RuleIntentClassifier().classify(query)
    assert got.name == intent, got
    if focus is not None:
        assert got.focus == focus, got


def test_given_intent_keeps_the_focus_and_rejects_unknown_names() -> None:
    got = given("results similar to Brouwer fixed point theorem", "prereq", RuleIntentClassifier())
    assert (got.name, got.focus, got.rule) == ("prereq", "Brouwer fixed point theorem", "given")
    with pytest.raises(QueryError, match="intent must be one of lookup, survey, compare, prereq, related"):
        given("x", "tutorial", RuleIntentClassifier())


RECENCY = [
    ("recent advances in knot theory", "recent advances"),
    ("a survey of the latest results on prime gaps", "the latest results"),
    ("state-of-the-art methods for sparse linear systems", "state-of-the-art methods"),
    ("the state of the art in graph minors", "the state of the art in"),
    ("papers from the last ten years on graph minors", "papers from the last ten years"),
    ("an up to date survey of expander graphs", "up to date survey"),
    ("I would like to find more recent material on root isolation", "recent material"),
    ("current research on the Riemann hypothesis", "current research"),
    # words of recency inside a statement or a name are content, and so is a date
    ("Incidence of heart failure increased by 10% in women since 1979.", None),
    ("Patients with recent myocardial infarction have higher mortality.", None),
    ("A recent study found that aspirin lowers the risk.", None),
    ("Recently, vitamin D was shown to help.", None),
    ("in the last 20 years mortality decreased by 30%", None),
    ("New findings suggest that the effect is small.", None),
    ("latest start time in critical path scheduling", None),
    ("most recent common ancestor of two species", None),
    ("a new proof of the four colour theorem", None),
    ("Heine-Borel theorem statement", None),
]


@pytest.mark.parametrize(("query", "phrase"), RECENCY, ids=[row[0][:40] for row in RECENCY])
def test_recency_is_found_whatever_the_intent(query: str, phrase: str | None) -> None:
    got = RuleIntentClassifier().classify(query)
    assert got.recency == phrase, got
    assert given(query, "survey", RuleIntentClassifier()).recency == phrase
