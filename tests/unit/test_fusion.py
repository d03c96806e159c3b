from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hybridsearch.models import RankedList
from query_service.fusion import RrfConfig, RrfFuser


def rl(channel: str, ids: list[str]) -> RankedList:
    return RankedList.of(channel, ids, [float(len(ids) - i) for i in range(len(ids))])


def test_rrf_formula_rank_one_in_two_lists() -> None:
    fused = RrfFuser().fuse({"bm25": rl("bm25", ["a", "b"]), "dense": rl("dense", ["a", "c"])}, 10)
    assert fused.ids[0] == "a"
    assert fused.scores[0] == 2 / 61
    assert fused.contributions[0] == {"bm25": 1 / 61, "dense": 1 / 61}
    assert abs(sum(fused.contributions[1].values()) - fused.scores[1]) < 1e-15


def test_duplicates_keep_best_score_and_weights_apply() -> None:
    dup = RankedList.of("bm25", ["x", "a", "x"], [3.0, 2.0, 5.0])
    fused = RrfFuser(RrfConfig(rrf_k=60, weights={"bm25": 2.0})).fuse({"bm25": dup}, 10)
    assert fused.ids == ["x", "a"] and fused.scores == [2 / 61, 2 / 62]


ids = st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8)


@given(ids, ids, st.integers(min_value=1, max_value=10))
def test_rrf_is_independent_of_input_order(a, b, k) -> None:
    one = RrfFuser().fuse({"x": rl("x", a), "y": rl("y", b)}, k)
    two = RrfFuser().fuse(dict(reversed(list({"x": rl("x", a), "y": rl("y", b)}.items()))), k)
    assert one == two
    assert one.scores == sorted(one.scores, reverse=True)


# -- weighted fusion and more properties -------------------------------------------------------
import math  # noqa: E402

import pytest  # noqa: E402

from query_service.fusion import (  # noqa: E402
    AgreementFuser,
    WeightedConfig,
    WeightedFuser,
    adaptive_rrf_k,
    normalize,
)


def scored(channel: str, pairs: dict[str, float]) -> RankedList:
    items = sorted(pairs.items(), key=lambda kv: -kv[1])
    return RankedList.of(channel, [d for d, _ in items], [s for _, s in items])


def test_minmax_of_a_single_hit_is_defined() -> None:
    assert normalize({"a": 3.7}, "minmax") == {"a": 1.0}
    assert normalize({"a": 3.7}, "zscore") == {"a": 0.5}
    assert normalize({"a": 3.7}, "l2") == {"a": 1.0}
    assert normalize({}, "minmax") == {}


def test_weighted_arithmetic_counts_missing_as_zero() -> None:
    lists = {"bm25": scored("bm25", {"a": 10.0, "b": 5.0, "c": 0.0}),
             "dense": scored("dense", {"b": 0.9, "d": 0.5})}
    f = WeightedFuser(WeightedConfig(weights={"bm25": 0.3, "dense": 0.7})).fuse(lists, 10)
    got = dict(zip(f.ids, f.scores, strict=True))
    assert got["a"] == pytest.approx(0.3 * 1.0)
    assert got["b"] == pytest.approx(0.3 * 0.5 + 0.7 * 1.0)
    assert got["d"] == pytest.approx(0.0) and got["c"] == pytest.approx(0.0)
    for cont, score in zip(f.contributions, f.scores, strict=True):
        assert sum(cont.values()) == pytest.approx(score)


@pytest.mark.parametrize("mean", ["geometric", "harmonic"])
def test_geometric_and_harmonic_skip_missing_lists(mean) -> None:
    lists = {"x": scored("x", {"a": 4.0, "b": 2.0, "c": 0.0}), "y": scored("y", {"a": 1.0, "b": 3.0, "c": 2.0})}
    f = WeightedFuser(WeightedConfig(mean=mean)).fuse(lists, 10)
    got = dict(zip(f.ids, f.scores, strict=True))
    # normalised: x a=1, b=0.5, c=0; y a=0, b=1, c=0.5
    expected_b = math.sqrt(0.5 * 1.0) if mean == "geometric" else 2 / (1 / 0.5 + 1 / 1.0)
    assert got["b"] == pytest.approx(expected_b)
    assert got["a"] == pytest.approx(1.0) and got["c"] == pytest.approx(0.5)
    for cont, score in zip(f.contributions, f.scores, strict=True):
        assert sum(cont.values()) == pytest.approx(score)


def test_adaptive_rrf_constant() -> None:
    assert adaptive_rrf_k([1000, 20]) == 60 and adaptive_rrf_k([100]) == 6 and adaptive_rrf_k([3]) == 1
    f = RrfFuser(RrfConfig(rrf_k=0)).fuse({"a": rl("a", ["x", "y"]), "b": rl("b", ["y"])}, 10)
    assert f.scores == [1 / 2 + 1 / 3, 1 / 2]  # k = 1 for lists this short: y is 2nd in a, 1st in b


def test_weights_must_be_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        RrfConfig(weights={"bm25": float("nan")})
    with pytest.raises(ValueError, match="finite"):
        WeightedConfig(weights={"bm25": -1.0})


def test_weights_whose_sum_overflows_are_refused() -> None:
    """Each finite, but their sum is not: the weighted mean divided by it and scored every hit 0."""
    from hybridsearch.errors import ValidationError
    from query_service.searcher import adhoc_profile

    with pytest.raises(ValueError, match="the weights sum to more than a float holds"):
        WeightedConfig(weights={"bm25": 1e308, "dense": 1e308})
    with pytest.raises(ValueError, match="the weights sum to more than a float holds"):
        RrfConfig(weights={"bm25": 1e308, "dense": 1e308})
    prof = adhoc_profile(["bm25", "dense"], "weighted")
    with pytest.raises(ValidationError, match="field 'fuser.weights': .*the weights sum to more than a float holds"):
        prof.with_overrides({"fuser.weights": {"bm25": 1e308, "dense": 1e308}})
    assert prof.with_overrides({"fuser.weights": {"bm25": 1e308}}).fuser_config["weights"] == {"bm25": 1e308}


fusers = st.sampled_from([RrfFuser(), WeightedFuser(), WeightedFuser(WeightedConfig(norm="zscore")),
                          WeightedFuser(WeightedConfig(mean="geometric"))])


@given(ids, ids, fusers)
def test_fusion_does_not_depend_on_list_order(a, b, fuser) -> None:
    one = fuser.fuse({"x": rl("x", a), "y": rl("y", b)}, 10)
    two = fuser.fuse({"y": rl("y", b), "x": rl("x", a)}, 10)
    assert one == two


@given(ids.filter(lambda x: len(x) >= 2), st.data())
def test_a_better_rank_never_lowers_the_rrf_score(a, data) -> None:
    i = data.draw(st.integers(min_value=1, max_value=len(a) - 1))
    promoted = a[:i - 1] + [a[i]] + [a[i - 1]] + a[i + 1:]
    other = rl("y", ["q", a[i]])
    before = dict(zip(*_ids_scores(RrfFuser().fuse({"x": rl("x", a), "y": other}, 20)), strict=True))
    after = dict(zip(*_ids_scores(RrfFuser().fuse({"x": rl("x", promoted), "y": other}, 20)), strict=True))
    assert after[a[i]] >= before[a[i]]


def _ids_scores(f):
    return f.ids, f.scores


def test_agreement_of_one_list_is_its_normalised_score() -> None:
    f = AgreementFuser().fuse({"bm25": scored("bm25", {"a": 4.0, "b": 1.0})}, 10)
    assert f.scores == [1.0, 0.25] and f.contributions[1] == {"bm25": 0.25}


@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=30),
       st.floats(min_value=0.0, max_value=1.0))
def test_gap_pruning_never_drops_the_top_hit(raw, gap) -> None:
    from query_service.pruning import prune

    scores = sorted(raw, reverse=True)
    keep = prune(scores, ceiling=max(scores[0], 1e-9), gap=gap)
    assert keep[0] == 0 and keep == sorted(keep)
    assert all(scores[i] >= scores[0] * gap for i in keep)


def test_gap_pruning_keeps_a_negative_top_hit() -> None:
    """Raw cosines of a dense-only search can all be below 0; top x gap then lies above the top,
    and the top hit failed its own test, so every hit went."""
    from query_service.pruning import prune

    assert prune([-0.0017, -0.002, -0.01], ceiling=1.0, gap=0.5) == [0]
    assert prune([-0.0017, -0.002], ceiling=1.0, gap=0.0) == [0, 1]  # min_score 0 drops nothing


def test_rrf_ranks_equal_scores_by_id_not_by_list_position() -> None:
    a = RankedList.of("bm25", ["zeta", "beta", "alpha"], [1.0, 1.0, 1.0])
    b = RankedList.of("bm25", ["alpha", "zeta", "beta"], [1.0, 1.0, 1.0])
    fa, fb = (RrfFuser(RrfConfig()).fuse({"bm25": rl}, 3) for rl in (a, b))
    assert fa.ids == fb.ids == ["alpha", "beta", "zeta"]


def test_degenerate_fuser_parameters_are_refused() -> None:
    """All-zero agreement weights ranked by id; an overflowing ceiling emptied every search that
    prunes (every score divided by inf is 0); an RRF constant of 1e30 made every score equal."""
    from query_service.fusion import AgreementConfig

    with pytest.raises(ValueError, match="both 0"):
        AgreementConfig(primary_weight=0, secondary_weight=0)
    with pytest.raises(ValueError, match="more than a float holds"):
        AgreementConfig(primary_weight=1e308, secondary_weight=1e308)
    with pytest.raises(ValueError, match="less than or equal to 1000000"):
        RrfConfig(rrf_k=10**30)
    assert AgreementConfig(primary_weight=0).secondary_weight == 0.7


def test_rescored_bm25_that_overflows_is_an_error_not_a_dropped_hit() -> None:
    from hybridsearch.errors import QueryError
    from hybridsearch.scoring import rescore_bm25

    # a's term frequency times k1 + 1 is inf, and so is its length norm: inf / inf is NaN
    tokens = {"a": {"text": ["x"] * 40}, "b": {"text": ["x"]}}
    args = ([("x", 1.0)], {"text": 1.0}, tokens, 2, {"text": 2.0}, lambda f, t: 2, 10, "most_fields", 0.2)
    assert {i for i, _ in rescore_bm25(*args, k1=1.5, b=0.75)} == {"a", "b"}
    with pytest.raises(QueryError, match="overflow"):
        rescore_bm25(*args, k1=1e308, b=0.75)
