"""Ingest progress: a total from a quick count of the input, and movement within a batch."""

from __future__ import annotations

import json

import numpy as np

from hybridsearch.config import get_settings
from hybridsearch.models import Document
from indexer.pipeline import _TRUNCATED_CHARS, PIECE_CHARS, count_records, embed
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
    docs = [Document(id=str(i), title=f"T{i}", text=("One sentence of some length here. " * (i % 40)) + "Two!")
            for i in range(100)]
    seen: list[float] = []
    enc = CountingEncoder()
    vecs, passages, _ = embed(enc, docs, seen.append)
    # dense texts and passages are one queue, longest first, encoded in pieces of about PIECE_CHARS
    read = sum(min(len(t), _TRUNCATED_CHARS) for d in docs for t in [d.dense_text, *d.passages])
    assert vecs.shape == (100, 4) and enc.calls == len(seen) >= read // PIECE_CHARS
    assert [len(t) for t in enc.texts] == sorted((len(t) for t in enc.texts), reverse=True)
    assert seen == sorted(seen) and seen[-1] == 1.0
    assert [enc.texts[int(v[0])] for v in vecs] == [d.dense_text for d in docs]
    assert [[enc.texts[int(r[0])] for r in p] for p in passages] == [d.passages for d in docs]
    assert docs[1].passages == ["T1", "One sentence of some length here.", "Two!"]


def test_pooled_passages_come_from_the_chunks_own_pass_and_those_past_its_window_alone(
        encoder, monkeypatch) -> None:
    long = " ".join(f"Sentence {i} says that compact sets are closed and bounded." for i in range(60))
    docs = [Document(id="a", title="", text="Brouwer fixed point theorem."),
            Document(id="b", title="Heine-Borel", text=long)]
    monkeypatch.setattr(get_settings(), "passage_vectors", "pooled")
    vecs, passages, _ = embed(encoder, docs)
    monkeypatch.setattr(get_settings(), "passage_vectors", "separate")
    alone_vecs, alone, _ = embed(encoder, docs)
    assert (vecs * alone_vecs).sum(axis=1).min() > 0.9999  # the chunks' own vectors are the same
    assert [len(p) for p in passages] == [len(d.passages) for d in docs] == [1, 61]
    assert np.allclose(np.linalg.norm(np.vstack(passages), axis=1), 1.0, atol=1e-5)
    # the only sentence of "a", pooled from its tokens without [CLS] and [SEP]: near, not equal
    assert 0.9 < float(passages[0][0] @ vecs[0]) < 0.9999
    # "b" reads about 20 of its 60 sentences within 256 word pieces: those are pooled, the rest alone
    same = (passages[1] * alone[1]).sum(axis=1) > 0.9999
    assert 30 < same.sum() < 60 and not same[:10].any() and same[-1]


def test_totals_come_from_a_quick_count(tmp_path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text("".join(json.dumps({"id": str(i), "title": "t"}) + "\n" for i in range(37)))
    (tmp_path / "notes").mkdir()
    for i in range(3):
        (tmp_path / "notes" / f"{i}.md").write_text("# T\nx")
    assert count_records(f) == 37 and count_records(tmp_path / "notes") == 3
    assert count_records(DEMO) == sum(1 for _ in (DEMO / "corpus.jsonl").open())
