"""Index lifecycle on an OpenSearch cluster: templates, logical indices and their versions,
zero-downtime reindex, pruning and snapshots.

A logical index `<name>` is a set of versions `<name>-v<N>`; the live one holds the read alias
`<name>` and the write alias `<name>-write`. `reindex` builds the next version from the current
templates while searches keep reading the live one, then moves both aliases in one atomic
`_aliases` request. Writes made meanwhile are paused, not lost: the live version is write-blocked
while it is copied, and writers (`OpenSearchEngine._bulk`) send refused items again until the
write alias points at the new version, where they land.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

import opensearchpy

from hybridsearch.config import Settings, get_settings
from hybridsearch.engines import stale_analysis
from hybridsearch.engines.opensearch import queries as Q
from hybridsearch.engines.opensearch.engine import (
    LOCK_BEAT,
    LOCK_TTL,
    LockLost,
    OpenSearchEngine,
    check_index_name,
    cluster_lock,
    display_url,
    error_reason,
    make_client,
    translate_errors,
)
from hybridsearch.engines.opensearch.node import NATIVE_KNN_ATTR
from hybridsearch.errors import ConfigError, EngineError, HybridSearchError, IndexNotFoundError

_log = logging.getLogger("hybridsearch.opensearch")
VERSIONED = re.compile(r"^(?P<name>.+)-v(?P<version>\d+)$")
SEARCH_PIPELINES = ("hybridsearch-minmax", "hybridsearch-rrf")
# Dynamic settings an operator tunes on a live version (replicas, refresh, result window, shard
# allocation, slow logs, translog durability): `reindex` carries them to the next version, over
# what the templates give it.
CARRIED_SETTINGS = re.compile(r"index\.(number_of_replicas|auto_expand_replicas|refresh_interval|max_result_window"
                              r"|priority|translog\.durability|routing\.allocation\.total_shards_per_node"
                              r"|routing\.allocation\.(include|exclude|require)\..+|(search|indexing)\.slowlog\..+)")

Progress = Callable[[int, int], None]  # (documents copied, documents in all)


@dataclass
class Change:
    """One object `templates apply` looked at: created, updated, unchanged or skipped (with why)."""

    kind: str
    name: str
    action: str
    note: str = ""


@dataclass
class Version:
    index: str
    version: int
    docs: int
    bytes: int
    health: str
    aliases: list[str]
    write_blocked: bool
    reindexed_from: str | None = None
    deleted: int = 0  # deleted and soft-deleted copies Lucene still holds (and counts in BM25 statistics)


@dataclass
class LogicalIndex:
    name: str
    versions: list[Version] = field(default_factory=list)

    @property
    def live(self) -> Version | None:
        return next((v for v in self.versions if self.name in v.aliases), None)

    def row(self) -> dict[str, Any]:
        """What `indices list --json` prints for it."""
        live = self.live
        return {"name": self.name, "version": live.version if live else None, "index": live.index if live else None,
                "aliases": live.aliases if live else [], "docs": live.docs if live else 0,
                "size_bytes": live.bytes if live else 0, "health": live.health if live else "missing",
                "versions": [v.version for v in self.versions]}


@dataclass
class MergeResult:
    name: str
    index: str
    dropped: int
    remaining: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReindexResult:
    name: str
    old: str
    new: str
    docs: int
    seconds: float
    removed: list[str]
    carried: dict[str, str] = field(default_factory=dict)  # settings kept from the old version

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def digest(body: dict[str, Any]) -> str:
    """A short content hash of a template body (without its own digest), stored in `_meta`."""
    clean = {k: v for k, v in body.items() if k != "_meta"}
    clean["_meta"] = {k: v for k, v in body.get("_meta", {}).items() if k != "digest"}
    return hashlib.sha256(json.dumps(clean, sort_keys=True).encode()).hexdigest()[:16]


def with_digest(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "_meta": {**body.get("_meta", {}), "digest": digest(body)}}


def _stored_digest(entries: Sequence[dict[str, Any]], key: str) -> str | None:
    """The digest stored with an existing template ("-" if it has none), None if there is none."""
    for e in entries:
        meta = e.get(key, {}).get("_meta") or {}
        return str(meta.get("digest") or "-")
    return None


def put_template(client: opensearchpy.OpenSearch, kind: str, name: str, body: dict[str, Any]) -> Change:
    """Put a component or index template unless the stored one has the same digest."""
    body = with_digest(body)
    if kind == "component template":
        got = client.cluster.get_component_template(name=name, ignore=404).get("component_templates", [])
        was, put = _stored_digest(got, "component_template"), client.cluster.put_component_template
    else:
        got = client.indices.get_index_template(name=name, ignore=404).get("index_templates", [])
        was, put = _stored_digest(got, "index_template"), client.indices.put_index_template
    new = body["_meta"]["digest"]
    if was != new:
        put(name=name, body=body)
    return Change(kind, name, "created" if was is None else "unchanged" if was == new else "updated")


# what an index made before a template field existed does without it
OUTDATED = {"bm25.title_text": " (so a search that scores BM25 field title_text, as `hybrid` does, is refused)",
            "title.raw": " (so the reranker and diversity read DocInfo from _source: about 30 ms per 100 chunks "
                         "instead of 3)",
            "title_bin": " (so the reranker and diversity read titles from title.raw: about 6 ms per 100 chunks "
                         "instead of 3)"}


def missing_fields(want: dict[str, Any], have: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the fields (sub-fields included) in mapping `want` that mapping `have` lacks."""
    out: list[str] = []
    for key in ("properties", "fields"):
        theirs = have.get(key, {})
        for f, spec in want.get(key, {}).items():
            if f not in theirs:
                out.append(prefix + f)
            else:
                out.extend(missing_fields(spec, theirs[f], f"{prefix}{f}."))
    return out


@contextlib.contextmanager
def _beating(beats: Sequence[Callable[[bool], None]], after: str = "") -> Iterator[None]:
    """Keep cluster locks alive (their `beat`s) from a thread while the block makes one long call
    (a restore waits on the node for as long as it takes). A beat that fails is tried again at the
    next; a lock another run took over meanwhile is named in a warning once the block is done,
    followed by `after` (the holder's own next beat raises LockLost)."""
    stop, lost = threading.Event(), []

    def run() -> None:
        while not stop.wait(1.0):
            try:
                for beat in beats:
                    beat(False)
            except LockLost as e:
                lost.append(e)
                return
            except Exception as e:  # noqa: BLE001 - a blip: the lock lives LOCK_TTL, the next beat may do
                _log.warning("could not renew a lock (tried again in 1 s): %s", e)

    thread = threading.Thread(target=run, name="hybridsearch-lock-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if lost:
        _log.warning("%s%s", lost[0], after)


def _add_to(e: BaseException, note: str) -> bool:
    """Add `note` to the message of `e`, an error of ours the caller re-raises; False when `e` has
    no such message (an interrupt, say)."""
    if isinstance(e, HybridSearchError) and e.args:
        e.args = (f"{e.args[0]}{note}", *e.args[1:])
        return True
    return False


def check_snapshot_name(snapshot: str) -> None:
    """One snapshot's name: a pattern or a list would have a delete or a restore act on several."""
    if not snapshot or snapshot == "_all" or any(c in snapshot for c in "*,"):
        raise ConfigError(f"snapshot: {snapshot!r} is not one snapshot's name (no wildcards, commas or _all)")


def lacking_native_knn(client: opensearchpy.OpenSearch) -> list[str]:
    """The nodes that say they lack the k-NN plugin's native libraries (as `hybridsearch opensearch
    start`'s do). A caller that may not read node attributes (403) gets none: its cluster is not
    such a node."""
    try:
        attrs = client.cat.nodeattrs(format="json")
    except (opensearchpy.exceptions.AuthorizationException, opensearchpy.exceptions.NotFoundError):
        return []
    return sorted({a["node"] for a in attrs if a.get("attr") == NATIVE_KNN_ATTR and a.get("value") == "absent"})


def check_native_knn(client: opensearchpy.OpenSearch, knn_engine: str, what: str | None = None,
                     remedy: str = "use 'lucene'") -> None:
    """Refuse a k-NN engine other than Lucene on a cluster with a node that lacks the k-NN plugin's
    native libraries: the first refresh of such a field would kill that node, and every start after
    it. `what` names what asks for the engine (default: the setting)."""
    if knn_engine == "lucene":
        return
    lacking = lacking_native_knn(client)
    if lacking:
        raise ConfigError(f"{what or f'opensearch_knn_engine: {knn_engine!r}'} needs the k-NN plugin's native "
                          f"libraries, which node {', '.join(lacking)} lacks (assembled from Maven Central); {remedy}")


def server_major(client: opensearchpy.OpenSearch) -> int:
    """The major version of the OpenSearch that answers (3 for "3.6.0")."""
    number = str(client.info()["version"]["number"])
    try:
        return int(number.split(".")[0])
    except ValueError:
        raise EngineError(f"the cluster reports OpenSearch version {number!r}, which is not a version number") from None


def cluster_chunks_template(client: opensearchpy.OpenSearch, knn_engine: Q.KnnEngine, compression: Q.Compression
                     ) -> tuple[str, dict[str, Any]]:
    """The name and body of the chunk component template for this cluster (its version, and
    whether its nodes have the k-NN native libraries), after `check_native_knn`; a compression the
    engine or the version lacks is refused in one line."""
    check_native_knn(client, knn_engine)
    major = server_major(client)
    if compression != "1x" and knn_engine != "lucene":
        raise ConfigError(f"opensearch_vector_compression: {compression!r} is offered on the lucene engine only "
                          f"(opensearch_knn_engine is {knn_engine!r})")
    if compression != "1x" and major < 3:
        raise ConfigError(f"opensearch_vector_compression: {compression!r} needs OpenSearch 3.x (whose k-NN rescores "
                          f"the quantised vectors' candidates with the float32 ones); the cluster runs {major}.x")
    niofs = compression != "1x" and major >= 3 and bool(lacking_native_knn(client))
    return (Q.chunks_component(knn_engine, compression),
            Q.chunks_template(knn_engine, major, compression, niofs=niofs))


def apply_chunk_templates(client: opensearchpy.OpenSearch, index: str, knn_engine: Q.KnnEngine,
                          compression: Q.Compression) -> list[Change]:
    """The chunk component template and the index template of logical index `index`, put where
    missing or different from this version's."""
    return [put_template(client, "component template", *cluster_chunks_template(client, knn_engine, compression)),
            put_template(client, "index template", f"hybridsearch-{index}",
                         Q.index_template(index, knn_engine, compression))]


class Admin:
    """Lifecycle operations on one cluster. Every failure is a HybridSearchError with one line."""

    def __init__(self, url: str | None = None, *, settings: Settings | None = None) -> None:
        s = settings or get_settings()
        url = url or s.opensearch_url
        if not url:
            raise ConfigError("no OpenSearch URL: pass --url or set HYBRIDSEARCH_OPENSEARCH_URL")
        self.settings = s
        self._url = url
        self.url = display_url(url)
        self.client = make_client(url, s)

    def errors(self, what: str, index: str | None = None) -> AbstractContextManager[None]:
        return translate_errors(self.url, what, index)

    def engine(self, name: str) -> OpenSearchEngine:
        return OpenSearchEngine(self._url, index=name, settings=self.settings)

    def close(self) -> None:
        self.client.close()

    # -- templates --------------------------------------------------------------------------------
    def apply_templates(self, names: Sequence[str] | None = None) -> list[Change]:
        """Put every template, search pipeline and policy hybridsearch uses where it is missing or
        out of date (idempotent): the chunk templates for each logical index (all existing ones by
        default), the query-log template, the search pipelines, and the query-log ISM policy where
        the index-management plugin is installed."""
        knn, compression = self.settings.opensearch_knn_engine, self.settings.opensearch_vector_compression
        with self.errors("apply templates"):
            out = [put_template(self.client, "component template",
                                *cluster_chunks_template(self.client, knn, compression))]
            for name in [check_index_name(n) for n in names] if names else [ix.name for ix in self.indices()]:
                out.append(put_template(self.client, "index template", f"hybridsearch-{name}",
                                        Q.index_template(name, knn, compression)))
            out.append(put_template(self.client, "index template",
                                    *Q.query_log_template(self.settings.query_log_prefix)))
            for pid in SEARCH_PIPELINES:
                body = Q.template(f"pipelines/{pid}")
                got = self.client.transport.perform_request("GET", f"/_search/pipeline/{pid}", params={"ignore": 404})
                old = got.get(pid) if isinstance(got, dict) else None
                if old != body:
                    self.client.transport.perform_request("PUT", f"/_search/pipeline/{pid}", body=body)
                out.append(Change("search pipeline", pid, "created" if old is None else
                                  "unchanged" if old == body else "updated"))
            out.append(self._apply_ism_policy())
        return out

    def plugins(self) -> set[str]:
        with self.errors("list plugins"):
            return {p["component"] for p in self.client.cat.plugins(format="json")}

    def _apply_ism_policy(self) -> Change:
        name, body = Q.query_log_policy(self.settings.query_log_prefix)
        if "opensearch-index-management" not in self.plugins():
            return Change("ISM policy", name, "skipped",
                          "index-management plugin not installed; prune with `hybridsearch logs prune`")
        tag = f" [digest {digest(body)}]"
        body["policy"]["description"] += tag
        path = f"/_plugins/_ism/policies/{name}"
        got = self.client.transport.perform_request("GET", path, params={"ignore": 404})
        if isinstance(got, dict) and "policy" in got:
            if str(got["policy"].get("description", "")).endswith(tag):
                return Change("ISM policy", name, "unchanged")
            self.client.transport.perform_request("PUT", path, body=body, params={
                "if_seq_no": got["_seq_no"], "if_primary_term": got["_primary_term"]})
            return Change("ISM policy", name, "updated")
        self.client.transport.perform_request("PUT", path, body=body)
        return Change("ISM policy", name, "created")

    # -- logical indices --------------------------------------------------------------------------
    def _live_docs(self, cat: Mapping[str, Any]) -> int:
        """The chunks an index version holds: its live top-level documents (`_cat`'s docs.count
        counts Lucene documents, nested passages and not yet merged-away copies included); a
        closed index says what `_cat` does."""
        if cat.get("status") == "close":
            return int(cat.get("docs.count") or 0)
        with self.errors("count documents"):
            return int(self.client.count(index=cat["index"])["count"])

    def indices(self) -> list[LogicalIndex]:
        """Every logical index hybridsearch made on the cluster (versions with our `_meta`)."""
        with self.errors("list indices"):
            cat = self.client.cat.indices(format="json", bytes="b", expand_wildcards="all",
                                          h="index,health,status,docs.count,docs.deleted,store.size")
            if not any(VERSIONED.match(c["index"]) for c in cat):
                return []
            every = {"index": "*-v*", "expand_wildcards": "all"}
            mappings = self.client.indices.get_mapping(**every)
            aliases = self.client.indices.get_alias(**every)
            blocks = self.client.indices.get_settings(**every, name="index.blocks.write")
        by_name: dict[str, LogicalIndex] = {}
        for c in sorted(cat, key=lambda c: c["index"]):
            m = VERSIONED.match(c["index"])
            if not m:
                continue
            meta = Q.hybridsearch_meta(mappings.get(c["index"], {}).get("mappings", {}))
            if meta.get("index") != m["name"]:
                continue
            blocked = blocks.get(c["index"], {}).get("settings", {}).get("index", {}).get("blocks", {}).get("write")
            v = Version(c["index"], int(m["version"]), self._live_docs(c), int(c.get("store.size") or 0),
                        c.get("health") or c.get("status") or "unknown",
                        sorted(aliases.get(c["index"], {}).get("aliases", {})), blocked == "true",
                        meta.get("reindexed_from"), int(c.get("docs.deleted") or 0))
            by_name.setdefault(m["name"], LogicalIndex(m["name"])).versions.append(v)
        for ix in by_name.values():
            ix.versions.sort(key=lambda v: v.version)
        return sorted(by_name.values(), key=lambda ix: ix.name)

    def get(self, name: str) -> LogicalIndex:
        check_index_name(name)
        for ix in self.indices():
            if ix.name == name:
                return ix
        raise IndexNotFoundError(f"no index {name!r} at {self.url} (`hybridsearch indices list` shows them)")

    def status(self, name: str) -> dict[str, Any]:
        """The logical index, its versions, counts of vectors and codes, and warnings."""
        ix = self.get(name)
        live = ix.live
        out: dict[str, Any] = {**ix.row(), "write_alias": f"{name}-write",
                               "versions": [asdict(v) for v in ix.versions], "warnings": []}
        if live is None:
            out["warnings"].append(f"no version holds the read alias {name!r}")
            return out
        engine = self.engine(name)
        try:
            st = engine.stats()
        finally:
            engine.close()
        out.update(vectors=st.vectors, codes=st.codes, knn_engine=st.details.get("knn_engine"))
        with self.errors("read the shards"):
            rows = self.client.cat.shards(index=live.index, format="json", h="shard,prirep,state,node")
        out["shards"] = sorted(({"shard": int(r["shard"]), "primary": r["prirep"] == "p", "state": r["state"],
                                 "node": r.get("node")} for r in rows),
                               key=lambda r: (r["shard"], not r["primary"], r["node"] or ""))
        out["number_of_shards"] = len({r["shard"] for r in out["shards"]})
        out["number_of_replicas"] = sum(not r["primary"] for r in out["shards"]) // max(out["number_of_shards"], 1)
        unassigned = [r for r in out["shards"] if r["state"] == "UNASSIGNED"]
        if unassigned:
            out["warnings"].append(f"{len(unassigned)} shard copies of {live.index} are unassigned (a node is "
                                   "missing, or the cluster has fewer nodes than copies)")
        if live.write_blocked:
            out["warnings"].append(f"the live version {live.index} is write-blocked, so writes wait: a reindex is "
                                   f"running, or one was interrupted (run `hybridsearch indices reindex {name}` again)")
        if live.deleted:
            out["warnings"].append(
                f"{live.deleted} deleted or replaced copies of chunks (left by updates: workers' "
                f"vectors or codes, a re-ingest) still count in BM25's statistics, so scores differ slightly from "
                f"an index without them; `hybridsearch indices merge {name}` drops them")
        with self.errors("count"):
            older = 0 if self.client.indices.exists(index=Q.graph_index(name)) else int(
                self.client.count(index=live.index, body={"query": Q.GRAPH_BEFORE_LISTS})["count"])
        if older:
            out["warnings"].append(
                f"chunks whose citation graph was written before `graph.lists` existed: {older}; searches read "
                f"their neighbours from _source (about 0.8 ms more for 5 seeds); `hybridsearch graph --url "
                f"{self.url} --index {name} --force` moves the graph to its own index")
        running = self._reindex_tasks(name)
        if running:
            out["reindex_running"] = running
        if f"{name}-write" not in live.aliases:
            out["warnings"].append(f"the write alias {name}-write is not on the live version {live.index}")
        with self.errors("read the mapping"):
            got = self.client.indices.get_mapping(index=live.index)[live.index]["mappings"]
        stale = stale_analysis(Q.meta_value(Q.hybridsearch_meta(got), "analysis"), "tokens and HDC codes",
                               f"the live version {live.index}")
        if stale and st.documents:
            out["warnings"].append(stale)
        # field names only: the same for every k-NN engine, compression and version
        missing = missing_fields(Q.template("hybridsearch-chunks")["template"]["mappings"], got)
        if missing:
            why = next((OUTDATED[f] for f in missing if f in OUTDATED), "")  # the costliest first
            out["warnings"].append(
                f"the live version {live.index} was made from older templates and lacks {', '.join(missing)}"
                f"{why}; `hybridsearch indices reindex {name}` moves it onto the current ones")
        return out

    def create(self, name: str, shards: int | None = None, replicas: int | None = None) -> LogicalIndex:
        """Create the first version of `name` with `shards` primary shards and `replicas` copies of
        each (default: the settings')."""
        check_index_name(name)
        if any(ix.name == name for ix in self.indices()):
            raise ConfigError(f"index {name!r} already exists at {self.url}")
        if shards is not None and not 1 <= shards <= 1024:
            raise ConfigError(f"shards: {shards} is not a shard count from 1 to 1024")
        if replicas is not None and not 0 <= replicas <= 32:
            raise ConfigError(f"replicas: {replicas} is not a replica count from 0 to 32")
        given = {k: v for k, v in (("opensearch_shards", shards), ("opensearch_replicas", replicas)) if v is not None}
        engine = OpenSearchEngine(self._url, index=name, settings=self.settings.model_copy(update=given))
        try:
            engine.ensure_index()
        finally:
            engine.close()
        return self.get(name)

    def delete(self, name: str) -> list[str]:
        self.get(name)
        engine = self.engine(name)
        try:
            return engine.drop()
        finally:
            engine.close()

    def prunable(self, name: str, keep: int = 1) -> list[str]:
        """The versions `prune` would delete."""
        if keep < 1:
            raise ConfigError(f"--keep must be >= 1, got {keep}")
        ix = self.get(name)
        kept = {v.index for v in ix.versions[-keep:]}
        return [v.index for v in ix.versions if v.index not in kept and not v.aliases
                and (ix.live is None or v.version < ix.live.version)]

    def prune(self, name: str, keep: int = 1, only: Sequence[str] | None = None) -> list[str]:
        """Delete old versions, keeping the `keep` newest; never the live one or one with an alias;
        with `only`, none outside it (the list a user confirmed)."""
        doomed = [v for v in self.prunable(name, keep) if only is None or v in only]
        if doomed:
            with self.errors("delete versions"):
                self.client.indices.delete(index=",".join(doomed))
        return doomed

    # -- merge ----------------------------------------------------------------------------------
    def merge(self, name: str, progress: Callable[[str], None] | None = None, timeout: float = 120.0,
              poll: float = 1.0, report_every: float = 10.0) -> MergeResult:
        """Drop the deleted and replaced copies of chunks that Lucene keeps in the live version
        (every update leaves one), so that BM25's statistics count live chunks only. OpenSearch
        keeps a copy while a shard's retention leases may still need it to recover a copy of the
        shard; the leases advance every 30 s, so this waits (up to `timeout` seconds) until every
        shard copy's leases are past its primary's last operation, then merges every segment that
        holds such a copy (`index.merge.policy.expunge_deletes_allowed` 0 for the merge, restored
        after), saying every `report_every` seconds what the node is merging. A reindex, which
        drops them too, is not merged under."""
        live = self.get(name).live
        if live is None:
            raise EngineError(f"index {name!r} has no live version (no version holds the read alias)")
        index, t0 = live.index, time.monotonic()
        if live.write_blocked or self._reindex_tasks(name):
            raise EngineError(f"the live version {index} is write-blocked: a reindex is running or was interrupted "
                              f"(`hybridsearch indices reindex {name}` finishes it, and drops the replaced copies)")
        merging = self._running("indices:admin/forcemerge", re.escape(index))
        if merging:
            raise EngineError(f"a merge of {index} is already running (task {merging[0]})")
        with self.errors("merge", index):
            self.client.indices.refresh(index=index)
            self.client.indices.flush(index=index)
            before = self._deleted(index)
            if before == 0:
                return MergeResult(name, index, 0, 0, time.monotonic() - t0)
            retention = self._retention(index)
            last = {shard: top for shard, (top, _) in retention.items()}
            said = False
            while True:
                behind = sorted(shard for shard, (_, kept) in retention.items() if kept <= last[shard])
                if not behind:
                    break
                if time.monotonic() - t0 > timeout:
                    raise EngineError(
                        f"merge {name}: the retention leases of shard(s) {', '.join(map(str, behind))} of {index} "
                        f"still keep its last operations after {timeout:.0f} s (they advance every 30 s; a "
                        f"recovering replica holds them longer); try again later or with a longer --timeout")
                if progress is not None and not said:
                    progress(f"waiting for the retention leases of {index} to pass its last operations "
                             f"(they advance every 30 s)")
                    said = True
                time.sleep(poll)
                retention = self._retention(index)
            if progress is not None:
                progress(f"merging the segments of {index} that hold {before} deleted or replaced copies")
            self._expunge(index, poll, progress, report_every)
            self.client.indices.refresh(index=index)  # searches see the merged segments now
            after = self._deleted(index)
        return MergeResult(name, index, max(0, before - after), after, time.monotonic() - t0)

    def _expunge(self, index: str, poll: float, progress: Callable[[str], None] | None = None,
                 report_every: float = 10.0) -> None:
        """Merge every segment of `index` that holds a deleted copy, as a task (a large index
        merges for longer than a request may wait), with the policy's threshold at 0 meanwhile.
        https://docs.opensearch.org/latest/api-reference/index-apis/force-merge/ (retained deleted
        documents are not expunged: hence the wait for the leases first)."""
        key = "index.merge.policy.expunge_deletes_allowed"
        got = self.client.indices.get_settings(index=index, name=key, flat_settings=True)
        was = got.get(index, {}).get("settings", {}).get(key)  # None: the default, restored by null
        failed: BaseException | None = None
        try:
            self.client.indices.put_settings(index=index, body={key: 0})
            task = self.client.indices.forcemerge(index=index, params={"only_expunge_deletes": "true",
                                                                       "wait_for_completion": "false"})["task"]
            t0 = said = time.monotonic()
            while not (done := self.client.tasks.get(task_id=task)).get("completed"):
                time.sleep(poll)
                if progress is not None and time.monotonic() - said >= report_every:
                    said = time.monotonic()
                    progress(self._merging(index, said - t0))
            if done.get("error"):
                raise EngineError(f"merge of {index} failed: {done['error'].get('reason', done['error'])}")
        except BaseException as e:
            failed = e
            raise
        finally:
            try:
                self.client.indices.put_settings(index=index, body={key: was})
            except opensearchpy.OpenSearchException as e:
                note = (f"could not set {key} on {index} back to {was if was is not None else 'its default'} "
                        f"({error_reason(e)}); set it by hand")
                raise EngineError(f"{failed}; and {note}" if failed is not None else note) from e

    def _merging(self, index: str, seconds: float) -> str:
        """One line on the merges under way in `index` (index stats, `merges`)."""
        m = self.client.indices.stats(index=index, metric="merge")["indices"][index]["primaries"]["merges"]
        return (f"still merging {index} after {seconds:.0f} s: {m['current']} merge(s) under way over "
                f"{m['current_docs']:,} documents ({m['current_size_in_bytes'] / 2**20:,.1f} MiB)")

    def _deleted(self, index: str) -> int:
        got = self.client.indices.stats(index=index, metric="docs")
        return int(got["indices"][index]["primaries"]["docs"]["deleted"])

    def _retention(self, index: str) -> dict[int, tuple[int, int]]:
        """Per shard: its primary's highest operation's sequence number, and the lowest one that
        the retention leases of its started copies keep (an operation at or above it is kept)."""
        got = self.client.indices.stats(index=index, level="shards", metric="docs")["indices"][index]["shards"]
        out = {}
        for shard, copies in got.items():
            started = [c for c in copies if c["routing"]["state"] == "STARTED"]
            primary = next((c for c in started if c["routing"]["primary"]), None)
            if primary is None:
                raise EngineError(f"shard {shard} of {index} has no started primary; merge when `hybridsearch "
                                  f"indices status` shows the index green or yellow")
            leases = [int(lease["retaining_seq_no"]) for c in started for lease in c["retention_leases"]["leases"]]
            out[int(shard)] = (int(primary["seq_no"]["max_seq_no"]), min(leases, default=2**63))
        return out

    # -- reindex --------------------------------------------------------------------------------
    def _running(self, actions: str, index: str) -> list[str]:
        """Ids of running tasks of `actions` whose description names an index matching the regex `index`."""
        with self.errors("list tasks"):
            got = self.client.tasks.list(actions=actions, detailed=True)
        return [tid for node in got.get("nodes", {}).values() for tid, t in node.get("tasks", {}).items()
                if re.search(rf"\[{index}\]", t.get("description", ""))]

    def _reindex_tasks(self, name: str) -> list[str]:
        return self._running("*reindex", rf"{re.escape(name)}-v\d+")

    def reindex(self, name: str, progress: Progress | None = None, poll: float = 0.5) -> ReindexResult:
        """Build the next version from the current templates, copy the live one into it with a
        server-side `_reindex` task, check the counts, then swap both aliases atomically. Writes
        to the live version are paused meanwhile (see the module docstring). On any failure the
        new version is deleted and the live one unblocked; the aliases never move. One reindex (or
        restore) of an index runs at a time, cluster-wide (`cluster_lock`)."""
        with cluster_lock(self.client, self.errors, f"reindex:{name}", f"a reindex or restore of {name!r}") as beat:
            return self._reindex(name, progress, poll, beat)

    def _reindex(self, name: str, progress: Progress | None, poll: float,
                 beat: Callable[[bool], None]) -> ReindexResult:
        ix = self.get(name)
        live = ix.live
        if live is None:
            raise EngineError(f"index {name!r} has no live version (no version holds the read alias)")
        if f"{name}-write" not in live.aliases:
            raise EngineError(f"the write alias {name}-write is not on the live version {live.index}; fix the "
                              "aliases before reindexing")
        running = self._reindex_tasks(name)
        if running:
            raise EngineError(f"a reindex of {name!r} is already running (task {running[0]})")
        newer = [v for v in ix.versions if v.version > live.version]
        stray = [v.index for v in newer if v.aliases or v.reindexed_from != live.index]
        if stray:
            raise EngineError(f"{', '.join(stray)} is newer than the live version {live.index} but was not left by a "
                              f"reindex of it; move the aliases or delete it first")
        removed = [v.index for v in newer]  # left by an interrupted reindex of the live version
        t0 = time.perf_counter()
        with self.errors("reindex"):
            apply_chunk_templates(self.client, name, self.settings.opensearch_knn_engine,
                                  self.settings.opensearch_vector_compression)  # before anything changes
            if removed:
                self.client.indices.delete(index=",".join(removed))
            new = f"{name}-v{max(v.version for v in ix.versions if v.index not in removed) + 1}"
            got = self.client.indices.get_settings(index=live.index, name="index.number_of_shards")
            shards = got[live.index]["settings"]["index"]["number_of_shards"]  # kept: the copies follow it
            self.client.indices.create(index=new, body={"settings": {"index": {"refresh_interval": "-1",
                                                                               "number_of_shards": shards}},
                                                        "mappings": {"_meta": self._meta_for(live.index, new)}},
                                       params={"wait_for_active_shards": "1"})
        swap_sent = False
        try:
            carried = self._carried(live.index, new)
            with self.errors("write block"):
                # waits until writes already under way on the shards have finished
                self.client.indices.add_block(index=live.index, block="write")
                self.client.indices.refresh(index=live.index)  # the copy reads what a search sees
            self._copy(live.index, new, progress, poll, beat)
            with self.errors("reindex"):
                self.client.indices.put_settings(index=new, body={"index.refresh_interval": None, **carried})
                self.client.indices.refresh(index=f"{live.index},{new}")
                before = int(self.client.count(index=live.index)["count"])
                after = int(self.client.count(index=new)["count"])
                if before != after:
                    raise EngineError(f"reindex of {name!r} copied {after} of {before} documents; the aliases "
                                      f"were not moved and {new} was deleted")
                self.client.cluster.health(index=new, wait_for_status="yellow")
                # metadata written while copying (set_meta) goes along: none is written between
                # this copy and the swap (set_meta takes the same lock, which this waits for while
                # keeping its own alive)
                with contextlib.ExitStack() as meta_lock:
                    with _beating([beat]):
                        meta_lock.enter_context(cluster_lock(
                            self.client, self.errors, f"meta:{name}", f"a metadata update of {name!r}",
                            wait=LOCK_TTL + LOCK_BEAT))
                    self.client.indices.put_mapping(index=new, body={"_meta": self._meta_for(live.index, new)})
                    beat(True)  # still ours, so the index is as this run left it
                    swap_sent = True
                    self.client.indices.update_aliases(body={"actions": [
                        {"remove": {"index": live.index, "alias": name}},
                        {"add": {"index": new, "alias": name}},
                        {"remove": {"index": live.index, "alias": f"{name}-write"}},
                        {"add": {"index": new, "alias": f"{name}-write", "is_write_index": True}}]})
        except LockLost:
            raise  # the run that took over the lock cleans up after this one
        except BaseException as e:
            self._settle_swap(e, name, new, swap_sent, lambda err: self._abandon(live.index, new, err))
        return ReindexResult(name, live.index, new, before, time.perf_counter() - t0, removed, carried)

    def _carried(self, old: str, new: str) -> dict[str, str]:
        """The settings in CARRIED_SETTINGS that `old` has and the templates gave `new` otherwise."""
        with self.errors("read settings"):
            got = self.client.indices.get_settings(index=f"{old},{new}", params={"flat_settings": "true"})
        given = got[new]["settings"]
        given.pop("index.refresh_interval", None)  # set for the copy only
        return {k: v for k, v in got[old]["settings"].items() if CARRIED_SETTINGS.fullmatch(k) and given.get(k) != v}

    def _swapped(self, name: str, new: str) -> bool | None:
        """Whether alias `name` is on `new` (a swap whose answer was lost may still have happened);
        None when the node cannot say, asked three times."""
        for attempt in range(3):
            try:
                return new in self.client.indices.get_alias(name=name, ignore=404)
            except Exception:  # noqa: BLE001 - asked again
                time.sleep(0.5 * (attempt + 1))
        return None

    def _settle_swap(self, e: BaseException, name: str, new: str, swap_sent: bool,
                     undo: Callable[[BaseException], None]) -> None:
        """After `e` broke off work that ends by moving `name`'s aliases to `new`: return when they
        moved anyway (the swap's answer was lost), else `undo` and raise `e`; when the node cannot
        say where they are, raise `e` saying so, with nothing undone."""
        swapped = self._swapped(name, new) if swap_sent else False
        if swapped is None:
            _add_to(e, f"; could not tell whether the aliases of {name!r} moved to {new}, so nothing was deleted: "
                       f"`hybridsearch indices status {name}` shows where they are")
            raise e
        if not swapped:
            undo(e)
            raise e

    def _meta_for(self, old: str, new: str) -> dict[str, Any]:
        """The hybridsearch `_meta` of `old`, for version `new` (made from `old` when they differ)."""
        with self.errors("read metadata"):
            got = self.client.indices.get_mapping(index=old)
        meta = dict(Q.hybridsearch_meta(got[old]["mappings"]))
        m = VERSIONED.match(new)
        assert m is not None
        meta["version"] = int(m["version"])
        if new != old:
            meta["reindexed_from"] = old
        return {"hybridsearch": meta}

    def _unblock(self, index: str) -> None:
        """Lift the write block `reindex` set (with the add-block API) on `index`."""
        with self.errors("write block"):
            self.client.indices.put_settings(index=index, body={"index": {"blocks": {"write": None}}})

    def _copy(self, old: str, new: str, progress: Progress | None, poll: float,
              beat: Callable[[bool], None]) -> None:
        with self.errors("reindex"):
            total = int(self.client.count(index=old)["count"])
            task = self.client.reindex(body={"source": {"index": old, "size": 500}, "dest": {"index": new},
                                             "script": {"lang": "painless", "source": Q.REINDEX_SCRIPT,
                                                        "params": Q.REINDEX_PARAMS}},
                                       params={"wait_for_completion": "false",
                                               "slices": str(self.settings.opensearch_reindex_slices)})["task"]
        shown = 0  # a finished slice leaves the task list before the parent counts it: never go back
        try:
            while True:
                with self.errors("reindex status"):
                    got = self.client.tasks.get(task_id=task)
                    # a sliced reindex reports progress in its child tasks until they finish
                    children = self.client.tasks.list(parent_task_id=task, detailed=True).get("nodes", {})
                statuses = [t.get("status", {}) for n in children.values() for t in n.get("tasks", {}).values()]
                statuses.append(got.get("task", {}).get("status", {}))
                done = max(sum(int(st.get("created", 0)) + int(st.get("updated", 0)) for st in statuses[:-1]),
                           int(statuses[-1].get("created", 0)) + int(statuses[-1].get("updated", 0)))
                shown = max(shown, min(done, total))
                if progress is not None:
                    progress(shown, total)
                beat(False)
                if got.get("completed"):
                    break
                time.sleep(poll)
        except BaseException:
            # wait for the slices to stop, so that none writes into the version about to be deleted
            self.client.tasks.cancel(task_id=task, params={"wait_for_completion": "true"}, ignore=404)
            raise
        if got.get("error"):
            raise EngineError(f"reindex {old} -> {new} failed: {got['error'].get('reason', got['error'])}")
        failures = got.get("response", {}).get("failures") or []
        if failures:
            f = failures[0]
            raise EngineError(f"reindex {old} -> {new}: {len(failures)} documents failed, e.g. {f.get('id')}: "
                              f"{(f.get('cause') or {}).get('reason', f)}")

    def _abandon(self, live: str, new: str, cause: BaseException) -> None:
        """Undo an unfinished reindex: delete the new version, unblock the live one. A failure
        here is added to the message of `cause`, which the caller re-raises."""
        try:
            self.client.indices.delete(index=new, ignore=404)
            self._unblock(live)
        except Exception as e:
            note = (f"; cleaning up also failed ({error_reason(e)}): delete {new} and lift the write block on {live} "
                    f"(`hybridsearch indices reindex` does both when run again)")
            if not _add_to(cause, note):
                _log.error("reindex cleanup failed%s", note)

    # -- snapshots ------------------------------------------------------------------------------
    def repo_add(self, repo: str | None = None, location: str | None = None) -> dict[str, Any]:
        """Register (and verify) an `fs` snapshot repository; `location` is relative to the node's
        `path.repo` unless absolute."""
        repo = repo or self.settings.opensearch_snapshot_repo
        body = {"type": "fs", "settings": {"location": location or repo}}
        with self.errors("add snapshot repository"):
            self.client.snapshot.create_repository(repository=repo, body=body)
            nodes = self.client.snapshot.verify_repository(repository=repo)["nodes"]
        return {"repository": repo, **body, "verified_nodes": len(nodes)}

    def snapshots(self, repo: str | None = None) -> list[dict[str, Any]]:
        with self.errors("list snapshots"):
            repo = self._check_repo(repo)
            got = self.client.snapshot.get(repository=repo, snapshot="_all")["snapshots"]
        return [{"snapshot": s["snapshot"], "state": s["state"], "indices": sorted(s["indices"]),
                 "logical": sorted((s.get("metadata") or {}).get("hybridsearch", {}).get("indices", {})),
                 "start": s.get("start_time"), "seconds": s.get("duration_in_millis", 0) / 1000}
                for s in got]

    def _check_repo(self, repo: str | None) -> str:
        """The repository's name (default: the setting), which must exist."""
        repo = repo or self.settings.opensearch_snapshot_repo
        with self.errors("read snapshot repository"):
            found = self.client.snapshot.get_repository(repository=repo, ignore=404).get(repo)
        if not found:
            raise ConfigError(f"no snapshot repository {repo!r} at {self.url}; add one with "
                              f"`hybridsearch snapshot repo-add {repo}`")
        return repo

    def snapshot_create(self, snapshot: str, repo: str | None = None,
                        names: Sequence[str] | None = None) -> dict[str, Any]:
        """Snapshot the live version of each logical index (all by default), with its aliases and
        its graph index."""
        check_snapshot_name(snapshot)
        chosen = [self.get(n) for n in names] if names else self.indices()
        if not chosen:
            raise IndexNotFoundError(f"no hybridsearch index at {self.url} to snapshot")
        live = {ix.name: ix.live.index for ix in chosen if ix.live is not None}
        lost = [ix.name for ix in chosen if ix.live is None]
        if not live or (names and lost):
            raise IndexNotFoundError(f"no live version of {', '.join(lost)} to snapshot (no version holds its read "
                                     "alias); `hybridsearch indices status NAME` shows its versions")
        with self.errors("create snapshot"):
            repo = self._check_repo(repo)
            mappings = self.client.indices.get_mapping(index=",".join(live.values()))
            # what a restore checks before bringing them back (a faiss field kills a node without
            # the k-NN plugin's native libraries)
            knn = {n: Q.dense_method(mappings[c]["mappings"])[0] for n, c in live.items()}
            graphs = {n: Q.graph_index(n) for n in live if self.client.indices.exists(index=Q.graph_index(n))}
            wait = self.settings.opensearch_snapshot_timeout
            try:
                got = self.client.snapshot.create(repository=repo, snapshot=snapshot, body={
                    "indices": ",".join([*live.values(), *graphs.values()]), "include_global_state": False,
                    "ignore_unavailable": False,
                    "metadata": {"hybridsearch": {"indices": live, "knn_engines": knn, "graphs": graphs}}},
                    params={"wait_for_completion": "true", "request_timeout": wait})
            except opensearchpy.exceptions.ConnectionTimeout:
                raise EngineError(f"snapshot {snapshot!r} did not finish in {wait:g} s "
                                  "(HYBRIDSEARCH_OPENSEARCH_SNAPSHOT_TIMEOUT); the node goes on with it: "
                                  f"`hybridsearch snapshot list --repo {repo}` shows its state") from None
        s = got["snapshot"]
        if s["state"] != "SUCCESS":
            raise EngineError(f"snapshot {snapshot!r} ended {s['state']}: {s.get('failures')}")
        return {"snapshot": snapshot, "repository": repo, "state": s["state"], "indices": live, "graphs": graphs,
                "seconds": s.get("duration_in_millis", 0) / 1000}

    def _stored(self, snapshot: str, repo: str, names: Sequence[str] | None, *, state_ok: bool = False
                ) -> tuple[dict[str, str], dict[str, str], dict[str, str], str]:
        """{logical index: concrete index} of a successful hybridsearch snapshot (of any state
        with `state_ok`), for `names` (all by default), the k-NN engine of each as recorded
        (snapshots made before the record: none), the graph index of each that has one, and the
        snapshot's state."""
        check_snapshot_name(snapshot)
        with self.errors("read snapshot"):
            got = self.client.snapshot.get(repository=repo, snapshot=snapshot, ignore=404)
        snaps = [s for s in got.get("snapshots") or [] if s.get("snapshot") == snapshot]
        if not snaps:
            raise IndexNotFoundError(f"no snapshot {snapshot!r} in repository {repo!r}")
        if snaps[0].get("state") != "SUCCESS" and not state_ok:
            raise EngineError(f"snapshot {snapshot!r} is {snaps[0].get('state')}, not SUCCESS; not restoring it")
        ours = (snaps[0].get("metadata") or {}).get("hybridsearch", {})
        stored: dict[str, str] = ours.get("indices", {})
        if not stored:
            raise IndexNotFoundError(f"snapshot {snapshot!r} was not made by `hybridsearch snapshot create` "
                                     "(it names no logical index)")
        if names:
            unknown = [n for n in names if n not in stored]
            if unknown:
                raise IndexNotFoundError(f"snapshot {snapshot!r} holds no index {', '.join(map(repr, unknown))}; it "
                                         f"holds {', '.join(sorted(stored))}")
            stored = {n: stored[n] for n in names}
        knn = {n: e for n, e in (ours.get("knn_engines") or {}).items() if n in stored and e}
        graphs = {n: g for n, g in (ours.get("graphs") or {}).items() if n in stored}
        return stored, knn, graphs, str(snaps[0].get("state"))

    def snapshot_delete(self, snapshot: str, repo: str | None = None,
                        ask: Callable[[dict[str, str], str], None] | None = None) -> dict[str, Any]:
        """Delete a snapshot that `snapshot create` made (one without our metadata is refused),
        after `ask` (given {logical index: concrete index} and the snapshot's state: deleting one
        IN_PROGRESS stops it) returns; the repository keeps the files other snapshots share."""
        check_snapshot_name(snapshot)
        repo = self._check_repo(repo)
        stored, _, _, state = self._stored(snapshot, repo, None, state_ok=True)
        if ask is not None:
            ask(stored, state)
        with self.errors("delete snapshot"):  # one IN_PROGRESS is stopped first, which takes a while
            self.client.snapshot.delete(repository=repo, snapshot=snapshot,
                                        params={"request_timeout": self.settings.opensearch_snapshot_timeout})
        return {"snapshot": snapshot, "repository": repo, "indices": stored}

    def restore_conflicts(self, snapshot: str, repo: str | None = None,
                          names: Sequence[str] | None = None) -> list[str]:
        """The existing logical indices a restore of `snapshot` would replace."""
        stored, _, _, _ = self._stored(snapshot, self._check_repo(repo), names)
        return sorted(ix.name for ix in self.indices() if ix.name in stored)

    def snapshot_restore(self, snapshot: str, repo: str | None = None, names: Sequence[str] | None = None,
                         *, replace: bool = False) -> dict[str, Any]:
        """Restore logical indices (all in the snapshot by default) with their aliases. One that
        exists is replaced only with `replace`: its versions are write-blocked (writes wait, as
        during a reindex, and land in the restored version), the snapshot is restored beside them
        as a new version, the aliases move to that version in one request, and only then are the
        old versions deleted. Each index is restored under its reindex lock. Any name the restore
        would take that is not a hybridsearch index to replace is refused before anything changes;
        an index whose restore fails is deleted, its old versions unblocked, and the error names
        the indices restored before it."""
        check_snapshot_name(snapshot)
        repo = self._check_repo(repo)
        stored, knn, graphs, _ = self._stored(snapshot, repo, names)
        t0 = time.perf_counter()
        with contextlib.ExitStack() as locks:
            beats = [locks.enter_context(cluster_lock(self.client, self.errors, f"reindex:{name}",
                                                      f"a reindex or restore of {name!r}")) for name in sorted(stored)]
            with _beating(beats, "; the restore had finished by then"):
                return self._restore(snapshot, repo, stored, knn, graphs, replace, t0)

    def _restore(self, snapshot: str, repo: str, stored: dict[str, str], knn: dict[str, str],
                 graphs: dict[str, str], replace: bool, t0: float) -> dict[str, Any]:
        """`snapshot_restore` once it holds the indices' locks."""
        present = {ix.name: ix for ix in self.indices() if ix.name in stored}
        if present and not replace:
            raise ConfigError(f"index {', '.join(sorted(present))} exists at {self.url}; pass --yes to replace it")
        restored: dict[str, str] = {}
        with self.errors("restore snapshot"):
            # before anything changes: the engine each index was made with (not known for a snapshot
            # made before it was recorded), and the one the templates put back name
            for name, engine in sorted(knn.items()):
                check_native_knn(self.client, engine, f"snapshot {snapshot!r}: index {name!r} (k-NN engine "
                                 f"{engine!r})", "restore it on a cluster that has them")
            check_native_knn(self.client, self.settings.opensearch_knn_engine)
            targets: dict[str, str] = {}
            for name, concrete in stored.items():
                taken = [v.version for v in present[name].versions] if name in present else []
                m = VERSIONED.match(concrete)
                targets[name] = concrete if m is None or int(m["version"]) not in taken \
                    else f"{name}-v{max(taken) + 1}"
            held = [n for name, target in sorted(targets.items())
                    for n in [target, *([] if name in present else [name, f"{name}-write"])]
                    if self.client.indices.exists(index=n, expand_wildcards="all")]
            if held:
                raise ConfigError(f"snapshot {snapshot!r}: {', '.join(held)} at {self.url} is taken by an index or "
                                  "alias that is not a hybridsearch index to replace; delete or rename it first")
        for name, target in targets.items():
            try:
                self._restore_one(snapshot, repo, name, stored[name], target, present.get(name), graphs.get(name))
            except BaseException as e:
                done = f", after {', '.join(f'{k} ({v})' for k, v in restored.items())}" if restored else ""
                _add_to(e, f"; restoring {name!r} from snapshot {snapshot!r}{done}")
                raise
            restored[name] = target
        return {"snapshot": snapshot, "repository": repo, "indices": restored, "replaced": sorted(present),
                "seconds": time.perf_counter() - t0}

    def _restore_one(self, snapshot: str, repo: str, name: str, concrete: str, target: str,
                     ix: LogicalIndex | None, graph: str | None) -> None:
        """Restore `concrete` from the snapshot as `target` and make it logical index `name`,
        replacing `ix`'s versions; on failure `target` is deleted and the old versions unblocked.
        Then the graph index: the snapshot's `graph` replaces the one there, and without one in
        the snapshot (none built, or built on the chunks) the one there goes with what it was
        built for."""
        old = [v.index for v in ix.versions] if ix else []
        sent = swap_sent = False
        try:
            with self.errors("restore snapshot"):
                if old:
                    self.client.indices.add_block(index=",".join(old), block="write")
                sent = True
                self.client.snapshot.restore(repository=repo, snapshot=snapshot, body={
                    "indices": concrete, "include_aliases": False, "include_global_state": False,
                    "rename_pattern": f"^{re.escape(concrete)}$", "rename_replacement": target,
                    # a snapshot taken while a reindex copied the index must not come back blocked
                    "index_settings": {"index.blocks.write": False}},
                    params={"wait_for_completion": "true",
                            "request_timeout": self.settings.opensearch_snapshot_timeout})
                self.client.cluster.health(index=target, wait_for_status="yellow")
                meta = self._meta_for(target, target)
                meta["hybridsearch"].pop("reindexed_from", None)  # where the snapshot's version came from
                meta["hybridsearch"]["restored_from"] = f"{repo}:{snapshot}"
                self.client.indices.put_mapping(index=target, body={"_meta": meta})
                actions: list[dict[str, Any]] = []
                for v in ix.versions if ix else []:
                    actions += [{"remove": {"index": v.index, "alias": a}} for a in v.aliases
                                if a in (name, f"{name}-write")]
                actions += [{"add": {"index": target, "alias": name}},
                            {"add": {"index": target, "alias": f"{name}-write", "is_write_index": True}}]
                swap_sent = True
                self.client.indices.update_aliases(body={"actions": actions})
        except BaseException as e:
            self._settle_swap(e, name, target, swap_sent, lambda err: self._undo_restore(target, old, sent, err))
            if not isinstance(e, Exception):  # interrupted: the old versions stay, for `indices prune`
                raise
            _log.warning("restore of %s: %s; its aliases moved to %s, so it goes on", name, e, target)
        with self.errors("restore snapshot"):
            if old:
                self.client.indices.delete(index=",".join(old))
            apply_chunk_templates(self.client, name, self.settings.opensearch_knn_engine,
                                  self.settings.opensearch_vector_compression)
            self.client.indices.delete(index=Q.graph_index(name), ignore=404)
            if graph is not None:
                self.client.snapshot.restore(repository=repo, snapshot=snapshot, body={
                    "indices": graph, "include_aliases": False, "include_global_state": False},
                    params={"wait_for_completion": "true",
                            "request_timeout": self.settings.opensearch_snapshot_timeout})
                self.client.cluster.health(index=graph, wait_for_status="yellow")

    def _undo_restore(self, target: str, old: list[str], sent: bool, e: BaseException) -> None:
        """A failed restore: delete `target` and lift the write block from `old`, saying in `e`
        what was done (or what is left to do by hand)."""
        # deleting the index ends a restore still under way; one whose request went unanswered (a
        # timeout) may not have made it yet
        cause = e.__cause__
        answered = isinstance(cause, opensearchpy.exceptions.TransportError) and isinstance(cause.status_code, int)
        deadline = time.monotonic() + (10.0 if sent and not answered else 0.0)
        undone = []
        try:
            while not self.client.indices.exists(index=target) and time.monotonic() < deadline:
                time.sleep(0.1)
            self.client.indices.delete(index=target, ignore=404)
            undone.append(f"the partial {target} was deleted")
        except Exception:
            undone.append(f"deleting the partial {target} failed too: delete it by hand")
        try:
            for index in old:
                self._unblock(index)
            if old:
                undone.append(f"{', '.join(old)} left as they were")
        except Exception:
            undone.append(f"lifting the write block on {', '.join(old)} failed too: lift it by hand")
        _add_to(e, f"; {' and '.join(undone)}")
