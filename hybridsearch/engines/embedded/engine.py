"""EmbeddedEngine: the journal in SQLite is the truth; tantivy and faiss are caught up from it."""

from __future__ import annotations

import fcntl
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hybridsearch.analysis import Analyzer, default_analyzer
from hybridsearch.embeddings import DIM, MODEL_NAME
from hybridsearch.engines.embedded.bm25 import Bm25Index
from hybridsearch.engines.embedded.dense import DenseIndex
from hybridsearch.engines.embedded.store import HDC_FIELDS, Store
from hybridsearch.errors import QueryError, ValidationError
from hybridsearch.hdc import HdcEncoder
from hybridsearch.hdc.algebra import DIM as HDC_DIM
from hybridsearch.models import (
    BM25_FIELD_WEIGHTS,
    Bm25Mode,
    DocInfo,
    Document,
    Filters,
    RankedList,
    check_unique_ids,
)

DEFAULT_EXACT_MAX = 200_000
_CHECKPOINT_EVERY = 20_000  # journal entries between dense checkpoints


class EmbeddedEngine:
    """One index directory. The process holding `owner.lock` applies the journal to the derived
    indexes; other processes may append to the journal and read what the owner committed."""

    capabilities = frozenset({"lexical", "vector", "binary"})

    def __init__(self, path: str | os.PathLike[str], *, exact_max: int = DEFAULT_EXACT_MAX,
                 analyzer: Analyzer | None = None, model: str = MODEL_NAME, dim: int = DIM) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.model, self.dim = model, dim
        self.analyzer = analyzer or default_analyzer()
        self._lock = threading.RLock()
        self._lock_file = open(self.path / "owner.lock", "a+")  # noqa: SIM115
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.owner = True
        except OSError:
            self.owner = False
        self.store = Store(self.path / "store.sqlite")
        self.bm25_index = Bm25Index(self.path / "bm25", self.analyzer, owner=self.owner)
        self.dense_index = DenseIndex.load(self.path / "dense.npz", dim, exact_max)
        # derived vector indexes: name -> (index, checkpoint path, fetch vectors by label)
        self._vector_indexes: dict[str, tuple[DenseIndex, Path, Callable[[list[int]], dict[int, np.ndarray]]]] = {
            "dense": (self.dense_index, self.path / "dense.npz", self.store.vectors_by_label)}
        for f in HDC_FIELDS:
            idx = DenseIndex.load(self.path / f"hdc_{f}.npz", HDC_DIM, exact_max, binary=True)
            self._vector_indexes[f"hdc:{f}"] = (idx, self.path / f"hdc_{f}.npz",
                                                 partial(self.store.codes_by_label, field=f))
        self._saved_seq = {name: idx.applied_seq for name, (idx, _, _) in self._vector_indexes.items()}
        self._id_of: dict[int, str] = self.store.id_map()
        self._label_of: dict[str, int] = {v: k for k, v in self._id_of.items()}
        self._seen_seq = self.store.max_seq()
        self._hdc_encoder: HdcEncoder | None = None
        self._info: dict[str, DocInfo] = {}
        self._data_version = -1
        self.refresh()

    # -- journal catch-up ---------------------------------------------------------------------
    def refresh(self) -> None:
        """Catch derived indexes up with the journal if another connection committed since the
        last look (SQLite's data_version moves only on other connections' commits)."""
        with self._lock:
            version = self.store.data_version()
            if version == self._data_version:
                return
            self._data_version = version
            self._catch_up()

    def _catch_up(self) -> None:
        start = min([self.bm25_index.applied_seq, self._seen_seq]
                    + [idx.applied_seq for idx, _, _ in self._vector_indexes.values()])
        entries = self.store.journal_since(start)
        for e in entries:
            if e.seq > self._seen_seq:
                self._info.pop(e.id, None)
                if e.op == "delete":
                    self._id_of.pop(e.label, None)
                    self._label_of.pop(e.id, None)
                else:
                    self._id_of[e.label] = e.id
                    self._label_of[e.id] = e.label
        if not entries:
            if not self.owner:
                self.bm25_index.reload()
            return
        last = entries[-1].seq
        self._seen_seq = max(self._seen_seq, last)
        if self.owner:
            todo = [e for e in entries if e.seq > self.bm25_index.applied_seq and e.op != "vector"]
            if todo:
                touched = {e.label: e.id for e in todo}
                docs = self.store.docs_by_label(list(touched))
                self.bm25_index.apply(docs, [i for lb, i in touched.items() if lb not in docs], last)
        else:
            self.bm25_index.reload()
        for name, (index, _, fetch) in self._vector_indexes.items():
            todo = [e for e in entries if e.seq > index.applied_seq]
            if not todo:
                continue
            labels = list(dict.fromkeys(e.label for e in todo))
            vectors = fetch(labels)
            index.remove([lb for lb in labels if lb not in vectors])
            index.upsert(vectors)
            index.applied_seq = last
            if self.owner and last - self._saved_seq[name] >= _CHECKPOINT_EVERY:
                self._save(name)

    def _save(self, name: str) -> None:
        index, path, _ = self._vector_indexes[name]
        if index.applied_seq != self._saved_seq[name]:
            index.save(path)
            self._saved_seq[name] = index.applied_seq

    def checkpoint(self) -> None:
        """Persist the vector indexes so that the next open replays less of the journal."""
        with self._lock:
            if self.owner:
                for name in self._vector_indexes:
                    self._save(name)

    # -- writes ---------------------------------------------------------------------------------
    def write(self, docs: Sequence[Document], vectors: np.ndarray | None = None,
              codes: Sequence[Mapping[str, np.ndarray]] | None = None) -> int:
        """Store documents (optionally with vectors and HDC codes) atomically; returns the journal
        seq. When this returns, the documents are acknowledged: no crash can lose them."""
        docs = list(docs)
        check_unique_ids(docs)
        if vectors is not None:
            vectors = self._check_vectors(vectors, len(docs))
        if codes is not None:
            codes = self._check_codes(codes, len(docs))
        with self._lock:
            seq = self.store.write(docs, vectors, self.model, codes)
            self._catch_up()
            return seq

    def set_vectors(self, ids: Sequence[str], vectors: np.ndarray) -> int:
        vectors = self._check_vectors(vectors, len(ids))
        with self._lock:
            seq = self.store.set_vectors(list(ids), vectors, self.model)
            self._catch_up()
            return seq

    def set_codes(self, ids: Sequence[str], codes: Sequence[Mapping[str, np.ndarray]]) -> int:
        codes = self._check_codes(codes, len(ids))
        with self._lock:
            seq = self.store.set_codes(list(ids), codes)
            self._catch_up()
            return seq

    def delete(self, ids: Sequence[str]) -> list[str]:
        with self._lock:
            deleted = self.store.delete(list(ids))
            self._catch_up()
            return deleted

    def _check_vectors(self, vectors: np.ndarray, n: int) -> np.ndarray:
        arr = np.asarray(vectors, dtype=np.float32)
        if arr.shape != (n, self.dim):
            raise ValidationError(f"expected shape ({n}, {self.dim}), got {arr.shape}", field="vectors")
        bad = np.flatnonzero(~np.isfinite(arr).all(axis=1))
        if bad.size:
            raise ValidationError(f"row {int(bad[0])} has a non-finite value", field="vectors")
        return arr

    def _check_codes(self, codes: Sequence[Mapping[str, np.ndarray]], n: int) -> list[Mapping[str, np.ndarray]]:
        codes = list(codes)
        if len(codes) != n:
            raise ValidationError(f"expected {n} code sets, got {len(codes)}", field="codes")
        for i, c in enumerate(codes):
            for f, v in c.items():
                if f not in HDC_FIELDS:
                    raise ValidationError(f"row {i}: unknown field {f!r}; valid: {', '.join(HDC_FIELDS)}",
                                          field="codes")
                if np.asarray(v).dtype != np.uint8 or np.asarray(v).shape != (HDC_DIM // 8,):
                    raise ValidationError(f"row {i}, {f}: expected {HDC_DIM // 8} uint8 bytes", field="codes")
        return codes

    # -- reads ----------------------------------------------------------------------------------
    def get(self, ids: Sequence[str]) -> dict[str, Document]:
        return self.store.docs_by_id(list(ids))

    def count(self) -> int:
        return self.store.count()

    def missing_vectors(self, limit: int | None = None) -> list[tuple[str, Document]]:
        return self.store.missing_vectors(limit)

    def bm25(self, query: str | Sequence[tuple[str, float]], fields: Mapping[str, float] | None = None,
             k: int = 10, filters: Filters | None = None, *, mode: Bm25Mode = "most_fields",
             tie_breaker: float = 0.2, role_boost: float = 1.0, k1: float = 1.2, b: float = 0.75) -> RankedList:
        """Field-boosted BM25. `most_fields` sums fields; `best_fields` is dis_max. tantivy scores
        with k1=1.2, b=0.75; other values rescore tantivy's top max(4k, 200) candidates exactly
        (see `_rescore`)."""
        if mode not in ("most_fields", "best_fields"):
            raise QueryError(f"mode must be one of most_fields, best_fields; got {mode!r}")
        for name, v in (("tie_breaker", tie_breaker), ("role_boost", role_boost), ("k1", k1), ("b", b)):
            if not math.isfinite(v) or v < 0:
                raise QueryError(f"{name} must be a finite number >= 0, got {v!r}")
        if b > 1:
            raise QueryError(f"b must be in [0, 1], got {b!r}")
        terms = ([(t, 1.0) for t in self.analyzer.analyze(query)] if isinstance(query, str)
                 else list(query))
        self.refresh()
        fields = fields or BM25_FIELD_WEIGHTS
        labels, scores = self.bm25_index.search(terms, fields, k if (k1, b) == (1.2, 0.75) else max(4 * k, 200),
                                                filters, mode, tie_breaker)
        if (k1, b) != (1.2, 0.75) and labels:
            labels, scores = self._rescore(terms, fields, labels, k, mode, tie_breaker, k1, b)
        if role_boost != 1.0:
            scores = [s * role_boost for s in scores]
        return self._ranked("bm25", labels, scores)

    def _rescore(self, terms: Sequence[tuple[str, float]], fields: Mapping[str, float], labels: list[int],
                 k: int, mode: Bm25Mode, tie_breaker: float, k1: float, b: float) -> tuple[list[int], list[float]]:
        """BM25 with other k1/b over candidates, in tantivy's scale: per field,
        sum_t w_t idf(t) tf (k1+1) / (tf + k1 (1 - b + b dl/avgdl)), idf = ln(1 + (N - df + 0.5)/(df + 0.5))
        over all documents as tantivy counts them; lengths are exact token counts (tantivy
        quantises them, so at k1=1.2, b=0.75 long fields differ slightly from its scores)."""
        n, avg = self.bm25_index.field_stats()
        weights: dict[str, float] = {}
        for t, w in terms:
            weights[t] = weights.get(t, 0.0) + w
        active = {f: fw for f, fw in fields.items() if fw > 0 and f in avg and avg[f] > 0}
        idf = {(f, t): math.log(1 + (n - (df := self.bm25_index.field_doc_freq(f, t)) + 0.5) / (df + 0.5))
               for f in active for t in weights}
        docs = self.store.docs_by_label(labels)
        out: dict[int, float] = {}
        for label, d in docs.items():
            per_field = []
            for f, fw in active.items():
                an = self.analyzer
                toks = an.analyze_many(d.subjects) if f == "subjects" else an.analyze(getattr(d, f))
                if not toks:
                    continue
                counts: dict[str, int] = {}
                for tok in toks:
                    if tok in weights:
                        counts[tok] = counts.get(tok, 0) + 1
                norm = k1 * (1 - b + b * len(toks) / avg[f])
                per_field.append(fw * sum(weights[t] * idf[(f, t)] * tf * (k1 + 1) / (tf + norm)
                                          for t, tf in counts.items()))
            if per_field:
                best = max(per_field)
                out[label] = (best + tie_breaker * (sum(per_field) - best) if mode == "best_fields"
                              else sum(per_field))
        order = sorted((lb for lb in out if out[lb] > 0), key=lambda lb: (-out[lb], lb))[:k]
        return order, [out[lb] for lb in order]

    def term_stats(self, terms: Sequence[str]) -> dict[str, Any]:
        """Full-corpus document frequencies and Lucene idf for analyzed terms."""
        self.refresh()
        out: dict[str, Any] = {}
        n = 0
        for t in terms:
            n, df = self.bm25_index.doc_freq(t)
            out[t] = {"df": df, "idf": math.log(1 + (n - df + 0.5) / (df + 0.5)) if n else 0.0}
        return {"num_docs": n, "terms": out}

    def knn(self, vec: np.ndarray, k: int = 10, filters: Filters | None = None) -> RankedList:
        self.refresh()
        allowed = None if filters is None or filters.is_empty() else self.store.filter_labels(filters)
        labels, scores = self.dense_index.search(vec, k, allowed)
        return self._ranked("dense", labels, scores)

    def vector_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        self.refresh()
        labels = {self._label_of[i]: i for i in ids if i in self._label_of}
        return {labels[lb]: s for lb, s in self.dense_index.score(vec, list(labels)).items()}

    def hamming(self, code: np.ndarray, field: str, k: int = 10, filters: Filters | None = None) -> RankedList:
        """Nearest codes of one HDC field; scores are similarities 1 - hamming/4096."""
        index = self._hdc_index(field)
        self.refresh()
        allowed = None if filters is None or filters.is_empty() else self.store.filter_labels(filters)
        labels, scores = index.search(code, k, allowed)
        return self._ranked(f"hdc:{field}", labels, scores)

    def hamming_score(self, code: np.ndarray, field: str, ids: Sequence[str]) -> dict[str, float]:
        """Exact similarity of `code` to the chosen documents' codes of `field` (absent: no entry)."""
        index = self._hdc_index(field)
        self.refresh()
        labels = {self._label_of[i]: i for i in ids if i in self._label_of}
        return {labels[lb]: s for lb, s in index.score(code, list(labels)).items()}

    def _hdc_index(self, field: str) -> DenseIndex:
        if field not in HDC_FIELDS:
            raise QueryError(f"unknown HDC field {field!r}; valid: {', '.join(HDC_FIELDS)}")
        return self._vector_indexes[f"hdc:{field}"][0]

    def hdc_encoder(self, *, ngrams: bool | None = None) -> HdcEncoder:
        """The HDC encoder for this index (its options are stored with the index)."""
        options = self.store.hdc_options(ngrams=ngrams)
        if self._hdc_encoder is None or self._hdc_encoder.ngrams != options["ngrams"]:
            self._hdc_encoder = HdcEncoder(self.analyzer, ngrams=options["ngrams"])
        return self._hdc_encoder

    def missing_codes(self) -> list[tuple[str, Document]]:
        return self.store.missing_codes()

    def doc_info(self, ids: Sequence[str]) -> dict[str, DocInfo]:
        """Work, source, page, authors, venue, kind and title of chunks (cached in memory)."""
        self.refresh()
        missing = [i for i in ids if i not in self._info]
        if missing:
            if len(self._info) > 200_000:
                self._info.clear()
            for id_, d in self.store.docs_by_id(missing).items():
                self._info[id_] = DocInfo.of(d)
        return {i: self._info[i] for i in ids if i in self._info}

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The dense vectors of chunks that have one."""
        self.refresh()
        labels = {self._label_of[i]: i for i in ids if i in self._label_of}
        return {labels[lb]: v for lb, v in self.dense_index.vectors(list(labels)).items()}

    def _ranked(self, channel: str, labels: list[int], scores: list[float]) -> RankedList:
        ids, out = [], []
        for lb, s in zip(labels, scores, strict=True):
            id_ = self._id_of.get(lb)
            if id_ is not None:
                ids.append(id_)
                out.append(s)
        return RankedList.of(channel, ids, out)

    def stats(self) -> dict[str, Any]:
        self.refresh()
        return {
            "path": str(self.path),
            "owner": self.owner,
            "documents": self.count(),
            "works": int(self.store.conn.execute("SELECT count(DISTINCT work_id) FROM chunks").fetchone()[0]),
            "vectors": self.store.count_vectors(),
            "journal_seq": self._seen_seq,
            "bm25_applied_seq": self.bm25_index.applied_seq,
            "bm25_docs": self.bm25_index.num_docs(),
            "dense_applied_seq": self.dense_index.applied_seq,
            "dense_vectors": len(self.dense_index),
            "dense_mode": "hnsw" if self.dense_index.hnsw else "exact",
            "hdc_codes": self.store.count_codes(),
            "hdc_indexed": {f: len(self._hdc_index(f)) for f in HDC_FIELDS},
            "bm25_fields": sorted(self.bm25_index.fields_present),
            "model": self.model,
        }

    def close(self) -> None:
        with self._lock:
            self.checkpoint()
            self.bm25_index.close()
            self.store.close()
            self._lock_file.close()

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

