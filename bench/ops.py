"""Operations on a real OpenSearch node, measured on a BEIR dataset; prints tables.

    python bench/ops.py DATASET [--url URL] [--queries N]

The logical index `bench-ops-<dataset>-<random>` holds the documents, MiniLM vectors and HDC codes
(vectors from the embedded index cached in `.hybridsearch/bench/<dataset>`, built once) and the
citation graph.

1. Merge: `Admin.merge` drops the replaced copies the graph build left; counts, time (the wait for
   the retention leases included) and store size.
2. Reindex under load: the index is reindexed with `Admin.reindex` while one thread runs the
   `hybrid` profile over the dataset's queries through the read alias: time, searches served,
   failures, empty results for queries that had hits, and latency during against before.
3. Snapshot and restore: create a snapshot, delete the index, restore it; times and counts.
4. Query-log overhead: the `hybrid` profile one query at a time, alternating blocks with and
   without the query log (OpenSearch daily index), p50 each. The records go to daily indices of
   the run's own, `bench-ops-<random>-queries-YYYY.MM.DD` (HYBRIDSEARCH_QUERY_LOG_PREFIX for this
   log only), never into the deployment's query log.

Whatever happens, the index, the snapshot and its repository, and the run's query-log indices and
template are deleted at the end; a cleanup step that fails is a warning.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import cleanup, dataset_dir, node_version, positive_int, run_main  # noqa: E402

from hybridsearch.config import Settings, get_settings  # noqa: E402
from hybridsearch.embeddings import default_encoder  # noqa: E402
from hybridsearch.engines.opensearch.admin import Admin  # noqa: E402
from hybridsearch.metrics import percentile  # noqa: E402
from indexer.loaders import load_queries  # noqa: E402
from query_service.evaluate import prepare_index  # noqa: E402
from query_service.parity import copy_corpus  # noqa: E402
from query_service.querylog import OpenSearchSink, QueryLog, delete_log  # noqa: E402
from query_service.searcher import Searcher, get_profile  # noqa: E402


def table(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"\n{title}")
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=dataset_dir)
    ap.add_argument("--url", default=get_settings().opensearch_url)
    ap.add_argument("--queries", type=positive_int, default=300)
    args = ap.parse_args()
    if not args.url:
        ap.error("pass --url or set HYBRIDSEARCH_OPENSEARCH_URL")
    node_version(args.url)  # before the model loads: an unreachable node is one error line
    ds = args.dataset
    tag = uuid.uuid4().hex[:6]
    slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in ds.resolve().name.lower()).strip("-_") or "dataset"
    name = f"bench-ops-{slug}-{tag}"
    log_settings = get_settings().model_copy(update={"query_log_prefix": f"bench-ops-{tag}-queries-"})
    admin = Admin(args.url)
    state = Run(admin, name, log_settings.query_log_prefix)
    try:
        bench(ds, args.queries, state, log_settings)
    finally:
        state.clean_up()


class Run:
    """What one run made on the node, for the cleanup at its end."""

    def __init__(self, admin: Admin, name: str, log_prefix: str) -> None:
        self.admin, self.name, self.log_prefix = admin, name, log_prefix
        self.repo: str | None = None
        self.snapshot: str | None = None
        self.closers: list[tuple[str, Callable[[], object]]] = []

    def clean_up(self) -> None:
        """Each step on its own (a failure is a warning): searchers and their query log first, so that
        no record lands after its index is gone."""
        admin, client = self.admin, self.admin.client
        for what, close in reversed(self.closers):
            cleanup(what, close)
        if self.repo is not None:
            if self.snapshot is not None:
                cleanup(f"delete snapshot {self.snapshot}",
                        lambda: client.snapshot.delete(repository=self.repo, snapshot=self.snapshot, ignore=404))
            cleanup(f"delete snapshot repository {self.repo}",
                    lambda: client.snapshot.delete_repository(repository=self.repo, ignore=404))
        cleanup(f"delete index {self.name}",
                lambda: any(ix.name == self.name for ix in admin.indices()) and admin.delete(self.name))
        cleanup(f"delete the query log {self.log_prefix}* (its indices and template)",
                lambda: delete_log(client, self.log_prefix))
        cleanup("close the OpenSearch client", admin.close)


def bench(ds: Path, nq: int, run: Run, log_settings: Settings) -> None:
    admin, name = run.admin, run.name
    encoder = default_encoder()
    embedded = prepare_index(ds, Path(".hybridsearch/bench") / ds.resolve().name, need_vectors=True,
                             encoder=encoder, progress=True, log=print)
    try:
        engine = admin.engine(name)
        run.closers.append(("close the engine", engine.close))
        write_s = copy_corpus(ds, embedded, engine, log=print)
    finally:
        embedded.close()
    texts = [q.text for q in load_queries(ds)][:nq]
    hybrid = get_profile("hybrid")
    searcher = Searcher(engine, encoder=encoder)
    run.closers.append(("close the searcher", searcher.close))
    for q in texts[:20]:
        searcher.search(q, hybrid)  # warm-up
    had_hits = {}
    before_ms = []
    for q in texts:
        t = time.perf_counter()
        had_hits[q] = bool(searcher.search(q, hybrid).hits)
        before_ms.append((time.perf_counter() - t) * 1000)

    # 1. merge away the replaced copies the graph build left
    live = admin.get(name).live
    assert live is not None
    merged = admin.merge(name)
    time.sleep(11)  # store sizes are cached for 10 s (index.store.stats_refresh_interval)
    after = admin.get(name).live
    assert after is not None
    table(f"merge: {name} after its graph build", [
        ("replaced copies before / dropped / left", f"{live.deleted} / {merged.dropped} / {merged.remaining}"),
        ("merge time (retention wait included)", f"{merged.seconds:.1f} s"),
        ("store size before / after", f"{live.bytes / 2**20:.1f} / {after.bytes / 2**20:.1f} MiB"),
    ])

    # 2. reindex under load
    stop = threading.Event()
    during_ms: list[float] = []
    failures: list[str] = []
    empty = [0]

    def load() -> None:
        i = 0
        while not stop.is_set():
            q = texts[i % len(texts)]
            t = time.perf_counter()
            try:
                if not searcher.search(q, hybrid).hits and had_hits[q]:
                    empty[0] += 1
            except Exception as e:
                failures.append(str(e))
            during_ms.append((time.perf_counter() - t) * 1000)
            i += 1

    docs = engine.count()
    th = threading.Thread(target=load)
    th.start()
    try:
        res = admin.reindex(name)
    finally:
        stop.set()
        th.join()
    table(f"reindex under load: {name}, {docs} documents with vectors and HDC codes (written in {write_s:.1f} s)", [
        ("reindex time (create, copy, verify, swap)", f"{res.seconds:.1f} s ({res.old} -> {res.new})"),
        ("copy rate", f"{res.docs / res.seconds:.0f} docs/s"),
        ("hybrid searches served during it", f"{len(during_ms)}"),
        ("failed searches", f"{len(failures)}" + (f" (first: {failures[0]})" if failures else "")),
        ("empty results for queries that had hits", f"{empty[0]}"),
        ("hybrid p50 / p95 before", f"{percentile(before_ms, 50):.1f} / {percentile(before_ms, 95):.1f} ms"),
        ("hybrid p50 / p95 during", f"{percentile(during_ms, 50):.1f} / {percentile(during_ms, 95):.1f} ms"),
        ("count before / after", f"{docs} / {engine.count()}"),
    ])
    admin.prune(name, keep=1)

    # 3. snapshot, delete, restore
    repo = run.repo = f"bench-ops-{uuid.uuid4().hex[:6]}"
    admin.repo_add(repo)
    t = time.perf_counter()
    run.snapshot = "bench"
    snap = admin.snapshot_create("bench", repo, [name])
    create_s = time.perf_counter() - t
    admin.delete(name)
    t = time.perf_counter()
    admin.snapshot_restore("bench", repo)
    restore_s = time.perf_counter() - t
    st = engine.stats()
    table("snapshot and restore (fs repository on the node's disk)", [
        ("snapshot create (wait_for_completion)", f"{create_s:.2f} s ({snap['indices'][name]})"),
        ("delete, then restore with aliases", f"{restore_s:.2f} s"),
        ("documents / vectors / codes after restore", f"{st.documents} / {st.vectors} / {st.codes}"),
    ])
    admin.client.snapshot.delete(repository=repo, snapshot="bench")
    run.snapshot = None
    admin.client.snapshot.delete_repository(repository=repo)
    run.repo = None

    # 4. query-log overhead: alternating blocks, the same queries
    log = QueryLog(OpenSearchSink(engine.raw_url, log_settings))
    logged = Searcher(engine, encoder=encoder, query_log=log)
    run.closers.append(("close the logged searcher", logged.close))
    plain_ms: list[float] = []
    log_ms: list[float] = []
    for block in range(0, len(texts), 25):
        for s, out in ((searcher, plain_ms), (logged, log_ms)):
            for q in texts[block:block + 25]:
                t = time.perf_counter()
                s.search(q, hybrid)
                out.append((time.perf_counter() - t) * 1000)
    logged.close()
    p_plain, p_log = percentile(plain_ms, 50), percentile(log_ms, 50)
    table(f"query-log overhead, hybrid, {len(texts)} queries each, one at a time", [
        ("p50 without the query log", f"{p_plain:.2f} ms"),
        ("p50 with the query log", f"{p_log:.2f} ms ({p_log - p_plain:+.2f} ms)"),
        ("records written / dropped / failed", f"{log.written} / {log.dropped} / {log.failed}"),
    ])


if __name__ == "__main__":
    run_main(main)
