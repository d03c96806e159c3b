from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError as PydanticValidationError

from hybridsearch.hdc import (
    DIM,
    FIELDS,
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
from hybridsearch.hdc import encoder as encoder_module
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


def test_unrelated_even_bundles_are_at_the_noise_floor() -> None:
    """Ties broken by a vector of the bundle's own tokens: unrelated 2-token fields sit at about
    0.50 similarity, where the scoring formula's 0.50 puts them (one fixed tie vector gave about
    0.625, a field score of 0.25 for nothing in common); equal token sets still give equal codes,
    and a shared token still shows."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(400)]
    for ties, lo, hi in (("content", 0.48, 0.52), ("fixed", 0.60, 0.65)):
        enc = HdcEncoder(ties=ties)
        sims = []
        for _ in range(100):
            a, b, c, d = rng.choice(words, 4, replace=False)
            sims.append(similarity(enc.encode_tokens("topic", [a, b]), enc.encode_tokens("topic", [c, d])))
        assert lo < float(np.mean(sims)) < hi, (ties, np.mean(sims))
    enc = HdcEncoder()
    assert np.array_equal(enc.encode_tokens("claim", ["b", "a"]), enc.encode_tokens("claim", ["a", "b", "a"]))
    assert similarity(enc.encode_tokens("claim", ["a", "b"]), enc.encode_tokens("claim", ["a", "c"])) > 0.6
    with pytest.raises(ValueError, match="ties 'random'; valid: content, fixed"):
        HdcEncoder(ties="random")


def test_an_index_keeps_the_ties_it_was_encoded_with(tmp_path) -> None:
    """A new index breaks ties by content; one whose stored options predate the choice keeps the
    fixed vector, so its stored codes and new queries are still encoded alike."""
    from hybridsearch.engines.embedded import EmbeddedEngine

    with EmbeddedEngine(tmp_path / "new") as e:
        assert e.hdc_encoder().ties == "content" and e.store.get_meta("hdc")["ties"] == "content"
    with EmbeddedEngine(tmp_path / "old") as e:
        e.store.set_meta("hdc", {"ngrams": False})  # as an index encoded before stored them
        e._hdc_encoder = None
        assert e.hdc_encoder().ties == "fixed" and e.store.hdc_options() == {"ngrams": False, "ties": "fixed"}


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
    # the misspelt token shares most of its 3-grams: its field score is well above the one shared token's
    assert field_score(sim_grams) > 1.3 * field_score(sim_plain) > 0


@pytest.mark.parametrize(("ngrams", "ties"), [(False, "content"), (True, "content"), (False, "fixed")])
def test_documents_encoded_together_get_the_codes_of_each_field_alone(ngrams: bool, ties: str, monkeypatch) -> None:
    """The compiled pass over a batch's fields gives, bit for bit, the codes encode_tokens gives
    field by field: odd and even token counts (ties), repeated tokens, empty fields, a field of
    600 distinct tokens (vote lanes emptied every 255), more tokens than the table first holds."""
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(3000)]
    docs: list[list[list[str] | None]] = []
    for n in range(60):
        doc: list[list[str] | None] = []
        for _ in FIELDS:
            size = int(rng.integers(0, 12)) if n % 3 else int(rng.integers(0, 600))
            doc.append([str(w) for w in rng.choice(words, size)] or None)
        docs.append(doc)
    docs.append([None, None, None, None])
    docs[0][1] = [f"x{i}" for i in range(600)]
    monkeypatch.setattr(encoder_module, "_COMPILED_MIN", 1)  # the compiled pass, even for this small batch
    enc = HdcEncoder(ngrams=ngrams, ties=ties)
    together = enc.encode_analysed(docs)
    for doc, codes in zip(docs, together, strict=True):
        alone = {f: enc.encode_tokens(f, toks) for f, toks in zip(FIELDS, doc, strict=True) if toks}
        assert codes.keys() == alone.keys()
        for f, code in codes.items():
            assert np.array_equal(code, alone[f]), f
    assert together[-1] == {}
