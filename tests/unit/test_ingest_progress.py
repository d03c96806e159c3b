"""Ingest progress: a total from a quick count of the input, and movement within a batch."""

from __future__ import annotations

import json

import numpy as np

from hybridsearch.models import Document
from indexer.pipeline import _embed, count_records
from tests.conftest import DEMO


class CountingEncoder:
    name, dim = "counting", 4

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, texts, *, batch_size=None, progress=False, query=False) -> np.ndarray:  # noqa: ANN001
        self.calls += 1
        return np.ones((len(texts), self.dim), dtype=np.float32)


def test_the_bar_moves_within_a_batch() -> None:
    docs = [Document(id=str(i), title="t", text="x") for i in range(100)]
    seen: list[float] = []
    enc = CountingEncoder()
    vecs = _embed(enc, docs, seen.append)
    assert vecs.shape == (100, 4) and enc.calls == 7  # slices of 16
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == 7


def test_totals_come_from_a_quick_count(tmp_path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text("".join(json.dumps({"id": str(i), "title": "t"}) + "\n" for i in range(37)))
    (tmp_path / "notes").mkdir()
    for i in range(3):
        (tmp_path / "notes" / f"{i}.md").write_text("# T\nx")
    assert count_records(f) == 37 and count_records(tmp_path / "notes") == 3
    assert count_records(DEMO) == sum(1 for _ in (DEMO / "corpus.jsonl").open())
