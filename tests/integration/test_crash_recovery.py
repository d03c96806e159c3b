"""Kill a writer process in the middle of a batch; after reopening, every acknowledged document
is searchable in every channel (BM25, dense, HDC) and no half-written document is visible."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from hybridsearch.engines.embedded import EmbeddedEngine

BATCH = 300

WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from hybridsearch.engines.embedded import EmbeddedEngine, engine as engine_mod
    from hybridsearch.engines.embedded import store as store_mod, bm25 as bm25_mod
    from hybridsearch.models import Document

    path, first, pause_in = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    BATCH = {batch}

    def vecs(b):
        v = np.random.default_rng(b).normal(size=(BATCH, 384)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def docs(b):
        return [Document(id=f"b{{b}}-{{i}}", title=f"batch {{b}} item {{i}}",
                         text=f"uniq{{b}}x{{i}} shared words here", subjects=["crash"], year=1990)
                for i in range(BATCH)]

    if pause_in == "sqlite":      # stall inside the SQLite transaction, half the batch inserted
        real = store_mod.hash_text
        calls = [0]
        def slow(text):
            calls[0] += 1
            if calls[0] == BATCH // 2:
                print("PAUSED", flush=True); time.sleep(60)
            return real(text)
        store_mod.hash_text = slow
    elif pause_in == "bm25":      # stall after SQLite commit, tantivy documents added, no commit
        real_add = bm25_mod.Bm25Index._to_tantivy
        count = [0]
        def slow_add(self, label, d):
            count[0] += 1
            if count[0] == BATCH // 2:
                print("PAUSED", flush=True); time.sleep(60)
            return real_add(self, label, d)
        bm25_mod.Bm25Index._to_tantivy = slow_add

    e = EmbeddedEngine(path)
    enc = e.hdc_encoder()
    b = first
    while True:
        batch = docs(b)
        e.write(batch, vecs(b), [enc.encode_document(d) for d in batch])
        print(f"ACK {{b}}", flush=True)
        b += 1
""").format(batch=BATCH)


def _vec(b: int, i: int) -> np.ndarray:
    v = np.random.default_rng(b).normal(size=(BATCH, 384)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v[i]


def _run_and_kill(path, first: int, pause_in: str, acks_wanted: int) -> list[int]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(first), pause_in],
                            stdout=subprocess.PIPE, text=True)
    acked: list[int] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("ACK"):
                acked.append(int(line.split()[1]))
                if pause_in == "none" and len(acked) >= acks_wanted:
                    time.sleep(0.05)  # somewhere inside the next batch
                    break
            elif line.startswith("PAUSED"):
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return acked


@pytest.mark.integration
@pytest.mark.slow
def test_kill_mid_batch_loses_nothing_acknowledged(tmp_path) -> None:
    path = tmp_path / "idx"
    acked: list[int] = []
    first = 0
    lagged = False
    for pause_in in ("none", "sqlite", "bm25", "none"):
        acked += _run_and_kill(path, first, pause_in, acks_wanted=2)
        applied = json.loads((path / "bm25" / "applied.json").read_text())["seq"]
        import sqlite3

        with sqlite3.connect(path / "store.sqlite") as c:
            journal = c.execute("SELECT max(seq) FROM journal").fetchone()[0]
        lagged |= journal > applied
        first = (max(acked) + 1 if acked else 0) + 1  # never reuse a possibly half-written batch
    assert lagged, "no round left the derived indexes behind the journal"
    assert len(acked) >= 4

    with EmbeddedEngine(path) as e:
        stored = {i for i, _ in e.store.conn.execute("SELECT id, 1 FROM chunks")}
        batches = {int(i.split("-")[0][1:]) for i in stored}
        # all-or-nothing per batch: a batch is either fully present or absent
        for b in batches:
            assert sum(1 for i in stored if i.startswith(f"b{b}-")) == BATCH
        assert set(acked) <= batches
        e.knn(_vec(0, 0), 1)  # the vector indexes open when a search needs them
        e.hamming(dict.fromkeys(("topic", "claim"), e.hdc_encoder().encode_query("x")["topic"]), 1)
        stats = e.stats().as_dict()
        assert stats["bm25_docs"] == stats["documents"] == stats["vectors"] == stats["dense_vectors"]
        assert stats["hdc_codes"] == stats["hdc_indexed"]["claim"] == stats["hdc_indexed"]["topic"] == len(stored)
        enc = e.hdc_encoder()
        for b in sorted(batches):
            for i in (0, BATCH // 2, BATCH - 1):
                doc_id = f"b{b}-{i}"
                assert e.bm25(f"uniq{b}x{i}", k=1).ids == [doc_id]
                assert e.knn(_vec(b, i), 1).ids == [doc_id]
                code = enc.encode_document(e.get([doc_id])[doc_id])["claim"]
                assert e.hamming({"claim": code}, 1)["claim"].ids == [doc_id]
                assert e.get([doc_id])[doc_id].title == f"batch {b} item {i}"
        assert len(e.bm25("shared", k=100_000).ids) == len(stored)


OWNER = textwrap.dedent("""
    import sys
    import numpy as np
    from hybridsearch.engines.embedded import EmbeddedEngine
    from hybridsearch.models import Document

    engine = EmbeddedEngine(sys.argv[1])
    print("owner" if engine.owner else "not owner", flush=True)
    for line in sys.stdin:  # one document per line: written (and applied, being the owner) at once
        if line.strip() == "?":  # a query: applies what other processes committed
            engine.refresh()
            print("refreshed", flush=True)
            continue
        v = np.random.default_rng(len(line)).normal(size=(1, 384)).astype(np.float32)
        engine.write([Document(id=line.strip(), title=f"{line.strip()}word", text="late arrival")], v)
        print("written", flush=True)
    engine.close()
""")


@pytest.mark.integration
def test_a_process_opening_while_the_owner_writes_sees_every_document(tmp_path, monkeypatch) -> None:
    """Another process commits (and, as the owner, applies) while this one opens the index: this
    one neither refuses the index as "built from another store" nor loses the document."""
    from hybridsearch.engines.embedded.store import Store
    from hybridsearch.models import Document

    idx = tmp_path / "idx"
    EmbeddedEngine(idx).close()
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(idx)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert owner.stdout is not None and owner.stdin is not None
        assert owner.stdout.readline().strip() == "owner"
        owner.stdin.write("first\n")
        owner.stdin.flush()
        assert owner.stdout.readline().strip() == "written"
        pending = ["during-open", "afteropen"]
        real_max_seq = Store.max_seq

        def owner_writes(name: str) -> None:
            assert owner.stdin is not None and owner.stdout is not None
            owner.stdin.write(name + "\n")
            owner.stdin.flush()
            assert owner.stdout.readline().strip() == "written"

        def max_seq(self: Store) -> int:
            seq = real_max_seq(self)
            if pending and pending[0] == "during-open":
                owner_writes(pending.pop(0))  # right after the opening process first reads the journal's end
            return seq

        monkeypatch.setattr(Store, "max_seq", max_seq)
        with EmbeddedEngine(idx) as reader:
            assert not reader.owner and pending == ["afteropen"]
            owner_writes(pending.pop(0))  # after the open, before the dense index is first needed
            monkeypatch.undo()
            for name in ("first", "during-open", "afteropen"):
                assert reader.bm25(f"{name}word").ids == [name], name
                assert reader.get([name])[name] == Document(id=name, title=f"{name}word", text="late arrival")
            assert sorted(reader.knn(np.ones(384, np.float32), 10).ids) == ["afteropen", "during-open", "first"]
    finally:
        owner.stdin.close()  # type: ignore[union-attr]
        owner.wait(timeout=60)


@pytest.mark.integration
def test_a_reader_sees_what_the_owner_applies_and_takes_over_when_it_closes(tmp_path) -> None:
    from hybridsearch.models import Document

    idx = tmp_path / "idx"
    EmbeddedEngine(idx).close()
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(idx)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert owner.stdout is not None and owner.stdin is not None
    assert owner.stdout.readline().strip() == "owner"
    with EmbeddedEngine(idx) as reader:
        assert not reader.owner
        v = np.ones((1, 384), np.float32)
        reader.write([Document(id="mine", title="x", text="y", procedure="quokkaword steps")], v)
        assert reader.bm25("quokkaword").ids == []  # BM25 is the owner's to apply
        owner.stdin.write("?\n")
        owner.stdin.flush()
        assert owner.stdout.readline().strip() == "refreshed"
        # the owner's apply moved no SQLite version this reader watches, and a field it had not seen
        assert reader.bm25("quokkaword").ids == ["mine"]
        reader.write([Document(id="later", title="walrusword", text="z")], v)
        owner.stdin.close()
        assert owner.wait(timeout=60) == 0
        assert reader.bm25("walrusword").ids == ["later"] and reader.owner  # it took over
        assert reader.stats().details["bm25_applied_seq"] == reader.stats().details["journal_seq"]
    with EmbeddedEngine(idx) as again:
        assert again.owner and again.bm25("walrusword").ids == ["later"]
