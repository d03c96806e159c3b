"""tantivy BM25 index: one whitespace-tokenized field per scored field, fed the shared analysis."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tantivy

from hybridsearch.analysis import ANALYSIS_RULES, Analyzer
from hybridsearch.engines import rules_named
from hybridsearch.engines.embedded.store import norm_key
from hybridsearch.errors import EngineError
from hybridsearch.models import BM25_FIELD_WEIGHTS, SCORED_FIELDS, Bm25Mode, Document, Filters
from hybridsearch.scoring import document_joined, indexed_joined, merge_term_weights

_APPLIED = "applied.json"
# what the index holds, besides its schema: 2 = empty scored fields hold the placeholder token,
# 3 = the joined field `title_text`
_FORMAT = 3
_COMMIT_DOCS = 16_384  # pending changes that make `apply` commit
_COMMIT_S = 5.0  # seconds after which `apply` commits its pending changes


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("id", stored=True, tokenizer_name="raw")
    sb.add_unsigned_field("label", indexed=True, fast=True)
    for f in SCORED_FIELDS:
        sb.add_text_field(f, tokenizer_name="whitespace", index_option="freq")
        sb.add_unsigned_field(f"len_{f}", indexed=False, fast=True)  # token count: BM25 with other k1/b
    for f in ("subj", "kind", "license", "source"):
        sb.add_text_field(f, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field("ym", indexed=True, fast=True)
    return sb.build()


class Bm25Index:
    """Owner mode writes and commits; reader mode only reloads what the owner committed."""

    def __init__(self, path: Path, analyzer: Analyzer, *, owner: bool, store_id: str = "") -> None:
        self.path = path
        self.store_id = store_id
        self.rebuilt: str | None = None  # why the owner dropped the index it found, if it did
        self.stamp: str | None = None  # the store id recorded with the applied seq
        self.analyzer = analyzer
        self.owner = owner
        self.schema = _schema()
        self._writer: tantivy.IndexWriter | None = None
        self._lock = threading.Lock()
        self.index: tantivy.Index | None = None
        self.applied_seq = 0
        self.fields_present: set[str] = set()
        self._applied_mtime = 0
        try:
            if owner:
                path.mkdir(parents=True, exist_ok=True)
                try:
                    applied = _applied(path)
                    if (path / "meta.json").exists() and int(applied.get("format", 1)) != _FORMAT:
                        raise ValueError("written in another format")
                    if applied.get("store") not in (None, "", store_id):
                        self.rebuilt = "it was built from another store"
                        raise ValueError(self.rebuilt)
                    rules = applied.get("analysis")  # None: written before the rules were recorded
                    if (path / "meta.json").exists() and rules != ANALYSIS_RULES:
                        self.rebuilt = (f"it was analysed with {rules_named(rules)}, and these are rules "
                                        f"{ANALYSIS_RULES}")
                        raise ValueError(self.rebuilt)
                    self.index = tantivy.Index(self.schema, path=str(path), reuse=True)
                except ValueError:
                    # an index written with another schema or format, or from another store: it is
                    # derived, so rebuild it from the journal (applied seq back to 0)
                    self.index = self._fresh()
                self._writer = self.index.writer(heap_size=64_000_000, num_threads=1)
            elif (path / "meta.json").exists():
                self.index = tantivy.Index.open(str(path))
        except ValueError as e:
            raise EngineError(f"cannot open BM25 index {path}: {e}") from e
        self._lengths: tuple[int, dict[str, float]] | None = None
        self._pending = 0  # changes applied and not committed
        self._pending_since: float | None = None  # when the first of them was applied
        self._read_applied()

    def _fresh(self) -> tantivy.Index:
        shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        return tantivy.Index(self.schema, path=str(self.path), reuse=True)

    def reset(self, why: str) -> None:
        """Owner: drop the index, to be rebuilt from the journal (applied seq back to 0)."""
        with self._lock:
            if self._writer is not None:
                self._writer.wait_merging_threads()
            self.index = self._fresh()
            self._writer = self.index.writer(heap_size=64_000_000, num_threads=1)
            self.applied_seq, self.fields_present, self._lengths = 0, set(), None
            self._pending, self._pending_since = 0, None
            self.rebuilt = why

    def stale(self) -> bool:
        """Reader: whether the owner has committed since this index last read its record."""
        return self._record_mtime() != self._applied_mtime

    def _record_mtime(self) -> int:
        """When the owner last wrote its record (applied seq, fields); 0 when there is none."""
        try:
            return (self.path / _APPLIED).stat().st_mtime_ns
        except OSError:
            return 0

    def _read_applied(self) -> None:
        self._applied_mtime = self._record_mtime()
        data = _applied(self.path)
        if not data:
            return
        self.applied_seq = int(data.get("seq", 0))
        self.fields_present = set(data.get("fields", []))
        self.stamp = data.get("store") or None

    def reload(self) -> None:
        if self.index is None and (self.path / "meta.json").exists():
            self.index = tantivy.Index.open(str(self.path))
        if self.index is not None:
            self.index.reload()
        self._lengths = None
        self._read_applied()

    def apply(self, upserts: Mapping[int, Document], deletes: Sequence[str], seq: int, *,
              defer: bool = False) -> None:
        """Apply changes idempotently (delete by id, then add) up to journal `seq`, commit, then
        record `seq`. With `defer` the commit waits until _COMMIT_DOCS changes or _COMMIT_S seconds
        are pending, or anything reads this index (`flush`): a commit costs about as much as
        indexing a thousand documents, so a bulk load commits every few batches instead of every
        one. What a crash loses uncommitted is replayed from the journal past the recorded seq."""
        if self._writer is None:
            raise EngineError("the BM25 index is read-only in this process (another owns it)")
        with self._lock:
            w = self._writer
            for id_ in list(deletes) + [d.id for d in upserts.values()]:
                w.delete_documents_by_term("id", id_)
            for label, d in upserts.items():
                w.add_document(self._to_tantivy(label, d))
            self.applied_seq = seq
            if self._pending_since is None:
                self._pending_since = time.monotonic()
            self._pending += len(deletes) + len(upserts)
            if not defer or self._pending >= _COMMIT_DOCS or time.monotonic() - self._pending_since >= _COMMIT_S:
                self._commit()

    def flush(self) -> None:
        """Commit what `apply` left pending (a no-op when nothing is)."""
        with self._lock:
            if self._pending_since is not None:
                self._commit()

    def _commit(self) -> None:
        assert self._writer is not None
        self._writer.commit()
        if self.index is not None:
            self.index.reload()
        self._lengths = None
        self._pending, self._pending_since = 0, None
        self._record(self.applied_seq)

    def skip_to(self, seq: int) -> None:
        """Record that the journal up to `seq` holds nothing this index takes (vectors, codes), so
        that the next open does not read those entries again (a million `vector` entries: 2 s)."""
        if self._writer is None:
            raise EngineError("the BM25 index is read-only in this process (another owns it)")
        with self._lock:
            if self._pending_since is not None:
                self.applied_seq = seq  # recorded with the pending changes' commit
            else:
                self._record(seq)

    def _record(self, seq: int) -> None:
        """Write the record of what is applied (atomically: readers watch it)."""
        self.applied_seq = seq
        tmp = self.path / (_APPLIED + ".tmp")
        tmp.write_text(json.dumps({"seq": seq, "fields": sorted(self.fields_present), "format": _FORMAT,
                                   "store": self.store_id, "analysis": ANALYSIS_RULES}))
        os.replace(tmp, self.path / _APPLIED)

    def _to_tantivy(self, label: int, d: Document) -> tantivy.Document:
        doc = tantivy.Document()
        doc.add_text("id", d.id)
        doc.add_unsigned("label", label)
        for f, (joined, n) in document_joined(self.analyzer, d).items():
            text, length = indexed_joined(joined, n)
            doc.add_text(f, text)
            doc.add_unsigned(f"len_{f}", length)
            if n:
                self.fields_present.add(f)
        for s in d.subjects:
            doc.add_text("subj", norm_key(s))
        for f in ("kind", "license"):
            value = getattr(d, f)
            if value:
                doc.add_text(f, norm_key(value))
        if d.source:
            doc.add_text("source", d.source)
        if d.year is not None:
            doc.add_integer("ym", d.year * 100 + (d.month or 0))
        return doc

    def search(self, terms: Sequence[tuple[str, float]], fields: Mapping[str, float], k: int,
               filters: Filters | None, mode: Bm25Mode, tie_breaker: float) -> tuple[list[int], list[float]]:
        """Top-k (labels, scores). `terms` are analyzed tokens with query weights."""
        self.flush()
        if self.index is None or not terms or k <= 0:
            return [], []
        Q, schema = tantivy.Query, self.schema
        weights = merge_term_weights(terms)
        if not weights:
            return [], []
        per_field = []
        for f, fw in fields.items():
            if f not in self.fields_present or fw <= 0:
                continue
            # a boost of 1 is left out: a union of bare term queries is what tantivy prunes with
            # block-max WAND (the `lexical` profile's equal fields), a boosted one it scores whole
            clauses = [(tantivy.Occur.Should, q if fw * w == 1.0 else Q.boost_query(q, fw * w))
                       for t, w in weights.items() for q in (Q.term_query(schema, f, t),)]
            per_field.append(clauses)
        if not per_field:
            return [], []
        if mode == "best_fields":
            query = Q.disjunction_max_query([Q.boolean_query(c) for c in per_field],
                                            tie_breaker=tie_breaker)
        else:
            query = Q.boolean_query([c for clauses in per_field for c in clauses])
        if filters is not None and not filters.is_empty():
            query = Q.boolean_query([(tantivy.Occur.Must, query)] + [
                (tantivy.Occur.Must, Q.const_score_query(fq, 0.0)) for fq in self._filter_queries(filters)])
        searcher = self.index.searcher()
        hits = searcher.search(query, k, count=False).hits
        if not hits:
            return [], []
        labels = searcher.fast_field_values("label", [a for _, a in hits])
        pairs = [(int(lb), float(s)) for lb, (s, _) in zip(labels, hits, strict=True) if lb is not None]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _filter_queries(self, f: Filters) -> list[tantivy.Query]:
        Q, schema, out = tantivy.Query, self.schema, []
        if f.date_range is not None:
            lo, hi = f.date_range.bounds()
            if lo is not None or hi is not None:
                out.append(Q.range_query(schema, "ym", tantivy.FieldType.Integer, lo, hi))
        for field, values, key in (("subj", f.subjects, True), ("kind", f.kind, True),
                                   ("license", f.license, True), ("source", f.sources, False)):
            if values:
                out.append(Q.term_set_query(schema, field, [norm_key(v) if key else v for v in values]))
        return out

    def doc_freq(self, term: str) -> int:
        """The max document frequency of `term` over the fields of BM25_FIELD_WEIGHTS (a joined
        field would count its parts' documents again)."""
        self.flush()
        if self.index is None:
            return 0
        s = self.index.searcher()
        return max(s.doc_freq(f, term) for f in BM25_FIELD_WEIGHTS)

    def field_stats(self) -> tuple[int, dict[str, float]]:
        """(documents, average token count per scored field over all documents), as tantivy's BM25
        counts them; cached until the next commit is seen."""
        self.flush()
        if self.index is None:
            return 0, {}
        searcher = self.index.searcher()
        n = searcher.num_docs
        if self._lengths is None or self._lengths[0] != n:
            aggs = {f: {"sum": {"field": f"len_{f}"}} for f in self.fields_present}
            sums = searcher.aggregate(tantivy.Query.all_query(), aggs) if aggs and n else {}
            self._lengths = (n, {f: (sums[f]["value"] or 0.0) / n for f in sums})
        return self._lengths

    def field_doc_freq(self, field: str, term: str) -> int:
        self.flush()
        return 0 if self.index is None else int(self.index.searcher().doc_freq(field, term))

    def num_docs(self) -> int:
        self.flush()
        return 0 if self.index is None else self.index.searcher().num_docs

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                if self._pending_since is not None:
                    self._commit()
                self._writer.wait_merging_threads()
                self._writer = None


def _applied(path: Path) -> dict[str, Any]:
    """What the owner recorded with its last commit (applied seq, fields, format, store id, the
    analysis rules); {} when nothing readable is there."""
    try:
        data = json.loads((path / _APPLIED).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
