"""Pruning and limits: pure functions over a fused ranking."""

from __future__ import annotations

from collections.abc import Sequence


def prune(scores: Sequence[float], *, ceiling: float, min_score: float = 0.0, gap: float = 0.0) -> list[int]:
    """Positions to keep, best first.

    - minScore: drop a hit whose score / ceiling (the fuser's maximum attainable score) is below
      `min_score`, so the threshold means the same for every fuser and engine;
    - confidence gap: drop a hit below top score x `gap`. The top hit always passes the gap test.
    """
    if not scores:
        return []
    top = scores[0]
    return [i for i, s in enumerate(scores)
            if (min_score <= 0 or ceiling <= 0 or s / ceiling >= min_score) and (gap <= 0 or i == 0 or s >= top * gap)]
