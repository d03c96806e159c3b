"""Dedup and diversity over a ranked candidate list (pure functions, best first in, best first out).

- by work: keep the best chunk of each work (`work_id`);
- near-duplicates: a chunk whose dense vector has cosine >= `near_duplicate` (default 0.82) with an
  already kept chunk is dropped. Measured on the demo corpus: its restated passages score 0.81-0.96
  against their originals and distinct units at most 0.814, while word overlap cannot tell them
  apart (token Jaccard 0.20-0.48 for restated pairs, up to 0.44 for distinct ones), so neither can
  shingles. A chunk without a vector is never called a duplicate;
- at most `per_page` chunks per (source, page), default 2 (VoiceVault);
- at most `per_author` / `per_venue` hits sharing an author / a venue (off by default);
- MMR on dense vectors: greedy argmax of lambda * relevance - (1 - lambda) * max cosine to picked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hybridsearch.models import DocInfo
from hybridsearch.scoring import minmax


def diversify(ids: Sequence[str], info: Mapping[str, DocInfo], *, vectors: Mapping[str, np.ndarray] | None = None,
              by_work: bool = True, near_duplicate: float | None = 0.82, per_page: int | None = 2,
              per_author: int | None = None, per_venue: int | None = None,
              limit: int | None = None) -> tuple[list[int], dict[str, int]]:
    """Positions to keep (in order, at most `limit`) and how many each rule dropped among the
    candidates it looked at."""
    keep: list[int] = []
    dropped: Counter[str] = Counter()
    works: set[str] = set()
    pages: Counter[tuple[str, int | None]] = Counter()
    authors: Counter[str] = Counter()
    venues: Counter[str] = Counter()
    vecs = vectors if near_duplicate is not None and vectors else {}
    dup_at = near_duplicate if near_duplicate is not None else float("inf")
    # kept vectors, row by row: each candidate costs one small matrix-vector product
    kept = np.empty((min(len(ids), limit or len(ids)), next(iter(vecs.values())).shape[0] if vecs else 0),
                    dtype=np.float32)
    n_kept = 0
    for i, id_ in enumerate(ids):
        if limit is not None and len(keep) >= limit:
            break
        d = info.get(id_)
        if d is None:
            keep.append(i)
            continue
        if by_work and d.work_id in works:
            dropped["work"] += 1
            continue
        v = vecs.get(id_)
        if v is not None and n_kept and float((kept[:n_kept] @ v).max()) >= dup_at:
            dropped["near_duplicate"] += 1
            continue
        if per_page is not None and d.source is not None and pages[(d.source, d.page)] >= per_page:
            dropped["per_page"] += 1
            continue
        if per_author is not None and any(authors[a] >= per_author for a in d.authors):
            dropped["per_author"] += 1
            continue
        if per_venue is not None and d.venue is not None and venues[d.venue] >= per_venue:
            dropped["per_venue"] += 1
            continue
        keep.append(i)
        works.add(d.work_id)
        if v is not None:
            kept[n_kept] = v
            n_kept += 1
        if d.source is not None:
            pages[(d.source, d.page)] += 1
        authors.update(d.authors)
        if d.venue is not None:
            venues[d.venue] += 1
    return keep, dict(dropped)


def mmr(ids: Sequence[str], relevance: Sequence[float], vector: Callable[[str], np.ndarray | None],
        k: int, lam: float = 0.7) -> list[int]:
    """Maximal marginal relevance over dense vectors; relevance is min-max normalised first.
    Candidates without a vector keep their relevance and never penalise others."""
    if not ids:
        return []
    vecs = {i: v for i in ids if (v := vector(i)) is not None}
    normed = minmax(dict(enumerate(relevance)))
    rel = [normed[i] for i in range(len(ids))]
    chosen: list[int] = []
    left = list(range(len(ids)))
    while left and len(chosen) < k:
        def gain(i: int) -> float:
            v = vecs.get(ids[i])
            sim = max((float(v @ vecs[ids[j]]) for j in chosen if v is not None and ids[j] in vecs), default=0.0)
            return lam * rel[i] - (1 - lam) * sim
        best = max(left, key=lambda i: (gain(i), -i))
        chosen.append(best)
        left.remove(best)
    return chosen
