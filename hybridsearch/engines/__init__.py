"""The engine contract: what the indexer and the query layer may call, with typed options and
results and the meaning of every score; `open_engine` picks an engine plugin for a path or URL.

Score meanings, the same on every engine whatever the engine scores internally:
- `bm25`: raw BM25 in the engine's own scale (the embedded engine and OpenSearch 2.x both carry
  Lucene's classic (k1+1) factor, but idf statistics of sparse fields differ between engines), so
  only normalised BM25 is portable; never compare raw BM25 across engines or against a constant.
- `knn`, `vector_score`: raw cosine in [-1, 1] of normalised vectors.
- `passage_score`: the best raw cosine in [-1, 1] over a chunk's passage vectors.
- `hamming`, `hamming_score`: Hamming similarity 1 - d/4096 in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hybridsearch.analysis import ANALYSIS_RULES, Analyzer
from hybridsearch.errors import ConfigError, QueryError, ValidationError
from hybridsearch.hdc import FIELDS as HDC_FIELDS
from hybridsearch.hdc import NBYTES, HdcEncoder
from hybridsearch.models import BM25_FIELD_WEIGHTS, SCORED_FIELDS, Bm25Mode, DocInfo, Document, Filters, RankedList

Codes = Mapping[str, np.ndarray]  # HDC field -> 512 packed uint8 bytes
Progress = Callable[[str, int, int], None]  # a phase of long work: (what, done, total)


@dataclass(frozen=True, slots=True)
class Bm25Options:
    """How `bm25` combines fields: `most_fields` sums the weighted per-field scores, `best_fields`
    takes the best plus `tie_breaker` times the others. k1/b other than 1.2/0.75 rescore the
    engine's top max(4k, 200) candidates exactly (hybridsearch.scoring). `role_boost` multiplies."""

    mode: Bm25Mode = "most_fields"
    tie_breaker: float = 0.2
    role_boost: float = 1.0
    k1: float = 1.2
    b: float = 0.75

    def __post_init__(self) -> None:
        if self.mode not in ("most_fields", "best_fields"):
            raise QueryError(f"mode must be one of most_fields, best_fields; got {self.mode!r}")
        for name in ("tie_breaker", "role_boost", "k1", "b"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise QueryError(f"{name} must be a finite number >= 0, got {v!r}")
        for name in ("tie_breaker", "b"):
            if getattr(self, name) > 1:
                raise QueryError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")

    @property
    def rescored(self) -> bool:
        return (self.k1, self.b) != (1.2, 0.75)


@dataclass(frozen=True, slots=True)
class TermStat:
    df: int  # documents containing the term, in the scored field where it is most frequent
    idf: float  # hybridsearch.scoring.bm25_idf over all documents


@dataclass(frozen=True, slots=True)
class TermStats:
    num_docs: int
    terms: dict[str, TermStat]


@dataclass(frozen=True, slots=True)
class Neighbors:
    """A work's place in the citation graph, by work id (every chunk of a work has its work's):
    what it cites and what cites it, sorted, with a link between dated works of different dates
    pointing from the newer to the older; the works cited together with it, most shared citers
    first; its PageRank (the graph's values sum to 1) and its authority, PageRank on a log scale
    in [0, 1] (0 at or below the average work, 1 from the 99th percentile up). All empty, and
    authority None, until the graph is built (`indexer.graph.update_graph`)."""

    cites: tuple[str, ...] = ()
    cited_by: tuple[str, ...] = ()
    cocited: tuple[str, ...] = ()
    pagerank: float | None = None
    authority: float | None = None


def named_work(id_: str) -> str:
    """The work an id names by itself: `<work>` for a chunk id `<work>#<n>`, else the id."""
    return id_.rpartition("#")[0] or id_


def names_its_work(chunk_id: str, work_id: str) -> bool:
    """Whether a chunk's id names its work by itself: the work id, or `<work>#<n>`."""
    return chunk_id == work_id or named_work(chunk_id) == work_id


@dataclass(frozen=True, slots=True)
class WorkLinks:
    """What the graph is built from, per work: the union of its chunks' `cites`, its date as
    year*100+month (None when undated), and the ids of its chunks that do not name it by
    themselves (neither the work id nor `<work>#<n>`), so that citing one stands for the work."""

    work_id: str
    ym: int | None
    cites: tuple[str, ...]
    chunks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GraphSummary:
    """A built citation graph: works indexed, distinct citation edges (after orientation), links
    oriented by date, missing targets (cited but not indexed: kept as dangling nodes), dangling
    nodes (no outgoing edge, missing targets included), the PageRank total, and the hash of the
    inputs it was built from (a build with the same hash has nothing to do)."""

    hash: str
    works: int
    edges: int
    oriented: int
    missing: int
    dangling: int
    pagerank_sum: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def of(cls, value: Mapping[str, Any] | None) -> GraphSummary | None:
        """The summary stored as index metadata (None when no graph was built)."""
        return None if not value else cls(**{f: value[f] for f in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class GraphState:
    """What the last graph build leaves for the next to start from, so that an update costs what
    it changes (`indexer.graph.update_graph`): the graph's nodes by number (works, and missing
    targets), its edges and the links orientation dropped, each work's input digest, and the ranks.
    Node numbers stay as they were given; a node nothing cites any more and that is not indexed is
    not live (out of the counts and of PageRank) until a full build numbers the nodes afresh."""

    seq: int  # the journal's last entry when the links were read: later changes are the next update's
    params: tuple[float, int]  # (damping, co-cited limit) it was built with
    names: list[str]  # node i's name: a work id, or what a missing target names
    rank: np.ndarray  # int64 per node: its name's place in name order (the order lists are kept in)
    flags: np.ndarray  # uint8 per node: GRAPH_INDEXED | GRAPH_DATED | GRAPH_ALIASED
    ym: np.ndarray  # int64 per node: year*100+month, 0 when undated
    digests: np.ndarray  # (nodes, 2) uint64: an indexed work's input digest (indexer.graph.work_digest), else 0
    edges: np.ndarray  # int64 keys citing << 32 | cited, sorted: the edges after orientation
    away: np.ndarray  # int64 keys, sorted: the links orientation dropped
    pagerank: np.ndarray  # float64 per node, 0 where not live
    authority: np.ndarray  # float64 per node


GRAPH_INDEXED, GRAPH_DATED, GRAPH_ALIASED = 1, 2, 4  # GraphState.flags: indexed; dated; has chunks not naming it


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counts every engine reports, plus engine-specific details."""

    documents: int
    vectors: int
    codes: int
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"documents": self.documents, "vectors": self.vectors, "hdc_codes": self.codes, **self.details}


@runtime_checkable
class Reader(Protocol):
    """What the query layer reads besides the search capabilities (an engine, or several merged)."""

    def get(self, ids: Sequence[str]) -> dict[str, Document]: ...
    def doc_info(self, ids: Sequence[str]) -> dict[str, DocInfo]: ...


@runtime_checkable
class Engine(Reader, Protocol):
    """Storage and retrieval of chunks. A write is acknowledged when it returns: searchable in every
    channel and durable. Vectors are normalised float32 (n, 384); a chunk's passage vectors are
    normalised float32 (p, 384), one row per passage of Document.passages, in order; codes are
    per-field packed bits.
    `capabilities` names the search protocols it provides: lexical, vector, binary, graph."""

    capabilities: frozenset[str]

    def write(self, docs: Sequence[Document], vectors: np.ndarray | None = None,
              codes: Sequence[Codes] | None = None, passages: Sequence[np.ndarray] | None = None) -> int:
        """Upsert documents (with their vectors, passage vectors and HDC codes when given); returns
        how many. An update without vectors keeps the old vector and passage vectors while the
        dense text is unchanged; an update without codes drops the old codes."""
        ...

    def set_vectors(self, ids: Sequence[str], vectors: np.ndarray, *, texts: Sequence[str] | None = None,
                    passages: Sequence[np.ndarray] | None = None) -> int:
        """Attach vectors (and passage vectors) to existing chunks (unknown ids are skipped); returns
        how many were set. With `texts` (the dense texts the vectors were computed from), a chunk
        whose dense text has changed since is skipped too, atomically: a worker's stale result is
        dropped."""
        ...

    def set_codes(self, ids: Sequence[str], codes: Sequence[Codes]) -> int: ...
    def delete(self, ids: Sequence[str]) -> list[str]:
        """Delete by id; returns the ids that existed."""
        ...

    def count(self) -> int: ...
    def work_chunks(self, work_ids: Sequence[str], filters: Filters | None = None) -> dict[str, DocInfo]:
        """Every chunk of these works that passes `filters`, with its DocInfo, in id order (what
        citation expansion needs of the chunks it reaches, read with them)."""
        ...

    def missing_vectors(self, limit: int | None = None, ids: Sequence[str] | None = None
                        ) -> list[tuple[str, Document]]:
        """Chunks with no vector, or no passage vectors, for their current text (a text change
        drops both), among `ids` when given: the work an embedding pass still has to do."""
        ...

    def missing_codes(self, ids: Sequence[str] | None = None) -> list[tuple[str, Document]]:
        """Chunks with no HDC codes for their current content, among `ids` when given."""
        ...

    def get_meta(self, key: str) -> Any:
        """A JSON value stored with the index (None when absent)."""
        ...

    def set_meta(self, key: str, value: Any) -> None: ...
    def stats(self) -> EngineStats: ...
    def close(self) -> None: ...


@runtime_checkable
class LexicalSearch(Protocol):
    def bm25(self, query: str | Sequence[tuple[str, float]], fields: Mapping[str, float] | None = None,
             k: int = 10, filters: Filters | None = None, options: Bm25Options | None = None) -> RankedList:
        """Top-k by field-boosted BM25. `query` is text (analysed) or analysed (term, weight) pairs;
        `fields` maps scored field to weight (default BM25_FIELD_WEIGHTS). Scores: raw BM25."""
        ...

    def term_stats(self, terms: Sequence[str]) -> TermStats:
        """Full-corpus document frequencies and idf of analysed terms."""
        ...


@runtime_checkable
class VectorSearch(Protocol):
    dim: int  # of every vector the index holds

    def knn(self, vec: np.ndarray, k: int = 10, filters: Filters | None = None) -> RankedList:
        """Nearest chunks by cosine (HNSW or exact, engine's choice). Scores: raw cosine."""
        ...

    def vector_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        """Exact cosine of chosen chunks (a chunk without a vector has no entry)."""
        ...

    def passage_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        """The best exact cosine between `vec` and a passage vector of each chosen chunk (a chunk
        without passage vectors has no entry)."""
        ...

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]: ...
    def has_vectors(self) -> bool:
        """Whether any chunk holds a vector (cheap: no vector index is loaded), so that a search of
        an index without vectors embeds no query."""
        ...

    def passage_vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Each chosen chunk's passage vectors (p, 384), as stored (a chunk without them has no entry)."""
        ...


@runtime_checkable
class VectorSampling(Protocol):
    def vector_sample(self, n: int, filters: Filters | None = None) -> np.ndarray:
        """Up to n stored vectors, as rows: those of the chunks with the smallest (sample_keys
        value, id), in that order, so every engine samples the same chunks of the same contents.
        Chunks without a vector, and chunks the filters exclude (the domain check passes the
        caller's licence filter), are not in it."""
        ...


def sample_keys(ids: Sequence[str]) -> np.ndarray:
    """Each chunk id's sample key, a pseudo-random integer in [0, 2**24): Java's String.hashCode of
    the id (over its UTF-16 code units), mixed by MurmurHash3's fmix32, low 24 bits. OpenSearch
    computes the same in painless (queries.SAMPLE_KEY_SCRIPT). About 0.5 s for a million ids."""
    out = np.zeros(len(ids), dtype=np.int64)
    for lo in range(0, len(ids), 65536):
        part = list(ids[lo:lo + 65536])
        units = np.array(part, dtype=np.str_)  # code points, NUL-padded to the longest
        codes = units.view(np.uint32).reshape(len(part), -1).astype(np.uint64)
        lens = np.char.str_len(units)
        h = np.zeros(len(part), dtype=np.uint64)
        for j in range(codes.shape[1]):
            h = np.where(j < lens, (h * 31 + codes[:, j]) & 0xFFFFFFFF, h)
        # beyond the Basic Multilingual Plane (two UTF-16 units), or with a trailing NUL: by hand
        odd = (codes > 0xFFFF).any(axis=1) | (lens != np.fromiter(map(len, part), dtype=np.int64, count=len(part)))
        for i in np.nonzero(odd)[0].tolist():
            s = part[i]
            v = 0
            for u in np.frombuffer(s.encode("utf-16-be"), dtype=">u2").tolist():
                v = (v * 31 + u) & 0xFFFFFFFF
            h[i] = v
        h ^= h >> np.uint64(16)
        h = (h * np.uint64(0x85EBCA6B)) & np.uint64(0xFFFFFFFF)
        h ^= h >> np.uint64(13)
        h = (h * np.uint64(0xC2B2AE35)) & np.uint64(0xFFFFFFFF)
        h ^= h >> np.uint64(16)
        out[lo:lo + len(part)] = (h & np.uint64(0xFFFFFF)).astype(np.int64)
    return out


def sample_order(ids: Sequence[str], n: int) -> list[int]:
    """Positions in `ids` of the n with the smallest (sample key, id), in that order."""
    if len(ids) <= 0 or n <= 0:
        return []
    keys = sample_keys(ids)
    if n < len(ids):
        kth = np.partition(keys, n - 1)[n - 1]
        near = np.nonzero(keys <= kth)[0].tolist()
    else:
        near = list(range(len(ids)))
    return sorted(near, key=lambda i: (int(keys[i]), ids[i]))[:n]


@runtime_checkable
class BinarySearch(Protocol):
    def hamming(self, codes: Codes, k: int = 10, filters: Filters | None = None) -> dict[str, RankedList]:
        """Per HDC field of `codes`, the candidates nearest to its code (the fields in one round
        trip where the engine is remote). Scores: 1 - hamming/4096."""
        ...

    def hamming_score(self, codes: Codes, ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """Per HDC field of `codes`, exact similarity of its code to the chosen chunks' codes of
        that field (a chunk without one has no entry)."""
        ...

    def hdc_encoder(self, *, ngrams: bool | None = None) -> HdcEncoder:
        """The encoder whose options are stored with the index (documents and queries alike)."""
        ...


@runtime_checkable
class Neighborhood(Protocol):
    """What the query layer reads of a citation graph (citation expansion, authority)."""

    def neighbors(self, ids: Sequence[str]) -> dict[str, Neighbors]:
        """The citation graph as built for the works of chosen chunks (absent chunks have no
        entry; a chunk whose work the last build did not see has empty Neighbors)."""
        ...

    def authority(self, ids: Sequence[str]) -> dict[str, float]:
        """Each chunk's work authority in [0, 1] as the last build computed it (what the reranker
        reads, without the neighbour lists); a chunk absent, or written since, has no entry."""
        ...


@runtime_checkable
class DerivedIndexes(Protocol):
    """An engine that derives indexes from its store itself (the embedded engine's vector
    indexes): `checkpoint` brings them up to date on disk, and long work on them (replaying the
    journal, building an HNSW graph) reports to `progress` while it is set. While `bulk` is set
    (a long load), a write's lexical changes may wait for a later commit (seconds) before other
    processes see them; this process sees them at once, and `checkpoint` commits them."""

    progress: Progress | None
    bulk: bool

    def checkpoint(self) -> None:
        """Bring every derived index up to date and save it, so that the next open replays little."""
        ...


@runtime_checkable
class GraphStore(Neighborhood, Protocol):
    """An index that stores a citation graph: what building it reads and writes."""

    def citation_links(self) -> list[WorkLinks]:
        """Every work's citations and date, in work id order: the graph's input."""
        ...

    def set_graph(self, works: Mapping[str, Neighbors], summary: GraphSummary) -> None:
        """Store a built graph, replacing the previous one; `summary` is stored last (as index
        metadata `graph`), so a build cut short leaves the old summary and is redone."""
        ...

    def graph_summary(self) -> GraphSummary | None:
        """The summary of the graph last stored (None before the first build)."""
        ...


@runtime_checkable
class IncrementalGraphStore(GraphStore, Protocol):
    """A graph store that keeps the last build's GraphState and knows which works changed since,
    so that a graph update reads and writes what changed (the embedded engine)."""

    def graph_state(self) -> GraphState | None:
        """The state the last build stored (None: no build yet, or one stored without it)."""
        ...

    def graph_changes(self, since: int | None) -> tuple[int, list[str]]:
        """The journal's last seq, and the works whose chunks were written, moved or deleted after
        seq `since` (none asked for when None)."""
        ...

    def work_links(self, work_ids: Sequence[str]) -> list[WorkLinks]:
        """The links of those of `work_ids` that have chunks, as `citation_links` gives them."""
        ...

    def chunk_works(self, ids: Sequence[str]) -> dict[str, str]:
        """The work of each of `ids` that names a stored chunk."""
        ...

    def set_graph(self, works: Mapping[str, Neighbors], summary: GraphSummary,
                  state: GraphState | None = None) -> None:
        """GraphStore.set_graph, keeping `state` for the next update when given (its nodes 0, 1,
        ... are `works`, in order)."""
        ...

    def update_graph_rows(self, works: Mapping[str, Neighbors], nodes: Sequence[int], gone: Sequence[str],
                          state: GraphState, summary: GraphSummary) -> None:
        """Store an update: the lists of `works` (their node numbers `nodes`, in order; their ranks
        come from `state`), `gone` no longer indexed, every rank, the state and the summary, in one
        transaction."""
        ...


def check_vectors(vectors: np.ndarray, n: int, dim: int) -> np.ndarray:
    """Vectors as float32 (n, dim), every value finite, none all zeros (it has no cosine); each
    scaled to unit length, so that every engine's dense score is the cosine (inner products of
    unit vectors), bounded whatever the lengths given."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.shape != (n, dim):
        raise ValidationError(f"expected shape ({n}, {dim}), got {arr.shape}", field="vectors")
    squares = _squared_lengths(arr)  # not finite exactly where a value is not; 0 exactly for all zeros
    bad = np.flatnonzero(~np.isfinite(squares))
    if bad.size:
        raise ValidationError(f"row {int(bad[0])} has a non-finite value", field="vectors")
    zero = np.flatnonzero(squares == 0)
    if zero.size:
        raise ValidationError(f"row {int(zero[0])} is all zeros (a vector without a direction has no cosine)",
                              field="vectors")
    return _unit_rows(arr, squares)


def check_passages(passages: Sequence[np.ndarray] | None, n: int, dim: int, with_vectors: bool
                   ) -> list[np.ndarray] | None:
    """n chunks' passage vectors, each as check_vectors makes them (at least one row); None stays
    None. They come with the chunks' vectors (`with_vectors`), never alone."""
    if passages is None:
        return None
    if not with_vectors:
        raise ValidationError("passage vectors come with the chunks' vectors; give both", field="passages")
    if len(passages) != n:
        raise ValidationError(f"expected passage vectors of {n} chunks, got {len(passages)}", field="passages")
    out = []
    for i, p in enumerate(passages):
        arr = np.asarray(p, dtype=np.float32)
        try:
            if arr.ndim != 2 or not len(arr):
                raise ValidationError(f"expected shape (passages, {dim}), got {arr.shape}")
            out.append(check_vectors(arr, len(arr), dim))
        except ValidationError as e:
            raise ValidationError(f"chunk {i}: {e.message}", field="passages") from None
    return out


def check_query_vector(vec: np.ndarray, dim: int) -> np.ndarray:
    """A query vector as float32 (dim,), every value finite, not all zeros; scaled to unit length,
    so that scores are cosines whatever its length."""
    v = np.asarray(vec, dtype=np.float32).ravel()
    if v.shape != (dim,) or not np.isfinite(v).all():
        raise QueryError(f"a query vector must be {dim} finite numbers, got shape {np.shape(vec)}")
    if not v.any():
        raise QueryError("a query vector must not be all zeros (it has no cosine with anything)")
    return _unit_rows(v[None, :])[0]


def _squared_lengths(arr: np.ndarray) -> np.ndarray:
    """The squared length of each float32 row, summed in float64, where no float32 value's square
    overflows or vanishes (one pass, no float64 copy of the rows)."""
    return np.einsum("ij,ij->i", arr, arr, dtype=np.float64)


def _unit_rows(arr: np.ndarray, squares: np.ndarray | None = None) -> np.ndarray:
    """float32 rows, none all zeros, scaled to unit length (in float64, where no length overflows);
    as they are when every row already has unit length (to 1e-6). `squares`: their squared
    lengths, when known."""
    norms = np.sqrt(_squared_lengths(arr) if squares is None else squares)[:, None]
    if np.all(np.abs(norms - 1.0) < 1e-6):
        return arr
    return (arr.astype(np.float64) / norms).astype(np.float32)


def check_bm25_fields(fields: Mapping[str, float] | None) -> Mapping[str, float]:
    """BM25 field weights (default BM25_FIELD_WEIGHTS): scored fields (SCORED_FIELDS), finite
    weights >= 0."""
    if fields is None or not fields:
        return BM25_FIELD_WEIGHTS
    for f, w in fields.items():
        if f not in SCORED_FIELDS:
            raise QueryError(f"unknown BM25 field {f!r}; valid: {', '.join(SCORED_FIELDS)}")
        if not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise QueryError(f"the weight of BM25 field {f!r} must be a finite number >= 0, got {w!r}")
    return fields


def check_codes(codes: Sequence[Codes], n: int) -> list[Codes]:
    """n code sets, each mapping known HDC fields to 512 uint8 bytes."""
    codes = list(codes)
    if len(codes) != n:
        raise ValidationError(f"expected {n} code sets, got {len(codes)}", field="codes")
    for i, c in enumerate(codes):
        for f, v in c.items():
            if f not in HDC_FIELDS:
                raise ValidationError(f"row {i}: unknown field {f!r}; valid: {', '.join(HDC_FIELDS)}",
                                      field="codes")
            if np.asarray(v).dtype != np.uint8 or np.asarray(v).shape != (NBYTES,):
                raise ValidationError(f"row {i}, {f}: expected {NBYTES} uint8 bytes", field="codes")
    return codes


def check_query_codes(codes: Codes) -> dict[str, np.ndarray]:
    """A query's HDC codes: known fields, each 512 packed uint8 bytes."""
    out = {}
    for name, code in codes.items():
        if name not in HDC_FIELDS:
            raise QueryError(f"unknown HDC field {name!r}; valid: {', '.join(HDC_FIELDS)}")
        c = np.asarray(code)
        if c.dtype != np.uint8 or c.shape != (NBYTES,):
            raise QueryError(f"an HDC code is {NBYTES} uint8 bytes, got {c.dtype} {c.shape} for {name}")
        out[name] = c
    return out


def check_lexicon(stored: str | None, analyzer: Analyzer, where: str) -> None:
    """Refuse to use an index analysed with another variant lexicon (its tokens would not match
    the queries'): one ConfigError naming both."""
    if stored is not None and stored != analyzer.lexicon.fingerprint:
        raise ConfigError(f"{where} was analysed with variant lexicon {stored}, but HYBRIDSEARCH_LEXICON now gives "
                          f"{analyzer.lexicon.fingerprint}; set HYBRIDSEARCH_LEXICON as it was at ingest, or ingest "
                          "into a new index")


def rules_named(stored: Any) -> str:
    """The analysis rules an index records, in words (one made before indexes recorded them holds
    none)."""
    return f"rules {stored}" if isinstance(stored, int) else "rules older than recorded ones"


def stale_analysis(stored: Any, what: str, where: str) -> str | None:
    """Why an index's `what` may not match this process's queries (None when they do): the index
    records the analysis rules it was made with (`ANALYSIS_RULES`)."""
    if stored == ANALYSIS_RULES:
        return None
    return (f"{where} holds {what} made with analysis {rules_named(stored)}, and this version analyses with rules "
            f"{ANALYSIS_RULES} (hybridsearch/analysis/tokenizer.py lists what each changed): text in the notations "
            "that changed may not match queries; ingest the corpus again into it (unchanged text is not embedded "
            "again) to bring them up to date")


def is_url(target: str) -> bool:
    """A target names a server (an engine registered for its scheme) rather than a directory."""
    return "://" in target


def open_engine(path_or_url: str, **options: Any) -> Engine:
    """Open the engine for a directory (embedded) or a URL (the engine registered for its scheme)."""
    from hybridsearch import plugins

    scheme = path_or_url.split("://", 1)[0] if is_url(path_or_url) else "embedded"
    name = "opensearch" if scheme in ("http", "https") else scheme
    factory = plugins.load("engines", name)
    engine: Engine = factory(path_or_url, **options)
    return engine
