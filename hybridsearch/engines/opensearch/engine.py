"""OpenSearchEngine: the engine contract on an OpenSearch cluster (2.19+, k-NN plugin).

A logical index `<name>` is a versioned index `<name>-v<N>` behind a read alias `<name>` and a
write alias `<name>-write`. Documents are written with our own analysis (pre-analysed tokens),
so BM25 sees exactly the tokens and field lengths the embedded engine sees. Scores leave with the
contract's meanings: raw BM25, raw cosine, Hamming similarity.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import opensearchpy
import orjson
from opensearchpy import helpers

from hybridsearch.analysis import ANALYSIS_RULES, Analyzer, default_analyzer
from hybridsearch.config import Settings, get_settings
from hybridsearch.embeddings import DIM
from hybridsearch.engines import (
    Bm25Options,
    Codes,
    EngineStats,
    GraphSummary,
    Neighbors,
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
    names_its_work,
    stale_analysis,
)
from hybridsearch.engines.embedded.store import HDC_FIELDS, hash_text
from hybridsearch.engines.opensearch import queries as Q
from hybridsearch.engines.opensearch.node import process_exists
from hybridsearch.errors import (
    BulkWriteError,
    ConfigError,
    EngineError,
    EngineUnavailableError,
    IndexNotFoundError,
    QueryError,
)
from hybridsearch.hdc import HdcEncoder, index_options
from hybridsearch.models import (
    BM25_FIELD_WEIGHTS,
    JOINED_FIELDS,
    MAX_ID_BYTES,
    DocInfo,
    Document,
    Filters,
    RankedList,
    check_unique_ids,
)
from hybridsearch.scoring import bm25_idf, document_joined, merge_term_weights, rescore_bm25, unzip

_log = logging.getLogger("hybridsearch.opensearch")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,200}$")
_PAGE = 1000
_WRITE_TRIES = 5  # a chunk changed by another writer between write's read and its write is tried again
_SET_IF_HASH = ("if (ctx._source.dense_hash == params.h) { ctx._source.dense = params.v; "
                "if (params.p != null) { ctx._source.passages = params.p } } else { ctx.op = 'noop' }")
# a chunk with its vector and its passage vectors: what an embedding pass has done (a version
# made before `passages` existed, not yet written to, has no such chunk)
_EMBEDDED = {"bool": {"filter": [{"exists": {"field": "dense"}}, {"nested": {
    "path": "passages", "query": {"match_all": {}}, "ignore_unmapped": True}}]}}


class _Serializer(opensearchpy.JSONSerializer):
    """orjson, which writes numpy vectors and codes without going through Python lists (a bulk
    body is mostly numbers: this makes encoding it about ten times faster)."""

    def dumps(self, data: Any) -> str:
        if isinstance(data, str):
            return data
        return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode()

    def loads(self, s: str | bytes) -> Any:
        return orjson.loads(s)


def split_urls(url: str) -> list[str]:
    """The URLs of `url`: one node's, or several nodes' of one cluster separated by commas (a comma
    starts another URL only where a scheme follows it, so credentials may hold commas)."""
    return [u.strip() for u in re.split(r",(?=\s*https?://)", url) if u.strip()]


def display_url(url: str) -> str:
    """The URL (or URLs) without credentials, for messages and for anything sent elsewhere."""
    urls = split_urls(url)
    if len(urls) > 1:
        return ",".join(display_url(u) for u in urls)
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL (an unclosed [IPv6 address): still never show a password
        return re.sub(r"(//)[^/]*@", r"\1", url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def check_urls(url: str) -> list[str]:
    """The URLs of an OpenSearch URL list (`split_urls`), each checked, all of one scheme."""
    urls = split_urls(url)
    if not urls:
        raise ConfigError(f"url: {url!r} is not an OpenSearch URL (expected http(s)://host[:port], or several "
                          "separated by commas)")
    for u in urls:
        check_url(u)
    if len({urlsplit(u).scheme for u in urls}) > 1:
        raise ConfigError(f"url: {display_url(url)!r} mixes http and https; the nodes of one cluster take one")
    return urls


def check_url(url: str, what: str = "an OpenSearch URL") -> None:
    """An http(s) URL with a host and, if any, a numeric port (one clear error otherwise, saying the
    URL is not `what`)."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # a bad port, or an unclosed [IPv6 address
        parts, port_ok = urlsplit(""), False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ConfigError(f"url: {display_url(url)!r} is not {what} (expected http(s)://host[:port])")


# Cluster-wide locks: one document each (a running reindex, a metadata update) in a hidden index.
LOCK_INDEX = "hybridsearch-locks"
LOCK_TTL = 60.0  # seconds without a sign of life after which a holder is taken for killed
LOCK_BEAT = 5.0  # seconds between a holder's signs of life


class LockLost(EngineError):
    """Another run took over a lock this one held (it was silent for LOCK_TTL seconds)."""


def _machine() -> str | None:
    """This machine as a lock records it, so that a holder's pid is checked only where it means the
    same process: the kernel's boot id (one per host and boot; hosts cloned from one image, or
    named alike, differ) and the PID namespace (containers on one host have their own process
    ids). None where they cannot be read: a lock is then taken over only once silent."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


@contextmanager
def cluster_lock(client: opensearchpy.OpenSearch, errors: Callable[[str], AbstractContextManager[None]], key: str,
                 what: str, wait: float = 0.0) -> Iterator[Callable[[bool], None]]:
    """Hold the cluster-wide lock `key` (a document in LOCK_INDEX, created only if absent) for
    the block, which gets a `beat(force)` to call while it works: it refreshes the lock at most
    every LOCK_BEAT seconds (always when forced) and raises LockLost if another run took it.
    A lock held by another run is waited for up to `wait` seconds, then refused with an error
    naming its holder; one left by a killed run is taken over once it has been silent for
    LOCK_TTL seconds, or at once when it was held by a process of this machine that is gone."""
    owner = {"owner": f"{socket.gethostname()} pid {os.getpid()}", "machine": _machine(), "pid": os.getpid(),
             "started": datetime.now(UTC).isoformat(timespec="seconds")}
    exc = opensearchpy.exceptions
    deadline = time.monotonic() + wait
    with errors("lock"):
        if not client.indices.exists(index=LOCK_INDEX):
            client.indices.create(index=LOCK_INDEX, ignore=400, params={"wait_for_active_shards": "1"},
                                  body={"settings": {"index": {"number_of_shards": 1, "hidden": True,
                                                               "auto_expand_replicas": "0-1"}}})
        tries = 0
        while True:  # the holder may let go between our create and our read
            tries += 1
            try:
                got = client.index(index=LOCK_INDEX, id=key, body={**owner, "beat": time.time()}, op_type="create")
                break
            except exc.ConflictError:
                held = client.get(index=LOCK_INDEX, id=key, ignore=404)
            if not held.get("found"):
                if tries < 3 or time.monotonic() < deadline:
                    continue
                raise EngineError(f"could not take the lock for {what}; try again")
            h = held["_source"]
            silent = time.time() - float(h.get("beat", 0))
            busy = EngineError(f"{what} is already running ({h.get('owner')}, started {h.get('started')}, last "
                               f"seen {silent:.0f} s ago); if that run was killed, its lock is taken over "
                               f"{LOCK_TTL:.0f} s after it was last seen")
            gone = (owner["machine"] is not None and h.get("machine") == owner["machine"]
                    and isinstance(h.get("pid"), int) and not process_exists(h["pid"]))
            if silent < LOCK_TTL and not gone:
                if time.monotonic() < deadline:
                    time.sleep(random.uniform(0.02, 0.1))
                    continue
                raise busy
            try:
                _log.warning("taking over the lock %s from %s, %s", key, h.get("owner"),
                             "whose process is gone" if gone else f"silent for {silent:.0f} s")
                got = client.index(index=LOCK_INDEX, id=key, body={**owner, "beat": time.time()},
                                   if_seq_no=held["_seq_no"], if_primary_term=held["_primary_term"])
                break
            except exc.ConflictError:  # another run took it over first
                if time.monotonic() < deadline:
                    continue
                raise busy from None
    mine = {"if_seq_no": got["_seq_no"], "if_primary_term": got["_primary_term"]}
    last = time.monotonic()

    def beat(force: bool = False) -> None:
        nonlocal last
        if not force and time.monotonic() - last < LOCK_BEAT:
            return
        with errors("lock"):
            try:
                got = client.index(index=LOCK_INDEX, id=key, body={**owner, "beat": time.time()}, **mine)
            except (exc.ConflictError, exc.NotFoundError) as e:
                raise LockLost(f"another run took over the lock for {what} after this one was silent for "
                               f"{LOCK_TTL:.0f} s; this one stops and leaves the index to it") from e
        mine.update(if_seq_no=got["_seq_no"], if_primary_term=got["_primary_term"])
        last = time.monotonic()

    try:
        yield beat
    finally:
        try:
            client.delete(index=LOCK_INDEX, id=key, **mine)
        except exc.ConflictError:
            pass  # taken over: not ours to delete
        except Exception as e:  # the run's own outcome matters more; the lock expires anyway
            _log.warning("could not release the lock %s (it expires %.0f s after its last beat): %s", key,
                         LOCK_TTL, error_reason(e))


def check_index_name(name: str, field: str = "index") -> str:
    """A logical index name: lower case, not a version name, not an alias, query-log or lock name
    (`field` names the option or parameter in the error)."""
    prefix = get_settings().query_log_prefix
    log = Q.query_log_name(prefix)
    if (not _NAME.match(name) or re.search(r"-v\d+$", name) or name.endswith("-write")
            or name.startswith(prefix) or name in (log, LOCK_INDEX)):
        raise ConfigError(f"{field}: {name!r} is not a valid logical index name (lower-case letters, digits, '-', "
                          f"'_', '.'; not ending in -v<N> or -write; not {log}, {prefix}* or {LOCK_INDEX})")
    return name


def check_new_index_name(name: str) -> None:
    """A logical index about to be made: its index template (`hybridsearch-<name>`) must not be the
    query log's. (One made before this rule keeps working: it is refused only at creation.)"""
    log = Q.query_log_name(get_settings().query_log_prefix)
    if f"hybridsearch-{name}" == log:
        raise ConfigError(f"index: {name!r} would have the index template {log}, which is the query log's "
                          "(HYBRIDSEARCH_QUERY_LOG_PREFIX); choose another name")


# error types that say a request met a node that left the cluster, or shards not yet moved off it:
# the same request sent again a little later, to the nodes that remain, goes through
NODE_LOST = frozenset({"node_not_connected_exception", "node_disconnected_exception", "node_closed_exception",
                       "connect_transport_exception", "send_request_transport_exception",
                       "no_shard_available_action_exception", "unavailable_shards_exception",
                       "cluster_manager_not_discovered_exception", "master_not_discovered_exception"})


def node_lost(status: object, error: object) -> bool:
    """Whether a request that failed with `status` and `error` (the body's `error` object) met a
    lost node (NODE_LOST anywhere in its causes and shard failures, or 502/503/504)."""
    if status in (502, 503, 504):
        return True
    todo = [error]
    while todo:
        e = todo.pop()
        if isinstance(e, dict):
            if e.get("type") in NODE_LOST:
                return True
            todo += [e.get("caused_by"), *(e.get("root_cause") or []),
                     *(f.get("reason") for f in e.get("failed_shards") or [] if isinstance(f, dict))]
    return False


def _pauses(seconds: float) -> Iterator[None]:
    """Pauses with backoff (0.1 s, doubling up to 2 s) until `seconds` from now have gone, the last
    ending then: a loop over them tries again after each (what met a lost node)."""
    deadline, delay = time.monotonic() + seconds, 0.1
    while (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(delay, remaining))
        delay = min(2 * delay, 2.0)
        yield


# reads sent as POST, which a retry cannot apply twice (a bulk write is retried item by item by the
# engine, whose items carry ids; the query log's carry none)
_REPEATABLE_POSTS = ("/_search", "/_msearch", "/_count", "/_mget", "/_refresh")


def _repeatable(method: str, url: str) -> bool:
    return method in ("GET", "HEAD") or method == "POST" and url.partition("?")[0].endswith(_REPEATABLE_POSTS)


class _Transport(opensearchpy.Transport):
    """opensearch-py's transport, which tries a request that meets a dead node on the next node at
    once (a refused or reset connection; 502, 503 or 504), and here also keeps trying a read (a GET,
    HEAD or search: `_repeatable`) that met a lost node (those, or `node_lost` errors: a search
    whose fetch phase met it), with backoff, for up to `retry_s` seconds in all: a cluster that
    lost a node promotes replicas and may elect another cluster manager meanwhile. A timeout is not
    retried (a slow request is not a lost node), nor a write (a lock taken, a task started, a
    snapshot begun would be done twice). `make_client` gives `retry_s` only to a client that knows
    several nodes: one node that does not answer fails at once, as it always has."""

    def __init__(self, hosts: Any, *, retry_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(hosts, **kwargs)
        self.retry_s = retry_s

    def perform_request(self, method: str, url: str, params: Any = None, body: Any = None, timeout: Any = None,
                        ignore: Any = (), headers: Any = None) -> Any:
        exc = opensearchpy.exceptions
        last: Exception | None = None
        for _ in itertools.chain([None], _pauses(self.retry_s if _repeatable(method, url) else 0.0)):
            try:  # opensearch-py takes `ignore` and `request_timeout` out of the params it is given
                return super().perform_request(method, url, params=dict(params) if params else params, body=body,
                                               timeout=timeout, ignore=ignore,
                                               headers=dict(headers) if headers else headers)
            except exc.ConnectionTimeout:
                raise
            except exc.TransportError as e:
                info = e.info if isinstance(e.info, dict) else {}
                if not (isinstance(e, exc.ConnectionError) or node_lost(e.status_code, info.get("error"))):
                    raise
                last = e
        assert last is not None
        raise last


def retry_window(url: str, settings: Settings) -> float:
    """Seconds a read, a sub-search or a bulk item that met a lost node is tried again: the
    setting's for a client that knows several nodes, none for one node."""
    return settings.opensearch_retry_s if len(split_urls(url)) > 1 else 0.0


def make_client(url: str, settings: Settings) -> opensearchpy.OpenSearch:
    """A client for `url` (one node, or several of a cluster: `split_urls`) with the credentials,
    TLS, timeout and retries of `settings` (credentials in the URL are used when the settings name
    none)."""
    urls = check_urls(url)
    s = settings
    parts = urlsplit(urls[0])
    auth = None
    if s.opensearch_username is not None:
        auth = (s.opensearch_username, s.opensearch_password.get_secret_value() if s.opensearch_password else "")
    else:
        named = next((urlsplit(u) for u in urls if urlsplit(u).username), None)
        if named is not None:
            auth = (named.username or "", named.password or "")
    return opensearchpy.OpenSearch(
        hosts=[display_url(u) for u in urls], http_auth=auth, use_ssl=parts.scheme == "https",
        verify_certs=s.opensearch_verify_certs,
        ca_certs=str(s.opensearch_ca_certs) if s.opensearch_ca_certs else None,
        ssl_show_warn=False, timeout=s.opensearch_timeout, max_retries=max(2, len(urls)), retry_on_timeout=False,
        http_compress=False, pool_maxsize=8, serializer=_Serializer(), transport_class=_Transport,
        retry_s=retry_window(url, s))


@contextmanager
def translate_errors(url: str, what: str, index: str | None = None) -> Iterator[None]:
    """Translate opensearch-py's exceptions into ours at the engine boundary."""
    exc = opensearchpy.exceptions
    try:
        yield
    except exc.ConnectionError as e:
        raise EngineUnavailableError(f"cannot reach OpenSearch at {url} ({what}): {error_reason(e)}") from e
    except exc.NotFoundError as e:
        if index is not None and getattr(e, "error", "") == "index_not_found_exception":
            raise IndexNotFoundError(f"no index {index!r} at {url}; ingest into it first") from e
        raise EngineError(f"OpenSearch {what} failed: {error_reason(e)}") from e
    except (exc.AuthenticationException, exc.AuthorizationException) as e:
        raise EngineUnavailableError(f"OpenSearch at {url} refused the credentials ({what}): {error_reason(e)}") from e
    except exc.TransportError as e:
        if e.status_code in (502, 503, 504):
            raise EngineUnavailableError(f"OpenSearch at {url} is unavailable ({what}): {error_reason(e)}") from e
        raise EngineError(f"OpenSearch {what} failed: {error_reason(e)}") from e


class OpenSearchEngine:
    """The `opensearch` engine plugin. The constructor makes no network call; the index and its
    templates are created on the first write."""

    capabilities = frozenset({"lexical", "vector", "binary", "graph"})

    def __init__(self, url: str | None = None, *, index: str | None = None, settings: Settings | None = None,
                 analyzer: Analyzer | None = None) -> None:
        s = settings or get_settings()
        url = url or s.opensearch_url
        if not url:
            raise ConfigError("no OpenSearch URL: pass one or set HYBRIDSEARCH_OPENSEARCH_URL")
        check_urls(url)
        self.url = display_url(url)
        self.raw_url = url  # with any credentials it carries: for further clients, never for messages
        self.retry_s = retry_window(url, s)  # what met a lost node is tried again this long
        self.index = check_index_name(index or s.opensearch_index)
        self.write_alias = f"{self.index}-write"
        # the k-NN engine of new indices; an existing version keeps its own, read with its mapping
        self.knn_engine: Q.KnnEngine = s.opensearch_knn_engine
        # (version, k-NN engine, space type, compression) of the dense field last read
        self._dense: tuple[str, str, str, str] | None = None
        self.settings = s
        self.analyzer = analyzer or default_analyzer()
        self._analysis_checked = False
        self._joined: set[str] = set()  # joined BM25 fields every chunk is known to hold
        self.dim = DIM
        self.client = make_client(url, s)
        self._ready = False
        self.graph_index = Q.graph_index(self.index)
        self._graph_ready = False  # whether the graph index is known to exist
        self._lock = threading.Lock()
        self._hdc_encoder: HdcEncoder | None = None

    # -- errors and setup -----------------------------------------------------------------------
    def _errors(self, what: str) -> AbstractContextManager[None]:
        return translate_errors(self.url, what, self.index)

    def ensure_index(self) -> None:
        """Create the templates, the first version `<index>-v1` and both aliases, unless the read
        alias exists already."""
        if self._ready:
            return
        with self._lock, self._errors("create index"):
            if self.client.indices.exists_alias(name=self.index):
                _, meta = self._ours("write")  # never write into an index hybridsearch did not make
                self._check_analysis(meta)
                # an index made before these fields existed gets them here (its mapping is strict)
                props = Q.template("hybridsearch-chunks")["template"]["mappings"]["properties"]
                with self._errors("write mapping"):
                    self.client.indices.put_mapping(index=self.write_alias, body={"properties": {
                        f: props[f] for f in Q.ADDED_FIELDS}})
                self._ready = True
                return
            if self.client.indices.exists(index=self.index):
                raise ConfigError(f"index: {self.index!r} at {self.url} is a concrete index, not a hybridsearch "
                                  "alias; choose another --index")
            from hybridsearch.engines.opensearch.admin import apply_chunk_templates

            check_new_index_name(self.index)
            apply_chunk_templates(self.client, self.index, self.knn_engine, self.settings.opensearch_vector_compression)
            first, made = f"{self.index}-v1", False
            if not self.client.indices.exists(index=first):
                meta = {"hybridsearch": {"index": self.index, "version": 1, "hdc": index_options(None),
                                         "lexicon": self.analyzer.lexicon.fingerprint, "analysis": ANALYSIS_RULES}}
                try:
                    # shards and replicas where the settings name them; else the templates decide
                    sharding = {k: v for k, v in (("number_of_shards", self.settings.opensearch_shards),
                                                  ("number_of_replicas", self.settings.opensearch_replicas))
                                if v is not None}
                    self.client.indices.create(index=first, body={"settings": {"index": sharding},
                                                                  "mappings": {"_meta": meta}},
                                               params={"wait_for_active_shards": "1"})
                    made = True
                except opensearchpy.exceptions.RequestError as e:
                    if e.error != "resource_already_exists_exception":  # another process was first
                        raise
            if not made and Q.hybridsearch_meta(self.client.indices.get_mapping(index=first)[first]["mappings"]
                                                ).get("index") != self.index:
                raise ConfigError(f"index: {first} at {self.url} exists and was not made by hybridsearch for "
                                  f"{self.index!r}; choose another --index, or remove {first}")
            # the aliases name a version whose primary is started: a process that finds them searches at once
            self.client.cluster.health(index=first, wait_for_status="yellow")
            self.client.indices.update_aliases(body={"actions": [
                {"add": {"index": first, "alias": self.index}},
                {"add": {"index": first, "alias": self.write_alias, "is_write_index": True}}]})
            self._ready = True

    def _check_analysis(self, meta: Mapping[str, Any] | None = None) -> None:
        """Once per engine: the index (its hybridsearch `_meta`, read unless given) was analysed
        with this process's variant lexicon; a warning when it was analysed with other rules."""
        if not self._analysis_checked:
            meta = self._index_meta() if meta is None else meta
            where = f"index {self.index!r} at {self.url}"
            check_lexicon(meta.get("lexicon"), self.analyzer, where)
            stale = stale_analysis(Q.meta_value(meta, "analysis"), "tokens and HDC codes", where)
            if stale and self.count():
                _log.warning("%s", stale)
            self._analysis_checked = True

    def drop(self) -> list[str]:
        """Delete every version of this logical index (and so its aliases), its graph index and its
        index template; returns the indices deleted."""
        with self._lock, self._errors("drop index"):
            found = self.client.indices.get(index=f"{self.index}-v*", params={"expand_wildcards": "all"})
            pattern = re.compile(rf"^{re.escape(self.index)}-v\d+$")
            # only the versions made for this index: never another's that happens to match the name
            versions = sorted(v for v, body in found.items()
                              if pattern.match(v) and Q.hybridsearch_meta(body.get("mappings", {})).get("index")
                              == self.index)
            if versions:
                self.client.indices.delete(index=",".join(versions))
            if self.client.indices.exists(index=self.graph_index):
                self.client.indices.delete(index=self.graph_index, ignore=404)
                versions.append(self.graph_index)
            if self.client.indices.exists_index_template(name=f"hybridsearch-{self.index}"):
                self.client.indices.delete_index_template(name=f"hybridsearch-{self.index}")
            self._ready = self._graph_ready = False
            self._hdc_encoder = None
        return versions

    def _search(self, body: dict[str, Any], what: str, *, index: str | None = None, **params: Any) -> dict[str, Any]:
        """A search of the read alias, or of the concrete `index` named (the graph index). A shard
        that fails fails the search (never partial results: the transport tries it again where a
        node was lost)."""
        with self._errors(what):
            result: dict[str, Any] = self.client.search(index=index or self.index, body=body,
                                                        allow_partial_search_results="false", **params)
        return result

    def _msearch(self, bodies: Sequence[dict[str, Any]], what: str) -> list[list[dict[str, Any]]]:
        """Several searches in one `_msearch` round trip: each search's hits, in order. A search
        that fails raises as `_search` would; one that met a lost node is sent again, as the
        transport would (`node_lost`)."""
        if not bodies:
            return []
        header = {"allow_partial_search_results": False}
        with self._errors(what):
            for _ in itertools.chain([None], _pauses(self.retry_s)):
                got = self.client.msearch(index=self.index, body=[line for b in bodies for line in (header, b)])
                failed = [r for r in got["responses"] if "error" in r]
                if not failed or not all(node_lost(r.get("status"), r["error"]) for r in failed):
                    break
            for r in failed:
                status, err = int(r.get("status", 500)), r["error"]
                kind = err.get("type", "") if isinstance(err, dict) else str(err)
                raise opensearchpy.exceptions.HTTP_EXCEPTIONS.get(status, opensearchpy.TransportError)(status, kind, r)
        return [r["hits"]["hits"] for r in got["responses"]]

    def _live(self, what: str) -> tuple[str, dict[str, Any]]:
        """The version behind the read alias and its hybridsearch `_meta`, in one request; notes the
        k-NN method of its `dense` field (see `_dense_method`)."""
        with self._errors(what):
            got = self.client.indices.get_mapping(index=self.index)
        name = sorted(got)[0]
        if name == self.index:  # a concrete index of that name, not our alias
            raise IndexNotFoundError(f"no index {self.index!r} at {self.url}; ingest into it first")
        mappings = got[name]["mappings"]
        self._note_dense(name, mappings)
        return name, Q.hybridsearch_meta(mappings)

    def _note_dense(self, version: str, mappings: Mapping[str, Any]) -> tuple[str, str, str, str]:
        engine, space_type, compression = Q.dense_method(mappings)
        engine = engine if engine in Q.SPACE_TYPE else self.knn_engine
        self._dense = dense = (version, engine, space_type or Q.SPACE_TYPE[engine], compression)
        return dense

    def _dense_method(self, version: str) -> tuple[str, str, str, str]:
        """(version, k-NN engine, space type, compression) of a version's `dense` field. A version keeps the
        engine it was made with, whatever this process's `opensearch_knn_engine`, and its kNN scores
        read by that engine's formula; a reindex may make the next version with another, so this is
        read again when a kNN's hits come from another version than the one last read."""
        dense = self._dense
        if dense is not None and dense[0] == version:
            return dense
        with self._errors("read mapping"):
            got = self.client.indices.get_mapping(index=version)
        return self._note_dense(version, got[version]["mappings"])

    def _concrete_index(self) -> str:
        return self._ours("read alias")[0]

    def _ours(self, what: str) -> tuple[str, dict[str, Any]]:
        """The live version and its metadata, refusing an index hybridsearch did not make."""
        name, meta = self._live(what)
        if meta.get("index") != self.index:
            raise ConfigError(f"index: {self.index!r} at {self.url} was not made by hybridsearch (its index "
                              f"{name} carries no hybridsearch metadata)")
        return name, meta

    # -- writes ---------------------------------------------------------------------------------
    def write(self, docs: Sequence[Document], vectors: np.ndarray | None = None,
              codes: Sequence[Codes] | None = None, passages: Sequence[np.ndarray] | None = None) -> int:
        """Bulk-index documents; returns how many. Returns when a search can see them (refresh).
        An update without vectors keeps the stored vector and passage vectors while the dense text
        is unchanged (and, where the graph is still held by the chunks, their work's graph until the
        next build). What is kept is read from the stored chunk and written back only if nothing
        changed the chunk in between (a worker's vectors or codes): a chunk changed meanwhile is read
        and written again."""
        docs = list(docs)
        if not docs:
            return 0
        check_unique_ids(docs)
        vecs = check_vectors(vectors, len(docs), self.dim) if vectors is not None else None
        pas = check_passages(passages, len(docs), self.dim, vecs is not None)
        code_sets = check_codes(codes, len(docs)) if codes is not None else None
        self.ensure_index()
        todo = list(range(len(docs)))
        for _ in range(_WRITE_TRIES):
            conflicts: set[str] = set()
            self._bulk(self._write_actions([docs[i] for i in todo], None if vecs is None else vecs[todo],
                                           None if code_sets is None else [code_sets[i] for i in todo],
                                           None if pas is None else [pas[i] for i in todo]),
                       conflicts=conflicts)
            todo = [i for i in todo if docs[i].id in conflicts]
            if not todo:
                return len(docs)
        ids = [docs[i].id for i in todo]
        raise BulkWriteError(f"{len(ids)} of {len(docs)} items failed: {', '.join(ids[:5])}: changed by another "
                             f"writer at each of {_WRITE_TRIES} attempts", dict.fromkeys(ids, "version conflict"))

    def _write_actions(self, docs: list[Document], vecs: np.ndarray | None, code_sets: list[Codes] | None,
                       pas: list[np.ndarray] | None) -> Iterator[dict[str, Any]]:
        """Index actions for `docs`, each conditional on the stored chunk it read (`if_seq_no`), or
        a `create` for a chunk that did not exist. Kept from the stored chunk: without new vectors
        its vector and passage vectors while the dense text is unchanged. Where the graph is still
        held by the chunks (built before the graph index), a chunk keeps its work's graph while it
        stays in that work, and one new to its work takes the graph the work's other chunks have."""
        hashes = [str(hash_text(d.dense_text)) for d in docs]
        on_chunks = not self._graph_exists()
        old = self._mget([d.id for d in docs], ["work_id", *(["graph"] if on_chunks else []),
                                                *(["dense_hash", "dense", "passages"] if vecs is None else [])])
        kept: dict[str, dict[str, Any]] = {}
        for d, h in zip(docs, hashes, strict=True):
            o = old[d.id].get("_source", {}) if d.id in old else {}
            kept[d.id] = {"graph": o["graph"]} if o.get("graph") and o.get("work_id") == d.work_id else {}
            if vecs is None and o.get("dense_hash") == h and o.get("dense") is not None:
                kept[d.id]["dense"] = o["dense"]
                if o.get("passages"):
                    kept[d.id]["passages"] = o["passages"]
        graphless = {d.work_id for d in docs if "graph" not in kept[d.id]} if on_chunks else set()
        graphs = self._work_graphs(graphless) if graphless and Q.meta_value(self._index_meta(), "graph") else {}
        for d in docs:
            if "graph" not in kept[d.id] and d.work_id in graphs:
                kept[d.id]["graph"] = graphs[d.work_id]

        def actions() -> Iterator[dict[str, Any]]:  # built while earlier chunks are being indexed
            for i, (d, h) in enumerate(zip(docs, hashes, strict=True)):
                src = Q.to_source(d, document_joined(self.analyzer, d), h, None if vecs is None else vecs[i],
                                  None if code_sets is None else code_sets[i], None if pas is None else pas[i])
                src.update(kept[d.id])
                o = old.get(d.id)
                cas = ({"_op_type": "index", "if_seq_no": o["_seq_no"], "if_primary_term": o["_primary_term"]}
                       if o is not None else {"_op_type": "create"})
                yield {**cas, "_index": self.write_alias, "_id": d.id, "_source": src}

        return actions()

    def _work_graphs(self, works: set[str]) -> dict[str, dict[str, Any]]:
        """The citation graph of each of these works that the last build saw, from one of its
        chunks (asked only of an index whose chunks hold a graph built)."""
        out: dict[str, dict[str, Any]] = {}
        ordered = sorted(works)
        for i in range(0, len(ordered), _PAGE):
            page = ordered[i:i + _PAGE]
            body = {"size": len(page), "_source": ["graph", "work_id"], "collapse": {"field": "work_id"},
                    "query": {"bool": {"filter": [{"terms": {"work_id": page}},
                                                  {"exists": {"field": "graph.pagerank"}}]}}}
            for h in self._search(body, "read graph")["hits"]["hits"]:
                out[h["_source"]["work_id"]] = h["_source"]["graph"]
        return out

    def set_vectors(self, ids: Sequence[str], vectors: np.ndarray, *, texts: Sequence[str] | None = None,
                    passages: Sequence[np.ndarray] | None = None) -> int:
        vecs = check_vectors(vectors, len(ids), self.dim)
        pas = check_passages(passages, len(ids), self.dim, True)
        parts = [{"dense": v.tolist(), "passages": None if pas is None else Q.passage_source(pas[i])}
                 for i, v in enumerate(vecs)]
        if texts is None:
            return self._update(ids, [{k: x for k, x in p.items() if x is not None} for p in parts])
        # compare and set on the node: the vectors land only if the chunk's dense text still has
        # the hash of the text they were computed from (else the update is a no-op)
        return self._update(ids, [{"script": {"source": _SET_IF_HASH, "lang": "painless",
                                              "params": {"h": str(hash_text(t)), "v": p["dense"], "p": p["passages"]}}}
                                  for t, p in zip(texts, parts, strict=True)])

    def set_codes(self, ids: Sequence[str], codes: Sequence[Codes]) -> int:
        code_sets = check_codes(codes, len(ids))
        return self._update(ids, [{"hdc_encoded": True, **{f"hdc_{f}": Q.packed_to_int8(c[f]) if f in c else None
                                                           for f in HDC_FIELDS}} for c in code_sets])

    def _update(self, ids: Sequence[str], partials: Sequence[dict[str, Any]]) -> int:
        """Partial updates of existing chunks (unknown ids are skipped), each a partial document or
        a `{"script": ...}`; returns how many were sent."""
        if not ids:
            return 0
        self.ensure_index()
        present = set(self._sources(list(ids), ["id"]))
        # workers update different fields of the same chunks at once (vectors, codes, graph): an
        # update that meets a concurrent one is applied again to the newer version
        actions = [{"_op_type": "update", "_index": self.write_alias, "_id": i, "retry_on_conflict": 5,
                    **(p if "script" in p else {"doc": p})} for i, p in zip(ids, partials, strict=True) if i in present]
        return len(self._bulk(actions, missing_ok=True))  # one deleted since is skipped like an unknown id

    def delete(self, ids: Sequence[str]) -> list[str]:
        """Delete by id; returns the ids that existed. An id no chunk can have (empty, or over
        MAX_ID_BYTES) is not sent: OpenSearch would fail its whole bulk request."""
        ids = _possible_ids(ids)
        if not ids:
            return []
        self.ensure_index()
        done = self._bulk([{"_op_type": "delete", "_index": self.write_alias, "_id": i} for i in ids],
                          missing_ok=True)
        return [i for i in ids if i in done]

    def _bulk(self, actions: Iterable[dict[str, Any]], *, missing_ok: bool = False,
              conflicts: set[str] | None = None, index: str | None = None) -> set[str]:
        """Bulk requests in chunks by count and bytes, `opensearch_bulk_threads` at a time (the
        node indexes them in parallel while the next chunk is encoded); items rejected with 429
        are sent again with exponential backoff; other per-item failures raise BulkWriteError
        naming ids and reasons (after the rest was written). With `missing_ok` a chunk that is
        not there (404: deleted meanwhile) is no failure; with `conflicts`, the ids of items
        whose condition failed (409) go there instead. Refreshes, so the writes are searchable
        on return. Returns the ids that succeeded and changed something. The actions go to the
        write alias, or to the concrete `index` named (the graph index)."""
        s = self.settings
        by_id: dict[str, dict[str, Any]] = {}

        def remembered() -> Iterator[dict[str, Any]]:
            for a in actions:
                by_id[str(a["_id"])] = a
                yield a

        ok_ids: set[str] = set()
        failures: dict[str, str] = {}
        rejected: list[dict[str, Any]] = []
        chunking: dict[str, Any] = {"chunk_size": s.opensearch_bulk_docs, "max_chunk_bytes": s.opensearch_bulk_bytes,
                    "raise_on_error": False, "raise_on_exception": False,
                    "request_timeout": max(60.0, s.opensearch_timeout),
                    # never auto-create a stray index when the alias has gone (dropped meanwhile)
                    "params": {"require_alias": "true"} if index is None else {}}

        unreachable: dict[str, str] = {}
        blocked: list[dict[str, Any]] = []
        lost: list[dict[str, Any]] = []  # items whose shard had its primary on a node the cluster lost
        retry_s = self.retry_s

        def record(ok: bool, item: dict[str, Any], *, retry_429: bool) -> None:
            # a request that failed as a whole reports each of its items with the request's status
            # ('N/A' when the node could not be reached) and the exception
            (_, info), = item.items()
            id_ = str(info.get("_id"))
            if ok:
                if info.get("result") != "noop":  # an update that changed nothing is not counted
                    ok_ids.add(id_)
            elif retry_429 and info.get("status") == 429:
                rejected.append(by_id[id_])
            elif _reindex_block(info):
                blocked.append(by_id[id_])  # write-blocked while `indices reindex` copies the index
            elif retry_s and node_lost(info.get("status"), info.get("error")):
                lost.append(by_id[id_])  # sent again once a replica has taken over
            elif isinstance(info.get("exception"), opensearchpy.exceptions.ConnectionError):
                unreachable[id_] = error_reason(info["exception"])
            elif conflicts is not None and info.get("status") == 409:
                conflicts.add(id_)
            elif not (missing_ok and info.get("status") == 404):
                failures[id_] = _item_reason(info)

        def resend(batch: list[dict[str, Any]]) -> None:
            for ok, item in helpers.streaming_bulk(self.client, batch, max_retries=s.opensearch_bulk_retries,
                                                   initial_backoff=1, max_backoff=30, **chunking):
                record(ok, item, retry_429=False)

        with self._errors("bulk write"):
            for ok, item in helpers.parallel_bulk(self.client, remembered(), thread_count=s.opensearch_bulk_threads,
                                                  **chunking):
                record(ok, item, retry_429=True)
            if rejected:
                resend(rejected)
            if blocked:
                _log.warning("index %r is write-blocked (a reindex is copying it); %d writes wait", self.index,
                             len(blocked))
            # an item sent again for one reason may be refused for the other: on until both are
            # empty, each item given each wait at most twice, then reported
            for last in (False, False, True):
                for items, wait, why in (
                        (blocked, s.opensearch_write_block_wait,
                         f"write-blocked for more than {s.opensearch_write_block_wait:.0f} s (a reindex still "
                         f"running, or one that was interrupted: see `hybridsearch indices status {self.index}`)"),
                        (lost, retry_s, f"its shard was on a node the cluster lost, and no copy took over within "
                                        f"{retry_s:.0f} s (opensearch_retry_s)")):
                    for id_ in self._send_again(items, resend, 0.0 if last else wait):
                        failures[id_] = why
                    items.clear()
            if ok_ids and not unreachable:
                self.client.indices.refresh(index=index or self.write_alias)
        if unreachable:
            raise EngineUnavailableError(f"cannot reach OpenSearch at {self.url} (bulk write): "
                                         f"{next(iter(unreachable.values()))}; {len(unreachable)} of {len(by_id)} "
                                         "items were not written")
        if failures:
            shown = "; ".join(f"{i}: {r}" for i, r in list(failures.items())[:5])
            more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
            raise BulkWriteError(f"{len(failures)} of {len(by_id)} items failed: {shown}{more}", failures)
        return ok_ids

    @staticmethod
    def _send_again(items: list[dict[str, Any]], send: Callable[[list[dict[str, Any]]], None],
                    seconds: float) -> list[str]:
        """Send refused items again, with backoff, until they pass or `seconds` have gone; `send`
        puts those refused again back into `items`. For the reindex write block (`indices reindex`
        blocks writes to the live version while it copies it, then moves the write alias to the new
        version, where the items land) and for shards whose primary was on a lost node (a replica
        takes over). Returns the ids still refused."""
        deadline = time.monotonic() + seconds
        delay = 0.25
        while items and time.monotonic() + delay <= deadline:
            time.sleep(delay)
            delay = min(2 * delay, 5.0)
            batch = items[:]
            items.clear()
            send(batch)
        return [str(a["_id"]) for a in items]

    # -- reads ----------------------------------------------------------------------------------
    def _sources(self, ids: Sequence[str], includes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """`_source` of existing chunks by id (mget through the read alias, which has one index)."""
        return {i: d.get("_source", {}) for i, d in self._mget(ids, includes).items()}

    def _mget(self, ids: Sequence[str], includes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """The existing chunks by id as mget finds them (`_source`, `_seq_no`, `_primary_term`)."""
        out: dict[str, dict[str, Any]] = {}
        ids = list(dict.fromkeys(ids))
        for i in range(0, len(ids), _PAGE):
            params: dict[str, Any] = ({"_source_includes": ",".join(includes)} if includes is not None
                                      else {"_source_excludes": ",".join(Q.EXCLUDE_SOURCE)})
            for _ in itertools.chain([None], _pauses(self.retry_s)):
                with self._errors("get"):
                    got = self.client.mget(index=self.index, body={"ids": ids[i:i + _PAGE]}, params=params)
                # on a cluster, a document the node could not read because its shard was on a lost
                # node is not a missing one (other errors, an index deleted meanwhile, and on one
                # node a shard still starting, are read as missing, as ever)
                failed = [d for d in got["docs"] if self.retry_s and "error" in d and node_lost(None, d["error"])]
                if not failed:
                    break
            if failed:
                err = failed[0]["error"]
                raise EngineUnavailableError(f"OpenSearch at {self.url} could not read {len(failed)} chunks (get): "
                                             f"{err.get('type', err) if isinstance(err, dict) else err}")
            out.update({d["_id"]: d for d in got["docs"] if d.get("found")})
        return out

    def _fields(self, ids: Sequence[str], includes: Sequence[str], what: str, *, docvalues: bool = False,
                index: str | None = None) -> dict[str, dict[str, Any]]:
        """Chosen fields of existing chunks (or of the documents of the concrete `index` named: the
        graph index, whose `id` is the work id) by an ids search. From `_source`: on the query path
        it costs about half an mget, which is realtime and rebuilds each chunk's derived source.
        With `docvalues`, from doc values, each field as a list: no stored field is read, which is
        what a `_source` read mostly costs here (it holds the vectors), about 3 ms for 100 chunks
        against about 30."""
        out: dict[str, dict[str, Any]] = {}
        ids = _possible_ids(ids)
        fetch = ({**Q.HITS_BY_ID, "docvalue_fields": list(dict.fromkeys(["id", *includes]))} if docvalues
                 else {"_source": list(includes), "track_total_hits": False})
        for i in range(0, len(ids), _PAGE):
            page = ids[i:i + _PAGE]
            hits = self._search({"size": len(page), "query": {"ids": {"values": page}}, **fetch}, what,
                                index=index)["hits"]["hits"]
            out.update({Q.hit_id(h): h["fields"] for h in hits} if docvalues
                       else {h["_id"]: h.get("_source", {}) for h in hits})
        return out

    def get(self, ids: Sequence[str]) -> dict[str, Document]:
        return {i: Q.from_source(src) for i, src in self._sources(ids).items()}

    def doc_info(self, ids: Sequence[str]) -> dict[str, DocInfo]:
        """From doc values (see `_infos`)."""
        return self._infos(self._fields(ids, Q.INFO_DOCVALUES, "doc info", docvalues=True))

    def _infos(self, found: Mapping[str, Mapping[str, list[Any]]]) -> dict[str, DocInfo]:
        """DocInfo of existing chunks from their INFO_DOCVALUES (hits' `fields`, by id); a chunk
        written before `title_bin` existed is read again with `title.raw`, and one without that
        either from `_source`."""
        out = {i: info for i, f in found.items() if (info := Q.info_from_docvalues(f)) is not None}
        rest = [i for i in found if i not in out]
        if rest:
            raw = self._fields(rest, Q.INFO_DOCVALUES_RAW, "doc info", docvalues=True)
            out.update({i: info for i, f in raw.items() if (info := Q.info_from_docvalues(f)) is not None})
            rest = [i for i in raw if i not in out]
        if rest:
            out.update({i: Q.info_from_source(s) for i, s in self._fields(rest, Q.INFO_FIELDS, "doc info").items()})
        return out

    def count(self) -> int:
        """Chunks in the index; 0 before the first write creates it."""
        try:
            return self._count({"match_all": {}})
        except IndexNotFoundError:
            return 0

    def work_chunks(self, work_ids: Sequence[str], filters: Filters | None = None) -> dict[str, DocInfo]:
        """With the DocInfo from doc values in the same requests (a chunk written before
        `title_bin` existed is read as `doc_info` reads it)."""
        works = list(dict.fromkeys(work_ids))
        if not works:
            return {}
        flt = Q.filter_clauses(filters)
        try:
            found = dict(kv for p in range(0, len(works), _PAGE) for kv in self._scan(
                {"bool": {"filter": [{"terms": {"work_id": works[p:p + _PAGE]}}, *flt]}}, (),
                docvalues=Q.INFO_DOCVALUES))
        except IndexNotFoundError:  # before the first write
            return {}
        out = self._infos(found)
        return {i: out[i] for i in sorted(out)}

    def _count(self, query: dict[str, Any]) -> int:
        with self._errors("count"):
            return int(self.client.count(index=self.index, body={"query": query})["count"])

    def _scan(self, query: dict[str, Any], includes: Sequence[str] | None, limit: int | None = None, *,
              docvalues: Sequence[str] = (), index: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every matching chunk's (id, source), in id order (search_after on the id field), or every
        matching document's of the concrete `index` named (the graph index). No `includes` (an
        empty sequence): ids alone, from doc values, each with the `docvalues` fields asked for
        (lists, as a hit's `fields`) instead of a source."""
        after: list[Any] | None = None
        seen = 0
        ids_only = includes is not None and not includes
        by_id = {**Q.HITS_BY_ID, "docvalue_fields": list(dict.fromkeys(["id", *docvalues]))}
        while limit is None or seen < limit:
            size = _PAGE if limit is None else min(_PAGE, limit - seen)
            source: Any = list(includes) if includes is not None else {"excludes": Q.EXCLUDE_SOURCE}
            body: dict[str, Any] = {"size": size, "query": query, "sort": [{"id": "asc"}],
                                    "track_total_hits": False, **(by_id if ids_only else {"_source": source})}
            if after is not None:
                body["search_after"] = after
            hits = self._search(body, "scan", index=index)["hits"]["hits"]
            for h in hits:
                yield (Q.hit_id(h), h["fields"]) if ids_only else (h["_id"], h.get("_source", {}))
            seen += len(hits)
            if len(hits) < size:
                return
            after = hits[-1]["sort"]

    def missing_vectors(self, limit: int | None = None, ids: Sequence[str] | None = None
                        ) -> list[tuple[str, Document]]:
        return self._missing(_EMBEDDED, limit, ids)

    def missing_codes(self, ids: Sequence[str] | None = None) -> list[tuple[str, Document]]:
        return self._missing({"term": {"hdc_encoded": True}}, None, ids)

    def _missing(self, done: dict[str, Any], limit: int | None, ids: Sequence[str] | None
                 ) -> list[tuple[str, Document]]:
        """Chunks not matching `done`, among `ids` when given, in id order."""
        if ids is not None:
            ids = _possible_ids(ids)
            if not ids:
                return []
        out: list[tuple[str, Document]] = []
        pages = [None] if ids is None else [ids[i:i + _PAGE] for i in range(0, len(ids), _PAGE)]
        for page in pages:
            q: dict[str, Any] = {"bool": {"must_not": [done]}}
            if page is not None:
                q["bool"]["filter"] = [{"ids": {"values": page}}]
            out += [(i, Q.from_source(src)) for i, src in self._scan(q, None, limit)]
        return sorted(out, key=lambda x: x[0])[:limit] if ids is not None else out

    # -- index metadata ---------------------------------------------------------------------------
    def _index_meta(self) -> dict[str, Any]:
        return self._live("read metadata")[1]

    def exists(self) -> bool:
        """Whether the logical index exists (its read alias does); it is made at the first write."""
        with self._errors("look for the index"):
            return bool(self.client.indices.exists_alias(name=self.index))

    def get_meta(self, key: str) -> Any:
        if not self.exists():
            return None
        return Q.meta_value(self._index_meta(), key)

    def set_meta(self, key: str, value: Any) -> None:
        """Store `value` under `key` in the index's `_meta`. A mapping update replaces the whole
        `_meta`, so processes take turns (a cluster lock) to read it, add their key and write it."""
        self.ensure_index()
        with cluster_lock(self.client, self._errors, f"meta:{self.index}", f"a metadata update of {self.index!r}",
                          wait=LOCK_TTL + LOCK_BEAT):
            meta = self._index_meta()
            meta.setdefault("meta", {})[key] = value
            with self._errors("write metadata"):
                self.client.indices.put_mapping(index=self.write_alias, body={"_meta": {"hybridsearch": meta}})

    def stats(self) -> EngineStats:
        index, meta = self._ours("stats")
        _, knn_engine, space_type, compression = self._dense_method(index)
        graph = GraphSummary.of(Q.meta_value(meta, "graph"))
        with self._errors("stats"):
            st = self.client.indices.stats(index=index, metric="docs,store")["indices"][index]["primaries"]
        return EngineStats(self.count(), self._count({"exists": {"field": "dense"}}),
                           self._count({"term": {"hdc_encoded": True}}), {
                               "engine": "opensearch", "url": self.url, "index": self.index, "concrete_index": index,
                               "write_alias": self.write_alias, "knn_engine": knn_engine, "compression": compression,
                               "space_type": space_type, "store_bytes": st["store"]["size_in_bytes"],
                               "lucene_docs": st["docs"]["count"], "lucene_deleted": st["docs"]["deleted"],
                               "graph": None if graph is None else graph.as_dict()})

    # -- lexical --------------------------------------------------------------------------------
    def bm25(self, query: str | Sequence[tuple[str, float]], fields: Mapping[str, float] | None = None,
             k: int = 10, filters: Filters | None = None, options: Bm25Options | None = None) -> RankedList:
        """Field-boosted BM25 (k1=1.2, b=0.75 in the index); other k1/b rescore the top max(4k, 200)
        candidates with hybridsearch.scoring.rescore_bm25, as the embedded engine does."""
        opt = options or Bm25Options()
        self._check_analysis()
        terms = ([(t, 1.0) for t in self.analyzer.analyze(query)] if isinstance(query, str) else list(query))
        fields = check_bm25_fields(fields)
        weights = merge_term_weights(terms)
        if not weights or k <= 0 or not any(w > 0 for w in fields.values()):
            return RankedList.of("bm25", [], [])  # (no field to score: an empty bool would match everything)
        self._check_joined([f for f, w in fields.items() if w > 0 and f in JOINED_FIELDS])
        depth = max(4 * k, 200) if opt.rescored else k
        # Lucene's BM25 statistics are a shard's own: the DFS phase first gathers every shard's, so
        # that scores are the index's whatever its shards (one shard skips the phase)
        hits = self._search(Q.bm25_query(weights, fields, depth, filters, opt.mode, opt.tie_breaker),
                            "bm25", search_type="dfs_query_then_fetch")["hits"]["hits"]
        ids, scores = [Q.hit_id(h) for h in hits], [float(h["_score"]) for h in hits]
        if opt.rescored and ids:
            ids, scores = unzip(self._rescore(terms, fields, ids, k, opt))
        if opt.role_boost != 1.0:
            scores = [s * opt.role_boost for s in scores]
        return RankedList.of("bm25", ids, scores)

    def _check_joined(self, fields: Sequence[str]) -> None:
        """Every chunk holds the joined fields asked for: a chunk written before one existed would
        score 0 in it (and its parts are not asked for), so a search would pass it over unsaid."""
        for f in fields:
            if f in self._joined:
                continue
            try:
                lacking = self._count({"bool": {"must_not": {"exists": {"field": f"bm25_len.{f}"}}}})
            except IndexNotFoundError:
                return
            if lacking:
                raise EngineError(f"BM25 field {f!r}: {lacking} chunks of index {self.index!r} at {self.url} were "
                                  f"written before it existed; `hybridsearch indices reindex {self.index}` fills it in")
            self._joined.add(f)

    def _rescore(self, terms: Sequence[tuple[str, float]], fields: Mapping[str, float], ids: list[str], k: int,
                 opt: Bm25Options) -> list[tuple[str, float]]:
        active = [f for f, w in fields.items() if w > 0]
        src = self._sources(ids, [f"bm25.{f}" for f in active])
        tokens = {i: {f: s.get("bm25", {}).get(f, "").split() for f in active} for i, s in src.items()}
        n, df, sums = self._statistics(list(merge_term_weights(terms)), active, lengths=True)
        avg = {f: sums[f] / n for f in active} if n else {}
        return rescore_bm25(terms, fields, tokens, n, avg, lambda f, t: df.get((f, t), 0), k,
                            opt.mode, opt.tie_breaker, opt.k1, opt.b)

    def _statistics(self, terms: Sequence[str], fields: Sequence[str], *, lengths: bool = False
                    ) -> tuple[int, dict[tuple[str, str], int], dict[str, float]]:
        """In one request: the number of chunks, the document frequency of each (field, term),
        and with `lengths` each field's total token count."""
        body = Q.doc_freq_query(terms, fields)
        if lengths:
            body.setdefault("aggs", {}).update(Q.length_sum_query(fields)["aggs"])
        got = self._search(body, "term statistics")
        aggs = got.get("aggregations", {})
        df = {}
        for key, b in aggs.get("df", {}).get("buckets", {}).items():
            f, _, t = key.partition("\t")
            df[(f, t)] = int(b["doc_count"])
        sums = {f: float(aggs[f]["value"] or 0.0) for f in fields if lengths and f in aggs}
        return int(got["hits"]["total"]["value"]), df, sums

    def term_stats(self, terms: Sequence[str]) -> TermStats:
        """Document frequency of each analysed term (in the scored field where it is most
        frequent) and its idf over all documents."""
        terms = list(dict.fromkeys(terms))
        n, df, _ = self._statistics(terms, list(BM25_FIELD_WEIGHTS))
        out = {}
        for t in terms:
            d = max((df.get((f, t), 0) for f in BM25_FIELD_WEIGHTS), default=0)
            out[t] = TermStat(d, bm25_idf(n, d))
        return TermStats(n, out)

    # -- dense ----------------------------------------------------------------------------------
    def knn(self, vec: np.ndarray, k: int = 10, filters: Filters | None = None) -> RankedList:
        if k <= 0:
            return RankedList.of("dense", [], [])
        v = self._query_vector(vec)
        # the live version's dense field, read once (and again when hits come from another version)
        dense = self._dense or self._dense_method(self._live("knn")[0])
        oversample, widen = Q.COMPRESSED_SEARCH.get(dense[3], (None, 1))
        body = Q.knn_query("dense", v, k, filters, widen * self.settings.opensearch_ef_search, oversample=oversample)
        hits = self._search(body, "knn")["hits"]["hits"]
        space = {ix: self._dense_method(ix)[2] for ix in {h["_index"] for h in hits}}
        return RankedList.of("dense", [Q.hit_id(h) for h in hits],
                             [Q.cosine_from_score(float(h["_score"]), space[h["_index"]]) for h in hits])

    def vector_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        """Exact cosine by the k-NN scoring script (cosinesimil scores (1 + cos) / 2)."""
        return self._exact_cosines(vec, ids, lambda v, page: Q.exact_score_query("dense", "cosinesimil", v, page),
                                   "vector score")

    def passage_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]:
        """Best exact cosine over each chunk's passages by the k-NN scoring script on the nested
        passage vectors (the best passage's score the chunk's)."""
        return self._exact_cosines(vec, ids, Q.passage_score_query, "passage score")

    def _exact_cosines(self, vec: np.ndarray, ids: Sequence[str],
                       body: Callable[[list[float], list[str]], dict[str, Any]], what: str) -> dict[str, float]:
        """Cosines from a `knn_score` search (cosinesimil: (1 + cos) / 2) of the chosen chunks, a
        page of ids at a time."""
        ids = _possible_ids(ids)
        if not ids:
            return {}
        v = self._query_vector(vec)
        out: dict[str, float] = {}
        for i in range(0, len(ids), _PAGE):
            hits = self._search(body(v, ids[i:i + _PAGE]), what)["hits"]["hits"]
            out.update({Q.hit_id(h): Q.cosine_from_score(float(h["_score"]), "cosinesimil") for h in hits})
        return out

    def has_vectors(self) -> bool:
        try:
            return self._count({"exists": {"field": "dense"}}) > 0
        except IndexNotFoundError:  # before the first write
            return False

    def passage_vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {i: np.asarray([p["v"] for p in s["passages"]], dtype=np.float32)
                for i, s in self._sources(ids, ["passages"]).items() if s.get("passages")}

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {i: np.asarray(s["dense"], dtype=np.float32) for i, s in self._sources(ids, ["dense"]).items()
                if s.get("dense") is not None}

    def vector_sample(self, n: int, filters: Filters | None = None) -> np.ndarray:
        hits = self._search(Q.sample_query("dense", n, filters), "vector sample")["hits"]["hits"] if n > 0 else []
        rows = [h["_source"]["dense"] for h in hits if h.get("_source", {}).get("dense") is not None]
        return np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dim)

    def _query_vector(self, vec: np.ndarray) -> list[float]:
        out: list[float] = check_query_vector(vec, self.dim).tolist()
        return out

    # -- HDC ------------------------------------------------------------------------------------
    def hamming(self, codes: Codes, k: int = 10, filters: Filters | None = None) -> dict[str, RankedList]:
        """Per field, candidates from the binary HNSW of `hdc_<field>`, all fields in one
        `_msearch`; scores 1 - d/4096."""
        q = self._codes(codes)
        if k <= 0:
            return {f: RankedList.of(f"hdc:{f}", [], []) for f in q}
        ef = self.settings.opensearch_ef_search
        got = self._msearch([Q.knn_query(f"hdc_{f}", v, k, filters, ef) for f, v in q.items()], "hamming")
        return {f: RankedList.of(f"hdc:{f}", [Q.hit_id(h) for h in hits],
                                 [Q.hamming_similarity(float(h["_score"])) for h in hits])
                for f, hits in zip(q, got, strict=True)}

    def hamming_score(self, codes: Codes, ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """Exact similarity by the k-NN scoring script (space hamming scores 1 / (1 + d)), every
        field and page of ids in one `_msearch`."""
        q = self._codes(codes)
        ids = _possible_ids(ids)
        pages = [(f, ids[i:i + _PAGE]) for f in q for i in range(0, len(ids), _PAGE)]
        got = self._msearch([Q.exact_score_query(f"hdc_{f}", "hamming", q[f], page) for f, page in pages],
                            "hamming score")
        out: dict[str, dict[str, float]] = {f: {} for f in q}
        for (f, _), hits in zip(pages, got, strict=True):
            out[f].update({Q.hit_id(h): Q.hamming_similarity(float(h["_score"])) for h in hits})
        return out

    def _codes(self, codes: Codes) -> dict[str, list[int]]:
        return {f: Q.packed_to_int8(c) for f, c in check_query_codes(codes).items()}

    def hdc_encoder(self, *, ngrams: bool | None = None) -> HdcEncoder:
        """The encoder with the options stored in the index's metadata (fixed at creation, to the
        defaults; an index that does not exist yet is not created by asking)."""
        if self._hdc_encoder is None:
            with self._errors("read metadata"):
                exists = self.client.indices.exists_alias(name=self.index)
            options = index_options(self._index_meta().get("hdc", {}) if exists else None)
            self._hdc_encoder = HdcEncoder(self.analyzer, **options)
        if ngrams is not None and ngrams != self._hdc_encoder.ngrams:
            raise QueryError(f"this index encodes HDC with ngrams={self._hdc_encoder.ngrams}; "
                             "rebuild it to change that")
        return self._hdc_encoder

    # -- citation graph -------------------------------------------------------------------------
    def _graph_exists(self) -> bool:
        """Whether the graph index exists (once found, not asked again until a drop)."""
        if not self._graph_ready:
            with self._errors("look for the graph index"):
                self._graph_ready = bool(self.client.indices.exists(index=self.graph_index))
        return self._graph_ready

    def neighbors(self, ids: Sequence[str]) -> dict[str, Neighbors]:
        """Each chunk's work's graph from the graph index (empty for a work the last build did not
        see); where the graph is still held by the chunks, from their doc values, or from `_source`
        for a chunk whose graph was written before `graph.lists` existed."""
        found = self._work_neighbors(ids)
        if found is not None:
            return found
        on_chunks = {i: Q.neighbors_from_docvalues(f)
                     for i, f in self._fields(ids, Q.GRAPH_DOCVALUES, "neighbors", docvalues=True).items()}
        out = {i: nb for i, nb in on_chunks.items() if nb is not None}
        older = [i for i, nb in on_chunks.items() if nb is None]
        if older:
            sources = self._fields(older, ["graph"], "neighbors")
            out.update({i: Q.neighbors_of(src.get("graph")) for i, src in sources.items()})
        return out

    def _work_neighbors(self, ids: Sequence[str]) -> dict[str, Neighbors] | None:
        """Neighbors of existing chunks from the graph index: their work ids from doc values, then
        the works' `lists`; None where there is no graph index."""
        if not self._graph_exists():
            return None
        work_of = {i: f["work_id"][0] for i, f in self._fields(ids, ["work_id"], "neighbors", docvalues=True).items()
                   if f.get("work_id")}
        try:
            found = self._fields(sorted(set(work_of.values())), ["lists"], "read graph", docvalues=True,
                                 index=self.graph_index)
        except IndexNotFoundError:  # dropped meanwhile
            self._graph_ready = False
            return None
        graphs = {w: Q.neighbors_from_docvalues(f, "") or Neighbors() for w, f in found.items()}
        return {i: graphs.get(w, Neighbors()) for i, w in work_of.items()}

    def authority(self, ids: Sequence[str]) -> dict[str, float]:
        """From the graph index (or, where the graph is still held by the chunks, their doc values)."""
        found = self._work_neighbors(ids)
        if found is not None:
            return {i: nb.authority for i, nb in found.items() if nb.authority is not None}
        return {i: float(f["graph.authority"][0])
                for i, f in self._fields(ids, ["graph.authority"], "authority", docvalues=True).items()
                if "graph.authority" in f}

    def citation_links(self) -> list[WorkLinks]:
        """From doc values: no chunk's `_source` (text, vectors) is read (four to five times faster at
        20,000 chunks)."""
        works: dict[str, tuple[int | None, set[str]]] = {}
        chunks: dict[str, list[str]] = {}
        for chunk, f in self._scan({"match_all": {}}, (), docvalues=("work_id", "ym", "cites")):
            work, (chunk_ym,) = f["work_id"][0], f.get("ym", [None])
            ym, cites = works.setdefault(work, (chunk_ym, set()))
            cites.update(f.get("cites", ()))
            if chunk_ym is not None and (ym is None or chunk_ym < ym):
                works[work] = (chunk_ym, cites)
            if not names_its_work(chunk, work):
                chunks.setdefault(work, []).append(chunk)
        return [WorkLinks(w, ym, tuple(sorted(c)), tuple(sorted(chunks.get(w, ())))) for w, (ym, c) in
                sorted(works.items())]

    def set_graph(self, works: Mapping[str, Neighbors], summary: GraphSummary) -> None:
        """Write the graph index: the works whose graph changed since the last build (their
        digests compared), and delete the works no longer in it; then the summary. No chunk is
        written. The graph index is made at the first build."""
        self.ensure_index()
        if not self._graph_exists():
            with self._errors("create the graph index"):
                try:
                    # as many copies as the chunks have: a lost node loses no graph
                    got = self.client.indices.get_settings(index=self.index, name="index.number_of_replicas")
                    replicas = max(int(v["settings"]["index"]["number_of_replicas"]) for v in got.values())
                    self.client.indices.create(index=self.graph_index, body=Q.graph_index_body(self.index, replicas),
                                               params={"wait_for_active_shards": "1"})
                except opensearchpy.exceptions.RequestError as e:
                    if e.error != "resource_already_exists_exception":  # another process was first
                        raise
                self.client.cluster.health(index=self.graph_index, wait_for_status="yellow")
            self._graph_ready = True
        stored = self._graph_digests()

        def actions() -> Iterator[dict[str, Any]]:
            for w, nb in works.items():
                doc = Q.graph_doc(w, nb)
                if stored.pop(w, None) != doc["digest"]:
                    yield {"_op_type": "index", "_index": self.graph_index, "_id": w, "_source": doc}
            for w in list(stored):
                yield {"_op_type": "delete", "_index": self.graph_index, "_id": w}

        self._bulk(actions(), missing_ok=True, index=self.graph_index)
        self.set_meta("graph", summary.as_dict())

    def _graph_digests(self) -> dict[str, str]:
        """{work: digest} of every document of the graph index, from doc values."""
        return {w: f["digest"][0] for w, f in self._scan({"match_all": {}}, (), docvalues=["digest"],
                                                          index=self.graph_index)}

    def graph_summary(self) -> GraphSummary | None:
        return GraphSummary.of(self.get_meta("graph"))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> OpenSearchEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def error_reason(e: Exception) -> str:
    """One line from an opensearch-py exception: the server's error type and reason when present."""
    info = getattr(e, "info", None)
    if isinstance(info, dict) and isinstance(info.get("error"), dict):
        err = info["error"]
        root = (err.get("root_cause") or [err])[0]
        return f"{root.get('type', err.get('type'))}: {root.get('reason', err.get('reason'))}"
    if isinstance(info, Exception):
        return f"{type(info).__name__}: {info}".splitlines()[0][:300]
    return str(getattr(e, "error", None) or e).splitlines()[0][:300]


def _possible_ids(ids: Iterable[str]) -> list[str]:
    """The ids, once each, without those no chunk can have (empty, or over MAX_ID_BYTES): an ids
    query or bulk item with one fails its whole request."""
    return [i for i in dict.fromkeys(ids) if i and len(i.encode("utf-8")) <= MAX_ID_BYTES]


def _reindex_block(info: dict[str, Any]) -> bool:
    """Whether a bulk item was refused by an index write block (`index.blocks.write`, which
    `indices reindex` sets), not by a read-only block, a cluster block or missing rights."""
    err = info.get("error")
    return (info.get("status") == 403 and isinstance(err, dict) and err.get("type") == "cluster_block_exception"
            and "index write (api)" in str(err.get("reason")))


def _item_reason(info: dict[str, Any]) -> str:
    """One line for a failed bulk item: the error type and reason, and the cause when given."""
    err = info.get("error")
    if isinstance(info.get("exception"), Exception):
        return error_reason(info["exception"])
    if not isinstance(err, dict):
        return str(err or info.get("status"))
    cause = err.get("caused_by")
    return f"{err.get('type')}: {err.get('reason')}" + (f" ({cause.get('reason')})" if isinstance(cause, dict) else "")
