"""HDC codes encoded in a helper process a batch ahead (indexer.pipeline.HdcAhead): the same codes
and tokens as inline, and --strict still commits every batch before the bad record."""

from __future__ import annotations

import json

import pytest

from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.errors import ValidationError
from indexer.pipeline import ingest


def _corpus(path, n: int, bad_at: int | None = None):  # noqa: ANN001, ANN202
    with path.open("w") as f:
        for i in range(n):
            if i == bad_at:
                f.write('{"id": "broken", "title": 5}\n')
                continue
            f.write(json.dumps({"id": f"w{i}", "title": f"Sylow theorem {i} über Gödel’s", "text":
                                f"Subgroups of order p^{i % 7} in finite group number {i}. Heat-kernel bound."}) + "\n")
    return path


def _codes(engine: EmbeddedEngine) -> dict[str, tuple]:
    rows = engine.store.conn.execute("SELECT c.id, h.topic, h.claim, h.role, h.acts FROM hdc h"
                                     " JOIN chunks c ON c.label = h.label").fetchall()
    return {r[0]: r[1:] for r in rows}


def test_the_helper_process_gives_the_codes_and_tokens_inline_encoding_gives(tmp_path, monkeypatch) -> None:
    corpus = _corpus(tmp_path / "c.jsonl", 300)
    found = {}
    for helper in ("false", "true"):
        monkeypatch.setenv("HYBRIDSEARCH_INGEST_HDC_PROCESS", helper)
        with EmbeddedEngine(tmp_path / helper) as e:
            summary = ingest(e, corpus, batch_size=64, progress=False, graph=False)
            assert summary.indexed == 300
            ranked = e.bm25("sylow theorem 17 godel", k=300)
            found[helper] = (_codes(e), {i: round(s, 5) for i, s in zip(ranked.ids, ranked.scores, strict=True)},
                             e.bm25_index.field_stats())
    assert len(found["true"][0]) == 300 and found["true"] == found["false"]


def test_strict_stops_at_the_bad_record_with_the_batches_before_it_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HYBRIDSEARCH_INGEST_HDC_PROCESS", "true")
    corpus = _corpus(tmp_path / "c.jsonl", 300, bad_at=150)
    with EmbeddedEngine(tmp_path / "idx") as e:
        with pytest.raises(ValidationError) as err:
            ingest(e, corpus, batch_size=64, strict=True, progress=False, graph=False)
        # the batches of records 0-63 and 64-127 were written; the one holding the bad record not
        assert e.count() == 128 and len(_codes(e)) == 128
        assert "c.jsonl:151" in str(err.value) and "the 128 chunks before it are committed" in str(err.value)
