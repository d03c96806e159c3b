"""Pure request builders and score conversions for the OpenSearch engine: data in, dicts out.

Each channel has one builder, and every builder takes its filters from `filter_clauses`, so a
filter means the same in every channel (and the same as on the embedded engine).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Literal

import numpy as np

from hybridsearch.engines import Neighbors
from hybridsearch.engines.embedded.store import norm_key
from hybridsearch.hdc import DIM as HDC_DIM
from hybridsearch.models import JOINED_FIELDS, SCORED_FIELDS, Bm25Mode, DocInfo, Document, Filters
from hybridsearch.scoring import EMPTY_FIELD_TOKEN, indexed_joined

KnnEngine = Literal["lucene", "faiss"]
Compression = Literal["1x", "4x", "32x"]
# How a kNN search of compressed vectors runs: (oversample, widen). It takes oversample x k
# candidates by the quantised vectors and rescores them with the float32 ones (k-NN 3.6 does not
# rescore 4x unless asked: on 20k clustered vectors it then found 0.81 of the exact top-10, 1.0 with
# it); and its HNSW walk examines widen x ef_search vectors. On 1-bit codes the walk is what loses
# neighbours: bench/vector_compression.py, 100k near-real chunks, 32x: recall@10 0.873 at ef_search
# 100 whatever the oversampling (2 to 10), 0.978 at 400.
COMPRESSED_SEARCH: dict[str, tuple[float, int]] = {"4x": (3.0, 1), "32x": (3.0, 4)}
# the space type the dense field is mapped with, per k-NN engine: Lucene scores cosine natively;
# the k-NN docs recommend inner product on Faiss for vectors that are already normalised
SPACE_TYPE: dict[str, str] = {"lucene": "cosinesimil", "faiss": "innerproduct"}
EXCLUDE_SOURCE = ["dense", "hdc_*", "bm25", "bm25_len", "keys", "ym", "published", "dense_hash",
                  "hdc_encoded", "graph"]
DOC_FIELDS = tuple(Document.model_fields)
# Ranked hits carry only their id, read from doc values: fetching `_id` would decompress each hit's
# stored-fields block, which holds the large `_source` (vectors and codes), about 0.1 ms a hit.
HITS_BY_ID: dict[str, Any] = {"_source": False, "stored_fields": "_none_", "docvalue_fields": ["id"],
                              "track_total_hits": False}


def hit_id(hit: Mapping[str, Any]) -> str:
    """The chunk id of a hit requested with HITS_BY_ID."""
    value: str = hit["fields"]["id"][0]
    return value


# -- templates --------------------------------------------------------------------------------
def template(name: str) -> dict[str, Any]:
    """A JSON file of opensearch_templates/ (e.g. `hybridsearch-chunks`, `pipelines/hybridsearch-rrf`)."""
    text = (resources.files("opensearch_templates") / f"{name}.json").read_text()
    body: dict[str, Any] = json.loads(text)
    return body


def chunks_component(knn_engine: KnnEngine, compression: Compression) -> str:
    """The name of the chunk component template: one per k-NN engine and dense compression."""
    return f"hybridsearch-chunks-{knn_engine}" + ("" if compression == "1x" else f"-{compression}")


def chunks_template(knn_engine: KnnEngine, major: int, compression: Compression = "1x", *,
                    niofs: bool = False) -> dict[str, Any]:
    """The component template of chunk indices for a cluster of OpenSearch `major`, with the dense
    and HDC fields on `knn_engine` and the dense vectors at `compression` (k-NN's
    compression_level). BM25 keeps Lucene's classic (k1+1) scale on every version: 3.x names that
    similarity LegacyBM25 (its BM25 drops the factor), 2.x BM25. `niofs`: the index is read
    through NIOFS, not memory-mapped (3.x's k-NN scores quantised vectors in mapped files with its
    native libraries, which a node assembled from Maven Central lacks; read otherwise, with
    Lucene's own scorer)."""
    body = template("hybridsearch-chunks")
    settings = body["template"]["settings"]["index"]
    if major >= 3:
        settings["similarity"]["hs_bm25"]["type"] = "LegacyBM25"
    if niofs:
        settings["store"] = {"type": "niofs"}
    props = body["template"]["mappings"]["properties"]
    for dense in (props["dense"], props["passages"]["properties"]["v"]):
        dense["space_type"] = SPACE_TYPE[knn_engine]
        dense["method"]["engine"] = knn_engine
        if compression != "1x":
            dense["compression_level"] = compression
    for f in [p for p in props if p.startswith("hdc_") and props[p].get("type") == "knn_vector"]:
        props[f]["method"]["engine"] = knn_engine
    return body


def index_template(index: str, knn_engine: KnnEngine, compression: Compression = "1x") -> dict[str, Any]:
    """The index template of logical index `index`. Its pattern `<index>-v*` also covers the
    versions of an index named `<index>-v<more>` (`papers` and `papers-videos`); OpenSearch
    refuses two overlapping patterns of one priority, so the longer name, whose pattern is the
    narrower, takes the higher priority and decides its own versions."""
    body = template("hybridsearch-index-template")
    body["index_patterns"] = [p.replace("{index}", index) for p in body["index_patterns"]]
    body["priority"] += len(index)
    body["composed_of"] = [chunks_component(knn_engine, compression) if c == "hybridsearch-chunks-{knn_engine}" else c
                           for c in body["composed_of"]]
    return body


def query_log_name(prefix: str) -> str:
    """The name of the query log whose daily indices are `<prefix>YYYY.MM.DD`: the prefix without its
    trailing separators (`hybridsearch-queries`). Its template and ISM policy take this name, and no
    logical index may have it (check_index_name)."""
    return prefix.rstrip("-_.")


def query_log_template(prefix: str) -> tuple[str, dict[str, Any]]:
    """The index template of the daily query-log indices `<prefix>YYYY.MM.DD`: its name and body.
    One prefix may start another (`hybridsearch-queries-` and `hybridsearch-queries-staging-`):
    the longer, whose pattern is the narrower, takes the higher priority (OpenSearch refuses two
    overlapping patterns of one priority), as the logical indices' templates do."""
    body = template("hybridsearch-queries")
    body["index_patterns"] = [f"{prefix}*"]
    body["priority"] += len(prefix)
    return query_log_name(prefix), body


def query_log_policy(prefix: str) -> tuple[str, dict[str, Any]]:
    """The ISM policy that deletes the daily query-log indices `<prefix>*` after 30 days: its name
    (`<query log name>-30d`) and its body."""
    body = template("policies/hybridsearch-queries-30d")
    body["policy"]["ism_template"][0]["index_patterns"] = [f"{prefix}*"]
    body["policy"]["ism_template"][0]["priority"] += len(prefix)  # the narrower pattern decides
    return f"{query_log_name(prefix)}-30d", body


# -- documents --------------------------------------------------------------------------------
def packed_to_int8(code: np.ndarray) -> list[int]:
    """512 packed bytes (bit 0 = the most significant bit of byte 0, as numpy packs them) as the
    signed bytes a binary knn_vector takes."""
    return np.asarray(code, dtype=np.uint8).view(np.int8).tolist()


def to_source(doc: Document, tokens: Mapping[str, tuple[str, int]], dense_hash: str, vector: np.ndarray | None,
              codes: Mapping[str, np.ndarray] | None, passages: np.ndarray | None = None) -> dict[str, Any]:
    """The indexed form of a chunk: the document's own fields, its analysed tokens per scored
    field (hybridsearch.scoring.document_joined), normalised filter keys, and its vector, passage
    vectors and codes when it has them."""
    src: dict[str, Any] = doc.model_dump(exclude_defaults=True)
    src["id"], src["work_id"] = doc.id, doc.work_id
    indexed = {f: indexed_joined(*t) for f, t in tokens.items()}
    src["bm25"] = {f: text for f, (text, _) in indexed.items()}
    src["bm25_len"] = {f: n for f, (_, n) in indexed.items()}
    src["keys"] = {"subjects": [norm_key(s) for s in doc.subjects],
                   "kind": norm_key(doc.kind) if doc.kind else None,
                   "license": norm_key(doc.license) if doc.license else None}
    if doc.year is not None:
        src["ym"] = doc.year * 100 + (doc.month or 0)
        if 1 <= doc.year <= 9999:
            src["published"] = f"{doc.year:04d}-{doc.month:02d}" if doc.month else f"{doc.year:04d}"
    src["title_bin"] = title_bin(doc.title)
    src["dense_hash"] = dense_hash
    if vector is not None:
        src["dense"] = np.asarray(vector, dtype=np.float32)  # the engine's serializer writes numpy arrays
    if passages is not None:
        src["passages"] = passage_source(passages)
    if codes is not None:
        src["hdc_encoded"] = True
        for f, code in codes.items():
            src[f"hdc_{f}"] = np.asarray(code, dtype=np.uint8).view(np.int8)
    return src


def passage_source(passages: np.ndarray) -> list[dict[str, Any]]:
    """A chunk's passage vectors as its `passages` field: one nested object per passage."""
    return [{"v": row} for row in np.asarray(passages, dtype=np.float32)]


def passage_score_query(query_value: Sequence[float], ids: Sequence[str]) -> dict[str, Any]:
    """The best exact score over each chosen chunk's passages, by the k-NN scoring script (`knn_score`,
    cosinesimil: (1 + cos) / 2) on the nested `passages.v`; chunks without passages are left out (all
    of them in a version made before `passages` existed and not yet written to)."""
    script = {"lang": "knn", "source": "knn_score",
              "params": {"field": "passages.v", "query_value": list(query_value), "space_type": "cosinesimil"}}
    best = {"nested": {"path": "passages", "score_mode": "max", "ignore_unmapped": True,
                       "query": {"script_score": {"query": {"match_all": {}}, "script": script}}}}
    return {"size": len(ids), **HITS_BY_ID,
            "query": {"bool": {"filter": [{"ids": {"values": list(ids)}}], "must": [best]}}}


def from_source(src: Mapping[str, Any]) -> Document:
    """The document stored in a chunk's `_source`."""
    return Document.model_validate({k: v for k, v in src.items() if k in DOC_FIELDS}, strict=False)


INFO_FIELDS = ("id", "work_id", "source", "page", "authors", "venue", "kind", "title", "subjects", "year")
# the same from doc values. The title comes from `title_bin`, its UTF-8 bytes as a binary doc value
# (100 chunks' DocInfo: about 3 ms; from the keyword copy `title.raw`, whose sorted doc values
# decompress a terms block per chunk: about 6 ms; from `_source`, which holds the vectors: about 30)
INFO_DOCVALUES = ("id", "work_id", "source", "page", "authors", "venue", "kind", "title_bin", "subjects", "year")
# chunks written before `title_bin` existed: `title.raw` (absent on chunks written before it existed
# too, and on titles over 4096 characters, whose DocInfo comes from `_source`)
INFO_DOCVALUES_RAW = tuple("title.raw" if f == "title_bin" else f for f in INFO_DOCVALUES)
# chunk fields added since the first template: put into an older index's mapping at its first write
# (`bm25` and `bm25_len` gained the joined field `title_text`)
ADDED_FIELDS = ("graph", "title_bin", "bm25", "bm25_len", "passages")
# `indices reindex` fills what chunks copied from an older index lack: `title_bin`, and each joined
# field (JOINED_FIELDS) from its parts' tokens, as hybridsearch.scoring.document_tokens joins them
# (the placeholder of an empty part dropped, the placeholder alone when every part is empty)
REINDEX_SCRIPT = (
    "if (ctx._source.title_bin == null) { String t = ctx._source.title; "
    "ctx._source.title_bin = (t == null ? '' : t).encodeBase64(); } "
    "Map tok = ctx._source.bm25; if (tok != null) { if (ctx._source.bm25_len == null) { ctx._source.bm25_len = "
    "new HashMap(); } for (def joined : params.joined.entrySet()) { if (tok[joined.getKey()] == null) { "
    "List out = new ArrayList(); for (String part : joined.getValue()) { String s = tok[part]; if (s != null) { "
    "for (String t : s.splitOnToken(' ')) { if (!t.isEmpty() && !t.equals(params.placeholder)) { out.add(t); } } } } "
    "if (out.isEmpty()) { out.add(params.placeholder); } tok[joined.getKey()] = String.join(' ', out); "
    "ctx._source.bm25_len[joined.getKey()] = out.size(); } } }")
REINDEX_PARAMS = {"placeholder": EMPTY_FIELD_TOKEN, "joined": {f: list(parts) for f, parts in JOINED_FIELDS.items()}}


def title_bin(title: str) -> str:
    """A title as a binary field takes it: its UTF-8 bytes in base64."""
    return base64.b64encode(title.encode("utf-8")).decode("ascii")


def info_from_source(src: Mapping[str, Any]) -> DocInfo:
    """A chunk's DocInfo from its `_source` fetched with INFO_FIELDS only."""
    return DocInfo(src.get("work_id") or src["id"], src.get("source"), src.get("page"),
                   tuple(sorted(set(src.get("authors") or ()))), src.get("venue"), src.get("kind"),
                   src.get("title") or "", tuple(sorted(set(src.get("subjects") or ()))), src.get("year"))


def binary_docvalue(fields: Mapping[str, list[Any]], field: str) -> bytes:
    """The bytes of a binary field's doc value in a hit's `fields` (served in base64 without its
    padding)."""
    b64: str = fields[field][0]
    return base64.b64decode(b64 + "=" * (-len(b64) % 4))


def info_from_docvalues(fields: Mapping[str, list[Any]]) -> DocInfo | None:
    """A chunk's DocInfo from a hit's INFO_DOCVALUES or INFO_DOCVALUES_RAW (keyword doc values come
    sorted and unique); None without the title's doc value."""
    if "title_bin" in fields:
        title = binary_docvalue(fields, "title_bin").decode("utf-8")
    elif "title.raw" in fields:
        title = fields["title.raw"][0]
    else:
        return None
    one = {k: v[0] for k, v in fields.items() if v}
    return DocInfo(one.get("work_id") or one["id"], one.get("source"), one.get("page"),
                   tuple(fields.get("authors", ())), one.get("venue"), one.get("kind"), title,
                   tuple(fields.get("subjects", ())), one.get("year"))


# -- citation graph ---------------------------------------------------------------------------
# The graph lives in an index of its own beside the chunk versions, `graph+<index>` ('+' is never
# in a logical index's name, so it names no logical index, version or alias, and no chunk
# template's pattern takes it): one document per work, its `id` (as a chunk's) the work id, holding the work's lists
# as keywords (for filters and Dashboards) and all of it again in `lists`, JSON as a binary doc
# value that the query path reads, with `digest`, which a build compares to write only the works
# whose graph changed. A build never rewrites a chunk.
#
# Before that layout each chunk held its work's graph in `graph` (GRAPH_DOCVALUES); an index
# built so is read from its chunks until its next build, and a chunk written before
# `graph.lists` existed from `_source`.
GRAPH_DOCVALUES = ("graph.lists", "graph.authority")
# the chunks read from `_source`, for `indices status`
GRAPH_BEFORE_LISTS = {"bool": {"filter": [{"exists": {"field": "graph.authority"}}],
                               "must_not": [{"exists": {"field": "graph.lists"}}]}}


def graph_index(index: str) -> str:
    """The graph index of logical index `index`."""
    return f"graph+{index}"


def graph_index_body(index: str, replicas: int) -> dict[str, Any]:
    """Settings and mappings of `graph_index(index)`: the chunk template's `graph` fields, `id`
    (the work id: read and scanned by id as chunks are) and the digest; one shard (a work's
    document is small) with `replicas` copies."""
    chunks = template("hybridsearch-chunks")["template"]
    props = {"id": chunks["mappings"]["properties"]["id"], **chunks["mappings"]["properties"]["graph"]["properties"],
             "digest": {"type": "keyword", "index": False}}
    return {"settings": {"index": {"number_of_shards": 1, "number_of_replicas": replicas}},
            "mappings": {"dynamic": "strict", "_meta": {"hybridsearch": {"graph_of": index}}, "properties": props}}


def graph_doc(work: str, nb: Neighbors) -> dict[str, Any]:
    """A work's document in the graph index (a work the build did not see has no PageRank or
    authority: null, as in Neighbors())."""
    g = {"cites": list(nb.cites), "cited_by": list(nb.cited_by), "cocited": list(nb.cocited),
         "pagerank": nb.pagerank, "authority": nb.authority}
    raw = json.dumps(g, separators=(",", ":")).encode("utf-8")
    return {"id": work, **g, "lists": base64.b64encode(raw).decode("ascii"),
            "digest": hashlib.sha256(raw).hexdigest()[:32]}


def neighbors_of(graph: Mapping[str, Any] | None) -> Neighbors:
    """Neighbors from a graph document, or a chunk's `graph` (empty without one)."""
    if not graph:
        return Neighbors()
    return Neighbors(tuple(graph.get("cites", [])), tuple(graph.get("cited_by", [])),
                     tuple(graph.get("cocited", [])), graph.get("pagerank"), graph.get("authority"))


def neighbors_from_docvalues(fields: Mapping[str, list[Any]], prefix: str = "graph.") -> Neighbors | None:
    """Neighbors from a hit's doc values: a graph document's `lists` (prefix ""), or a chunk's
    GRAPH_DOCVALUES; None for a chunk whose graph predates `graph.lists`."""
    if f"{prefix}lists" in fields:
        return neighbors_of(json.loads(binary_docvalue(fields, f"{prefix}lists")))
    return None if f"{prefix}authority" in fields else Neighbors()


# -- filters ----------------------------------------------------------------------------------
def filter_clauses(filters: Filters | None) -> list[dict[str, Any]]:
    """Filter clauses for every channel: date range on year*100+month (a bound without a month
    covers the whole year), subjects, kind and license compared trimmed and case-insensitively,
    sources exactly. Clauses are AND-ed; values within one are OR-ed."""
    if filters is None or filters.is_empty():
        return []
    out: list[dict[str, Any]] = []
    if filters.date_range is not None:
        lo, hi = filters.date_range.bounds()
        rng = {k: v for k, v in (("gte", lo), ("lte", hi)) if v is not None}
        if rng:
            out.append({"range": {"ym": rng}})
    for field, values in (("keys.subjects", filters.subjects), ("keys.kind", filters.kind),
                          ("keys.license", filters.license)):
        if values:
            out.append({"terms": {field: sorted({norm_key(v) for v in values})}})
    if filters.sources:
        out.append({"terms": {"source": list(dict.fromkeys(filters.sources))}})
    return out


def _with_filters(query: dict[str, Any], filters: Filters | None) -> dict[str, Any]:
    clauses = filter_clauses(filters)
    return {"bool": {"must": [query], "filter": clauses}} if clauses else query


def _knn_filter(filters: Filters | None) -> dict[str, Any] | None:
    clauses = filter_clauses(filters)
    return {"bool": {"filter": clauses}} if clauses else None


# -- channels ---------------------------------------------------------------------------------
# index.max_result_window (10,000 by default), also the most a knn query may ask for: a request
# for more fails, so every query below asks for at most this many hits
MAX_HITS = 10_000


def bm25_query(terms: Mapping[str, float], fields: Mapping[str, float], k: int, filters: Filters | None,
               mode: Bm25Mode, tie_breaker: float) -> dict[str, Any]:
    """Field-boosted BM25 over the pre-analysed token fields: per field, a bool of term queries
    boosted field weight x term weight; `most_fields` sums all of them, `best_fields` is a
    dis_max of the per-field sums with `tie_breaker`. The same query the embedded engine runs."""
    per_field = [[{"term": {f"bm25.{f}": {"value": t, "boost": fw * w}}} for t, w in terms.items()]
                 for f, fw in fields.items() if fw > 0 and f in SCORED_FIELDS]
    if mode == "best_fields":
        query: dict[str, Any] = {"dis_max": {"queries": [{"bool": {"should": c}} for c in per_field],
                                             "tie_breaker": tie_breaker}}
    else:
        query = {"bool": {"should": [c for clauses in per_field for c in clauses]}}
    return {"size": min(k, MAX_HITS), **HITS_BY_ID, "query": _with_filters(query, filters)}


def knn_query(field: str, vector: Sequence[float] | Sequence[int], k: int, filters: Filters | None,
              ef_search: int, *, oversample: float | None = None) -> dict[str, Any]:
    """Approximate kNN on `field` with efficient filtering (the filter inside the knn clause, so
    k hits come back whenever k documents pass it). The HNSW search examines max(k, ef_search)
    vectors on both engines: Lucene otherwise examines only k (a greedy walk at k=1). `oversample`
    (a compressed field): that many times k candidates, rescored with the float32 vectors."""
    k = min(k, MAX_HITS)
    clause: dict[str, Any] = {"vector": list(vector), "k": k, "method_parameters": {"ef_search": max(k, ef_search)}}
    if oversample is not None:
        clause["rescore"] = {"oversample_factor": oversample}
    flt = _knn_filter(filters)
    if flt is not None:
        clause["filter"] = flt
    return {"size": k, **HITS_BY_ID, "query": {"knn": {field: clause}}}


def exact_score_query(field: str, space_type: str, query_value: Sequence[float] | Sequence[int],
                      ids: Sequence[str]) -> dict[str, Any]:
    """Exact scores of chosen chunks by the k-NN scoring script (`knn_score`); chunks without a
    value in `field` are left out."""
    return {"size": len(ids), **HITS_BY_ID, "query": {"script_score": {
        "query": {"bool": {"filter": [{"ids": {"values": list(ids)}}, {"exists": {"field": field}}]}},
        "script": {"lang": "knn", "source": "knn_score",
                   "params": {"field": field, "query_value": list(query_value), "space_type": space_type}}}}}


# hybridsearch.engines.sample_keys in painless, as 2**24 - key so that the smallest keys score highest
# (Java's int arithmetic wraps as the Python version's masks do; the fmix32 constants as signed ints)
SAMPLE_KEY_SCRIPT = ("int h = doc['id'].value.hashCode(); h ^= h >>> 16; h *= -2048144789; h ^= h >>> 13; "
                     "h *= -1028477387; h ^= h >>> 16; return 16777216 - (h & 16777215);")


def sample_query(field: str, n: int, filters: Filters | None = None) -> dict[str, Any]:
    """Up to n chunks that have `field` and pass the filters: those with the smallest (sample key,
    id), in that order (VectorSampling), with only that field's source."""
    return {"size": min(n, MAX_HITS), "_source": [field], "sort": [{"_score": "desc"}, {"id": "asc"}],
            "query": {"script_score": {
                "query": {"bool": {"filter": [{"exists": {"field": field}}, *filter_clauses(filters)]}},
                "script": {"source": SAMPLE_KEY_SCRIPT}}}}


def doc_freq_query(terms: Sequence[str], fields: Sequence[str]) -> dict[str, Any]:
    """Per (field, term) document counts in one request (filters aggregation), and the total."""
    buckets = {f"{f}\t{t}": {"term": {f"bm25.{f}": t}} for f in fields for t in terms}
    body: dict[str, Any] = {"size": 0, "track_total_hits": True, "query": {"match_all": {}}}
    if buckets:
        body["aggs"] = {"df": {"filters": {"filters": buckets}}}
    return body


def length_sum_query(fields: Sequence[str]) -> dict[str, Any]:
    """Total token count per scored field and the document count (for average lengths over all
    documents, as the embedded engine computes them)."""
    return {"size": 0, "track_total_hits": True, "query": {"match_all": {}},
            "aggs": {f: {"sum": {"field": f"bm25_len.{f}"}} for f in fields}}


def hybrid_query(terms: Mapping[str, float], fields: Mapping[str, float], vector: Sequence[float], k: int,
                 filters: Filters | None, mode: Bm25Mode, tie_breaker: float, ef_search: int) -> dict[str, Any]:
    """OpenSearch's own hybrid query (neural-search) over our BM25 and dense sub-queries, for
    comparison with our fusion: fused by a search pipeline, to depth k per sub-query."""
    lexical = bm25_query(terms, fields, k, filters, mode, tie_breaker)["query"]
    dense = knn_query("dense", vector, k, filters, ef_search)["query"]
    return {"size": k, **HITS_BY_ID, "query": {"hybrid": {"pagination_depth": k, "queries": [lexical, dense]}}}


# -- what an index's mappings say ------------------------------------------------------------
def hybridsearch_meta(mappings: Mapping[str, Any]) -> dict[str, Any]:
    """The hybridsearch part of an index's `_meta` ({} for an index hybridsearch did not make);
    its `index` names the logical index a version belongs to."""
    meta = (mappings.get("_meta") or {}).get("hybridsearch")
    return meta if isinstance(meta, dict) else {}


def meta_value(meta: Mapping[str, Any], key: str) -> Any:
    """The value of `key` in a version's hybridsearch `_meta` (None when absent): the one `set_meta`
    wrote (under `meta`), else the version's own record made with it (its `lexicon` and `analysis`
    rules; an ingest that rewrote every chunk records newer rules with `set_meta`)."""
    stored = (meta.get("meta") or {}).get(key)
    return stored if stored is not None else meta.get(key)


def dense_method(mappings: Mapping[str, Any]) -> tuple[str | None, str | None, str]:
    """The k-NN engine, space type and compression an index's `dense` field was made with, as its
    mappings name them (None where they do not; compression 1x)."""
    dense = mappings.get("properties", {}).get("dense", {})
    return dense.get("method", {}).get("engine"), dense.get("space_type"), str(dense.get("compression_level", "1x"))


def cosine_from_score(score: float, space_type: str) -> float:
    """Raw cosine from a k-NN `_score`: cosinesimil scores (1 + cos) / 2; innerproduct scores
    1 + ip for ip >= 0 and 1 / (1 - ip) below (the vectors are normalised, so ip is the cosine)."""
    if space_type == "cosinesimil":
        return 2.0 * score - 1.0
    if space_type == "innerproduct":
        return score - 1.0 if score >= 1.0 else 1.0 - 1.0 / score
    raise ValueError(f"no cosine for space type {space_type!r}")


def hamming_similarity(score: float) -> float:
    """1 - d/4096 from a Hamming `_score` 1 / (1 + d) (exact: d is an integer up to 4096)."""
    distance = round(1.0 / score - 1.0) if score > 0 else HDC_DIM
    return 1.0 - distance / HDC_DIM

