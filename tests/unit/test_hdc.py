from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError as PydanticValidationError

from hybridsearch.hdc import (
    DIM,
    TIE_BREAK,
    HdcEncoder,
    HdcWeights,
    bind,
    bundle,
    combine,
    field_score,
    random_hv,
    similarity,
)
from hybridsearch.models import Document

keys = st.text(min_size=1, max_size=20)


@given(keys, keys)
def test_bind_is_its_own_inverse(a: str, b: str) -> None:
    x, y = random_hv(a), random_hv(b)
    assert np.array_equal(bind(bind(x, y), y), x)
    assert np.array_equal(bind(x, x), np.zeros_like(x))


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=1, max_value=64), st.integers(min_value=0, max_value=10_000))
def test_bundle_is_closer_to_members_than_to_fresh_vectors(n: int, seed: int) -> None:
    members = [random_hv(f"m{seed}-{i}") for i in range(n)]
    b = bundle(members)
    fresh = [random_hv(f"f{seed}-{i}") for i in range(20)]
    nearest_fresh = max(similarity(b, f) for f in fresh)
    assert min(similarity(b, m) for m in members) > nearest_fresh


@given(keys, keys)
def test_random_vectors_are_near_half(a: str, b: str) -> None:
    if a != b:
        assert abs(similarity(random_hv(a), random_hv(b)) - 0.5) <= 0.04


def test_similarity_of_random_pairs_has_the_expected_spread() -> None:
    sims = [similarity(random_hv(f"a{i}"), random_hv(f"b{i}")) for i in range(400)]
    assert abs(np.mean(sims) - 0.5) < 0.002
    assert abs(np.std(sims) - 0.5 / math.sqrt(DIM)) < 0.002  # sigma = 0.0078


def test_even_bundles_break_ties_with_the_fixed_vector() -> None:
    a, b = random_hv("a"), random_hv("b")
    bits = np.unpackbits(bundle([a, b]))
    ua, ub, ut = np.unpackbits(a), np.unpackbits(b), np.unpackbits(TIE_BREAK)
    agree = ua == ub
    assert np.array_equal(bits[agree], ua[agree]) and np.array_equal(bits[~agree], ut[~agree])
    assert np.array_equal(bundle([a, b]), bundle([b, a]))


def test_a_bundle_of_more_than_65535_vectors_is_their_majority() -> None:
    """Per-bit counts past 65,535 ones (a field of some 131k distinct tokens) stay exact: the bundle
    is the true majority vote, not a near-random vector from a wrapped count."""
    rng = np.random.default_rng(0)
    mat = rng.integers(0, 256, size=(140_001, 512), dtype=np.uint8)  # an odd count: no ties
    mat[:, 0] = 0xFF  # the first 8 bits: 140,001 ones each
    counts = np.unpackbits(mat, axis=1).sum(axis=0, dtype=np.int64)
    expected = np.packbits(2 * counts > len(mat))
    assert np.array_equal(bundle(mat), expected)


def test_field_score_and_renormalised_combination() -> None:
    assert field_score(0.5) == 0.0 and field_score(0.4) == 0.0 and field_score(0.75) == 0.5
    w = HdcWeights()
    all4 = {"topic": 1.0, "claim": 1.0, "role": 0.5, "acts": 0.5}
    assert combine(all4, w) == pytest.approx(0.35 + 0.35)
    # role and acts absent on one side: the remaining weights are renormalised
    assert combine({"topic": 0.75, "claim": 0.5}, w) == pytest.approx(0.35 * 0.5 / 0.70)
    assert combine({}, w) == 0.0


@pytest.mark.parametrize("bad", [{"topic": -0.1}, {"claim": float("nan")}, {"acts": float("inf")}])
def test_weights_are_validated(bad) -> None:
    with pytest.raises(PydanticValidationError):
        HdcWeights(**bad)


def test_document_and_query_encoding() -> None:
    enc = HdcEncoder()
    doc = enc.encode_document(Document(id="1", title="Gödel incompleteness theorem",
                                       text="A consistent formal system cannot prove its own consistency."))
    assert set(doc) == {"topic", "claim"}  # empty role and acts get no code at all
    q = enc.encode_query("Godel incompleteness")
    assert set(q) == {"topic", "claim"}
    assert similarity(q["topic"], doc["topic"]) > 0.6
    other = enc.encode_document(Document(id="2", title="Sylow theorems", text="p-subgroups exist."))
    assert similarity(q["topic"], other["topic"]) < similarity(q["topic"], doc["topic"])
    assert set(enc.encode_query("x", role="theorem", acts="prove")) == {"topic", "claim", "role", "acts"}
    # field binding: the same tokens under different field keys are unrelated (three tokens: an
    # odd bundle has no ties, and ties, going to the one fixed vector, correlate short bundles)
    q3 = enc.encode_query("Godel incompleteness proof")
    assert abs(similarity(q3["topic"], q3["claim"]) - 0.5) < 0.05
    assert similarity(q["topic"], q["claim"]) == pytest.approx(0.75, abs=0.03)


def test_character_trigrams_bring_spelling_variants_together() -> None:
    plain, grams = HdcEncoder(), HdcEncoder(ngrams=True)
    a, b = "Lebesgue integral", "Lebesque integral"
    sim_plain = similarity(plain.encode_query(a)["topic"], plain.encode_query(b)["topic"])
    sim_grams = similarity(grams.encode_query(a)["topic"], grams.encode_query(b)["topic"])
    assert sim_grams > sim_plain + 0.05
