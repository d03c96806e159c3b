"""Ingest progress: a total from a quick count of the input, and movement within a batch."""

from __future__ import annotations

import json

import numpy as np

from hybridsearch.models import Document
from indexer.pipeline import count_records, embed
from tests.conftest import DEMO


class CountingEncoder:
    name, dim = "counting", 4

    def __init__(self) -> None:
        self.calls = 0
        self.texts: list[str] = []  # every text encoded; a row's first value is its place here

    def encode(self, texts, *, batch_size=None, progress=False, query=False) -> np.ndarray:  # noqa: ANN001
        self.calls += 1
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        rows[:, 0] = np.arange(len(self.texts), len(self.texts) + len(texts))
        self.texts += texts
        return rows


def test_the_bar_moves_within_a_batch_and_each_chunk_gets_its_own_passages() -> None:
    docs = [Document(id=str(i), title=f"T{i}", text="One. Two!" if i % 2 else "x") for i in range(100)]
    seen: list[float] = []
    enc = CountingEncoder()
    vecs, passages = embed(enc, docs, seen.append)
    # 100 dense texts in slices of 16, then 250 passages in slices of 128
    assert vecs.shape == (100, 4) and enc.calls == 7 + 2
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == 9
    assert [enc.texts[int(v[0])] for v in vecs] == [d.dense_text for d in docs]
    assert [[enc.texts[int(r[0])] for r in p] for p in passages] == [d.passages for d in docs]
    assert docs[1].passages == ["T1", "One.", "Two!"] and docs[2].passages == ["T2", "x"]


def test_totals_come_from_a_quick_count(tmp_path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text("".join(json.dumps({"id": str(i), "title": "t"}) + "\n" for i in range(37)))
    (tmp_path / "notes").mkdir()
    for i in range(3):
        (tmp_path / "notes" / f"{i}.md").write_text("# T\nx")
    assert count_records(f) == 37 and count_records(tmp_path / "notes") == 3
    assert count_records(DEMO) == sum(1 for _ in (DEMO / "corpus.jsonl").open())
