"""faiss indexes for the vector channels: float vectors by inner product (dense) and binary codes
by Hamming distance (HDC). Exact search up to a size, HNSW above it."""

from __future__ import annotations

import io
import os
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import faiss
import numpy as np

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 100
HNSW_EF_SEARCH = 128

# One query at a time needs no OpenMP team, and faiss' idle OpenMP threads spin and steal the
# cores from torch's query embedding (it doubled dense latency). Bulk HNSW builds use all cores.
faiss.omp_set_num_threads(1)


_PARALLEL_FROM = 100_000  # below this many vectors one thread searches fastest


class DenseIndex:
    """faiss ids are vector versions (vids), so HNSW, which cannot remove, can tombstone old ones.

    Exact mode removes for real. Past `exact_max` vectors the index is rebuilt as HNSW once;
    it is rebuilt again when tombstones pass a fifth of its size. `binary=True` holds packed bit
    codes (`dim` bits) and scores them as 1 - hamming/dim.
    """

    def __init__(self, dim: int, exact_max: int, *, binary: bool = False) -> None:
        self.dim = dim
        self.binary = binary
        self.exact_max = exact_max
        self.applied_seq = 0
        self._lock = threading.RLock()
        self._vid_of: dict[int, int] = {}  # label -> live vid
        self._label_of: dict[int, int] = {}  # vid -> label (live and tombstoned)
        self._tombstones: set[int] = set()
        self._next_vid = 1
        self.hnsw = False
        self._index = self._new_index(hnsw=False)
        self.store_id = ""  # the store this index is built from (stamped into checkpoints)
        self.rebuilt: str | None = None  # why load() started empty instead of from the checkpoint

    def _new_index(self, *, hnsw: bool) -> faiss.Index:
        if self.binary:
            base = faiss.IndexBinaryHNSW(self.dim, 16) if hnsw else faiss.IndexBinaryFlat(self.dim)
            if hnsw:
                base.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
                base.hnsw.efSearch = HNSW_EF_SEARCH
            return faiss.IndexBinaryIDMap2(base)
        if hnsw:
            base = faiss.IndexHNSWFlat(self.dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            base.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            base.hnsw.efSearch = HNSW_EF_SEARCH
        else:
            base = faiss.IndexFlatIP(self.dim)
        return faiss.IndexIDMap2(base)

    def __len__(self) -> int:
        return len(self._vid_of)

    def upsert(self, vectors: Mapping[int, np.ndarray]) -> None:
        with self._lock:
            self.remove(list(vectors))
            if not vectors:
                return
            labels = list(vectors)
            mat = np.vstack([vectors[lb] for lb in labels]).astype(np.uint8 if self.binary else np.float32)
            vids = np.arange(self._next_vid, self._next_vid + len(labels), dtype=np.int64)
            self._next_vid += len(labels)
            self._index.add_with_ids(mat, vids)
            for lb, vid in zip(labels, vids.tolist(), strict=True):
                self._vid_of[lb] = vid
                self._label_of[vid] = lb
            if not self.hnsw and len(self._vid_of) > self.exact_max:
                self._rebuild(hnsw=True)

    def remove(self, labels: Sequence[int]) -> None:
        with self._lock:
            vids = [self._vid_of.pop(lb) for lb in labels if lb in self._vid_of]
            if not vids:
                return
            if self.hnsw:
                self._tombstones.update(vids)
                if len(self._tombstones) > max(1000, self._index.ntotal // 5):
                    self._rebuild(hnsw=True)
            else:
                self._index.remove_ids(np.array(vids, dtype=np.int64))
                for v in vids:
                    self._label_of.pop(v, None)

    def _rebuild(self, *, hnsw: bool) -> None:
        live = sorted(self._vid_of.items())
        index = self._new_index(hnsw=hnsw)
        if live:
            vids = np.array([v for _, v in live], dtype=np.int64)
            mat = np.vstack([self._index.reconstruct(int(v)) for v in vids])
            faiss.omp_set_num_threads(os.cpu_count() or 1)
            try:
                index.add_with_ids(mat, vids)
            finally:
                faiss.omp_set_num_threads(1)
        self._index = index
        self.hnsw = hnsw
        self._tombstones.clear()
        self._label_of = {v: lb for lb, v in live}

    def search(self, vec: np.ndarray, k: int, allowed: set[int] | None) -> tuple[list[int], list[float]]:
        """Top-k (labels, cosine) for a normalised query vector, optionally within `allowed` labels."""
        with self._lock:
            if not self._vid_of or k <= 0:
                return [], []
            sel = None
            if allowed is not None:
                vids = [self._vid_of[lb] for lb in allowed if lb in self._vid_of]
                if not vids:
                    return [], []
                sel = faiss.IDSelectorBatch(np.array(vids, dtype=np.int64))
            elif self._tombstones:
                sel = faiss.IDSelectorNot(faiss.IDSelectorBatch(np.array(sorted(self._tombstones), dtype=np.int64)))
            params = None
            if sel is not None:
                params = (faiss.SearchParametersHNSW(sel=sel, efSearch=max(HNSW_EF_SEARCH, k))
                          if self.hnsw else faiss.SearchParameters(sel=sel))
            elif self.hnsw:
                params = faiss.SearchParametersHNSW(efSearch=max(HNSW_EF_SEARCH, k))
            q = np.ascontiguousarray(vec, dtype=np.uint8 if self.binary else np.float32).reshape(1, -1)
            if self._index.ntotal >= _PARALLEL_FROM:
                faiss.omp_set_num_threads(os.cpu_count() or 1)
            try:
                scores, vids_out = self._index.search(q, min(k, len(self._vid_of)), params=params)
            finally:
                faiss.omp_set_num_threads(1)
            labels, out = [], []
            for s, v in zip(scores[0].tolist(), vids_out[0].tolist(), strict=True):
                if v < 0 or v in self._tombstones:
                    continue
                labels.append(self._label_of[v])
                out.append(1.0 - s / self.dim if self.binary else float(s))
            passing = len(vids) if allowed is not None else len(self._vid_of)
            if self.hnsw and len(labels) < min(k, passing):
                # an HNSW walk that skips vectors (those the filter refuses, or tombstones) can end
                # short of k when few pass: those that pass are scored exactly instead, so nothing
                # the filter lets through is withheld
                wanted = [self._label_of[v] for v in vids] if allowed is not None else list(self._vid_of)
                exact = sorted(self.score(vec, wanted).items(), key=lambda x: (-x[1], x[0]))[:k]
                return [lb for lb, _ in exact], [sc for _, sc in exact]
            return labels, out

    def labels(self) -> list[int]:
        """The labels that hold a vector."""
        with self._lock:
            return list(self._vid_of)

    def vectors(self, labels: Sequence[int]) -> dict[int, np.ndarray]:
        with self._lock:
            return {lb: self._index.reconstruct(self._vid_of[lb]) for lb in labels if lb in self._vid_of}

    def score(self, vec: np.ndarray, labels: Sequence[int]) -> dict[int, float]:
        """Exact scores of chosen labels: cosine, or 1 - hamming/dim for binary codes."""
        with self._lock:
            present = [lb for lb in labels if lb in self._vid_of]
            if not present:
                return {}
            if self.binary and not self.hnsw:
                # one selective scan in C++ instead of a reconstruct per label (faiss has no batch
                # reconstruct for binary indexes)
                vids = np.array([self._vid_of[lb] for lb in present], dtype=np.int64)
                query = np.ascontiguousarray(vec, dtype=np.uint8).reshape(1, -1)
                dist, got = self._index.search(query, len(vids), params=faiss.SearchParameters(
                    sel=faiss.IDSelectorBatch(vids)))
                return {self._label_of[v]: 1.0 - d / self.dim
                        for d, v in zip(dist[0].tolist(), got[0].tolist(), strict=True) if v >= 0}
            mat = np.vstack([self._index.reconstruct(self._vid_of[lb]) for lb in present])
            if self.binary:
                q8 = np.asarray(vec, dtype=np.uint8).ravel()
                dist = np.bitwise_count(np.bitwise_xor(mat, q8)).sum(axis=1)
                sims = 1.0 - dist / self.dim
            else:
                sims = mat @ np.asarray(vec, dtype=np.float32).ravel()
            return dict(zip(present, sims.tolist(), strict=True))

    # -- persistence (a checkpoint; the journal replays whatever came after it) -----------------
    def save(self, path: Path) -> None:
        with self._lock:
            buf = io.BytesIO()
            raw = faiss.serialize_index_binary(self._index) if self.binary else faiss.serialize_index(self._index)
            np.savez(buf, index=raw,
                     vid_of=np.array(list(self._vid_of.items()), dtype=np.int64).reshape(-1, 2),
                     label_of=np.array(list(self._label_of.items()), dtype=np.int64).reshape(-1, 2),
                     tombstones=np.array(sorted(self._tombstones), dtype=np.int64),
                     state=np.array([self.applied_seq, self._next_vid, int(self.hnsw), self.dim],
                                    dtype=np.int64),
                     store=np.frombuffer(self.store_id.encode(), dtype=np.uint8))
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(buf.getvalue())
            os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, dim: int, exact_max: int, *, binary: bool = False, store_id: str = "",
             max_seq: Callable[[], int] | None = None) -> DenseIndex:
        """The checkpoint at `path`, or an empty index (which the journal refills) when there is
        none, or when it cannot be read, was built from another store or is ahead of the journal
        (its last seq, `max_seq()`, read after the checkpoint: the owner may commit and checkpoint
        meanwhile); then `rebuilt` says why."""
        self = cls(dim, exact_max, binary=binary)
        self.store_id = store_id
        if not path.exists():
            return self
        try:
            with np.load(path) as z:
                seq, next_vid, hnsw, saved_dim = (int(x) for x in z["state"])
                saved_store = bytes(z["store"]).decode() if "store" in z.files else None
                if saved_dim != dim:
                    return self
                if saved_store not in (None, store_id) or (max_seq is not None and seq > max_seq()):
                    self.rebuilt = "it was built from another store"
                    return self
                index = faiss.deserialize_index_binary(z["index"]) if binary else faiss.deserialize_index(z["index"])
                vid_of = {int(a): int(b) for a, b in z["vid_of"]}
                label_of = {int(a): int(b) for a, b in z["label_of"]}
                tombstones = {int(x) for x in z["tombstones"]}
        except (OSError, ValueError, KeyError, EOFError, RuntimeError, zipfile.BadZipFile) as e:
            self.rebuilt = f"its checkpoint could not be read ({type(e).__name__})"
            return self
        self._index, self._vid_of, self._label_of, self._tombstones = index, vid_of, label_of, tombstones
        self.applied_seq, self._next_vid, self.hnsw = seq, next_vid, bool(hnsw)
        return self
