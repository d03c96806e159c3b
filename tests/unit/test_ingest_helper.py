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


def test_a_script_without_the_main_guard_runs_once(tmp_path) -> None:
    """The helper is a new interpreter, not a multiprocessing child: that one would import the
    caller's __main__ again and run a script's top-level code a second time (here: a line added to
    a file; it could as well be an rmtree of the index being written)."""
    import subprocess
    import sys

    corpus = _corpus(tmp_path / "c.jsonl", 300)
    marker = tmp_path / "ran.txt"
    script = tmp_path / "script.py"
    script.write_text(f"""
import hybridsearch
with open({str(marker)!r}, "a") as f:
    f.write("ran\\n")
with hybridsearch.create({str(tmp_path / "idx")!r}) as index:
    print(index.ingest({str(corpus)!r}, embed=False).indexed)
""")
    import os

    env = {**os.environ, "HYBRIDSEARCH_INGEST_HDC_PROCESS": "true"}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["300"] and marker.read_text() == "ran\n"
    assert "Traceback" not in out.stderr and "helper process ended" not in out.stderr, out.stderr


def test_a_helper_that_dies_is_replaced_by_encoding_here(caplog, monkeypatch) -> None:
    from hybridsearch.hdc import HdcEncoder
    from hybridsearch.models import Document
    from indexer.pipeline import HdcAhead

    monkeypatch.setenv("HYBRIDSEARCH_INGEST_HDC_PROCESS", "true")
    encoder = HdcEncoder()
    docs = [Document(id=f"d{i}", title=f"Sylow theorem {i}", text="Subgroups of prime-power order.") for i in range(40)]
    inline = HdcAhead(encoder, None)._codes(docs, None)
    ahead = HdcAhead.start(encoder, None, 10)
    try:
        assert ahead._helper is not None
        ahead._helper._proc.kill()  # gone before the batch is sent
        ahead._helper._proc.wait()
        ((_, _, codes),) = list(ahead.batches(iter([docs]), _Report()))
        with caplog.at_level("WARNING"):
            got = codes()
    finally:
        ahead.close()
    assert "the HDC helper process ended; encoding HDC codes in this process" in caplog.text
    assert ahead._helper is None
    assert {i: {f: c.tobytes() for f, c in v.items()} for i, v in got.items()} == \
        {i: {f: c.tobytes() for f, c in v.items()} for i, v in inline.items()}


class _Report:
    loaded = 0
    rejected: list = []
