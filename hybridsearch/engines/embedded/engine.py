"""EmbeddedEngine: the journal in SQLite is the truth; tantivy and faiss are caught up from it."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hybridsearch.analysis import ANALYSIS_RULES, Analyzer, default_analyzer
from hybridsearch.embeddings import DIM, MODEL_NAME, default_encoder
from hybridsearch.engines import (
    Bm25Options,
    Codes,
    EngineStats,
    GraphState,
    GraphSummary,
    Neighbors,
    Progress,
    TermStat,
    TermStats,
    WorkLinks,
    check_bm25_fields,
    check_codes,
    check_lexicon,
    check_passages,
    check_query_codes,
    check_query_vector,
    check_vectors,
    sample_order,
    stale_analysis,
)
from hybridsearch.engines.embedded.bm25 import Bm25Index
from hybridsearch.engines.embedded.dense import CodeIndex, DenseIndex, saved_seq
from hybridsearch.engines.embedded.store import HDC_FIELDS, JournalEntry, Store
from hybridsearch.errors import EngineError, HybridSearchError
from hybridsearch.hdc import HdcEncoder
from hybridsearch.hdc.algebra import DIM as HDC_DIM
from hybridsearch.models import DocInfo, Document, Filters, RankedList, check_unique_ids
from hybridsearch.scoring import bm25_idf, document_tokens, rescore_bm25, unzip

_log = logging.getLogger("hybridsearch")
_CHECKPOINT_EVERY = 20_000  # journal entries applied to a vector index before it is saved again (at least)
_PAGE = 50_000  # journal entries read and applied at a time
_LOAD_WHOLE = 100_000  # journal entries to replay past which an empty vector index loads the stored rows instead
_INFO_MAX = 200_000  # DocInfo kept in memory (doc_info), dropped all at once past it
_DUE_DENSE = 1000  # changes past the dense checkpoint that an ingest's end or a close saves (at least)
VectorIndex = DenseIndex | CodeIndex
Rows = tuple[np.ndarray, np.ndarray]  # labels, and their vectors or codes as the rows of a matrix


class _Spec(NamedTuple):
    """A vector index of the engine: where its checkpoint is, how it is opened and fed."""

    path: Path
    kind: type[VectorIndex]
    dim: int
    ops: frozenset[str]  # the journal operations that change it
    due: int  # changes past its checkpoint that an ingest's end or a close saves (at least; a tenth of its size)
    open: Callable[[], VectorIndex]
    fetch: Callable[[list[int]], Rows]  # its rows by label
    page: Callable[[int, int], Rows]  # its rows past a label, in label order, at most so many


def _checkpoint_rows(spec: _Spec) -> int:
    """About how many rows a vector index's checkpoint holds, from its file's size (0: none)."""
    try:
        size = spec.path.stat().st_size
    except OSError:
        return 0
    return size // (spec.dim * 4 if spec.kind is DenseIndex else spec.dim // 8)


class EmbeddedEngine:
    """One index directory. The process holding `owner.lock` applies the journal to the derived
    indexes; other processes may append to the journal and read what the owner committed."""

    capabilities = frozenset({"lexical", "vector", "binary", "graph"})

    def __init__(self, path: str | os.PathLike[str], *, exact_max: int | None = None,
                 analyzer: Analyzer | None = None, model: str = MODEL_NAME, dim: int | None = None) -> None:
        from hybridsearch.config import get_settings

        exact_max = get_settings().exact_dense_max if exact_max is None else exact_max
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.dim = dim or DIM  # until the store says which encoder made its vectors (below)
        self.analyzer = analyzer or default_analyzer()
        self._lock = threading.RLock()
        self._lock_file = open(self.path / "owner.lock", "a+")  # noqa: SIM115
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.owner = True
        except OSError:
            self.owner = False
        store = self.path / "store.sqlite"
        if store.is_dir():
            raise EngineError(f"{self.path}/store.sqlite is a directory, not an index store")
        # beside derived indexes, a store without tables is a damaged one, not a new index: made
        # anew, it would have the derived indexes rebuilt from its empty journal
        derived = [self.path / "bm25", self.path / "dense.npz", *(self.path / f"hdc_{f}.npz" for f in HDC_FIELDS)]
        try:
            self.store = Store(store, create=not (store.exists() and any(p.exists() for p in derived)))
        except EngineError:
            self._lock_file.close()
            raise
        if dim is None:  # the dimension of the encoder the index recorded, else of the one configured
            recorded = self.store.get_meta("encoder")
            if isinstance(recorded, dict):
                self.dim = int(recorded["dim"])
            elif not self.store.has_vectors():  # a new index: the configured encoder's (where it can say)
                with contextlib.suppress(HybridSearchError):  # a bad encoder setting fails where it embeds
                    self.dim = default_encoder().dim
        try:
            self._open_derived(exact_max)
        except sqlite3.DatabaseError as e:
            self.store.close()
            self._lock_file.close()
            raise EngineError(f"the index store {self.path}/store.sqlite is damaged ({e}); nothing was written. "
                              "Restore it from a snapshot or ingest into a new index") from e

    def _open_bm25(self) -> None:
        """Open the BM25 index as owner (writing) or reader, checking it against the journal."""
        store_id = self.store.store_id
        self.bm25_index = Bm25Index(self.path / "bm25", self.analyzer, owner=self.owner, store_id=store_id)
        max_seq = self.store.max_seq()  # after reading the BM25 checkpoint, which the owner may move meanwhile
        if self.owner and self.bm25_index.applied_seq > max_seq:
            self.bm25_index.reset("it is ahead of the journal (built from another store)")
        if not self.owner and (self.bm25_index.applied_seq > max_seq
                               or self.bm25_index.stamp not in (None, store_id)):
            raise EngineError(f"the BM25 index of {self.path} was built from another store; "
                              "open the index in one process alone to rebuild it")
        if self.bm25_index.rebuilt:
            _log.warning("%s: rebuilding the BM25 index from the journal: %s", self.path, self.bm25_index.rebuilt)

    def _take_over(self) -> None:
        """A reader becomes the owner once the owner has closed (its lock is free): it opens the
        BM25 index for writing and applies what the journal holds, its own writes included."""
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        self.owner = True
        self.bm25_index.close()
        self._open_bm25()
        self._data_version = -1  # catch up now

    def _open_derived(self, exact_max: int) -> None:
        """Open the BM25 index (it replays the journal past its checkpoint; one built from another
        store, ahead of the journal, or unreadable is rebuilt from the journal, with a warning that
        says so) and name the vector indexes, which open when first needed (`_index`)."""
        from hybridsearch.config import get_settings

        store_id = self.store.store_id
        stored = self.get_meta("lexicon")
        check_lexicon(stored, self.analyzer, str(self.path))
        if stored is None:
            self.set_meta("lexicon", self.analyzer.lexicon.fingerprint)
        # the BM25 index is rebuilt from the journal when the analysis rules change; HDC codes are not
        stale = stale_analysis(self.get_meta("analysis"), "HDC codes", str(self.path))
        if stale and self.store.count_codes():
            _log.warning("%s", stale)
        elif stale:
            self.set_meta("analysis", ANALYSIS_RULES)
        self._open_bm25()
        # derived vector indexes, opened when first needed; a dense insert is dear to replay, an HDC
        # code cheap (and a large HDC matrix dear to read and write whole)
        dense = self.path / "dense.npz"
        self._specs: dict[str, _Spec] = {"dense": _Spec(
            dense, DenseIndex, self.dim, frozenset({"upsert", "delete", "vector"}), _DUE_DENSE,
            partial(DenseIndex.load, dense, self.dim, exact_max, nprobe=get_settings().dense_nprobe,
                    store_id=store_id, max_seq=self.store.max_seq), self.store.vector_rows, self.store.vector_page)}
        for f in HDC_FIELDS:
            path = self.path / f"hdc_{f}.npz"
            self._specs[f"hdc:{f}"] = _Spec(
                path, CodeIndex, HDC_DIM, frozenset({"upsert", "delete", "hdc"}), _CHECKPOINT_EVERY,
                partial(CodeIndex.load, path, HDC_DIM, store_id=store_id, max_seq=self.store.max_seq),
                partial(self.store.code_rows, field=f), partial(self.store.code_page, field=f))
        self._loaded: dict[str, VectorIndex] = {}
        self._unsaved: dict[str, int] = {}  # labels each open vector index changed since its last save
        self.progress: Progress | None = None  # long work on the vector indexes reports here
        self.bulk = False  # a long load: BM25 commits every few batches (DerivedIndexes)
        # the seq first: a commit between the two reads is then replayed by the catch-up, not missed
        self._seen_seq = self.store.max_seq()
        self._hdc_encoder: HdcEncoder | None = None
        self._info: dict[str, DocInfo] = {}
        self._data_version = -1
        self.refresh()

    # -- journal catch-up ---------------------------------------------------------------------
    def refresh(self) -> None:
        """Catch derived indexes up with the journal if another connection committed since the
        last look (SQLite's data_version moves only on other connections' commits); a reader
        takes over the derived indexes when the owner has gone."""
        with self._lock:
            if not self.owner:
                self._take_over()
            version = self.store.data_version()
            # a reader also looks again when the owner has applied since (its commits to BM25 do
            # not move SQLite's data_version)
            if version == self._data_version and (self.owner or not self.bm25_index.stale()):
                return
            self._data_version = version
            self._catch_up()

    def _catch_up(self, written: tuple[int, Sequence[Document]] | None = None) -> None:
        """Apply the journal past what each derived index holds, a page at a time: BM25 takes
        upserts and deletes, each open vector index the operations that change it. `written`:
        (first seq, documents) of a write just made, whose upserts took the seqs from `first` on in
        the documents' order: BM25 takes those documents as they are instead of reading them back."""
        first, mine = written if written is not None else (0, ())
        start = min([self.bm25_index.applied_seq, self._seen_seq]
                    + [idx.applied_seq for idx in self._loaded.values()])
        if not self._loaded and written is None:  # only BM25 and the DocInfo cache follow: vectors or
            top = self.store.max_seq()  # codes alone were written (a bulk load: 10k entries read per batch)
            if top > start and self.store.first_since(start, ("upsert", "delete")) is None:
                self._seen_seq = max(self._seen_seq, top)
                if self.owner:
                    self.bm25_index.skip_to(max(self.bm25_index.applied_seq, top))
                else:
                    self.bm25_index.reload()
                return
        for entries in self.store.journal_pages(start, _PAGE):
            last = entries[-1].seq
            for e in entries:
                if e.seq > self._seen_seq:
                    self._info.pop(e.id, None)
            self._seen_seq = max(self._seen_seq, last)
            if self.owner:
                todo = [e for e in entries if e.seq > self.bm25_index.applied_seq and e.op in ("upsert", "delete")]
                if todo:
                    latest = {e.label: e for e in todo}
                    docs = {lb: mine[e.seq - first] for lb, e in latest.items()
                            if e.op == "upsert" and 0 <= e.seq - first < len(mine)}
                    docs |= self.store.docs_by_label([lb for lb in latest if lb not in docs])
                    self.bm25_index.apply(docs, [e.id for lb, e in latest.items() if lb not in docs], last,
                                          defer=self.bulk)
                elif last > self.bm25_index.applied_seq:  # nothing BM25 indexes changed: recorded, so
                    self.bm25_index.skip_to(last)  # that no later catch-up or open reads these again
            for name, index in self._loaded.items():
                self._apply(name, index, entries)
        if not self.owner:
            self.bm25_index.reload()

    def _apply(self, name: str, index: VectorIndex, entries: Sequence[JournalEntry]) -> None:
        """Apply journal entries to one vector index: the rows of the labels they touch are read
        from the store again (absent: removed). The owner saves the index when the labels it
        changed since its last save reach its size (at least _CHECKPOINT_EVERY), so that saving
        costs a bounded share of the writes however large the index grows."""
        spec = self._specs[name]
        labels = list(dict.fromkeys(e.label for e in entries if e.seq > index.applied_seq and e.op in spec.ops))
        if labels:
            found, rows = spec.fetch(labels)
            index.remove(np.setdiff1d(np.array(labels, dtype=np.int64), found))
            index.upsert(found, rows)
            self._unsaved[name] += len(labels)
        index.applied_seq = max(index.applied_seq, entries[-1].seq)
        if self.owner and self._unsaved[name] >= max(_CHECKPOINT_EVERY, len(index)):
            self._save(name, index)

    def _index(self, name: str) -> VectorIndex:
        """The vector index `name`, opened from its checkpoint and caught up with the journal the
        first time it is needed (one built from another store, ahead of the journal or unreadable
        is rebuilt from the journal, with a warning that says so)."""
        with self._lock:
            index = self._loaded.get(name)
            if index is not None:
                return index
            index = self._specs[name].open()
            if index.rebuilt:
                _log.warning("%s: rebuilding the %s index from the journal: %s", self.path, name, index.rebuilt)
            if isinstance(index, DenseIndex):
                index.progress = self._report
            self._unsaved[name] = 0
            # the entries before the first this index takes are passed over unread (after a million
            # vectors were added, an HDC index's checkpoint lies behind a million entries it ignores)
            spec = self._specs[name]
            top = self.store.max_seq()
            if not len(index) and self.store.count_since(index.applied_seq, spec.ops, _LOAD_WHOLE) >= _LOAD_WHOLE:
                self._load_whole(name, index, top)
            first = self.store.first_since(index.applied_seq, spec.ops)
            index.applied_seq = max(index.applied_seq, top if first is None else min(top, first - 1))
            for entries in self.store.journal_pages(index.applied_seq, _PAGE):
                self._apply(name, index, entries)
                self._report(f"{name} index: applying the journal", entries[-1].seq,
                             max(self._seen_seq, entries[-1].seq))
            self._loaded[name] = index
            return index

    def _load_whole(self, name: str, index: VectorIndex, top: int) -> None:
        """Fill an empty vector index with the rows the store holds, in label order, instead of
        replaying the journal up to `top` (read before): each row is read once, however many
        entries wrote it (a chunk's document, then its vector), and a dense index that they take
        past the exact size is trained first, on a sample of them, for as many lists as all of
        them call for (DenseIndex.expect). Rows written past `top` come again with the entries
        after it, which change nothing they already hold."""
        spec = self._specs[name]
        span = self.store.label_range("vectors" if isinstance(index, DenseIndex) else "hdc")
        total = 1 if span is None else span[1] - span[0] + 1
        if isinstance(index, DenseIndex) and span is not None:
            index.expect(total, partial(self.store.vector_sample, span))
        after = loaded = 0
        while True:
            labels, rows = spec.page(after, _PAGE)
            if not len(labels):
                break
            index.upsert(labels, rows)
            self._unsaved[name] += len(labels)
            after, loaded = int(labels[-1]), loaded + len(labels)
            self._report(f"{name} index: loading the stored rows", min(loaded, total), total)
        index.applied_seq = max(index.applied_seq, top)
        self._unsaved[name] += 1  # saved even when it holds nothing (no chunk has a role code): loaded once

    def _report(self, what: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(what, done, total)

    def _save(self, name: str, index: VectorIndex) -> None:
        """Save the index if it changed since its last save (or was rebuilt from the journal)."""
        if self._unsaved[name] or index.rebuilt:
            index.save(self._specs[name].path)
            self._unsaved[name], index.rebuilt = 0, None

    def checkpoint(self) -> None:
        """Save the vector indexes whose changes past their checkpoints the next open should not
        replay: those that reach the index's `due` and a tenth of its size (a checkpoint is written
        whole, so an update costs what it changes), or any change where there is no checkpoint
        load would take. One not open is opened, caught up, saved and let go, one at a time; the
        changes left unsaved are replayed from the journal when the index next opens. The BM25
        index commits what it holds pending, for other processes to read."""
        with self._lock:
            if not self.owner:
                return
            self.bm25_index.flush()
            for name, spec in self._specs.items():
                index = self._loaded.get(name)
                seq = saved_seq(spec.kind, spec.path, spec.dim, self.store.store_id)
                size = len(index) if index is not None else _checkpoint_rows(spec)
                due = 1 if seq < 0 else max(spec.due, size // 10)
                if index is not None:
                    if self._unsaved[name] >= due or index.rebuilt:
                        self._save(name, index)
                elif self.store.count_since(seq, spec.ops, due) >= due:
                    self._save(name, self._index(name))
                    del self._loaded[name]

    # -- writes ---------------------------------------------------------------------------------
    def write(self, docs: Sequence[Document], vectors: np.ndarray | None = None,
              codes: Sequence[Codes] | None = None, passages: Sequence[np.ndarray] | None = None) -> int:
        """Store documents (optionally with vectors, passage vectors and HDC codes) atomically in
        one journal transaction; returns how many. When this returns, no crash can lose them."""
        docs = list(docs)
        check_unique_ids(docs)
        if vectors is not None:
            vectors = check_vectors(vectors, len(docs), self.dim)
        passages = check_passages(passages, len(docs), self.dim, vectors is not None)
        if codes is not None:
            codes = check_codes(codes, len(docs))
        with self._lock:
            first = self.store.write(docs, vectors, self.model, codes, passages)
            self._catch_up(written=(first, docs))
            self._keep_info(docs)  # as doc_info would read them back
            return len(docs)

    def set_vectors(self, ids: Sequence[str], vectors: np.ndarray, *, texts: Sequence[str] | None = None,
                    passages: Sequence[np.ndarray] | None = None) -> int:
        vectors = check_vectors(vectors, len(ids), self.dim)
        passages = check_passages(passages, len(ids), self.dim, True)
        with self._lock:
            n = self.store.set_vectors(list(ids), vectors, self.model, texts=texts, passages=passages)
            self._catch_up()
            return n

    def set_codes(self, ids: Sequence[str], codes: Sequence[Codes]) -> int:
        codes = check_codes(codes, len(ids))
        with self._lock:
            n = self.store.set_codes(list(ids), codes)
            self._catch_up()
            return n

    def delete(self, ids: Sequence[str]) -> list[str]:
        with self._lock:
            deleted = self.store.delete(list(ids))
            self._catch_up()
            return deleted

    # -- reads ----------------------------------------------------------------------------------
    def get(self, ids: Sequence[str]) -> dict[str, Document]:
        return self.store.docs_by_id(list(ids))

    def count(self) -> int:
        return self.store.count()

    def missing_vectors(self, limit: int | None = None, ids: Sequence[str] | None = None
                        ) -> list[tuple[str, Document]]:
        return self.store.missing_vectors(limit, ids)

    def bm25(self, query: str | Sequence[tuple[str, float]], fields: Mapping[str, float] | None = None,
             k: int = 10, filters: Filters | None = None, options: Bm25Options | None = None) -> RankedList:
        """Field-boosted BM25 by tantivy (k1=1.2, b=0.75); other k1/b rescore tantivy's top
        max(4k, 200) candidates with hybridsearch.scoring.rescore_bm25."""
        opt = options or Bm25Options()
        terms = ([(t, 1.0) for t in self.analyzer.analyze(query)] if isinstance(query, str)
                 else list(query))
        self.refresh()
        fields = check_bm25_fields(fields)
        labels, scores = self.bm25_index.search(terms, fields, max(4 * k, 200) if opt.rescored else k,
                                                filters, opt.mode, opt.tie_breaker)
        rl = self._ranked("bm25", labels, scores)
        if opt.rescored and rl.ids:
            rl = RankedList.of("bm25", *unzip(self._rescore(terms, fields, rl.ids, k, opt)))
        if opt.role_boost != 1.0:
            rl = RankedList.of("bm25", rl.ids, [s * opt.role_boost for s in rl.scores])
        return rl

    def _rescore(self, terms: Sequence[tuple[str, float]], fields: Mapping[str, float], ids: list[str],
                 k: int, opt: Bm25Options) -> list[tuple[str, float]]:
        """Exact BM25 with other k1/b over candidates, with tantivy's statistics: all documents
        count, and lengths are exact token counts (tantivy quantises them)."""
        n, avg = self.bm25_index.field_stats()
        active = [f for f, w in fields.items() if w > 0]
        tokens = {id_: document_tokens(self.analyzer, d, active) for id_, d in self.store.docs_by_id(ids).items()}
        return rescore_bm25(terms, fields, tokens, n, avg, self.bm25_index.field_doc_freq, k,
                            opt.mode, opt.tie_breaker, opt.k1, opt.b)

    def term_stats(self, terms: Sequence[str]) -> TermStats:
        """Full-corpus document frequencies and Lucene idf for analyzed terms."""
        self.refresh()
        n = self.bm25_index.num_docs()
        out = {}
        for t in terms:
            df = self.bm25_index.doc_freq(t)
            out[t] = TermStat(df, bm25_idf(n, df))
        return TermStats(n, out)

    def knn(self, vec: np.ndarray, k: int = 10, filters: Filters | None = None) -> RankedList:
        vec = check_query_vector(vec, self.dim)
        self.refresh()
        allowed = None if filters is None or filters.is_empty() else self.store.filter_labels(filters)
        labels, scores = self._index("dense").search(vec, k, allowed)
        return self._ranked("dense", labels, scores)

    def vector_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        vec = check_query_vector(vec, self.dim)
        self.refresh()
        labels = self.store.labels_of(ids)
        return {labels[lb]: s for lb, s in self._index("dense").score(vec, list(labels)).items()}

    def passage_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        vec = check_query_vector(vec, self.dim)
        found = self.passage_vectors(ids)
        if not found:
            return {}
        sizes = [len(p) for p in found.values()]
        best = np.maximum.reduceat(np.concatenate(list(found.values())) @ vec, np.cumsum([0, *sizes[:-1]]))
        return dict(zip(found, best.tolist(), strict=True))

    def has_vectors(self) -> bool:
        return self.store.has_vectors()

    def passage_vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        self.refresh()
        labels = self.store.labels_of(ids)
        return {labels[lb]: p for lb, p in self.store.passages_by_label(list(labels), self.dim).items()}

    def hamming(self, codes: Codes, k: int = 10, filters: Filters | None = None) -> dict[str, RankedList]:
        """Per field, the nearest codes; scores are similarities 1 - hamming/4096."""
        codes = check_query_codes(codes)
        self.refresh()
        allowed = None if filters is None or filters.is_empty() else self.store.filter_labels(filters)
        return {f: self._ranked(f"hdc:{f}", *self._hdc_index(f).search(code, k, allowed)) for f, code in codes.items()}

    def hamming_score(self, codes: Codes, ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """Per field, exact similarity to the chosen documents' codes (absent: no entry)."""
        codes = check_query_codes(codes)
        self.refresh()
        labels = self.store.labels_of(ids)
        return {f: {labels[lb]: s for lb, s in self._hdc_index(f).score(code, list(labels)).items()}
                for f, code in codes.items()}

    def _hdc_index(self, field: str) -> VectorIndex:
        return self._index(f"hdc:{field}")

    def hdc_encoder(self, *, ngrams: bool | None = None) -> HdcEncoder:
        """The HDC encoder for this index (its options are stored with the index)."""
        options = self.store.hdc_options(ngrams=ngrams)
        if self._hdc_encoder is None or (self._hdc_encoder.ngrams, self._hdc_encoder.ties) != (
                options["ngrams"], options["ties"]):
            self._hdc_encoder = HdcEncoder(self.analyzer, **options)
        return self._hdc_encoder

    def missing_codes(self, ids: Sequence[str] | None = None) -> list[tuple[str, Document]]:
        return self.store.missing_codes(ids)

    def doc_info(self, ids: Sequence[str]) -> dict[str, DocInfo]:
        """DocInfo of chunks (cached in memory)."""
        self.refresh()
        missing = [i for i in ids if i not in self._info]
        if missing:
            self._keep_info(list(self.store.docs_by_id(missing).values()))
        return {i: self._info[i] for i in ids if i in self._info}

    def _keep_info(self, docs: Sequence[Document]) -> None:
        """Cache the DocInfo of stored chunks (all of it dropped at once past _INFO_MAX)."""
        if len(self._info) + len(docs) > _INFO_MAX:
            self._info.clear()
        self._info.update((d.id, DocInfo.of(d)) for d in docs)

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The dense vectors of chunks that have one."""
        self.refresh()
        labels = self.store.labels_of(ids)
        return {labels[lb]: v for lb, v in self._index("dense").vectors(list(labels)).items()}

    def vector_sample(self, n: int, filters: Filters | None = None) -> np.ndarray:
        self.refresh()
        allowed = None if filters is None or filters.is_empty() else self.store.filter_labels(filters)
        names = self.store.id_map()
        dense = self._index("dense")
        labels = [lb for lb in dense.labels() if lb in names and (allowed is None or lb in allowed)]
        chosen = [labels[i] for i in sample_order([names[lb] for lb in labels], n)]
        got = dense.vectors(chosen)
        rows = [got[lb] for lb in chosen if lb in got]
        return np.vstack(rows) if rows else np.zeros((0, dense.dim), dtype=np.float32)

    def work_chunks(self, work_ids: Sequence[str], filters: Filters | None = None) -> dict[str, DocInfo]:
        ids = self.store.work_chunks(work_ids, filters)
        infos = self.doc_info(ids)
        return {i: infos[i] for i in ids if i in infos}

    def neighbors(self, ids: Sequence[str]) -> dict[str, Neighbors]:
        return self.store.neighbors(ids)

    def authority(self, ids: Sequence[str]) -> dict[str, float]:
        return self.store.authority(ids)

    def citation_links(self) -> list[WorkLinks]:
        return self.store.citation_links()

    def set_graph(self, works: Mapping[str, Neighbors], summary: GraphSummary,
                  state: GraphState | None = None) -> None:
        self.store.set_graph(works, summary, state)

    def graph_summary(self) -> GraphSummary | None:
        return self.store.graph_summary()

    # IncrementalGraphStore: an update reads the works changed since the last build, from the store
    def graph_state(self) -> GraphState | None:
        return self.store.graph_state()

    def graph_changes(self, since: int | None) -> tuple[int, list[str]]:
        return self.store.graph_changes(since)

    def work_links(self, work_ids: Sequence[str]) -> list[WorkLinks]:
        return self.store.work_links(work_ids)

    def chunk_works(self, ids: Sequence[str]) -> dict[str, str]:
        return self.store.chunk_works(ids)

    def update_graph_rows(self, works: Mapping[str, Neighbors], nodes: Sequence[int], gone: Sequence[str],
                          state: GraphState, summary: GraphSummary) -> None:
        self.store.update_graph_rows(works, nodes, gone, state, summary)

    def get_meta(self, key: str) -> Any:
        return self.store.get_meta(key)

    def set_meta(self, key: str, value: Any) -> None:
        self.store.set_meta(key, value)

    def _ranked(self, channel: str, labels: list[int], scores: list[float]) -> RankedList:
        """Labels and scores as a ranked list of chunk ids; a label the store no longer holds (a
        chunk deleted since the index applied the journal) is dropped."""
        id_of = self.store.ids_of(labels)
        ids, out = [], []
        for lb, s in zip(labels, scores, strict=True):
            id_ = id_of.get(lb)
            if id_ is not None:
                ids.append(id_)
                out.append(s)
        return RankedList.of(channel, ids, out)

    def stats(self) -> EngineStats:
        self.refresh()
        return EngineStats(self.count(), self.store.count_vectors(), self.store.count_codes(), {
            "engine": "embedded",
            "path": str(self.path),
            "owner": self.owner,
            "works": self.store.count_works(),
            "journal_seq": self._seen_seq,
            "bm25_applied_seq": self.bm25_index.applied_seq,
            "bm25_docs": self.bm25_index.num_docs(),
            # the vector indexes this process has open (None: not open, nothing loaded to say)
            "dense_applied_seq": None if (d := self._loaded.get("dense")) is None else d.applied_seq,
            "dense_vectors": None if d is None else len(d),
            "dense_mode": None if not isinstance(d, DenseIndex) else ("exact", "hnsw", "ivf")[d.mode],
            "hdc_indexed": {f: None if (h := self._loaded.get(f"hdc:{f}")) is None else len(h) for f in HDC_FIELDS},
            "bm25_fields": sorted(self.bm25_index.fields_present),
            "model": self.model,
            "graph": None if (g := self.store.graph_summary()) is None else g.as_dict(),
        })

    def close(self) -> None:
        """Close the index. The owner first applies what other processes committed, so that what
        it leaves on disk is current when no other process takes over the derived indexes."""
        with self._lock:
            try:
                if self.owner:
                    self.refresh()
                self.checkpoint()
            finally:
                self.bm25_index.close()
                self.store.close()
                self._lock_file.close()

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
