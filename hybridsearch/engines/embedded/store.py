"""SQLite source of truth: chunks, vectors and the ingestion journal (WAL, many writers)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from hybridsearch.engines import GraphState, GraphSummary, Neighbors, WorkLinks, names_its_work
from hybridsearch.errors import EngineError, ValidationError
from hybridsearch.hdc import index_options
from hybridsearch.models import Document, Filters

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks(
    label INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    work_id TEXT NOT NULL,
    chunk_no INTEGER NOT NULL,
    doc TEXT NOT NULL,
    dense_hash TEXT NOT NULL,
    ym INTEGER,
    kind TEXT,
    license TEXT,
    source TEXT
);
-- covers the graph's input (work, date, id and, as every index, the label): reading it for a
-- graph build touches no chunk row (a store made before it had chunks_work, on work_id alone)
CREATE INDEX IF NOT EXISTS chunks_work_links ON chunks(work_id, ym, id);
DROP INDEX IF EXISTS chunks_work;
-- a ranked list's labels to chunk ids from a small index, not from the rows of the documents: at
-- a million chunks 100 labels take 0.8 ms with its pages out of memory, 15 ms through the rows
CREATE INDEX IF NOT EXISTS chunks_label_id ON chunks(label, id);
CREATE TABLE IF NOT EXISTS chunk_subjects(label INTEGER NOT NULL, subject TEXT NOT NULL,
    PRIMARY KEY(label, subject));
CREATE INDEX IF NOT EXISTS chunk_subjects_subject ON chunk_subjects(subject);
CREATE TABLE IF NOT EXISTS chunk_cites(label INTEGER NOT NULL, target TEXT NOT NULL,
    PRIMARY KEY(label, target));
CREATE INDEX IF NOT EXISTS chunk_cites_target ON chunk_cites(target);
CREATE TABLE IF NOT EXISTS vectors(label INTEGER PRIMARY KEY, model TEXT NOT NULL, vec BLOB NOT NULL,
    passages BLOB);
CREATE TABLE IF NOT EXISTS hdc(label INTEGER PRIMARY KEY, topic BLOB, claim BLOB, role BLOB, acts BLOB);
CREATE TABLE IF NOT EXISTS journal(seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL,
    id TEXT NOT NULL, label INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS journal_op ON journal(op, seq);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- the citation graph: each indexed work's lists and node number; the ranks by node, _RANK_BLOCK
-- nodes a row (an update rewrites every rank, and these few rows, not a row per work); what the
-- next update starts from (GraphState's arrays); and the works whose chunks moved to another
-- work or were deleted, by journal seq (the upserts' works are read from the journal itself)
CREATE TABLE IF NOT EXISTS graph_works(work_id TEXT PRIMARY KEY, node INTEGER NOT NULL, cites TEXT NOT NULL,
    cited_by TEXT NOT NULL, cocited TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS graph_ranks(block INTEGER PRIMARY KEY, pagerank BLOB NOT NULL, authority BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS graph_state(key TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS graph_dirty(seq INTEGER NOT NULL, work_id TEXT NOT NULL);
"""


def norm_key(value: str) -> str:
    """Filter values (subjects, kind, license) compare case-insensitively and trimmed."""
    return value.strip().lower()


class JournalEntry(NamedTuple):
    seq: int
    op: str  # "upsert" | "delete" | "vector" | "hdc"
    id: str
    label: int


@contextmanager
def write_transaction(conn: sqlite3.Connection, lock: AbstractContextManager[Any]) -> Iterator[sqlite3.Connection]:
    """One write transaction on `conn` (opened with isolation_level=None) under `lock`, which the
    threads sharing the connection take in turn: BEGIN IMMEDIATE (writers of other processes queue
    here, readers go on), COMMIT, or ROLLBACK on any exception."""
    with lock:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


class Store:
    """Writes go through one connection (`conn`), one transaction at a time; reads go through a
    connection of the reading thread's own, so that no thread ever sees a batch another thread is
    still writing (SQLite shows a connection's open transaction to everything using it)."""

    def __init__(self, path: Path, *, create: bool = True) -> None:
        """Open the store at `path`; a file without tables (0 bytes, say) is made a new store, or
        with `create=False` refused before anything is written (EngineError)."""
        self.path = path
        try:
            self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                        timeout=60)
            if not create and not self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                self.conn.close()
                raise EngineError(f"the index store {path} is damaged (it holds no tables: {path.stat().st_size} "
                                  "bytes); nothing was written. Restore it from a snapshot or ingest into a new index")
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.executescript(_SCHEMA)
            # a store written before passage vectors existed: its chunks have none, so an embedding
            # pass (`missing_vectors`) embeds them again
            if "passages" not in {r[1] for r in self.conn.execute("PRAGMA table_info(vectors)")}:
                self.conn.execute("ALTER TABLE vectors ADD COLUMN passages BLOB")
        except sqlite3.Error as e:
            raise EngineError(f"cannot open store {path}: {e}") from e
        self._lock = threading.RLock()
        self._local = threading.local()
        self._readers: dict[threading.Thread, sqlite3.Connection] = {}
        self._readers_lock = threading.Lock()
        self._closed = False
        if self.get_meta("cites_table") is None:
            self._backfill_cites()
        if self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'graph'").fetchone():
            self._graph_by_node()
        # the store's identity: derived indexes carry it, so one built from another store is known
        if self.get_meta("store_id") is None:
            with self._transaction() as c:
                c.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (json.dumps(uuid.uuid4().hex),))
        self.store_id: str = self.get_meta("store_id") or ""

    def _backfill_cites(self) -> None:
        """Fill the citation table of a store written before it existed (once)."""
        with self._transaction() as c:
            rows = c.execute("SELECT label, doc FROM chunks").fetchall()
            for label, doc in rows:
                cites = json.loads(doc).get("cites") or []
                c.executemany("INSERT OR IGNORE INTO chunk_cites VALUES (?,?)", [(label, t) for t in cites])
            c.execute("INSERT OR REPLACE INTO meta VALUES ('cites_table', '1')")

    def _graph_by_node(self) -> None:
        """Move the graph of a store written before graph_works (a row per work holding its ranks)
        to the layout of now, once, in place of any a later version left (an index opened by an
        older version in between); the next update builds the graph anew (it has no state)."""
        with self._transaction() as c:
            for table in ("graph_works", "graph_ranks", "graph_state"):  # what a later version left, if any
                c.execute(f"DELETE FROM {table}")
            rows = c.execute("SELECT work_id, cites, cited_by, cocited, pagerank, authority FROM graph"
                             " ORDER BY work_id").fetchall()
            c.executemany("INSERT OR REPLACE INTO graph_works VALUES (?,?,?,?,?)",
                          [(w, i, cites, by, co) for i, (w, cites, by, co, _, _) in enumerate(rows)])
            _set_ranks(c, np.array([r[4] for r in rows], dtype=np.float64), np.array([r[5] for r in rows]))
            c.execute("DROP TABLE graph")

    def close(self) -> None:
        with self._readers_lock:
            self._closed = True
            for c in self._readers.values():
                c.close()
            self._readers.clear()
        self.conn.close()

    def _read(self) -> sqlite3.Connection:
        """This thread's read connection (autocommit: each statement sees what was committed when
        it began); those of threads that have ended are closed as new ones open. A forked child
        opens its own (SQLite connections must not cross a fork)."""
        c: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if c is None or self._local.pid != os.getpid():
            with self._readers_lock:
                if self._closed:
                    raise EngineError(f"the store {self.path} is closed")
                c = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=60)
                c.execute("PRAGMA query_only=1")
                # reads through the page cache's own mapping, without a copy per page: a search
                # reads about 1.5 MB of passage vectors (100 SciFact chunks: 0.55 ms, from 1.4)
                c.execute(f"PRAGMA mmap_size={_READ_MMAP}")
                for gone in [t for t in self._readers if not t.is_alive()]:
                    self._readers.pop(gone).close()
                self._readers[threading.current_thread()] = c
            self._local.conn, self._local.pid = c, os.getpid()
        return c

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self.conn, self._lock)

    # -- writes -------------------------------------------------------------------------------
    def write(self, docs: Sequence[Document], vectors: np.ndarray | None, model: str,
              codes: Sequence[Mapping[str, np.ndarray]] | None = None,
              passages: Sequence[np.ndarray] | None = None) -> int:
        """Upsert chunks (with their vectors, passage vectors and HDC codes when given) in one
        transaction, a statement per table for the whole batch; returns the first journal seq the
        batch took (it took one `upsert` each, in the docs' order, from that one on). An updated
        chunk written without codes loses its stale codes. `docs` have distinct ids."""
        code_rows = None if codes is None else [_code_row(c) for c in codes]
        with self._transaction() as c:
            held = {id_: (label, dense_hash, work) for id_, label, dense_hash, work in c.execute(
                "SELECT c.id, c.label, c.dense_hash, c.work_id FROM json_each(?) j JOIN chunks c ON c.id = j.value",
                (json.dumps([d.id for d in docs]),))}
            # labels are never reused (AUTOINCREMENT): a new chunk takes the next after the highest
            # ever given, which the explicit insert records in sqlite_sequence as AUTOINCREMENT does
            top = c.execute("SELECT seq FROM sqlite_sequence WHERE name = 'chunks'").fetchone()
            top = max(int(top[0]) if top else 0, int(c.execute("SELECT max(label) FROM chunks").fetchone()[0] or 0))
            labels, new, updated, lost_vectors, moved = [], [], [], [], []
            for d in docs:
                dense_hash = str(hash_text(d.dense_text))
                values = (d.work_id, d.chunk_no, d.model_dump_json(exclude_defaults=True), dense_hash,
                          _ym(d), _opt(d.kind), _opt(d.license), d.source)
                row = held.get(d.id)
                if row is None:
                    top += 1
                    labels.append(top)
                    new.append((top, d.id, *values))
                else:
                    labels.append(row[0])
                    updated.append((*values, row[0]))
                    if vectors is None and row[1] != dense_hash:
                        lost_vectors.append((row[0],))
                    if row[2] != d.work_id:
                        moved.append(row[2])
            c.executemany("INSERT INTO chunks(label, id, work_id, chunk_no, doc, dense_hash, ym, kind, license,"
                          " source) VALUES (?,?,?,?,?,?,?,?,?,?)", new)
            if updated:
                c.executemany("UPDATE chunks SET work_id=?, chunk_no=?, doc=?, dense_hash=?, ym=?, kind=?,"
                              " license=?, source=? WHERE label=?", updated)
                gone = [(u[-1],) for u in updated]
                c.executemany("DELETE FROM chunk_subjects WHERE label=?", gone)
                c.executemany("DELETE FROM chunk_cites WHERE label=?", gone)
                c.executemany("DELETE FROM vectors WHERE label=?", lost_vectors)
                if code_rows is None:
                    c.executemany("DELETE FROM hdc WHERE label=?", gone)
            c.executemany("INSERT OR IGNORE INTO chunk_subjects VALUES (?,?)",
                          [(label, norm_key(s)) for label, d in zip(labels, docs, strict=True) for s in d.subjects])
            c.executemany("INSERT OR IGNORE INTO chunk_cites VALUES (?,?)",
                          [(label, t) for label, d in zip(labels, docs, strict=True) for t in d.cites])
            if vectors is not None:
                c.executemany("INSERT OR REPLACE INTO vectors VALUES (?,?,?,?)",
                              [(label, model, vectors[i].astype(np.float32).tobytes(),
                                None if passages is None else _blob(passages[i])) for i, label in enumerate(labels)])
            if code_rows is not None:
                c.executemany("INSERT OR REPLACE INTO hdc VALUES (?,?,?,?,?)",
                              [(label, *row) for label, row in zip(labels, code_rows, strict=True)])
            c.executemany("INSERT INTO journal(op, id, label) VALUES ('upsert',?,?)",
                          [(d.id, label) for label, d in zip(labels, docs, strict=True)])
            last = int(c.execute("SELECT max(seq) FROM journal").fetchone()[0] or 0)
            c.executemany("INSERT INTO graph_dirty VALUES (?,?)", [(last, w) for w in moved])
            return last - len(docs) + 1

    def delete(self, ids: Iterable[str]) -> list[str]:
        deleted: list[str] = []
        with self._transaction() as c:
            for id_ in ids:
                row = c.execute("SELECT label, work_id FROM chunks WHERE id=?", (id_,)).fetchone()
                if row is None:
                    continue
                for table in ("chunks", "chunk_subjects", "chunk_cites", "vectors", "hdc"):
                    c.execute(f"DELETE FROM {table} WHERE label=?", (row[0],))
                c.execute("INSERT INTO journal(op, id, label) VALUES ('delete',?,?)", (id_, row[0]))
                c.execute("INSERT INTO graph_dirty VALUES (last_insert_rowid(), ?)", (row[1],))
                deleted.append(id_)
        return deleted

    def _set_derived(self, ids: Sequence[str], rows: Iterable[Sequence[object]], table: str, op: str, *,
                     hashes: Sequence[str] | None = None, only_missing: bool = False) -> int:
        """Attach data computed after ingest to existing chunks, journaled as `op`; unknown ids are
        skipped, and so (in the same transaction, for workers) are chunks whose dense text no longer
        has the hash in `hashes`, and with `only_missing` chunks that have a complete row in `table`
        already (_COMPLETE: a vector with its passage vectors).
        Returns how many were set."""
        values = list(rows)
        if len(values) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(values)} rows")
        where, complete = _COMPLETE[table]
        with self._transaction() as c:
            held = c.execute("SELECT j.key, c.label, c.dense_hash FROM json_each(?) j JOIN chunks c ON c.id = j.value"
                             " ORDER BY j.key", (json.dumps(list(ids)),)).fetchall()
            if hashes is not None:
                held = [h for h in held if h[2] == hashes[h[0]]]
            done: set[int] = set()  # chunks with a complete row, read once, then as this batch writes them
            if only_missing:
                done = {label for (label,) in c.execute(
                    f"SELECT x.label FROM json_each(?) j JOIN {table} x ON x.label = j.value WHERE {where}",
                    (json.dumps([h[1] for h in held]),))}
            chosen = []
            for i, label, _ in held:
                if only_missing:
                    if label in done:
                        continue
                    if complete(values[i]):
                        done.add(label)
                chosen.append((i, label))
            c.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({','.join('?' * (5 if table == 'hdc' else 4))})",
                          [(label, *values[i]) for i, label in chosen])
            c.executemany("INSERT INTO journal(op, id, label) VALUES (?,?,?)",
                          [(op, ids[i], label) for i, label in chosen])
        return len(chosen)

    def set_vectors(self, ids: Sequence[str], vectors: np.ndarray, model: str, *,
                    texts: Sequence[str] | None = None, only_missing: bool = False,
                    passages: Sequence[np.ndarray] | None = None) -> int:
        """Store vectors (and passage vectors) computed after ingest (workers: with the dense texts
        they embedded and only_missing, so a stale or repeated result is dropped); journal op
        'vector'."""
        rows = ((model, np.asarray(v, dtype=np.float32).tobytes(), None if passages is None else _blob(passages[i]))
                for i, v in enumerate(vectors))
        hashes = None if texts is None else [str(hash_text(t)) for t in texts]
        return self._set_derived(ids, rows, "vectors", "vector", hashes=hashes, only_missing=only_missing)

    def set_codes(self, ids: Sequence[str], codes: Sequence[Mapping[str, np.ndarray]], *,
                  only_missing: bool = False) -> int:
        """Store HDC codes computed after ingest; journal op 'hdc'."""
        rows = (_code_row(code) for code in codes)
        return self._set_derived(ids, rows, "hdc", "hdc", only_missing=only_missing)

    # -- reads --------------------------------------------------------------------------------
    def max_seq(self) -> int:
        return int(self._read().execute("SELECT coalesce(max(seq), 0) FROM journal").fetchone()[0])

    def data_version(self) -> int:
        """Moves when another connection (another process) commits; the write connection's, so the
        number is one counter whichever thread asks."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def journal_since(self, seq: int, limit: int = -1) -> list[JournalEntry]:
        """The journal past `seq`, in order (at most `limit` entries; -1: all)."""
        rows = self._read().execute("SELECT seq, op, id, label FROM journal WHERE seq > ? ORDER BY seq LIMIT ?",
                                    (seq, limit)).fetchall()
        return list(map(JournalEntry._make, rows))

    def journal_pages(self, seq: int, size: int) -> Iterator[list[JournalEntry]]:
        """The journal past `seq` in pages of at most `size` entries (one page in memory at a time)."""
        while page := self.journal_since(seq, size):
            yield page
            if len(page) < size:
                return
            seq = page[-1].seq

    def count_since(self, seq: int, ops: Iterable[str], cap: int) -> int:
        """How many journal entries of `ops` lie past `seq`, counted up to `cap` (through the index
        on (op, seq): at most `cap` entries of each op are read, whatever else the journal holds)."""
        ops = list(ops)
        return int(self._read().execute(
            f"SELECT count(*) FROM (SELECT 1 FROM journal WHERE seq > ? AND op IN ({','.join('?' * len(ops))})"
            " LIMIT ?)", (seq, *ops, cap)).fetchone()[0])

    def first_since(self, seq: int, ops: Iterable[str]) -> int | None:
        """The seq of the first journal entry of `ops` past `seq`, or None (through the index on
        (op, seq): one lookup per op)."""
        found = [self._read().execute("SELECT min(seq) FROM journal WHERE op = ? AND seq > ?", (op, seq)).fetchone()[0]
                 for op in ops]
        return min((f for f in found if f is not None), default=None)

    def _rows_in(self, sql: str, keys: Sequence[object]) -> Iterator[tuple[Any, ...]]:
        """Rows of `sql`, whose `{marks}` is filled with placeholders for a slice of `keys` at a
        time (SQLite caps the number of bound parameters)."""
        for chunk in _chunks(keys):
            yield from self._read().execute(sql.format(marks=",".join("?" * len(chunk))), chunk)

    def docs_by_label(self, labels: Sequence[int]) -> dict[int, Document]:
        return {label: Document.model_validate_json(doc, strict=False)
                for label, doc in self._rows_in("SELECT label, doc FROM chunks WHERE label IN ({marks})", labels)}

    def docs_by_id(self, ids: Sequence[str]) -> dict[str, Document]:
        return {id_: Document.model_validate_json(doc, strict=False)
                for id_, doc in self._rows_in("SELECT id, doc FROM chunks WHERE id IN ({marks})", ids)}

    def _matrix(self, sql: str, labels: Sequence[int], dtype: type) -> tuple[np.ndarray, np.ndarray]:
        """(labels found, their blobs as the rows of one matrix) for `sql` selecting label, blob."""
        return _as_matrix(list(self._rows_in(sql, labels)), dtype)

    def vector_rows(self, labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(labels that have a vector, their vectors as rows)."""
        return self._matrix("SELECT label, vec FROM vectors WHERE label IN ({marks})", labels, np.float32)

    def code_rows(self, labels: Sequence[int], field: str) -> tuple[np.ndarray, np.ndarray]:
        """(labels that have a code of `field`, their codes as rows)."""
        if field not in HDC_FIELDS:
            raise ValueError(f"unknown HDC field {field!r}")
        sql = f"SELECT label, {field} FROM hdc WHERE label IN ({{marks}}) AND {field} IS NOT NULL"
        return self._matrix(sql, labels, np.uint8)

    def vector_page(self, after: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """(labels, vectors) of the first `limit` vectors past label `after`, in label order."""
        return self._matrix_page("SELECT label, vec FROM vectors WHERE label > ? ORDER BY label LIMIT ?",
                                 after, limit, np.float32)

    def code_page(self, after: int, limit: int, field: str) -> tuple[np.ndarray, np.ndarray]:
        """(labels, codes of `field`) of the first `limit` chunks with one past label `after`."""
        if field not in HDC_FIELDS:
            raise ValueError(f"unknown HDC field {field!r}")
        return self._matrix_page(f"SELECT label, {field} FROM hdc WHERE label > ? AND {field} IS NOT NULL "
                                 "ORDER BY label LIMIT ?", after, limit, np.uint8)

    def _matrix_page(self, sql: str, after: int, limit: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
        return _as_matrix(self._read().execute(sql, (after, limit)).fetchall(), dtype)

    def label_range(self, table: str) -> tuple[int, int] | None:
        """The lowest and highest label of `table` (vectors or hdc), None when it is empty: about
        how many rows it holds, read from its key alone (a count would read every row), one end at
        a time: SQLite reads each end from the key only for a min() or a max() alone, and reads
        every row for both together (1.3 s at a million vectors)."""
        if table not in ("vectors", "hdc"):
            raise ValueError(f"unknown table {table!r}")
        lo, hi = self._read().execute(f"SELECT (SELECT min(label) FROM {table}), (SELECT max(label) FROM {table})"
                                      ).fetchone()
        return None if lo is None else (int(lo), int(hi))

    def vector_sample(self, span: tuple[int, int], k: int) -> np.ndarray:
        """About `k` stored vectors (fewer where labels in `span` hold none), drawn at random (a
        fixed seed) across the labels of `span`."""
        lo, hi = span
        labels = np.random.default_rng(0).choice(np.arange(lo, hi + 1), min(k, hi - lo + 1), replace=False)
        return self.vector_rows(np.sort(labels).tolist())[1]

    def labels_of(self, ids: Sequence[str]) -> dict[int, str]:
        """{label: id} of the chunks among `ids` that the store holds."""
        return dict(self._rows_in("SELECT label, id FROM chunks WHERE id IN ({marks})", list(dict.fromkeys(ids))))

    def ids_of(self, labels: Sequence[int]) -> dict[int, str]:
        """{label: id} of the chunks among `labels` that the store holds."""
        return dict(self._rows_in("SELECT label, id FROM chunks INDEXED BY chunks_label_id WHERE label IN ({marks})",
                                  list(dict.fromkeys(labels))))

    def passages_by_label(self, labels: Sequence[int], dim: int) -> dict[int, np.ndarray]:
        """Each chunk's passage vectors (p, dim); chunks without them are absent."""
        sql = "SELECT label, passages FROM vectors WHERE passages IS NOT NULL AND label IN ({marks})"
        return {label: np.frombuffer(blob, dtype=np.float32).reshape(-1, dim)
                for label, blob in self._rows_in(sql, labels)}

    # -- citation graph (built by indexer.graph; read directly, so nothing to apply) -------------
    def citation_links(self) -> list[WorkLinks]:
        """Read through covering indexes alone (chunks_work_links, chunk_cites' own): at a million
        chunks about 10 s instead of 17, which the rows of the chunks themselves cost."""
        cites: dict[str, set[str]] = {}
        for work, target in self._read().execute("SELECT c.work_id, cc.target FROM chunks c"
                                              " JOIN chunk_cites cc ON cc.label = c.label"):
            cites.setdefault(work, set()).add(target)
        chunks: dict[str, list[str]] = {}
        for work, chunk in self._read().execute("SELECT work_id, id FROM chunks ORDER BY 1, 2"):
            if not names_its_work(chunk, work):
                chunks.setdefault(work, []).append(chunk)
        return [WorkLinks(w, ym, tuple(sorted(cites.get(w, ()))), tuple(chunks.get(w, ()))) for w, ym in
                self._read().execute("SELECT work_id, min(ym) FROM chunks GROUP BY work_id ORDER BY work_id")]

    def work_links(self, work_ids: Sequence[str]) -> list[WorkLinks]:
        """The links of those of `work_ids` that have chunks, in work id order, as citation_links
        reads them."""
        chunks: dict[str, list[tuple[int, str, int | None]]] = {}
        for work, label, chunk, ym in self._rows_in("SELECT work_id, label, id, ym FROM chunks WHERE work_id IN"
                                                    " ({marks})", list(dict.fromkeys(work_ids))):
            chunks.setdefault(work, []).append((label, chunk, ym))
        work_of = {label: work for work, rows in chunks.items() for label, _, _ in rows}
        cites: dict[str, set[str]] = {}
        for label, target in self._rows_in("SELECT label, target FROM chunk_cites WHERE label IN ({marks})",
                                           list(work_of)):
            cites.setdefault(work_of[label], set()).add(target)
        out = []
        for work in sorted(chunks):
            dates = [ym for _, _, ym in chunks[work] if ym is not None]
            out.append(WorkLinks(work, min(dates) if dates else None, tuple(sorted(cites.get(work, ()))),
                                 tuple(sorted(c for _, c, _ in chunks[work] if not names_its_work(c, work)))))
        return out

    def chunk_works(self, ids: Sequence[str]) -> dict[str, str]:
        return dict(self._rows_in("SELECT id, work_id FROM chunks WHERE id IN ({marks})", list(dict.fromkeys(ids))))

    def graph_changes(self, since: int | None) -> tuple[int, list[str]]:
        """The journal's last seq, and the works changed after `since` up to it: those of the
        chunks upserted (through the journal's (op, seq) index) and those that chunks left."""
        c = self._read()
        top = int(c.execute("SELECT max(seq) FROM journal").fetchone()[0] or 0)
        if since is None:
            return top, []
        works = {w for (w,) in c.execute("SELECT DISTINCT c.work_id FROM journal j JOIN chunks c ON c.label = j.label"
                                         " WHERE j.op = 'upsert' AND j.seq > ? AND j.seq <= ?", (since, top))}
        works.update(w for (w,) in c.execute("SELECT work_id FROM graph_dirty WHERE seq > ? AND seq <= ?",
                                             (since, top)))
        return top, sorted(works)

    def set_graph(self, works: Mapping[str, Neighbors], summary: GraphSummary,
                  state: GraphState | None = None) -> None:
        """Replace the graph and its summary in one transaction (lists as JSON, written by orjson:
        a million works' three lists take 9 s with the json module); the works are nodes 0, 1, ...
        in the order given (as a state from indexer.graph numbers them), and `state`, when given,
        is kept for the next update, unless a graph of later changes was stored meanwhile (by
        another process): then nothing is written."""
        node = list(range(len(works)))  # a state numbers the indexed works first, in the order given
        if state is not None:
            pagerank, auth = state.pagerank, state.authority
        else:
            pagerank = np.array([nb.pagerank or 0.0 for nb in works.values()], dtype=np.float64)
            auth = np.array([nb.authority or 0.0 for nb in works.values()], dtype=np.float64)
        with self._transaction() as c:
            if state is not None and _newer_graph(c, state):
                return
            c.execute("DELETE FROM graph_works")
            c.execute("DELETE FROM graph_ranks")
            c.execute("DELETE FROM graph_state")
            _set_lists(c, works, node)
            _set_ranks(c, pagerank, auth)
            if state is not None:
                _set_state(c, state)
            c.execute("INSERT OR REPLACE INTO meta VALUES ('graph', ?)", (json.dumps(summary.as_dict()),))

    def update_graph_rows(self, works: Mapping[str, Neighbors], nodes: Sequence[int], gone: Sequence[str],
                          state: GraphState, summary: GraphSummary) -> None:
        """IncrementalGraphStore.update_graph_rows: with no works and none gone, only the
        state's seq moves on (nothing the graph depends on changed). Nothing is written where a
        graph of later changes was stored meanwhile (by another process)."""
        with self._transaction() as c:
            if _newer_graph(c, state):
                return
            if works or gone:
                _set_lists(c, works, nodes)
                c.executemany("DELETE FROM graph_works WHERE work_id = ?", [(w,) for w in gone])
                _set_ranks(c, state.pagerank, state.authority)
                _set_state(c, state)
                c.execute("INSERT OR REPLACE INTO meta VALUES ('graph', ?)", (json.dumps(summary.as_dict()),))
            else:
                _set_seq(c, state.seq)

    def graph_state(self) -> GraphState | None:
        """The state the last build kept (None where it kept none), its ranks read from their rows."""
        c = self._read()
        c.execute("BEGIN")  # one snapshot: the arrays of one build
        try:
            blobs = dict(c.execute("SELECT key, data FROM graph_state"))
            ranks = c.execute("SELECT pagerank, authority FROM graph_ranks ORDER BY block").fetchall()
        finally:
            c.execute("COMMIT")
        if not blobs.keys() >= _STATE_KEYS:  # none kept, or kept by an older version
            return None
        names = orjson.loads(blobs["names"])
        n = len(names)
        pagerank = np.concatenate([np.frombuffer(r[0], dtype=np.float64) for r in ranks] or [np.zeros(0)])[:n]
        auth = np.concatenate([np.frombuffer(r[1], dtype=np.float64) for r in ranks] or [np.zeros(0)])[:n]
        if len(pagerank) != n:
            return None
        params = orjson.loads(blobs["params"])
        return GraphState(orjson.loads(blobs["seq"]), (float(params[0]), int(params[1])), names,
                          np.frombuffer(blobs["rank"], dtype=np.int64),
                          np.frombuffer(blobs["flags"], dtype=np.uint8).copy(),
                          np.frombuffer(blobs["ym"], dtype=np.int64).copy(),
                          np.frombuffer(blobs["digests"], dtype=np.uint64).reshape(-1, 2).copy(),
                          np.frombuffer(blobs["edges"], dtype=np.int64), np.frombuffer(blobs["away"], dtype=np.int64),
                          pagerank.copy(), auth.copy())

    def graph_summary(self) -> GraphSummary | None:
        raw = self.get_meta("graph")
        return None if raw is None else GraphSummary.of(raw)

    def neighbors(self, ids: Sequence[str]) -> dict[str, Neighbors]:
        sql = ("SELECT c.id, g.cites, g.cited_by, g.cocited, g.node, r.pagerank, r.authority FROM chunks c"
               " LEFT JOIN graph_works g ON g.work_id = c.work_id LEFT JOIN graph_ranks r"
               f" ON r.block = g.node / {_RANK_BLOCK} WHERE c.id IN ({{marks}})")
        return {i: Neighbors() if cites is None or pr is None else
                Neighbors(tuple(json.loads(cites)), tuple(json.loads(by)), tuple(json.loads(co)),
                          _rank(pr, node), _rank(auth, node))
                for i, cites, by, co, node, pr, auth in self._rows_in(sql, list(dict.fromkeys(ids)))}

    def authority(self, ids: Sequence[str]) -> dict[str, float]:
        sql = ("SELECT c.id, g.node, r.authority FROM chunks c JOIN graph_works g ON g.work_id = c.work_id"
               f" JOIN graph_ranks r ON r.block = g.node / {_RANK_BLOCK} WHERE c.id IN ({{marks}})")
        return {i: _rank(auth, node) for i, node, auth in self._rows_in(sql, list(dict.fromkeys(ids)))}

    def missing_codes(self, ids: Sequence[str] | None = None) -> list[tuple[str, Document]]:
        return self._missing("hdc", None, ids)

    def _missing(self, table: str, limit: int | None, ids: Sequence[str] | None) -> list[tuple[str, Document]]:
        """Chunks with no complete row in `table` (vectors: with passage vectors; or hdc), among
        `ids` when given."""
        q = (f"SELECT c.id, c.doc FROM chunks c LEFT JOIN {table} x ON x.label = c.label"
             f" WHERE (x.label IS NULL OR NOT ({_COMPLETE[table][0]}))")
        if ids is not None:
            rows = sorted(self._rows_in(q + " AND c.id IN ({marks})", list(dict.fromkeys(ids))))
        else:
            rows = list(self._read().execute(q + " ORDER BY c.label" + (f" LIMIT {int(limit)}" if limit is not None
                                                                    else "")))
        return [(i, Document.model_validate_json(d, strict=False)) for i, d in rows[:limit]]

    def work_chunks(self, work_ids: Sequence[str], filters: Filters | None = None) -> list[str]:
        found = list(self._rows_in("SELECT id, label FROM chunks WHERE work_id IN ({marks})",
                                   list(dict.fromkeys(work_ids))))
        if filters is not None and not filters.is_empty() and found:
            allowed = self.filter_labels(filters, within=[label for _, label in found])
            found = [(i, label) for i, label in found if label in allowed]
        return sorted(i for i, _ in found)

    def count_codes(self) -> int:
        return int(self._read().execute("SELECT count(*) FROM hdc").fetchone()[0])

    def count_works(self) -> int:
        return int(self._read().execute("SELECT count(DISTINCT work_id) FROM chunks").fetchone()[0])

    def id_map(self) -> dict[int, str]:
        return dict(self._read().execute("SELECT label, id FROM chunks"))

    def count(self) -> int:
        return int(self._read().execute("SELECT count(*) FROM chunks").fetchone()[0])

    def has_vectors(self) -> bool:
        return self._read().execute("SELECT 1 FROM vectors LIMIT 1").fetchone() is not None

    def count_vectors(self) -> int:
        return int(self._read().execute("SELECT count(*) FROM vectors").fetchone()[0])

    def missing_vectors(self, limit: int | None = None, ids: Sequence[str] | None = None
                        ) -> list[tuple[str, Document]]:
        return self._missing("vectors", limit, ids)

    def filter_labels(self, f: Filters, within: Sequence[int] | None = None) -> set[int]:
        """Labels of chunks that pass the filters (the dense channel's pre-filter), among `within`
        when given."""
        where: list[str] = []
        args: list[object] = []
        if within is not None:
            where.append(f"label IN ({','.join('?' * len(within))})")
            args.extend(within)
        if f.date_range is not None:
            lo, hi = f.date_range.bounds()
            if lo is not None:
                where.append("ym >= ?")
                args.append(lo)
            if hi is not None:
                where.append("ym <= ?")
                args.append(hi)
        for col, values in (("kind", f.kind), ("license", f.license)):
            if values:
                where.append(f"{col} IN ({','.join('?' * len(values))})")
                args.extend(norm_key(v) for v in values)
        if f.sources:
            where.append(f"source IN ({','.join('?' * len(f.sources))})")
            args.extend(f.sources)
        if f.subjects:
            where.append("label IN (SELECT label FROM chunk_subjects WHERE subject IN"
                         f" ({','.join('?' * len(f.subjects))}))")
            args.extend(norm_key(s) for s in f.subjects)
        sql = "SELECT label FROM chunks" + (" WHERE " + " AND ".join(where) if where else "")
        return {r[0] for r in self._read().execute(sql, args)}

    def hdc_options(self, *, ngrams: bool | None = None) -> dict[str, Any]:
        """The index's HDC encoding options (HdcEncoder's keyword arguments, `index_options`), fixed
        at first use so that documents and queries are always encoded alike."""
        saved = self.get_meta("hdc")
        options = index_options(saved, ngrams=ngrams)
        if saved is None:
            self.set_meta("hdc", options)
        elif ngrams is not None and options["ngrams"] != ngrams:
            raise ValidationError(f"this index encodes HDC with ngrams={options['ngrams']}; "
                                  "rebuild it to change that", field="ngrams")
        return options

    def get_meta(self, key: str) -> Any:
        """The value `set_meta` stored under `key` (None when there is none)."""
        row = self._read().execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def set_meta(self, key: str, value: object) -> None:
        with self._lock:
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, json.dumps(value)))


HDC_FIELDS = ("topic", "claim", "role", "acts")


_RANK_BLOCK = 256  # nodes whose ranks share a graph_ranks row
_STATE_KEYS = {"seq", "params", "names", "rank", "flags", "ym", "digests", "edges", "away"}


def _set_lists(c: sqlite3.Connection, works: Mapping[str, Neighbors], nodes: Sequence[int]) -> None:
    dumps = orjson.dumps
    c.executemany("INSERT OR REPLACE INTO graph_works VALUES (?,?,?,?,?)",
                  [(w, node, dumps(nb.cites).decode(), dumps(nb.cited_by).decode(), dumps(nb.cocited).decode())
                   for (w, nb), node in zip(works.items(), nodes, strict=True)])


def _set_ranks(c: sqlite3.Connection, pagerank: np.ndarray, auth: np.ndarray) -> None:
    """Every node's PageRank and authority, _RANK_BLOCK nodes a row."""
    pagerank, auth = pagerank.astype(np.float64), auth.astype(np.float64)
    c.execute("DELETE FROM graph_ranks WHERE block >= ?", (-(-len(pagerank) // _RANK_BLOCK),))
    c.executemany("INSERT OR REPLACE INTO graph_ranks VALUES (?,?,?)",
                  [(b, pagerank[lo:lo + _RANK_BLOCK].tobytes(), auth[lo:lo + _RANK_BLOCK].tobytes())
                   for b, lo in enumerate(range(0, len(pagerank), _RANK_BLOCK))])


def _set_state(c: sqlite3.Connection, state: GraphState) -> None:
    """The arrays the next update starts from, and the seq up to which changes are in them."""
    c.executemany("INSERT OR REPLACE INTO graph_state VALUES (?,?)", [
        ("params", orjson.dumps(list(state.params))), ("names", orjson.dumps(state.names)),
        ("rank", state.rank.tobytes()), ("flags", state.flags.tobytes()), ("ym", state.ym.tobytes()),
        ("digests", state.digests.tobytes()), ("edges", state.edges.tobytes()), ("away", state.away.tobytes())])
    _set_seq(c, state.seq)


def _set_seq(c: sqlite3.Connection, seq: int) -> None:
    """The journal seq up to which the graph state took changes in; their records of works left go."""
    c.execute("INSERT OR REPLACE INTO graph_state VALUES ('seq', ?)", (orjson.dumps(seq),))
    c.execute("DELETE FROM graph_dirty WHERE seq <= ?", (seq,))


def _newer_graph(c: sqlite3.Connection, state: GraphState) -> bool:
    """Whether the stored graph state took in changes past `state`'s."""
    row = c.execute("SELECT data FROM graph_state WHERE key = 'seq'").fetchone()
    return row is not None and orjson.loads(row[0]) > state.seq


def _rank(blob: bytes, node: int) -> float:
    """A node's value in its graph_ranks row."""
    return float(np.frombuffer(blob, dtype=np.float64)[node % _RANK_BLOCK])


_READ_MMAP = 1 << 30  # bytes of the store a read connection maps (address space, not memory)
# what makes a row of a derived table complete (what `only_missing` leaves alone; a chunk's vector
# comes with its passage vectors): as SQL over the row `x`, and as a test of the values a batch writes
_COMPLETE: dict[str, tuple[str, Callable[[Sequence[object]], bool]]] = {
    "vectors": ("x.passages IS NOT NULL", lambda v: v[2] is not None), "hdc": ("1", lambda v: True)}


def _as_matrix(rows: list[tuple[Any, ...]], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """(labels, blobs as the rows of one matrix) of (label, blob) rows."""
    labels = np.array([r[0] for r in rows], dtype=np.int64)
    mat: np.ndarray = np.frombuffer(b"".join(r[1] for r in rows), dtype=dtype).reshape(len(rows), -1) if rows \
        else np.zeros((0, 0), dtype=dtype)
    return labels, mat


def _blob(passages: np.ndarray) -> bytes:
    return np.asarray(passages, dtype=np.float32).tobytes()


def _code_row(codes: Mapping[str, np.ndarray]) -> list[bytes | None]:
    unknown = set(codes) - set(HDC_FIELDS)
    if unknown:
        raise ValueError(f"unknown HDC fields {sorted(unknown)}; valid: {', '.join(HDC_FIELDS)}")
    return [None if (v := codes.get(f)) is None else np.asarray(v, dtype=np.uint8).tobytes() for f in HDC_FIELDS]


def hash_text(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode("utf-8"))


def _ym(d: Document) -> int | None:
    return None if d.year is None else d.year * 100 + (d.month or 0)


def _opt(value: str | None) -> str | None:
    return None if value is None else norm_key(value)


def _chunks(seq: Sequence, size: int = 900):  # type: ignore[no-untyped-def,type-arg]
    seq = list(seq)
    for i in range(0, len(seq), size):
        yield seq[i:i + size]
