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
