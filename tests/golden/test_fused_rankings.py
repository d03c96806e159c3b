"""Golden fused rankings on a small fixture (values checked by hand in the comments)."""

from __future__ import annotations

import pytest

from hybridsearch.models import RankedList
from query_service.fusion import AgreementFuser, RrfConfig, RrfFuser, WeightedConfig, WeightedFuser

LISTS = {
    "bm25": RankedList.of("bm25", ["d1", "d2", "d3", "d4"], [12.0, 9.0, 4.5, 3.0]),
    "dense": RankedList.of("dense", ["d3", "d1", "d5"], [0.82, 0.74, 0.61]),
    "hdc": RankedList.of("hdc", ["d2", "d5", "d1"], [0.31, 0.22, 0.2]),
}

GOLDEN = {
    # d1 = 1/61 + 1/62 + 1/63
    "rrf": (RrfFuser(), [("d1", 0.048395), ("d2", 0.032522), ("d3", 0.032266), ("d5", 0.032002), ("d4", 0.015625)]),
    "rrf bm25 x2": (RrfFuser(RrfConfig(weights={"bm25": 2.0})),
                    [("d1", 0.064789), ("d2", 0.048652), ("d3", 0.048139), ("d5", 0.032002), ("d4", 0.03125)]),
    # d2 = (bm25 (9-3)/(12-3) + dense 0 + hdc 1) / 3
    "minmax arithmetic": (WeightedFuser(), [("d2", 0.555556), ("d1", 0.539683), ("d3", 0.388889),
                                            ("d5", 0.060606), ("d4", 0.0)]),
    "zscore arithmetic": (WeightedFuser(WeightedConfig(norm="zscore")),
                          [("d1", 0.544026), ("d2", 0.47642), ("d3", 0.359267), ("d5", 0.19766), ("d4", 0.079974)]),
    "l2 geometric": (WeightedFuser(WeightedConfig(norm="l2", mean="geometric")),
                     [("d2", 0.638246), ("d1", 0.590124), ("d5", 0.497605), ("d3", 0.428258), ("d4", 0.188144)]),
    # d2 = 2 / (1/0.667 + 1/1), the missing dense list skipped
    "minmax harmonic": (WeightedFuser(WeightedConfig(mean="harmonic")),
                        [("d2", 0.8), ("d1", 0.764706), ("d3", 0.285714), ("d5", 0.181818), ("d4", 0.0)]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden(name: str) -> None:
    fuser, expected = GOLDEN[name]
    fused = fuser.fuse(LISTS, 10)
    assert fused.ids == [d for d, _ in expected]
    assert fused.scores == pytest.approx([s for _, s in expected], abs=1e-6)
    for parts, score in zip(fused.contributions, fused.scores, strict=True):
        assert sum(parts.values()) == pytest.approx(score)


def test_golden_agreement() -> None:
    # d1 = 1.0 + 0.7 * 0.2/0.31 + 0.15; d2 = 9/12 + 0.7 + 0.15
    fused = AgreementFuser().fuse({"bm25": LISTS["bm25"], "hdc": LISTS["hdc"]}, 10)
    assert list(zip(fused.ids, [round(s, 6) for s in fused.scores], strict=True)) == [
        ("d1", 1.601613), ("d2", 1.6), ("d5", 0.496774), ("d3", 0.375), ("d4", 0.25)]
