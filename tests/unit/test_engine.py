"""What only the embedded engine has: reopening its directory, the switch to IVF, readers in
other threads and processes. The shared behaviour is in tests/contract/."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np

from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.models import Document
from tests.contract.test_engine_contract import DOCS, unit_vectors

VECS = unit_vectors(3)


def test_reopen_keeps_everything(tmp_path) -> None:
    with EmbeddedEngine(tmp_path / "idx") as e:
        e.write(DOCS, VECS)
        e.delete(["c"])
    with EmbeddedEngine(tmp_path / "idx") as e:
        assert e.count() == 2
        assert e.bm25("compact").ids == ["a", "b"]
        assert e.knn(VECS[1], 5).ids[0] == "b" and "c" not in e.knn(VECS[2], 5).ids


def test_ivf_above_the_exact_threshold(tmp_path) -> None:
    n = 400
    vecs = unit_vectors(n, seed=3)
    docs = [Document(id=f"d{i}", title=f"doc {i}", text="filler") for i in range(n)]
    with EmbeddedEngine(tmp_path / "idx", exact_max=100) as e:
        e.write(docs, vecs)
        e.knn(vecs[0], 1)
        assert e.stats().details["dense_mode"] == "ivf"
        hits = sum(e.knn(vecs[i], 1).ids == [f"d{i}"] for i in range(0, n, 10))
        assert hits >= 38
        e.delete(["d0"])
        e.write([Document(id="d1", title="moved", text="x")], unit_vectors(1, seed=77))
        assert "d0" not in e.knn(vecs[0], 5).ids
        assert e.knn(vecs[1], 5).ids.count("d1") <= 1 and e.knn(unit_vectors(1, 77)[0], 1).ids == ["d1"]
    with EmbeddedEngine(tmp_path / "idx", exact_max=100) as e:
        assert e.knn(vecs[5], 1).ids == ["d5"] and e.stats().details["dense_mode"] == "ivf"


def test_an_empty_vector_index_loads_the_stored_rows_and_trains_once(tmp_path, monkeypatch, caplog) -> None:
    """Past _LOAD_WHOLE journal entries to replay, an empty vector index is filled from the rows the
    store holds: the dense one built once, as IVF, its lists trained once on all the vectors; the
    HDC ones hold every code; entries written after the load still apply."""
    import logging

    from hybridsearch.engines.embedded import engine as engine_module

    monkeypatch.setattr(engine_module, "_LOAD_WHOLE", 50)
    monkeypatch.setattr(engine_module, "_PAGE", 100)  # replayed a page at a time, it would train at 101 and 512
    n = 1200
    vecs = unit_vectors(n, seed=5)
    docs = [Document(id=f"d{i}", title=f"doc {i}", text=f"filler {i}") for i in range(n)]
    with EmbeddedEngine(tmp_path / "idx", exact_max=100) as e:
        for lo in range(0, n, 300):
            part = docs[lo:lo + 300]
            e.write(part, vecs[lo:lo + 300], codes=e.hdc_encoder().encode_documents(part))
        with caplog.at_level(logging.INFO, logger="hybridsearch"):
            assert e.knn(vecs[7], 1).ids == ["d7"]
        assert e.stats().details["dense_mode"] == "ivf"
        assert sum("training" in r.getMessage() for r in caplog.records) == 1
        codes = e.hdc_encoder().encode_document(docs[9])
        assert e.hamming(codes, k=1)["claim"].ids == ["d9"]
        e.delete(["d7"])
        assert "d7" not in e.knn(vecs[7], 5).ids
    # an index that holds nothing (no chunk has a role) is saved too: the next open loads nothing again
    assert (tmp_path / "idx" / "hdc_role.npz").exists() and (tmp_path / "idx" / "hdc_acts.npz").exists()


def test_concurrent_readers_while_the_owner_writes(tmp_path) -> None:
    path = tmp_path / "idx"
    owner = EmbeddedEngine(path)
    owner.write(DOCS, VECS)
    errors: list[Exception] = []
    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                seen.append(len(owner.bm25("filler", k=1000).ids))
                owner.knn(VECS[0], 5)
        except Exception as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for b in range(10):
        owner.write([Document(id=f"n{b}-{i}", title="filler", text="x") for i in range(20)],
                    unit_vectors(20, seed=b))
    stop.set()
    for t in threads:
        t.join()
    assert not errors and seen == sorted(seen)
    # a second process is a reader: it sees the owner's commits, including later ones
    code = ("import sys; from hybridsearch.engines.embedded import EmbeddedEngine as E; "
            f"e = E({str(path)!r}); print(e.owner, len(e.bm25('filler', k=1000).ids))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "200"]
    owner.close()


def test_a_bulk_load_commits_bm25_later_and_loses_nothing_uncommitted(tmp_path) -> None:
    """In a bulk load BM25 holds a write's changes until enough are pending: this process finds
    them at once, another process once they are committed (the checkpoint); a process that ends
    without committing leaves them to the journal, and the next owner replays them."""
    path = tmp_path / "idx"
    reader = ("from hybridsearch.engines.embedded import EmbeddedEngine as E; "
              f"e = E({str(path)!r}); print(e.owner, len(e.bm25('filler', k=1000).ids))")
    with EmbeddedEngine(path) as owner:
        owner.bulk = True
        owner.write([Document(id=f"n{i}", title="filler", text="x") for i in range(30)])
        seen_elsewhere = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, check=True)
        assert seen_elsewhere.stdout.split() == ["False", "0"]
        assert len(owner.bm25("filler", k=1000).ids) == 30  # a read here commits first
        owner.write([Document(id=f"m{i}", title="filler", text="x") for i in range(20)])
        owner.checkpoint()
        seen_elsewhere = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, check=True)
        assert seen_elsewhere.stdout.split() == ["False", "50"]
    crash = ("import os; from hybridsearch.engines.embedded import EmbeddedEngine as E; from hybridsearch.models "
             f"import Document as D; e = E({str(path)!r}); e.bulk = True; "
             "e.write([D(id=f'k{i}', title='filler', text='x') for i in range(25)]); os._exit(0)")
    subprocess.run([sys.executable, "-c", crash], check=True)
    assert json.loads((path / "bm25" / "applied.json").read_text())["seq"] == 50  # the 25 were not committed
    with EmbeddedEngine(path) as e:
        assert len(e.bm25("filler", k=1000).ids) == 75


def test_other_threads_never_see_a_batch_before_it_commits(tmp_path) -> None:
    """While one thread's write transaction is open, the process's other threads read what was
    committed: not the new chunk, not the changed text, not the new count; a batch rolled back
    never shows at all, and a committed one shows at once."""
    owner = EmbeddedEngine(tmp_path / "idx")
    owner.write(DOCS[:2])
    first = DOCS[0].id
    before = owner.get([first])[first].text
    seen: dict[str, object] = {}

    def look(tag: str) -> None:
        got = owner.get([first, "uncommitted"])
        seen[tag] = (owner.count(), got[first].text, "uncommitted" in got)

    def in_thread(tag: str) -> None:
        t = threading.Thread(target=look, args=(tag,))
        t.start()
        t.join()

    changed = DOCS[0].model_copy(update={"text": "changed in an open transaction"})
    try:
        with owner.store._transaction() as c:  # a batch half-way through: one chunk changed, one added
            c.execute("UPDATE chunks SET doc=? WHERE id=?", (changed.model_dump_json(), first))
            c.execute("INSERT INTO chunks(id, work_id, chunk_no, doc, dense_hash) VALUES (?,?,?,?,?)",
                      ("uncommitted", "uncommitted", 0, Document(id="uncommitted", title="t").model_dump_json(), "0"))
            in_thread("open")
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    in_thread("rolled back")
    owner.write([changed])
    in_thread("committed")
    owner.close()
    assert seen["open"] == (2, before, False)
    assert seen["rolled back"] == (2, before, False)
    assert seen["committed"] == (2, "changed in an open transaction", False)
    # a closed store opens no connection for a thread that reads late: it says it is closed
    late: list[BaseException] = []
    t = threading.Thread(target=lambda: late.extend(_raised(owner.store.count)))
    t.start()
    t.join()
    assert len(late) == 1 and "is closed" in str(late[0])


def _raised(call) -> list[BaseException]:  # noqa: ANN001
    try:
        call()
    except Exception as e:  # noqa: BLE001 - returned for the assertion
        return [e]
    return []


def test_a_filter_that_few_vectors_pass_still_gets_k_of_them_from_ivf() -> None:
    """An IVF search scans the lists nearest the query and skips what the filter refuses, so with
    1 vector in 1,000 allowed it would find them poorly or end short of k: so few are scored
    exactly instead."""
    import numpy as np

    from hybridsearch.engines.embedded.dense import DenseIndex

    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(30_000, 64)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = DenseIndex(64, exact_max=1000)
    index.upsert(np.arange(len(vecs)), vecs)
    assert index.approximate
    allowed = set(range(0, 30_000, 1000))
    q = vecs[0] + vecs[7] * 0.5
    q /= np.linalg.norm(q)
    labels, scores = index.search(q, 10, allowed)
    best = sorted(allowed, key=lambda lb: -float(vecs[lb] @ q))[:10]
    assert labels == best and np.allclose(scores, [float(vecs[lb] @ q) for lb in best], atol=1e-5)


def test_ivf_with_many_tombstones_still_returns_k_when_k_of_them_live() -> None:
    """Removed vectors stay in an IVF index as tombstones (until a fifth of it is, or 1,000), and
    the unfiltered scan skips them: with most of a small index tombstoned it can end short of k.
    Then the live vectors are scored exactly."""
    import numpy as np

    from hybridsearch.engines.embedded.dense import DenseIndex

    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(1200, 32)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = DenseIndex(32, exact_max=100, nprobe=128)  # every list scanned: the answers are exact
    index.upsert(np.arange(1200), vecs)
    index.remove(list(range(999)))  # 999 tombstones, 201 live
    assert index.approximate and len(index) == 201
    labels, scores = index.search(vecs[1199], 201, None)
    assert sorted(labels) == list(range(999, 1200)) and labels[0] == 1199
    assert scores == sorted(scores, reverse=True)
    assert index.search(vecs[1199], 5, None)[0][0] == 1199
    # a label written again is found under its new vector only; the rebuild past a fifth of
    # tombstones keeps every live label
    index.upsert([1199], vecs[:1])
    assert index.search(vecs[0], 1, None)[0] == [1199]
    found = dict(zip(*index.search(vecs[1199], 3, None), strict=True))
    assert np.isclose(found.get(1199, 0.0), vecs[0] @ vecs[1199]) and max(found.values()) < 0.99
    index.upsert(np.arange(999), vecs[998::-1])
    index.upsert(np.arange(999), vecs[:999])  # new vectors tombstone the first ones: past a fifth
    assert not index._tombstones and len(index) == 1200 and index.search(vecs[5], 1, None)[0] == [5]
    index.upsert(np.arange(999), vecs[:999])  # the vectors they hold: nothing to do
    assert not index._tombstones and len(index) == 1200


def test_codes_are_searched_exactly_through_updates_removals_and_a_checkpoint(tmp_path) -> None:
    """HDC codes: every search is exact Hamming (the brute-force answer), an update overwrites a
    label's code, a removal fills its hole with the last row, and a checkpoint reloads the same."""
    import numpy as np

    from hybridsearch.engines.embedded.dense import CodeIndex

    rng = np.random.default_rng(1)
    codes = rng.integers(0, 256, size=(3000, 512), dtype=np.uint8)
    labels = np.arange(10, 3010)
    index = CodeIndex(4096)
    index.upsert(labels, codes)
    index.remove(list(range(10, 3010, 3)))  # a third removed, from everywhere in the matrix
    index.upsert([11, 5000], codes[:2])  # 11 takes code 0; 5000 is new
    truth = {int(lb): codes[i] for i, lb in enumerate(labels) if (lb - 10) % 3}
    truth[11], truth[5000] = codes[0], codes[1]
    q = codes[0] ^ (rng.random(512) < 0.05).astype(np.uint8)

    def sim(lb: int) -> float:
        return 1 - int(np.bitwise_count(truth[lb] ^ q).sum()) / 4096

    def top(allowed: set[int] | None = None) -> list[float]:
        return sorted((sim(lb) for lb in truth if allowed is None or lb in allowed), reverse=True)[:10]

    index.save(tmp_path / "hdc.npz")
    reloaded = CodeIndex.load(tmp_path / "hdc.npz", 4096)
    assert reloaded.rebuilt is None
    for idx in (index, reloaded):
        assert len(idx) == len(truth) and sorted(idx.labels()) == sorted(truth)
        labels_out, sims = idx.search(q, 10, None)
        assert labels_out[0] == 11 and np.allclose(sims, top())
        allowed = set(range(10, 400))
        labels_out, sims = idx.search(q, 10, allowed)
        assert set(labels_out) <= allowed and np.allclose(sims, top(allowed))
        assert idx.score(q, [11, 14, 5000, 10]) == {lb: sim(lb) for lb in (11, 14, 5000)}
        assert np.array_equal(idx.vectors([5000, 10])[5000], codes[1]) and 10 not in idx.vectors([10])


def test_a_reloaded_ivf_checkpoint_with_a_tombstoned_newest_label_rebuilds(tmp_path) -> None:
    """Tombstoned vids keep their labels: a checkpoint whose newest label is a tombstone reloads
    with room for it, and the rebuild past a fifth of tombstones keeps every live vector."""
    import numpy as np

    from hybridsearch.engines.embedded.dense import IVF, DenseIndex

    rng = np.random.default_rng(2)
    vecs = rng.normal(size=(1300, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    labels = np.array([*range(1, 1200), 5000])
    index = DenseIndex(16, exact_max=100)
    index.upsert(labels, vecs[:1200])
    index.remove([5000])
    index.save(tmp_path / "dense.npz")
    again = DenseIndex.load(tmp_path / "dense.npz", 16, 100)
    assert again.rebuilt is None and again.mode == IVF and again._lists() == index._lists() == 64
    assert again.search(vecs[1150], 1, None) == index.search(vecs[1150], 1, None)
    again.remove(list(range(1, 1100)))  # past a fifth: rebuilt
    assert not again._tombstones and len(again) == 100
    assert again.search(vecs[1150], 1, None)[0] == [1151]


def test_ivf_recall_lists_and_a_regrown_index() -> None:
    """On clustered vectors the default probe finds the exact top-10; fewer probed lists find
    fewer; past twice its ideal size the index is trained anew with more lists."""
    import numpy as np

    from hybridsearch.engines.embedded.dense import IVF, DenseIndex, ivf_lists

    rng = np.random.default_rng(4)
    centres = rng.normal(size=(300, 48)).astype(np.float32)
    vecs = centres[rng.integers(0, 300, 20_000)] + rng.normal(scale=0.35, size=(20_000, 48)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = DenseIndex(48, exact_max=1000)
    index.upsert(np.arange(1, 20_001), vecs)
    assert index.mode == IVF and index._lists() == ivf_lists(20_000) == 128

    def recall(probe: int) -> float:
        index.nprobe = probe
        got = 0
        for q in vecs[:50]:
            truth = set((np.argsort(-(vecs @ q))[:10] + 1).tolist())
            got += len(truth & set(index.search(q, 10, None)[0]))
        return got / 500

    assert recall(64) >= 0.98 and recall(1) < recall(64)
    index.nprobe = 64
    index.upsert(np.arange(20_001, 70_001), np.repeat(vecs, 3, axis=0)[:50_000])
    assert len(index) == 70_000 and index._lists() == ivf_lists(70_000) == 256
    assert index.search(vecs[7], 1, None)[1][0] > 0.9999


def test_an_hnsw_checkpoint_of_an_older_version_is_searched_then_rebuilt_as_ivf(tmp_path) -> None:
    """A dense checkpoint written before IVF (format without a version, HNSW above the exact
    size) loads and answers; its first rebuild makes it IVF."""
    import faiss
    import numpy as np

    from hybridsearch.engines.embedded.dense import HNSW, IVF, DenseIndex, _write_npz

    rng = np.random.default_rng(5)
    vecs = rng.normal(size=(3000, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    old = faiss.IndexIDMap2(faiss.IndexHNSWFlat(16, 32, faiss.METRIC_INNER_PRODUCT))
    old.add_with_ids(vecs, np.arange(1, 3001))
    labels = np.arange(10, 3010)
    _write_npz(tmp_path / "dense.npz", old, vid_of=np.stack([labels, np.arange(1, 3001)], axis=1),
               label_of=np.stack([np.arange(1, 3001), labels], axis=1), tombstones=np.zeros(0, dtype=np.int64),
               state=np.array([7, 3001, 1, 16], dtype=np.int64), store=np.frombuffer(b"s", dtype=np.uint8))
    index = DenseIndex.load(tmp_path / "dense.npz", 16, 100, store_id="s")
    assert index.rebuilt is None and index.mode == HNSW and index.applied_seq == 7 and len(index) == 3000
    assert index.search(vecs[42], 1, None)[0] == [52]
    index.remove(list(range(10, 1011)))  # past a fifth (and 1,000): rebuilt
    assert index.mode == IVF and len(index) == 1999 and index.search(vecs[2042], 1, None)[0] == [2052]


def test_a_label_given_twice_keeps_its_last_row() -> None:
    import numpy as np

    from hybridsearch.engines.embedded.dense import CodeIndex, DenseIndex

    codes = CodeIndex(64)
    codes.upsert([1, 2, 1], np.array([[1] * 8, [2] * 8, [3] * 8], dtype=np.uint8))
    codes.remove([2, 2])
    assert len(codes) == 1 and codes.vectors([1])[1].tolist() == [3] * 8
    dense = DenseIndex(2, exact_max=10)
    dense.upsert([7, 7], np.array([[1, 0], [0, 1]], dtype=np.float32))
    dense.remove([8, 8])
    assert len(dense) == 1 and dense.search(np.array([0, 1], np.float32), 5, None) == ([7], [1.0])


def test_a_dense_checkpoint_of_the_earlier_layout_still_loads(tmp_path) -> None:
    """Checkpoints used to hold the faiss index as one serialised array (`index.npy`); now it is
    streamed into its own member. Both load to the same index."""
    import faiss
    import numpy as np

    from hybridsearch.engines.embedded.dense import DenseIndex

    vecs = np.eye(8, dtype=np.float32)
    index = DenseIndex(8, exact_max=100)
    index.upsert(np.arange(1, 9), vecs)
    index.applied_seq = 8
    index.save(tmp_path / "new.npz")
    with np.load(tmp_path / "new.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "index.faiss"}
    np.savez(tmp_path / "old.npz", index=faiss.serialize_index(index._index), **arrays)
    for name in ("new.npz", "old.npz"):
        loaded = DenseIndex.load(tmp_path / name, 8, 100)
        assert loaded.rebuilt is None and loaded.applied_seq == 8 and len(loaded) == 8
        assert loaded.search(vecs[3], 1, None)[0] == [4]


def test_journal_entries_bm25_does_not_take_are_not_read_again_at_the_next_open(tmp_path, monkeypatch) -> None:
    """Vectors added after the documents journal `vector` entries, which BM25 does not index: the
    owner records them as passed, so that a fresh open does not page through them again (a million
    of them took 2 s of every open)."""
    with EmbeddedEngine(tmp_path / "idx") as e:
        e.write(DOCS)
        e.set_vectors([d.id for d in DOCS], unit_vectors(len(DOCS)))
        last = e.store.max_seq()
        assert e.bm25_index.applied_seq == last
    read = _journal_reads(monkeypatch)
    with EmbeddedEngine(tmp_path / "idx") as e:
        assert e.bm25_index.applied_seq == last and read == []
        assert e.bm25("compact space", k=3).ids[0] == "a"


def test_a_vector_index_opened_later_passes_over_entries_it_does_not_take(tmp_path, monkeypatch) -> None:
    """An HDC index whose checkpoint lies behind the `vector` entries of vectors added later does
    not read them when it opens: it starts at the first entry it takes (none here)."""
    with EmbeddedEngine(tmp_path / "idx") as e:
        enc = e.hdc_encoder()
        e.write(DOCS, codes=[enc.encode_document(d) for d in DOCS])
        e.checkpoint()  # the HDC indexes' checkpoints: before the vectors
        e.set_vectors([d.id for d in DOCS], unit_vectors(len(DOCS)))
        last = e.store.max_seq()
        want = e.hamming(enc.encode_document(DOCS[0]), k=1)
    read = _journal_reads(monkeypatch)
    with EmbeddedEngine(tmp_path / "idx") as e:
        got = e.hamming(enc.encode_document(DOCS[0]), k=1)
        assert read == [] and e._loaded["hdc:topic"].applied_seq == last
    assert {f: (r.ids, r.scores) for f, r in got.items()} == {f: (r.ids, r.scores) for f, r in want.items()}


def _journal_reads(monkeypatch) -> list[int]:  # noqa: ANN001
    """The seqs of the journal entries every store reads from now on (journal_pages)."""
    from hybridsearch.engines.embedded.store import Store

    read: list[int] = []
    pages = Store.journal_pages

    def counted(self, seq, size):  # noqa: ANN001, ANN202
        for page in pages(self, seq, size):
            read.extend(entry.seq for entry in page)
            yield page

    monkeypatch.setattr(Store, "journal_pages", counted)
    return read


def test_a_small_update_leaves_the_checkpoint_and_the_next_open_replays_it(tmp_path, monkeypatch) -> None:
    """A checkpoint is written whole, so a close saves a vector index only when its changes reach
    its minimum (1,000 for the dense one) and a tenth of its size: a small update leaves the file
    as it was, and the next open replays the update from the journal; a large one saves it."""
    n = 2000
    vecs = unit_vectors(n + 1, seed=9)
    docs = [Document(id=f"d{i}", title=f"doc {i}", text="filler") for i in range(n)]
    path = tmp_path / "idx"
    with EmbeddedEngine(path) as e:
        e.write(docs, vecs[:n])
        e.knn(vecs[0], 1)
    saved = (path / "dense.npz").stat()
    with EmbeddedEngine(path) as e:
        e.write([Document(id="d5", title="moved", text="x")], vecs[n:])
        e.delete(["d6"])
        assert e.knn(vecs[n], 1).ids == ["d5"]
    after = (path / "dense.npz").stat()
    assert (after.st_mtime_ns, after.st_size, after.st_ino) == (saved.st_mtime_ns, saved.st_size, saved.st_ino)
    read = _journal_reads(monkeypatch)
    with EmbeddedEngine(path) as e:
        assert e.knn(vecs[n], 1).ids == ["d5"] and "d6" not in e.knn(vecs[6], 3).ids
        assert len(read) == 2  # the update and the delete, replayed
        e.write(docs[:1500], vecs[1:1501])
    assert (path / "dense.npz").stat().st_mtime_ns != saved.st_mtime_ns
    read.clear()
    with EmbeddedEngine(path) as e:
        assert e.knn(vecs[1], 1).ids == ["d0"] and read == []


def test_derived_rows_set_in_one_batch_keep_the_order_and_only_missing(tmp_path) -> None:
    """A batch of vectors is set as its rows one after the other would be: unknown ids skipped, an
    id given twice ends with its last row, and with `only_missing` a chunk that has a complete row
    (a vector with its passages), stored or set earlier in the same batch, is left alone."""
    from hybridsearch.engines.embedded.store import Store

    store = Store(tmp_path / "store.sqlite")
    try:
        store.write(DOCS, None, "m")
        v, p = unit_vectors(4, seed=9), [unit_vectors(2, seed=10 + i) for i in range(4)]
        assert store.set_vectors(["a", "nope", "a"], v[:3], "m") == 2  # the last row for "a" wins
        labels, rows = store.vector_page(0, 10)
        assert len(labels) == 1 and np.allclose(rows[0], v[2])
        # only_missing: "a" has no passages (incomplete), so its first row here is set; that one is
        # complete, so the second is left alone; "b" is set once
        assert store.set_vectors(["a", "a", "b"], v[:3], "m", only_missing=True, passages=p[:3]) == 2
        _, rows = store.vector_page(0, 10)
        assert np.allclose(rows[0], v[0]) and np.allclose(rows[1], v[2])
        assert store.set_vectors(["b"], v[3:], "m", only_missing=True, passages=p[3:]) == 0
        assert [e.op for e in store.journal_since(0)].count("vector") == 4
    finally:
        store.close()
