"""Several knowledge bases searched in one call (VoiceVault's `kb_names`).

MultiEngine fans each channel call out to its engines and merges the candidates before fusion.
Ids are qualified as `<kb>:<id>`. Cosine and Hamming similarities are comparable across indexes
and merge as they are; raw BM25 is not (each index has its own idf and lengths), so each KB's
BM25 list is divided by its own top score first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hybridsearch.engines import Bm25Options, Codes, Neighbors, TermStat, TermStats
from hybridsearch.errors import QueryError
from hybridsearch.models import DocInfo, Document, Filters, RankedList
from hybridsearch.scoring import bm25_idf

SEP = ":"


class MultiEngine:
    def __init__(self, engines: Mapping[str, Any]) -> None:
        if not engines:
            raise QueryError("no knowledge base selected")
        bad = [n for n in engines if SEP in n]
        if bad:
            raise QueryError(f"knowledge base names may not contain {SEP!r}: {bad}")
        self.engines = dict(engines)
        self.dim = next(iter(self.engines.values())).dim

    def _split(self, ids: Sequence[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for q in ids:
            kb, sep, id_ = q.partition(SEP)
            if sep and kb in self.engines:
                out.setdefault(kb, []).append(id_)
        return out

    def _merge(self, channel: str, parts: Mapping[str, RankedList], k: int, *, by_top: bool) -> RankedList:
        items: list[tuple[float, str]] = []
        for kb, rl in parts.items():
            top = rl.scores[0] if by_top and rl.scores and rl.scores[0] > 0 else 1.0
            items.extend((s / top, f"{kb}{SEP}{i}") for i, s in rl.items())
        items.sort(key=lambda x: (-x[0], x[1]))
        return RankedList.of(channel, [i for _, i in items[:k]], [s for s, _ in items[:k]])

    def bm25(self, query: str | Sequence[tuple[str, float]], fields: Mapping[str, float] | None = None,
             k: int = 10, filters: Filters | None = None, options: Bm25Options | None = None) -> RankedList:
        parts = {kb: e.bm25(query, fields, k, filters, options) for kb, e in self.engines.items()}
        return self._merge("bm25", parts, k, by_top=True)

    def term_stats(self, terms: Sequence[str]) -> TermStats:
        stats = [e.term_stats(terms) for e in self.engines.values()]
        n = sum(s.num_docs for s in stats)
        out = {}
        for t in terms:
            df = sum(s.terms[t].df for s in stats if t in s.terms)
            out[t] = TermStat(df, bm25_idf(n, df))
        return TermStats(n, out)

    def knn(self, vec: np.ndarray, k: int = 10, filters: Filters | None = None) -> RankedList:
        return self._merge("dense", {kb: e.knn(vec, k, filters) for kb, e in self.engines.items()}, k, by_top=False)

    def hamming(self, codes: Codes, k: int = 10, filters: Filters | None = None) -> dict[str, RankedList]:
        parts = {kb: e.hamming(codes, k, filters) for kb, e in self.engines.items()}
        return {f: self._merge(f"hdc:{f}", {kb: p[f] for kb, p in parts.items()}, k, by_top=False) for f in codes}

    def hdc_encoder(self) -> Any:
        encoders = [e.hdc_encoder() for e in self.engines.values()]
        if len({(enc.ngrams, enc.ties) for enc in encoders}) > 1:
            raise QueryError("the selected knowledge bases encode HDC differently (ngrams, or the tie rule of an "
                             "index built before it changed); search them apart, or rebuild the older one")
        return encoders[0]

    def _routed(self, method: str, ids: Sequence[str], *args: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kb, local in self._split(ids).items():
            got = getattr(self.engines[kb], method)(*args, local) if args else getattr(self.engines[kb], method)(local)
            out.update({f"{kb}{SEP}{i}": v for i, v in got.items()})
        return out

    def hamming_score(self, codes: Codes, ids: Sequence[str]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {f: {} for f in codes}
        for kb, local in self._split(ids).items():
            for f, scores in self.engines[kb].hamming_score(codes, local).items():
                out[f].update({f"{kb}{SEP}{i}": s for i, s in scores.items()})
        return out

    def vector_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        return self._routed("vector_score", ids, vec)

    def passage_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        return self._routed("passage_score", ids, vec)

    def passage_vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return self._routed("passage_vectors", ids)

    def has_vectors(self) -> bool:
        return any(e.has_vectors() for e in self.engines.values())

    def get(self, ids: Sequence[str]) -> dict[str, Document]:
        return self._routed("get", ids)

    def doc_info(self, ids: Sequence[str]) -> dict[str, DocInfo]:
        """DocInfo with the work id qualified like the ids (`<kb>:<work>`), so works of different
        knowledge bases never merge and citation neighbours (qualified too) meet their works."""
        return {q: _qualified(q.partition(SEP)[0], info) for q, info in self._routed("doc_info", ids).items()}

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return self._routed("vectors", ids)

    def vector_sample(self, n: int, filters: Filters | None = None) -> np.ndarray:
        """Each knowledge base's share of the sample in proportion to its chunks (all of them,
        whatever the filters), n rows at most."""
        counts = {kb: e.count() for kb, e in self.engines.items()}
        total = sum(counts.values()) or 1
        parts = [e.vector_sample(n * counts[kb] // total, filters) for kb, e in self.engines.items()
                 if n * counts[kb] // total > 0]
        return np.vstack(parts)[:n] if parts else np.zeros((0, 0), dtype=np.float32)

    def count(self) -> int:
        return sum(e.count() for e in self.engines.values())

    def work_chunks(self, work_ids: Sequence[str], filters: Filters | None = None) -> dict[str, DocInfo]:
        """Chunks of qualified work ids (`<kb>:<work>`), qualified, their DocInfo as `doc_info` gives it."""
        found = {f"{kb}{SEP}{i}": _qualified(kb, info) for kb, works in self._split(work_ids).items()
                 for i, info in self.engines[kb].work_chunks(works, filters).items()}
        return {i: found[i] for i in sorted(found)}

    def authority(self, ids: Sequence[str]) -> dict[str, float]:
        return self._routed("authority", ids)

    def neighbors(self, ids: Sequence[str]) -> dict[str, Neighbors]:
        """Neighbours within each knowledge base, qualified like the ids."""
        out: dict[str, Neighbors] = {}
        for q, nb in self._routed("neighbors", ids).items():
            kb = q.partition(SEP)[0]
            cites, cited_by, cocited = (tuple(f"{kb}{SEP}{i}" for i in ids) for ids in (nb.cites, nb.cited_by,
                                                                                       nb.cocited))
            out[q] = Neighbors(cites, cited_by, cocited, nb.pagerank, nb.authority)
        return out


def _qualified(kb: str, info: DocInfo) -> DocInfo:
    return replace(info, work_id=f"{kb}{SEP}{info.work_id}")
