"""The vector channels' in-memory indexes: float vectors by inner product (DenseIndex: faiss, exact
up to a size, inverted lists (IVF) above it) and binary codes by Hamming similarity (CodeIndex:
always exact).

Both map labels (the store's chunk labels) to what they hold in numpy arrays indexed by label, not
Python dicts (a million entries cost 8 bytes each, not about a hundred), and take and give
matrices: `upsert(labels, mat)` (a label given twice in one call takes its last row)."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import faiss
import numpy as np

from hybridsearch.engines import Progress

# One query at a time needs no OpenMP team, and faiss' idle OpenMP threads spin and steal the
# cores from torch's query embedding (it doubled dense latency). Bulk builds use all cores.
faiss.omp_set_num_threads(1)

_log = logging.getLogger("hybridsearch")
_PARALLEL_FROM = 100_000  # below this many vectors one thread searches fastest
_BUILD_SLICE = 5_000  # vectors added to an index between two progress reports of a large addition
_EXACT_FILTERED = 2_000  # vectors passing a filter that an approximate index scores exactly instead
_TRAIN_PER_LIST = 16  # k-means sample of an IVF build: vectors per list (32: recall the same, training twice as long)
_LEGACY_EF_SEARCH = 256  # candidates a search of an HNSW index (from an older checkpoint) examines
EXACT, HNSW, IVF = 0, 1, 2  # a dense index's modes (HNSW: only as read from an older checkpoint)
_SCAN_ROWS = 1 << 16  # codes gathered and scanned at a time by a filtered Hamming search
_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, RuntimeError, zipfile.BadZipFile)


def _fit(arr: np.ndarray, size: int) -> np.ndarray:
    """`arr` (zero-filled past its end) with at least `size` rows; grows by half at least."""
    if size <= len(arr):
        return arr
    out = np.zeros((max(size, len(arr) + len(arr) // 2, 1024), *arr.shape[1:]), dtype=arr.dtype)
    out[:len(arr)] = arr
    return out


def _lookup(arr: np.ndarray, keys: Sequence[int] | np.ndarray) -> np.ndarray:
    """arr[keys], 0 for keys outside it."""
    keys = np.asarray(keys, dtype=np.int64).ravel()
    out = np.zeros(len(keys), dtype=np.int64)
    inside = (keys >= 0) & (keys < len(arr))
    out[inside] = arr[keys[inside]]
    return out


def _last_of_each(labels: np.ndarray, mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels and rows with a label given twice kept once, with its last row."""
    if len(labels) < 2:
        return labels, mat
    _, first_from_end = np.unique(labels[::-1], return_index=True)
    if len(first_from_end) == len(labels):
        return labels, mat
    keep = np.sort(len(labels) - 1 - first_from_end)
    return labels[keep], mat[keep]


def ivf_lists(n: int) -> int:
    """The inverted lists of an IVF index over `n` vectors: the power of two nearest sqrt(n) (at
    least 64): 512 at 200k, 1,024 at 1M. Building costs vectors x lists (each vector is compared
    with every centroid, k-means with lists squared); a search compares the query with the
    centroids and with the vectors of `nprobe` lists (about nprobe * n / lists). At 1M clustered
    vectors (bench/scale.py's, 2 cores), 1,024 lists against 2,048: training and filling 8 s
    against 21, a search of 64 lists 5.3 ms against 3.4, recall@10 0.995 against 0.994."""
    return 1 << max(6, round(math.log2(math.sqrt(max(n, 1)))))


_FAISS_MEMBER = "index.faiss"  # a dense checkpoint's faiss index, beside its arrays (older ones: index.npy)


def _write_npz(path: Path, index: faiss.Index | None = None, **arrays: np.ndarray) -> None:
    """Write arrays (and a faiss index) to `path` atomically: a temporary file, written as it goes
    (the faiss index streamed into its member, never copied whole in memory), renamed over it.
    np.load reads the arrays."""
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", allowZip64=True) as z:
        for name, arr in arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(arr))
        if index is not None:
            with z.open(_FAISS_MEMBER, "w", force_zip64=True) as f:
                faiss.write_index(index, faiss.PyCallbackIOWriter(f.write))
    os.replace(tmp, path)


def _read_faiss(path: Path, z: np.lib.npyio.NpzFile) -> faiss.Index:
    """The faiss index of a dense checkpoint, streamed from its member."""
    if "index" in z.files:  # written before the index was streamed
        return faiss.deserialize_index(z["index"])
    with zipfile.ZipFile(path) as zf, zf.open(_FAISS_MEMBER) as f:
        return faiss.read_index(faiss.PyCallbackIOReader(f.read))


class DenseIndex:
    """Float vectors (`dim`) scored by inner product. faiss ids are vector versions (vids), so an
    approximate index tombstones old ones instead of removing them.

    Exact mode (IndexFlatIP) removes for real. When an upsert takes the index past `exact_max`
    live vectors it is built again as IVF-Flat: k-means over a sample of the live vectors gives
    `ivf_lists(n)` centroids, each vector is kept in its nearest centroid's list, and a search
    scores every vector of the `nprobe` lists nearest the query exactly (bench/scale.py at 1M
    clustered vectors: recall@10 1.000 at 16 of 4,096 lists; HNSW, M 32, kept 0.94 at any
    ef_search, and took three times as long to build). New vectors join their nearest list; the
    index is built again (trained anew) when its live vectors call for twice its lists (at 524k
    for one built at 200k), and when tombstones pass a fifth of it; a bulk load trains it once,
    for all it brings (`expect`). A checkpoint of an older HNSW
    index is still read and searched until its next build. Large additions (a build, or a batch
    of _BUILD_SLICE vectors or more) use every core and report to `progress` slice by slice."""

    def __init__(self, dim: int, exact_max: int, nprobe: int = 64) -> None:
        self.dim = dim
        self.exact_max = exact_max
        self.nprobe = nprobe  # IVF lists a search scans
        self.applied_seq = 0
        self.progress: Progress | None = None
        self._lock = threading.RLock()
        self._vid_of = np.zeros(0, dtype=np.int64)  # label -> live vid (0: none)
        self._label_of = np.zeros(0, dtype=np.int64)  # vid -> label, live or tombstoned (0: removed)
        self._live = 0
        self._tombstones: set[int] = set()
        self._skip: tuple[faiss.IDSelector, ...] | None = None  # the tombstones' selector, kept until they change
        self._next_vid = 1
        self.mode = EXACT
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self.store_id = ""  # the store this index is built from (stamped into checkpoints)
        self.rebuilt: str | None = None  # why load() started empty instead of from the checkpoint

    @property
    def approximate(self) -> bool:
        return self.mode != EXACT

    def _lists(self) -> int:
        """The IVF index's list count (0 in another mode)."""
        return faiss.downcast_index(self._index.index).nlist if self.mode == IVF else 0

    def _new_index(self, mat: np.ndarray, n: int | None = None) -> faiss.Index:
        """An empty index in `self.mode` for the vectors `mat` (or for `n` vectors, `mat` a sample
        of them): exact, or IVF trained on them (on every core; the k-means sample is fixed by a
        seed, so a build repeats)."""
        if self.mode == EXACT:
            return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        nlist = ivf_lists(len(mat) if n is None else n)
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.min_points_per_centroid = 1  # the sample is sized here; no warning on stderr for it
        rows = len(mat)
        sample = np.sort(np.random.default_rng(0).choice(rows, min(rows, _TRAIN_PER_LIST * nlist), replace=False))
        what = f"dense index: training {nlist:,} IVF lists"
        if self.progress is not None:
            self.progress(what, 0, 1)
        start = time.perf_counter()
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        try:
            ivf.train(np.ascontiguousarray(mat[sample]))
        finally:
            faiss.omp_set_num_threads(1)
        if self.progress is not None:
            self.progress(what, 1, 1)
        _log.info("%s on %d vectors in %.1fs", what, len(sample), time.perf_counter() - start)
        ivf.make_direct_map()  # reconstruct() by position, for exact scores and rebuilds
        return faiss.IndexIDMap2(ivf)

    def __len__(self) -> int:
        return self._live

    def upsert(self, labels: Sequence[int] | np.ndarray, mat: np.ndarray) -> None:
        """Set the vectors (rows of `mat`) of `labels` (a label given twice takes its last row). A
        label that holds the very same vector already is left alone: replaying the journal meets a
        chunk's vector again (its document's entry, then its vector's), and an approximate index
        would otherwise tombstone and add it again."""
        labels = np.asarray(labels, dtype=np.int64).ravel()
        with self._lock:
            if not len(labels):
                return
            labels, mat = _last_of_each(labels, np.ascontiguousarray(mat, dtype=np.float32).reshape(len(labels), -1))
            held = np.flatnonzero(_lookup(self._vid_of, labels))
            if len(held):
                old = np.vstack(list(self.vectors(labels[held].tolist()).values()))
                same = held[(old == mat[held]).all(axis=1)]
                if len(same):
                    keep = np.ones(len(labels), dtype=bool)
                    keep[same] = False
                    labels, mat = labels[keep], mat[keep]
            self.remove(labels)
            if not len(labels):
                return
            vids = np.arange(self._next_vid, self._next_vid + len(labels), dtype=np.int64)
            self._next_vid += len(labels)
            self._vid_of = _fit(self._vid_of, int(labels.max()) + 1)
            self._vid_of[labels] = vids
            self._label_of = _fit(self._label_of, self._next_vid)
            self._label_of[vids] = labels
            self._live += len(labels)
            if self._outgrown():
                self._rebuild(adding=(vids, mat))
            else:
                self._add(self._index, mat, vids)

    def _outgrown(self) -> bool:
        """Whether the live vectors call for another mode, or for twice the IVF lists."""
        return (self.mode == EXACT and self._live > self.exact_max) or \
            (self.mode == IVF and ivf_lists(self._live) >= 2 * self._lists())

    def expect(self, n: int, sample: Callable[[int], np.ndarray]) -> None:
        """Before about `n` vectors are loaded into this empty index: where they call for IVF, it
        is trained now for them, on `sample(k)` (about k of them, drawn across the whole load), so
        that each vector loaded goes straight to its list: no exact copy first, no rebuild."""
        with self._lock:
            if self._index.ntotal or n <= self.exact_max:
                return
            mat = sample(_TRAIN_PER_LIST * ivf_lists(n))
            if len(mat) < ivf_lists(n):  # too few to train on: built as vectors come, as ever
                return
            self.mode = IVF
            self._index = self._new_index(np.ascontiguousarray(mat, dtype=np.float32), n)

    def remove(self, labels: Sequence[int] | np.ndarray) -> None:
        with self._lock:
            vids = np.unique(_lookup(self._vid_of, labels))
            vids = vids[vids > 0]
            if not len(vids):
                return
            self._vid_of[self._label_of[vids]] = 0
            self._live -= len(vids)
            if self.approximate:
                self._tombstones.update(vids.tolist())
                self._skip = None
                if len(self._tombstones) > max(1000, self._index.ntotal // 5):
                    self._rebuild()
            else:
                self._index.remove_ids(vids)
                self._label_of[vids] = 0

    def _rebuild(self, *, adding: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """The index built anew from its live vectors (and `adding`: vids and vectors not in it
        yet), in the mode their count calls for."""
        base = faiss.downcast_index(self._index.index)
        vids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        mat = base.reconstruct_n(0, base.ntotal) if base.ntotal else np.zeros((0, self.dim), dtype=np.float32)
        live = _lookup(self._vid_of, self._label_of[vids]) == vids
        vids, mat = vids[live], mat[live]
        if adding is not None:
            vids, mat = np.concatenate([vids, adding[0]]), np.concatenate([mat, adding[1]])
        self.mode = EXACT if len(mat) <= self.exact_max else IVF
        index = self._new_index(mat)
        self._add(index, mat, vids)
        self._index = index
        labels = self._label_of[vids]
        self._tombstones.clear()
        self._skip = None
        self._label_of[:] = 0
        self._label_of[vids] = labels

    def _add(self, index: faiss.Index, mat: np.ndarray, vids: np.ndarray) -> None:
        """Add vectors to `index`: a few on one thread; many on every core, in slices that report
        to `progress`."""
        if len(vids) < _BUILD_SLICE:
            index.add_with_ids(mat, vids)
            return
        what = "dense index: filling the IVF lists" if self.mode == IVF else "dense index: adding vectors"
        start = time.perf_counter()
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        try:
            for lo in range(0, len(vids), _BUILD_SLICE):
                index.add_with_ids(mat[lo:lo + _BUILD_SLICE], vids[lo:lo + _BUILD_SLICE])
                if self.progress is not None:
                    self.progress(what, min(lo + _BUILD_SLICE, len(vids)), len(vids))
        finally:
            faiss.omp_set_num_threads(1)
        _log.info("%s: %d vectors in %.1fs", what, len(vids), time.perf_counter() - start)

    def _params(self, sel: faiss.IDSelector | None, k: int) -> faiss.SearchParameters | None:
        if self.mode == IVF:
            return faiss.SearchParametersIVF(sel=sel, nprobe=self.nprobe) if sel is not None \
                else faiss.SearchParametersIVF(nprobe=self.nprobe)
        if self.mode == HNSW:
            return faiss.SearchParametersHNSW(sel=sel, efSearch=max(_LEGACY_EF_SEARCH, k)) if sel is not None \
                else faiss.SearchParametersHNSW(efSearch=max(_LEGACY_EF_SEARCH, k))
        return None if sel is None else faiss.SearchParameters(sel=sel)

    def search(self, vec: np.ndarray, k: int, allowed: set[int] | None) -> tuple[list[int], list[float]]:
        """Top-k (labels, cosine) for a normalised query vector, optionally within `allowed` labels."""
        with self._lock:
            if not self._live or k <= 0:
                return [], []
            sel = None
            vids = np.zeros(0, dtype=np.int64)
            if allowed is not None:
                vids = _lookup(self._vid_of, list(allowed))
                vids = vids[vids > 0]
                if not len(vids):
                    return [], []
                if self.approximate and len(vids) <= _EXACT_FILTERED:
                    # few pass the filter: scored exactly (the lists nearest the query may hold
                    # none of them)
                    return self._exact(vec, self._label_of[vids].tolist(), k)
                sel = faiss.IDSelectorBatch(vids)
            elif self._tombstones:
                if self._skip is None:
                    inner = faiss.IDSelectorBatch(np.fromiter(self._tombstones, dtype=np.int64))
                    self._skip = (faiss.IDSelectorNot(inner), inner)  # the outer refers to the inner
                sel = self._skip[0]
            q = np.ascontiguousarray(vec, dtype=np.float32).reshape(1, -1)
            if self._index.ntotal >= _PARALLEL_FROM:
                faiss.omp_set_num_threads(os.cpu_count() or 1)
            try:
                scores, vids_out = self._index.search(q, min(k, self._live), params=self._params(sel, k))
            finally:
                faiss.omp_set_num_threads(1)
            labels, out = [], []
            for s, v in zip(scores[0].tolist(), vids_out[0].tolist(), strict=True):
                if v < 0 or v in self._tombstones:
                    continue
                labels.append(int(self._label_of[v]))
                out.append(float(s))
            passing = len(vids) if allowed is not None else self._live
            if self.approximate and len(labels) < min(k, passing):
                # an approximate search that skips vectors (those the filter refuses, or
                # tombstones) can end short of k when few pass: those that pass are scored exactly
                # instead, so nothing the filter lets through is withheld
                return self._exact(vec, self._label_of[vids].tolist() if allowed is not None else self.labels(), k)
            return labels, out

    def _exact(self, vec: np.ndarray, labels: list[int], k: int) -> tuple[list[int], list[float]]:
        """The top-k of `labels` by exact cosine (ties by label)."""
        exact = sorted(self.score(vec, labels).items(), key=lambda x: (-x[1], x[0]))[:k]
        return [lb for lb, _ in exact], [sc for _, sc in exact]

    def labels(self) -> list[int]:
        """The labels that hold a vector."""
        with self._lock:
            return np.flatnonzero(self._vid_of).tolist()

    def vectors(self, labels: Sequence[int]) -> dict[int, np.ndarray]:
        with self._lock:
            vids = _lookup(self._vid_of, labels)
            return {int(lb): self._index.reconstruct(int(v)) for lb, v in zip(labels, vids, strict=True) if v}

    def score(self, vec: np.ndarray, labels: Sequence[int]) -> dict[int, float]:
        """Exact cosine of chosen labels (those without a vector are absent)."""
        found = self.vectors(labels)
        if not found:
            return {}
        sims = np.vstack(list(found.values())) @ np.asarray(vec, dtype=np.float32).ravel()
        return dict(zip(found, sims.tolist(), strict=True))

    # -- persistence (a checkpoint; the journal replays whatever came after it) -----------------
    _FORMAT = 2  # checkpoints without a format held an exact or an HNSW index

    @classmethod
    def fits(cls, state: list[int], dim: int) -> bool:
        """Whether a checkpoint's state (seq, next vid, mode, dim[, format]) is one `load` takes
        for `dim`: this _FORMAT (mode EXACT or IVF), or an older one without a format (EXACT or
        HNSW)."""
        return (len(state) == 4 and state[2] in (EXACT, HNSW) or len(state) == 5 and state[4] == cls._FORMAT) \
            and state[3] == dim

    def save(self, path: Path) -> None:
        with self._lock:
            live = np.flatnonzero(self._vid_of)
            kept = np.flatnonzero(self._label_of)
            _write_npz(path, self._index,
                       vid_of=np.stack([live, self._vid_of[live]], axis=1),
                       label_of=np.stack([kept, self._label_of[kept]], axis=1),
                       tombstones=np.array(sorted(self._tombstones), dtype=np.int64),
                       state=np.array([self.applied_seq, self._next_vid, self.mode, self.dim, self._FORMAT],
                                      dtype=np.int64),
                       store=np.frombuffer(self.store_id.encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: Path, dim: int, exact_max: int, *, nprobe: int = 64, store_id: str = "",
             max_seq: Callable[[], int] | None = None) -> DenseIndex:
        """The checkpoint at `path`, or an empty index (which the journal refills) when there is
        none, or when it cannot be read, was built from another store or is ahead of the journal
        (its last seq, `max_seq()`, read after the checkpoint: the owner may commit and checkpoint
        meanwhile); then `rebuilt` says why."""
        self = cls(dim, exact_max, nprobe)
        self.store_id = store_id
        if not path.exists():
            return self
        try:
            with np.load(path) as z:
                state = [int(x) for x in z["state"]]
                seq, next_vid, mode = state[:3]
                if not cls.fits(state, dim):
                    return self
                if not _same_store(z, store_id, seq, max_seq):
                    self.rebuilt = "it was built from another store"
                    return self
                index = _read_faiss(path, z)
                vid_of, label_of, tombstones = z["vid_of"], z["label_of"], z["tombstones"]
        except _READ_ERRORS as e:
            self.rebuilt = f"its checkpoint could not be read ({type(e).__name__})"
            return self
        # tombstoned vids keep their labels: the label array spans those too
        self._vid_of = _fit(self._vid_of, int(max(vid_of[:, 0].max(initial=0), label_of[:, 1].max(initial=0))) + 1)
        self._vid_of[vid_of[:, 0]] = vid_of[:, 1]
        self._label_of = _fit(self._label_of, next_vid)
        self._label_of[label_of[:, 0]] = label_of[:, 1]
        self._index, self._tombstones, self._live = index, set(tombstones.tolist()), len(vid_of)
        self.applied_seq, self._next_vid, self.mode = seq, next_vid, mode
        return self


def saved_seq(kind: type[DenseIndex | CodeIndex], path: Path, dim: int, store_id: str) -> int:
    """The journal seq of the checkpoint at `path` if `kind.load` would take it (its format,
    dimension and store match), else -1 (none, or one that load would rebuild)."""
    try:
        with np.load(path) as z:
            state = [int(x) for x in z["state"]]
            return state[0] if kind.fits(state, dim) and _same_store(z, store_id, state[0], None) else -1
    except (*_READ_ERRORS, IndexError):
        return -1


def _same_store(z: np.lib.npyio.NpzFile, store_id: str, seq: int, max_seq: Callable[[], int] | None) -> bool:
    """Whether a checkpoint was built from this store and is not ahead of its journal."""
    saved = bytes(z["store"]).decode() if "store" in z.files else None
    return saved in (None, store_id) and (max_seq is None or seq <= max_seq())


class CodeIndex:
    """Binary codes (`dim` bits, packed) scored by Hamming similarity 1 - hamming/dim, always
    exactly: a matrix with a row per label, scanned by faiss' Hamming kernels (binary HNSW kept
    at most 0.74 recall@10 on HDC codes, bench/hdc.py). An update overwrites its label's row and
    a removal moves the last row into the hole: nothing is tombstoned and nothing is rebuilt."""

    _FORMAT = 2  # checkpoints of format 1 held a faiss binary index

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.applied_seq = 0
        self.store_id = ""
        self.rebuilt: str | None = None
        self._lock = threading.RLock()
        self._codes = np.zeros((0, dim // 8), dtype=np.uint8)  # rows [0, _n) are live, the rest spare
        self._label_at = np.zeros(0, dtype=np.int64)  # row -> label
        self._row_of = np.zeros(0, dtype=np.int64)  # label -> row + 1 (0: none)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _rows(self, labels: Sequence[int] | np.ndarray) -> np.ndarray:
        """Row + 1 of each label (0: none)."""
        return _lookup(self._row_of, labels)

    def upsert(self, labels: Sequence[int] | np.ndarray, mat: np.ndarray) -> None:
        """Set the codes (rows of `mat`) of `labels` (a label given twice takes its last row)."""
        labels = np.asarray(labels, dtype=np.int64).ravel()
        if not len(labels):
            return
        labels, mat = _last_of_each(labels, np.asarray(mat, dtype=np.uint8).reshape(len(labels), -1))
        with self._lock:
            rows = self._rows(labels)
            old = rows > 0
            self._codes[rows[old] - 1] = mat[old]
            new = labels[~old]
            if not len(new):
                return
            end = self._n + len(new)
            self._codes = _fit(self._codes, end)
            self._codes[self._n:end] = mat[~old]
            self._label_at = _fit(self._label_at, end)
            self._label_at[self._n:end] = new
            self._row_of = _fit(self._row_of, int(new.max()) + 1)
            self._row_of[new] = np.arange(self._n + 1, end + 1)
            self._n = end

    def remove(self, labels: Sequence[int] | np.ndarray) -> None:
        with self._lock:
            rows = np.unique(self._rows(labels))
            for r in sorted((rows[rows > 0] - 1).tolist(), reverse=True):
                self._row_of[self._label_at[r]] = 0
                last = self._n - 1
                if r != last:  # the last row fills the hole
                    self._codes[r] = self._codes[last]
                    self._label_at[r] = self._label_at[last]
                    self._row_of[self._label_at[r]] = r + 1
                self._n = last

    def search(self, vec: np.ndarray, k: int, allowed: set[int] | None) -> tuple[list[int], list[float]]:
        """Top-k (labels, similarity) for a query code, optionally within `allowed` labels."""
        with self._lock:
            q = np.ascontiguousarray(vec, dtype=np.uint8).reshape(1, -1)
            blocks: Iterable[tuple[np.ndarray | None, np.ndarray]]
            if allowed is None:
                blocks = [(None, self._codes[:self._n])]  # a view: nothing copied
            else:
                rows = self._rows(list(allowed))
                rows = np.sort(rows[rows > 0] - 1)
                # the filter's rows gathered a block at a time: a broad filter never copies the matrix
                parts = np.split(rows, range(_SCAN_ROWS, len(rows), _SCAN_ROWS))
                blocks = ((part, self._codes[part]) for part in parts)
            if k <= 0:
                return [], []
            found: list[np.ndarray] = []
            for block_rows, codes in blocks:
                if len(codes):
                    _, at = faiss.knn_hamming(q, codes, min(k, len(codes)))
                    found.append(at[0] if block_rows is None else block_rows[at[0]])
            if not found:
                return [], []
            hits = np.concatenate(found)
            dist = np.bitwise_count(np.bitwise_xor(self._codes[hits], q)).sum(axis=1)
            order = np.lexsort((self._label_at[hits], dist))[:k]  # equal distances in label order
            return self._label_at[hits[order]].tolist(), (1.0 - dist[order] / self.dim).tolist()

    def labels(self) -> list[int]:
        with self._lock:
            return self._label_at[:self._n].tolist()

    def vectors(self, labels: Sequence[int]) -> dict[int, np.ndarray]:
        with self._lock:
            rows = self._rows(labels)
            return {int(lb): self._codes[r - 1].copy() for lb, r in zip(labels, rows.tolist(), strict=True) if r}

    def score(self, vec: np.ndarray, labels: Sequence[int]) -> dict[int, float]:
        """Exact similarity of chosen labels (those without a code are absent)."""
        with self._lock:
            rows = self._rows(labels)
            present = rows > 0
            if not present.any():
                return {}
            dist = np.bitwise_count(np.bitwise_xor(self._codes[rows[present] - 1],
                                                   np.asarray(vec, dtype=np.uint8).ravel())).sum(axis=1)
            chosen = np.asarray(labels, dtype=np.int64)[present]
            return dict(zip(chosen.tolist(), (1.0 - dist / self.dim).tolist(), strict=True))

    @classmethod
    def fits(cls, state: list[int], dim: int) -> bool:
        """Whether a checkpoint's state (seq, format, dim) is one `load` takes for `dim`."""
        return len(state) == 3 and state[1:] == [cls._FORMAT, dim]

    def save(self, path: Path) -> None:
        with self._lock:
            _write_npz(path, codes=self._codes[:self._n], labels=self._label_at[:self._n],
                       state=np.array([self.applied_seq, self._FORMAT, self.dim], dtype=np.int64),
                       store=np.frombuffer(self.store_id.encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: Path, dim: int, *, store_id: str = "", max_seq: Callable[[], int] | None = None
             ) -> CodeIndex:
        """As DenseIndex.load; a checkpoint of another format is rebuilt from the journal."""
        self = cls(dim)
        self.store_id = store_id
        if not path.exists():
            return self
        try:
            with np.load(path) as z:
                state = [int(x) for x in z["state"]]
                if not cls.fits(state, dim):
                    self.rebuilt = "its checkpoint is of an earlier format"
                    return self
                if not _same_store(z, store_id, state[0], max_seq):
                    self.rebuilt = "it was built from another store"
                    return self
                codes, labels = z["codes"], z["labels"].astype(np.int64)
        except _READ_ERRORS as e:
            self.rebuilt = f"its checkpoint could not be read ({type(e).__name__})"
            return self
        self._codes, self._label_at, self._n = codes, labels, len(labels)
        self._row_of = _fit(self._row_of, int(labels.max(initial=0)) + 1)
        self._row_of[labels] = np.arange(1, len(labels) + 1)
        self.applied_seq = state[0]
        return self
