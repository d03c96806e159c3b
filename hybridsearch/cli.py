"""The `hybridsearch` command. Subcommands import services lazily so that start-up stays fast."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sqlite3
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hybridsearch import __version__
from hybridsearch.errors import ConfigError, HybridSearchError, IndexNotFoundError

if TYPE_CHECKING:
    from hybridsearch.engines import Engine

DEMO_QUERIES = ("qa-05", "qb-01", "qb-09", "qc-01", "qa-12", "qc-07", "qa-ood-1")
CHUNK = 256  # chunks per worker task when --chunk is not given


def _index_dir(args: argparse.Namespace) -> Path:
    from hybridsearch.config import get_settings

    path = Path(args.index_dir) if args.index_dir else get_settings().index_dir
    if path.exists() and not path.is_dir():
        raise HybridSearchError(f"--index-dir {path}: a file, not an index directory")
    return path


def demo_dir() -> Path:
    """The bundled demo corpus (BEIR layout) inside the installed package."""
    return Path(str(resources.files("hybridsearch") / "data" / "demo"))


def _open(args: argparse.Namespace, *, must_exist: bool = True) -> Engine:
    """The engine the command names: `--engine embedded` (an index directory, the default) or
    `--engine opensearch` (`--url`, default $HYBRIDSEARCH_OPENSEARCH_URL; logical index `--index`)."""
    from hybridsearch.engines import open_engine

    if _engine_name(args) == "opensearch":
        url, index = _opensearch_target(args)
        engine = open_engine(url, index=index)
        from hybridsearch.engines.opensearch.engine import OpenSearchEngine

        if must_exist and isinstance(engine, OpenSearchEngine):
            try:
                found = engine.exists()
            except BaseException:
                engine.close()
                raise
            if not found:
                engine.close()
                raise IndexNotFoundError(f"no index {index!r} at {engine.url}; ingest into it first")
        return engine
    return open_engine(str(_existing_index_dir(args) if must_exist else _index_dir(args)))


def _replaced_note(engine: Engine, args: argparse.Namespace) -> list[str]:
    """On OpenSearch, a line on the replaced copies of chunks that updates left (they count in
    BM25's statistics until merged away); nothing on the embedded engine, which has none."""
    if _engine_name(args) != "opensearch":
        return []
    try:
        details = engine.stats().details
    except HybridSearchError:  # advice only: the work is done (an ingest that indexed nothing has no index)
        return []
    if not details.get("lucene_deleted"):
        return []
    return [f"{details['lucene_deleted']} replaced copies of chunks count in BM25's statistics until "
            f"`hybridsearch indices merge {details['index']}` drops them (about 30 s)"]


def _existing_index_dir(args: argparse.Namespace) -> Path:
    index_dir = _index_dir(args)
    if not (index_dir / "store.sqlite").exists():
        raise HybridSearchError(f"no index at {index_dir}; run `hybridsearch ingest PATH` first")
    return index_dir


def _engine_name(args: argparse.Namespace) -> str:
    """opensearch (with --url, or --engine opensearch) or embedded; --index with the embedded
    engine is refused rather than ignored (the embedded index is the directory)."""
    name = "opensearch" if getattr(args, "url", None) else getattr(args, "engine", "embedded")
    if name == "embedded" and getattr(args, "index", None):
        raise HybridSearchError(f"--index {args.index} names an OpenSearch index, and the engine is embedded (its "
                                "index is --index-dir); pass --url, or --engine opensearch with "
                                "HYBRIDSEARCH_OPENSEARCH_URL")
    return name


def _opensearch_target(args: argparse.Namespace, default_index: str | None = None) -> tuple[str, str]:
    from hybridsearch.config import get_settings

    settings = get_settings()
    url = getattr(args, "url", None) or settings.opensearch_url
    if not url:
        raise HybridSearchError("no OpenSearch URL: pass --url or set HYBRIDSEARCH_OPENSEARCH_URL "
                                "(`hybridsearch opensearch start` runs a local node and prints its URL)")
    from hybridsearch.engines.opensearch.engine import check_urls

    check_urls(url)
    return url, getattr(args, "index", None) or default_index or settings.opensearch_index


def _port_from(value: str, lowest: int) -> int:
    if not (value.isascii() and value.isdigit()) or not lowest <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from {lowest} to 65535, got {value!r}")
    return int(value)


def _port(value: str) -> int:
    """A port to listen on, 0 for any free one."""
    return _port_from(value, 0)


def fixed_port(value: str) -> int:
    """A port to listen on that a client can be told in advance (1..65535: not 0, any free one)."""
    return _port_from(value, 1)


def seconds(value: str) -> float:
    """A duration: a finite number of seconds above 0."""
    try:
        s = float(value)
    except ValueError:
        s = math.nan
    if not math.isfinite(s) or s <= 0:
        raise argparse.ArgumentTypeError(f"a number of seconds above 0, got {value!r}")
    return s


def _channels(value: str | None) -> list[str]:
    return [c.strip() for c in (value or "").replace("+", ",").split(",") if c.strip()]


def cmd_ingest(args: argparse.Namespace) -> int:
    from hybridsearch.embeddings import default_encoder
    from hybridsearch.engines import GraphStore
    from indexer.pipeline import ingest

    if not Path(args.path).exists():
        raise HybridSearchError(f"{args.path}: no such file or directory")
    celery = args.executor == "celery"
    if celery:
        from workers.celery_app import check_broker, redis_url

        check_broker(redis_url())
    engine = _open(args, must_exist=args.command == "update")
    code = 0
    try:
        enc = None if args.no_embed or celery else default_encoder()
        t0 = time.perf_counter()
        summary = ingest(engine, Path(args.path), loader=args.loader, strict=args.strict,
                         encoder=enc, hdc=not celery, graph=not celery, progress=not args.quiet)
        if celery:  # vectors, codes and the graph by the workers: the same functions, in batches
            from indexer.pipeline import missing_vector_ids
            from workers.tasks import start

            target, index = _worker_target(args)
            started = [] if args.no_embed else [start("embed", target, index, missing_vector_ids(engine), args.chunk)]
            started.append(start("hdc", target, index, [i for i, _ in engine.missing_codes()], args.chunk))
            started.append(start("graph", target, index, [], args.chunk))
            code, done = _follow_jobs(started, args.quiet)
            if _engine_name(args) != "opensearch":  # on OpenSearch the workers wrote to the node
                engine.stats()  # the owner applies what the workers journaled
            summary.embedded = 0 if args.no_embed else done[0]
            summary.graph = engine.graph_summary() if isinstance(engine, GraphStore) else None
            summary.graph_built = summary.graph is not None
            summary.seconds = time.perf_counter() - t0  # the workers' jobs included
        note = _replaced_note(engine, args)
    finally:
        engine.close()
    print("\n".join(summary.lines() + note))
    return code or (1 if summary.rejected and args.strict else 0)


def cmd_delete(args: argparse.Namespace) -> int:
    from hybridsearch.api import delete

    if not args.ids and not args.work:
        raise HybridSearchError("name chunk ids to delete, or --work WORK_ID")
    engine = _open(args)
    try:
        deleted, missing = delete(engine, args.ids, args.work or [])
    finally:
        engine.close()
    shown = ", ".join(missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
    if missing and not deleted:
        raise HybridSearchError(f"nothing deleted: not found: {shown}")
    print(f"deleted {len(deleted)} chunks" + (f"; not found: {shown}" if missing else ""))
    return 0


def _parse_sets(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise HybridSearchError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _print_explain(result: Any) -> None:
    d = result.diagnostics
    if "intent" in d:
        it = d["intent"]
        asks = f"; asks for recent work ({it['recency']!r})" if "recency" in it else ""
        print(f"  intent {it['name']} ({it['rule']}); focus: {it['focus']}{asks}")
    stages = d.get("stages", {})
    for name, stage in stages.items():
        for key in ("degraded", "low_confidence"):
            if key in stage:
                print(f"  {name}: {key.replace('_', ' ')}: {stage[key]}")
    terms = stages.get("symbolic", {}).get("terms", [])
    if terms:
        print("  symbolic expansion terms: " + "; ".join(f"{t['term']} (hop {t['hop']}, {t['weight']:.3f})"
                                                         for t in terms))
    for h in result.hits:
        parts = " + ".join(f"{c} {v:.4f}" for c, v in h.contributions.items())
        chans = ", ".join(f"{c}: raw {cs.raw:.4f}, norm {cs.normalized:.3f}, rank {cs.rank}"
                          for c, cs in h.channels.items())
        comps = ", ".join(f"{c} {v:.3f}" for c, v in h.components.items())
        tail = f"  components: {comps}" if comps else ""
        print(f"  {h.rank:>3}  {h.id}: {h.score:.4f} = {parts}   [{chans}]{tail}")
        if h.via:
            print(f"       reached by symbolic expansion: {h.via}")


def _print_hits(result: Any, show_title: bool = True) -> None:
    if not result.hits:
        print(f"  (no results: {result.diagnostics.get('reason', 'nothing matched')})")
        return
    channels = sorted({c for h in result.hits for c in h.channels})
    head = f"  {'#':>3}  {'score':>8}  " + "  ".join(f"{c + ' (rank)':>16}" for c in channels) + "  id / title"
    print(head)
    for h in result.hits:
        cells = []
        for c in channels:
            cs = h.channels.get(c)
            cells.append(f"{'-':>16}" if cs is None else f"{cs.raw:>9.4f} ({cs.rank:>3})")
        title = f"  {h.document.title[:60]}" if show_title and h.document is not None else ""
        print(f"  {h.rank:>3}  {h.score:>8.4f}  " + "  ".join(cells) + f"  {h.id}{title}")


def _profile_for(args: argparse.Namespace) -> Any:
    from query_service.searcher import adhoc_profile, get_profile

    if args.channels is not None:
        return adhoc_profile(_channels(args.channels), args.fuser or "rrf", args.k or 10)
    if args.fuser is not None:
        raise HybridSearchError(f"--fuser {args.fuser} picks the fuser of --channels; a profile has its own "
                                "(--set fuser.<param>=VALUE tunes it)")
    return get_profile(args.profile)


def _filters(args: argparse.Namespace) -> Any:
    """The search filters the options name (None when none)."""
    from hybridsearch.errors import ValidationError
    from hybridsearch.models import DateRange, Filters

    dates = DateRange(gte=args.date_from, lte=args.date_to) if args.date_from or args.date_to else None
    if dates is not None:
        try:
            dates.bounds()  # checked here, to name the options
        except ValidationError as e:
            raise HybridSearchError(f"--date-from/--date-to: {e.message}") from e
    f = Filters(date_range=dates, subjects=args.subject, sources=args.source, kind=args.kind, license=args.license)
    return None if f.is_empty() else f


def _worker_target(args: argparse.Namespace) -> tuple[str, str | None]:
    """What a worker opens: an OpenSearch URL without credentials (workers take theirs from
    their own settings) and the logical index, or the index directory."""
    if _engine_name(args) == "opensearch":
        from hybridsearch.engines.opensearch.engine import display_url

        url, index = _opensearch_target(args)
        return display_url(url), index
    return str(_index_dir(args).resolve()), None


class _StallWatch:
    """Says once, on stderr, when a followed job has made no progress for
    HYBRIDSEARCH_WORKER_STALL_WARNING seconds, and whether any worker consumes its queue."""

    def __init__(self, queue: str) -> None:
        from hybridsearch.config import get_settings

        self.queue, self.after = queue, get_settings().worker_stall_warning
        self.last: tuple[int, int, int] | None = None
        self.since = time.monotonic()
        self.warned = False

    def check(self, st: Any) -> None:
        now, seen = time.monotonic(), (st.done, st.failed, st.docs_done)
        if seen != self.last:
            self.last, self.since, self.warned = seen, now, False
        elif not self.warned and now - self.since >= self.after:
            self.warned = True
            import redis
            from kombu.exceptions import OperationalError

            from workers.celery_app import app

            try:
                queues = app.control.inspect(timeout=1.0).active_queues() or {}
            except (OperationalError, redis.RedisError, OSError):  # a broker error here only weakens the hint
                queues = {}
            consumers = [w for w, qs in queues.items() if any(q.get("name") == self.queue for q in qs)]
            hint = (f"{len(consumers)} worker(s) consume the {self.queue} queue (busy with other jobs?)" if consumers
                    else f"no worker consumes the {self.queue} queue: start one with `hybridsearch worker`")
            print(f"warning: job {st.id} has made no progress for {self.after:.0f} s; {hint}. Still waiting "
                  "(Ctrl-C stops waiting; the job goes on)", file=sys.stderr, flush=True)


def _follow_jobs(job_ids: list[str], quiet: bool, as_json: bool = False) -> tuple[int, list[int]]:
    """Progress bars fed from the jobs' state in Redis until they end, then a line on each (with
    `as_json`, its state as `jobs --json` shows it); returns 1 if a batch was dead-lettered
    (saying how to retry), else 0, and the chunks each job did."""
    from tqdm import tqdm

    from workers import jobs
    from workers.celery_app import redis_url

    r = jobs.client(redis_url())
    code = 0
    done: list[int] = []
    for job in job_ids:
        st = jobs.state(r, job)
        by_batch = st.kind == "graph"  # one batch over the whole index
        bar = tqdm(desc=f"{st.kind} (celery)", total=st.batches if by_batch else st.docs,
                   unit="batch" if by_batch else "doc", disable=quiet, leave=False)

        stall = _StallWatch(st.kind)

        def show(st: jobs.JobState, bar: tqdm = bar, by_batch: bool = by_batch,  # type: ignore[type-arg]
                 stall: _StallWatch = stall) -> None:
            bar.n = st.done if by_batch else min(st.docs_done + st.docs_partial, st.docs)
            bar.set_postfix_str(f"batches {st.done}/{st.batches}, failed {st.failed}", refresh=True)
            stall.check(st)

        try:
            st = jobs.follow(r, job, show)
        finally:
            bar.close()
        what = "" if by_batch else f"{st.docs_done} of {st.docs} chunks in "
        print(json.dumps(st.as_dict()) if as_json else
              f"job {job}: {st.kind}, {what}{st.done} of {st.batches} batches, {st.seconds:.1f}s, {st.status}")
        if st.failed:
            first = next(iter(jobs.failures(r, job).values()), "")
            print(f"error: {st.failed} batches of job {job} were dead-lettered (first: {first}); after fixing the "
                  f"cause run `hybridsearch jobs retry {job} --wait`", file=sys.stderr)
            code = 1
        done.append(st.docs_done)
    return code, done


def cmd_embed(args: argparse.Namespace) -> int:
    from hybridsearch.embeddings import default_encoder
    from indexer.pipeline import embed_missing, missing_vector_ids

    engine = _open(args)
    try:
        if args.enqueue:
            from workers.celery_app import check_broker, redis_url
            from workers.tasks import start

            check_broker(redis_url())  # one clear line, not a publish that retries for minutes
            target, index = _worker_target(args)
            ids = missing_vector_ids(engine)
        else:
            n = embed_missing(engine, default_encoder(), progress=not args.quiet)
            note = _replaced_note(engine, args)
    finally:
        engine.close()  # with --enqueue the workers do the rest; this process only follows them
    if args.enqueue:
        job = start("embed", target, index, ids, args.chunk)
        print(f"queued {len(ids)} chunks in {-(-len(ids) // args.chunk)} tasks (job {job})", flush=True)
        return _follow_jobs([job], args.quiet)[0] if args.wait else 0
    print("\n".join([f"embedded {n} chunks", *note]))
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    from indexer.pipeline import graph_at, graph_line, open_target

    if args.enqueue:
        from workers.celery_app import check_broker, redis_url
        from workers.tasks import start

        check_broker(redis_url())
        target, index = _worker_target(args)
        with open_target(target, index):  # the index exists: say so here rather than in a dead letter
            pass
        job = start("graph", target, index, [], 1, force=args.force)
        if not args.json:
            print(f"queued the citation graph (job {job})", flush=True)
        if args.wait:
            return _follow_jobs([job], args.quiet, as_json=args.json)[0]
        if args.json:  # the job's state, as `jobs --json` shows it
            from workers import jobs

            print(json.dumps(jobs.state(jobs.client(redis_url()), job).as_dict()))
        return 0
    if _engine_name(args) == "opensearch":
        url, index = _opensearch_target(args)
        summary, built = graph_at(url, index, force=args.force)
    else:
        summary, built = graph_at(str(_index_dir(args)), force=args.force)
    print(json.dumps({**summary.as_dict(), "built": built}) if args.json else graph_line(summary, built))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from hybridsearch.config import get_settings
    from hybridsearch.embeddings import usable_cores

    workers = args.workers if args.workers is not None else get_settings().http_workers or usable_cores()
    if workers < 1:
        raise HybridSearchError(f"--workers must be >= 1, got {workers}")
    if not Path(args.keys).is_file():
        raise HybridSearchError(f"--keys {args.keys}: no keys file; `hybridsearch keys add NAME --file "
                                f"{args.keys}` makes one")
    from query_service.keys import KeyStore

    KeyStore(Path(args.keys)).list()  # a file it cannot read is one line here, not a 503 on every request
    if _engine_name(args) == "opensearch":
        url, index = _opensearch_target(args)
        spec = {"target": url, "index": index, "options": {"index": index}}
    else:
        index_dir = _existing_index_dir(args).resolve()
        spec = {"target": str(index_dir), "index": index_dir.name, "options": {}}
    _check_listen(args.host, args.port, workers)
    print(f"serving {spec['index']} on http://{args.host}:{args.port} ({workers} worker(s)); ready when "
          f"/readyz answers 200", file=sys.stderr, flush=True)
    _share_cores(workers)
    from query_service.http import NoDelayH11

    with tempfile.TemporaryDirectory(prefix="hybridsearch-serve-") as shared:  # the workers' rate limits, metrics
        if workers > 1:  # each process keeps its metrics there, and /metrics adds them up (read when they start)
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(Path(shared, "metrics"))
            Path(shared, "metrics").mkdir()
        os.environ["HYBRIDSEARCH_SERVE_SPEC"] = json.dumps({**spec, "keys": str(Path(args.keys).resolve()),
                                                           "rates": str(Path(shared) / "rates.sqlite")})
        uvicorn.run("query_service.http:app_from_env", factory=True, host=args.host, port=args.port,
                    workers=workers, http=NoDelayH11, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=int(get_settings().http_shutdown_grace))
    return 0


def _check_listen(host: str, port: int, workers: int = 1) -> None:
    """One error line now if the server could not listen on host:port (a port in use, an address
    not of this machine), rather than uvicorn's own, after the start-up. Binds as the server will:
    one worker binds every address the host name resolves to (`localhost`: 127.0.0.1 and ::1), but
    those of a family this machine lacks, as asyncio does; several workers share one socket that
    uvicorn binds itself, IPv6 only for an address with a colon. A port taken between this check
    and the server's bind still gets uvicorn's."""
    import errno
    import socket

    try:
        addresses: list[tuple[Any, ...]]
        if workers > 1:
            addresses = [(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, 0, "", (host, port))]
        else:
            addresses = list(dict.fromkeys(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)))
        for family, kind, proto, _, addr in addresses:
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # no such family here (IPv6 turned off): the server skips it too
                if len(addresses) > 1:
                    continue
                raise
            with sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
                if family == socket.AF_INET6 and workers == 1:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds
                sock.bind(addr)
    except socket.gaierror as e:
        raise HybridSearchError(f"--host {host}: not an address to listen on ({e.strerror})") from e
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise HybridSearchError(f"--port {port}: {host}:{port} is in use; pick another port") from e
        raise HybridSearchError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from e


def cmd_keys(args: argparse.Namespace) -> int:
    from query_service.keys import KeyStore

    store = KeyStore(Path(args.file))
    if args.action != "add" and not store.path.is_file():  # only `add` makes the file
        raise HybridSearchError(f"--file {args.file}: no keys file; `hybridsearch keys add NAME --file "
                                f"{args.file}` makes one")
    if args.action == "add":
        rights = _channels(args.rights)
        indices = _channels(args.indices)
        if args.indices is not None and not indices:  # an empty variable must not grant every index
            raise ConfigError(f"--indices {args.indices!r} names no index; leave it out to allow all")
        key = store.add(args.name, rights, indices or None)
        print(f"key {args.name!r} added (rights: {', '.join(rights)}); it is shown once, here:", file=sys.stderr)
        print(key)
    elif args.action == "revoke":
        store.revoke(args.name)
        print(f"key {args.name!r} revoked")
    else:
        keys = store.list()
        if args.json:
            print(json.dumps([{"name": k.name, "rights": list(k.rights), "indices": k.indices, "created": k.created,
                               "revoked": k.revoked} for k in keys], indent=2))
        else:
            for k in keys:
                print(f"{k.name:<24} {','.join(k.rights):<18} {','.join(k.indices or ['*']):<24} "
                      f"{'revoked' if k.revoked else 'live'}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from workers import jobs
    from workers.celery_app import check_broker, redis_url

    url = redis_url()
    check_broker(url)
    if args.action == "retry":
        from workers.tasks import retry

        n = retry(args.job)
        print(f"sent {n} unfinished batches of job {args.job} again" if n else
              f"job {args.job} has no unfinished batches", flush=True)
        return _follow_jobs([args.job], args.quiet)[0] if args.wait and n else 0
    states = jobs.jobs(jobs.client(url))
    if args.json:
        print(json.dumps([s.as_dict() for s in states], indent=2))
    elif not states:
        print("no jobs")
    else:
        print(f"{'job':<32} {'kind':<6} {'status':<8} {'batches':>12} {'failed':>6} {'chunks':>14} "
              f"{'seconds':>8}  target")
        for st in states:
            print(f"{st.id:<32} {st.kind:<6} {st.status:<8} {f'{st.done}/{st.batches}':>12} {st.failed:>6} "
                  f"{f'{st.docs_done}/{st.docs}':>14} {st.seconds:>8.1f}  {st.target}"
                  + (f" [{st.index}]" if st.index else ""))
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from query_service.querylog import open_query_log
    from query_service.searcher import Searcher, check_k

    engine = _open(args)
    try:
        searcher = Searcher(engine, query_log=open_query_log(engine), origin="cli")
    except BaseException:
        engine.close()
        raise
    try:
        profile = _profile_for(args).with_overrides(_parse_sets(args.set))
        loaded = None
        if args.query.strip() and (args.k is None or check_k(args.k)):  # a bad request fails before the load
            loaded = _load_encoder(profile, searcher)
        result = searcher.search(args.query, profile, k=args.k, with_documents=True, filters=_filters(args),
                                 intent=args.intent)
        if args.json:
            print(result.model_dump_json(indent=2), flush=True)
        else:
            took = "" if loaded is None else f"; the embedding model loaded in {loaded:.1f} s before it"
            print(f"query: {args.query}   ({result.diagnostics['profile']}, {result.diagnostics['ms']:.1f} ms{took})")
            note = result.diagnostics.get("no_vectors") or result.diagnostics.get("vectors_missing")
            if note:
                print(f"note: {note}")
            _print_hits(result)
            if args.explain:
                print("explanation (final score = sum of contributions):")
                _print_explain(result)
            sys.stdout.flush()
    finally:
        searcher.close()  # writes the query-log record
        engine.close()
    return 0


def _load_encoder(profile: Any, searcher: Any) -> float | None:
    """Load the embedding model when a search with the profile will embed its query (the index
    holds vectors: the searcher remembers that, and does not ask again), so that the search's own
    time (printed and logged) is not the model's loading; its seconds, or None."""
    from hybridsearch.embeddings import default_encoder

    if not profile.embeds_query() or not searcher.holds_vectors():
        return None
    t = time.perf_counter()
    default_encoder().encode(["warm up"], query=True)
    return time.perf_counter() - t


def cmd_stats(args: argparse.Namespace) -> int:
    engine = _open(args)
    try:
        stats = engine.stats().as_dict()
    finally:
        engine.close()
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        for k, v in stats.items():
            print(f"{k:>18}: {v}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from hybridsearch.embedcache import embedding_cache

    cache = embedding_cache()
    if cache is None:
        raise HybridSearchError("the embedding cache is off (HYBRIDSEARCH_EMBEDDING_CACHE_MAX_MB=0) or cannot be "
                                "opened (see the warning above)")
    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.path}")
        return 0
    st = cache.stats()
    exports = sorted(p.name for p in cache.path.parent.glob("*.onnx"))
    if args.json:
        print(json.dumps({"path": str(st.path), "entries": st.entries, "bytes": st.bytes, "max_bytes": st.max_bytes,
                          "encoders": st.encoders, "exports": exports}, indent=2))
        return 0
    print(f"path: {st.path}\nentries: {st.entries} chunks\nsize: {st.bytes / 2**20:.1f} MB of "
          f"{st.max_bytes / 2**20:.0f} MB (least recently used entries go first)")
    for name, n in sorted(st.encoders.items()):
        print(f"  {n} chunks embedded by {name}")
    for name in exports:
        print(f"model export: {cache.path.parent / name}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from query_service.evaluate import ablation_specs, eval_index_name, format_table, plot, run_eval, run_specs

    dataset = Path(args.dataset)
    if dataset.is_file():
        raise HybridSearchError(f"{dataset}: eval needs a BEIR directory (corpus.jsonl, queries.jsonl and "
                                "qrels/<split>.tsv), not a file")
    channels = args.channels
    if not channels and not args.profiles and not args.ablation:
        channels = "bm25,dense,bm25+dense"
    if args.fuser is not None and not channels:
        raise HybridSearchError(f"--fuser {args.fuser} picks the fuser of fused --channels runs (a+b); "
                                "--profiles and --ablation runs have their own")
    specs = ablation_specs() if args.ablation else []
    if channels or args.profiles:
        specs += run_specs(channels, args.fuser or "rrf", args.profiles)
    options: dict[str, str] = {}
    if _engine_name(args) == "opensearch":
        target, options["index"] = _opensearch_target(args, eval_index_name(dataset))
    else:
        target = args.index_dir or str(Path(".hybridsearch/eval") / dataset.resolve().name)
    for option, out in (("--json", args.json), ("--plot", args.plot)):  # before the runs, not after
        if out and Path(out).is_dir():
            raise ConfigError(f"{option} {out}: a directory, not a file to write")
        if out and not Path(out).resolve().parent.is_dir():
            raise ConfigError(f"{option} {out}: no directory {Path(out).resolve().parent}")
    results = run_eval(dataset, specs, target=target, split=args.split, progress=not args.quiet,
                       log=lambda m: print(m, file=sys.stderr), engine_options=options)
    print(format_table(results))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        except OSError as e:
            raise HybridSearchError(f"--json {args.json}: cannot write it ({e.strerror or e})") from e
    if args.plot:
        plot(results, Path(args.plot), title=f"{dataset.resolve().name} ({args.split})")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from hybridsearch.config import get_settings
    from hybridsearch.engines.opensearch.admin_cli import confirm
    from query_service import querylog

    age = querylog.parse_age(args.older_than)
    log_dir = get_settings().query_log_dir
    if _engine_name(args) == "opensearch" and log_dir is None:
        from hybridsearch.engines.opensearch.admin import Admin

        admin = Admin(_opensearch_target(args)[0])
        try:
            confirm(f"delete query-log indices older than {args.older_than} at {admin.url}?", args.yes)
            with admin.errors("prune query log"):
                gone = querylog.prune_indices(admin.client, age, get_settings().query_log_prefix)
        finally:
            admin.close()
    else:  # JSONL files: HYBRIDSEARCH_QUERY_LOG_DIR, else the index directory's
        directory = log_dir or _index_dir(args) / "querylog"
        confirm(f"delete query-log files older than {args.older_than} in {directory}?", args.yes)
        gone = querylog.prune_files(directory, age)
    if args.json:
        print(json.dumps({"deleted": gone}))
    else:
        print(f"deleted {len(gone)}: {', '.join(gone)}" if gone else "nothing to prune")
    return 0


def cmd_dashboards(args: argparse.Namespace) -> int:
    from hybridsearch.config import get_settings
    from hybridsearch.dashboards import import_saved_objects
    from hybridsearch.engines.opensearch.engine import display_url

    s = get_settings()
    password = s.opensearch_password.get_secret_value() if s.opensearch_password else None
    try:
        got = import_saved_objects(args.url, corpus_index=args.corpus_index, username=s.opensearch_username,
                                   password=password, tenant=args.tenant)
    except ConfigError as e:  # the options by their names on the command line, where they were given
        corpus = "--corpus-index: " if args.corpus_index is not None else "HYBRIDSEARCH_OPENSEARCH_INDEX: "
        for param, option in (("corpus_index: ", corpus), ("tenant: ", "--tenant: ")):
            if str(e).startswith(param):
                raise ConfigError(option + str(e).removeprefix(param)) from e
        raise
    if args.json:
        print(json.dumps(got, indent=2))
    else:
        print(f"imported {got.get('successCount', 0)} saved objects into {display_url(args.url)}")
    return 0


def _share_cores(processes: int) -> None:
    """Each of `processes` processes (server or worker) embeds with its share of the cores, so that
    together they do not oversubscribe them (unless HYBRIDSEARCH_TORCH_THREADS says otherwise)."""
    from hybridsearch.embeddings import usable_cores

    os.environ.setdefault("HYBRIDSEARCH_TORCH_THREADS", str(max(1, usable_cores() // processes)))


def cmd_worker(args: argparse.Namespace) -> int:
    from hybridsearch.config import get_settings
    from workers.celery_app import QUEUES, check_broker, redis_url

    queues = _channels(args.queues) or list(QUEUES)
    unknown = [q for q in queues if q not in QUEUES]
    if unknown:
        raise HybridSearchError(f"--queues: unknown queue {', '.join(unknown)}; valid: {', '.join(QUEUES)}")
    url = redis_url()
    check_broker(url)
    from workers.celery_app import app

    concurrency = args.concurrency or get_settings().worker_concurrency or os.cpu_count() or 1
    _share_cores(concurrency)
    argv = ["worker", "--queues", ",".join(queues), "--concurrency", str(concurrency), "--loglevel", args.loglevel,
            "--hostname", args.hostname]
    app.worker_main(argv)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from hybridsearch.embeddings import default_encoder
    from indexer.loaders import load_queries
    from query_service.evaluate import format_table, prepare_index, run_eval, run_specs
    from query_service.searcher import Searcher, get_profile

    index_dir = Path(args.index_dir) if args.index_dir else Path(".hybridsearch/demo")
    data = demo_dir()
    engine = prepare_index(data, index_dir, need_vectors=True, need_codes=True, encoder=default_encoder(),
                           progress=not args.quiet)
    queries = {q.id: q for q in load_queries(data)}
    print(f"demo corpus: {engine.count()} units in {index_dir}\n")
    searcher = Searcher(engine)
    profile = get_profile("hybrid")
    try:
        for qid in DEMO_QUERIES:
            q = queries[qid]
            result = searcher.search(q.text, profile, k=args.k, with_documents=True)
            print(f"[{q.intent}] {q.text}")
            _print_hits(result)
            print()
        q = queries["qa-09"] if "qa-09" in queries else next(iter(queries.values()))
        print(f"kb-balanced (BM25, HDC when BM25 finds fewer than 7, agreement fusion): {q.text}")
        _print_hits(searcher.search(q.text, "kb-balanced", with_documents=True))
        print()
    finally:
        searcher.close()
        engine.close()
    specs = run_specs("bm25,dense,hdc,bm25+dense", "rrf", None) + run_specs("bm25+hdc", "agreement", "kb-balanced")
    results = run_eval(data, specs, target=index_dir, progress=False, log=lambda m: None)
    print("demo judgements (graded, test split):")
    print(format_table(results))
    return 0


class _Parser(argparse.ArgumentParser):
    """A usage error is one line, as every other error (subcommands' parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hybridsearch", description="Hybrid search for scientific "
                                "and mathematical corpora (embedded engine by default).")
    common = _Parser(add_help=False)
    common.add_argument("--index-dir", default=argparse.SUPPRESS,
                        help="index directory (default: $HYBRIDSEARCH_INDEX_DIR or .hybridsearch/index; "
                        "eval: .hybridsearch/eval/<dataset>; demo: .hybridsearch/demo)")
    p.add_argument("--index-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--version", action="version", version=f"hybridsearch {__version__}")
    engine_opts = _Parser(add_help=False)
    engine_opts.add_argument("--engine", choices=["embedded", "opensearch"], default="embedded",
                             help="embedded (an index directory, the default) or opensearch")
    engine_opts.add_argument("--url", help="OpenSearch URL (default $HYBRIDSEARCH_OPENSEARCH_URL); "
                             "implies --engine opensearch")
    engine_opts.add_argument("--index", help="OpenSearch logical index, with --url or --engine opensearch (default "
                             "$HYBRIDSEARCH_OPENSEARCH_INDEX or hybridsearch; eval: eval-<dataset>)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("ingest", parents=[common, engine_opts], help="load, validate, embed and index a corpus")
    s.add_argument("path", help="a JSONL file, BEIR directory, Atlas markdown or text directory")
    s.add_argument("--loader", choices=["jsonl", "beir", "atlas", "textdir"],
                   help="default: guessed from the path")
    s.add_argument("--strict", action="store_true", help="stop at the first bad record")
    s.add_argument("--no-embed", action="store_true", help="skip embeddings (BM25 only until "
                   "vectors are added)")
    s.add_argument("--executor", choices=["inline", "celery"], default="inline",
                   help="compute vectors and HDC codes here (inline, the default) or in Celery workers "
                   "(HYBRIDSEARCH_REDIS_URL; `hybridsearch worker`), with a progress bar until they are done")
    s.add_argument("--chunk", type=int, help="chunks per worker task with --executor celery (default 256)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_ingest)

    s = sub.add_parser("update", parents=[common, engine_opts], help="re-ingest changed works into an existing index",
                       description="Like ingest, into an index that must exist; each work in FILE replaces its "
                       "stored version whole. Example: hybridsearch update changed.jsonl")
    s.add_argument("path", help="a JSONL file, BEIR directory, Atlas markdown or text directory")
    s.add_argument("--loader", choices=["jsonl", "beir", "atlas", "textdir"], help="default: guessed from the path")
    s.add_argument("--strict", action="store_true", help="stop at the first bad record")
    s.add_argument("--no-embed", action="store_true", help="skip embeddings")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_ingest, executor="inline", chunk=None)

    s = sub.add_parser("delete", parents=[common, engine_opts], help="delete chunks by id, or whole works",
                       description="Searches see the deletion at once, in every process; the citation graph is "
                       "rebuilt. Example: hybridsearch delete doc-1 doc-2; hybridsearch delete --work paper-7")
    s.add_argument("ids", nargs="*", help="chunk ids")
    s.add_argument("--work", action="append", metavar="WORK_ID", help="delete every chunk of this work (repeatable)")
    s.set_defaults(func=cmd_delete)

    s = sub.add_parser("embed", parents=[common, engine_opts], help="embed chunks that have no vector yet")
    s.add_argument("--enqueue", action="store_true", help="send Celery tasks (HYBRIDSEARCH_REDIS_URL) "
                   "instead of embedding here")
    s.add_argument("--chunk", type=int, help="with --enqueue: chunks per task (default 256)")
    s.add_argument("--wait", action="store_true", help="with --enqueue: follow the job with a progress bar until "
                   "it ends (exit 1 if a batch was dead-lettered)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_embed)

    s = sub.add_parser("graph", parents=[common, engine_opts],
                       help="build the citation graph (neighbour lists, PageRank authority) of an index",
                       description="Ingest keeps the graph up to date; run this after deletes, or with --force. "
                       "Example: hybridsearch graph --index-dir idx; hybridsearch graph --enqueue --wait")
    s.add_argument("--force", action="store_true", help="build even if the stored graph has the same input")
    s.add_argument("--enqueue", action="store_true", help="build it in a Celery worker (the graph queue)")
    s.add_argument("--wait", action="store_true", help="with --enqueue: follow the job until it ends")
    s.add_argument("--json", action="store_true", help="print the graph's summary as JSON (with --enqueue: "
                   "the job's state, as `jobs --json` shows it)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_graph)

    s = sub.add_parser("jobs", help="Celery backfill jobs and their state (HYBRIDSEARCH_REDIS_URL)",
                       description="Example: hybridsearch jobs --json; hybridsearch jobs retry JOB --wait")
    s.add_argument("--json", action="store_true", help="print the jobs as JSON")
    s.set_defaults(func=cmd_jobs, action="list")
    acts = s.add_subparsers(dest="action", metavar="{retry}")
    r = acts.add_parser("retry", help="send a job's dead-lettered batches again")
    r.add_argument("job", help="the job id (`hybridsearch jobs` lists them)")
    r.add_argument("--wait", action="store_true", help="follow the job until it ends")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    s = sub.add_parser("search", parents=[common, engine_opts], help="search the index")
    s.add_argument("query", help="the query text")
    s.add_argument("--channels", help="channels to combine, e.g. bm25,dense (overrides --profile)")
    s.add_argument("--fuser", help="with --channels: rrf, weighted or agreement (default: rrf)")
    s.add_argument("--profile", default="hybrid", help="a profile name or a YAML profile file")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a profile parameter, e.g. min_score=0.2, bm25.tie_breaker=0.3, fuser.rrf_k=20")
    s.add_argument("--explain", action="store_true", help="print each hit's additive contributions")
    s.add_argument("--intent", choices=["lookup", "survey", "compare", "prereq", "related"],
                   help="the query's intent (default: classified from the text)")
    s.add_argument("-k", type=int, default=None, help="results to return (default: the profile's max_results; "
                   "10 with --channels)")
    s.add_argument("--json", action="store_true", help="print the whole result (hits, channels, diagnostics) as JSON")
    f = s.add_argument_group("filters (the same in every channel and on both engines)")
    f.add_argument("--date-from", metavar="YYYY[-MM]", help="published in or after this year (and month)")
    f.add_argument("--date-to", metavar="YYYY[-MM]", help="published in or before this year (and month)")
    f.add_argument("--subject", action="append", help="a subject the chunk has (repeat for any of several)")
    f.add_argument("--source", action="append", help="the chunk's source file (repeatable)")
    f.add_argument("--kind", action="append", help="e.g. theorem, definition (repeatable)")
    f.add_argument("--license", action="append", help="e.g. CC-BY-4.0 (repeatable)")
    s.set_defaults(func=cmd_search)

    s = sub.add_parser("stats", parents=[common, engine_opts], help="index statistics")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")
    s.set_defaults(func=cmd_stats)

    s = sub.add_parser("cache", help="the embedding cache (HYBRIDSEARCH_EMBEDDING_CACHE): show or empty it",
                       description="Example: hybridsearch cache; hybridsearch cache clear")
    s.add_argument("action", nargs="?", choices=["stats", "clear"], default="stats",
                   help="stats (the default): where it is, its entries by encoder and its size; clear: delete "
                   "every entry (the ONNX exports stay)")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")
    s.set_defaults(func=cmd_cache)

    s = sub.add_parser("eval", parents=[common, engine_opts], help="evaluate on a BEIR dataset")
    s.add_argument("dataset", help="a BEIR directory (corpus.jsonl, queries.jsonl, qrels/)")
    s.add_argument("--channels", help="bm25,dense = one run each; bm25+dense = one fused run")
    s.add_argument("--fuser", help="the fuser of fused --channels runs (default: rrf)")
    s.add_argument("--profiles", help="comma-separated profile names, one run each")
    s.add_argument("--ablation", action="store_true", help="RFC-0003's five runs: lexical, vector, hybrid "
                   "without citation, with citation, with citation and the reranker")
    s.add_argument("--json", metavar="OUT", help="write {run: metrics} JSON here")
    s.add_argument("--plot", metavar="OUT.png", help="draw nDCG@10 per run and per intent as a PNG here")
    s.add_argument("--split", default="test", help="the qrels split to score (default: test)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("logs", help="the query log (daily JSONL files, or daily OpenSearch indices)")
    acts = s.add_subparsers(dest="action", required=True, metavar="{prune}")
    s = acts.add_parser("prune", parents=[common, engine_opts], help="delete days of the query log older than an age",
                        description="Example: hybridsearch logs prune --older-than 30d "
                        "--url $HYBRIDSEARCH_OPENSEARCH_URL --yes")
    s.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 30d or 12h")
    s.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    s.add_argument("--json", action="store_true", help="print what was deleted as JSON")
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser("dashboards", help="OpenSearch Dashboards saved objects")
    acts = s.add_subparsers(dest="action", required=True, metavar="{import}")
    s = acts.add_parser("import", help="import the index patterns, visualizations and dashboard",
                        description="Example: hybridsearch dashboards import --url http://127.0.0.1:5601 "
                        "--corpus-index papers (credentials: in the URL, http://USER:PASSWORD@host:5601, "
                        "else HYBRIDSEARCH_OPENSEARCH_USERNAME / HYBRIDSEARCH_OPENSEARCH_PASSWORD)")
    s.add_argument("--url", required=True, help="OpenSearch Dashboards URL; credentials in it win over "
                   "HYBRIDSEARCH_OPENSEARCH_USERNAME / _PASSWORD")
    s.add_argument("--corpus-index", help="the logical index the corpus panels show (default "
                   "$HYBRIDSEARCH_OPENSEARCH_INDEX or hybridsearch)")
    s.add_argument("--tenant", help="with the security plugin's multi-tenancy, the tenant to import into: global "
                   "(shared by every user), private, or a custom tenant's name (default: the user's default tenant)")
    s.add_argument("--json", action="store_true", help="print the import API's answer")
    s.set_defaults(func=cmd_dashboards)

    s = sub.add_parser("worker", help="run a Celery worker (HYBRIDSEARCH_REDIS_URL) for embed, hdc and graph jobs",
                       description="Example: HYBRIDSEARCH_REDIS_URL=redis://127.0.0.1:6379/0 hybridsearch worker "
                       "--queues embed,hdc --concurrency 2")
    s.add_argument("--queues", help="comma-separated queues to consume (default: embed,hdc,graph)")
    s.add_argument("--concurrency", type=int, help="worker processes (default: $HYBRIDSEARCH_WORKER_CONCURRENCY, "
                   "else the number of CPUs)")
    s.add_argument("--loglevel", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="default: %(default)s")
    s.add_argument("--hostname", default="hybridsearch@%h", help="worker name (default: %(default)s)")
    s.set_defaults(func=cmd_worker)

    s = sub.add_parser("serve", parents=[common, engine_opts],
                       help="serve POST /retrieve over HTTP (FastAPI on uvicorn)",
                       description="Loads the model and opens the index before /readyz answers 200; SIGTERM lets "
                       "in-flight requests finish. Example: hybridsearch serve --index-dir idx --keys keys.json "
                       "--port 8080")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    s.add_argument("--port", type=_port, default=8080, help="port, 0 to 65535 (default: %(default)s)")
    s.add_argument("--workers", type=int, help="server processes, each with its own model and its share of the "
                   "cores (default: HYBRIDSEARCH_HTTP_WORKERS, else the cores this process may use)")
    s.add_argument("--keys", required=True, help="the API keys file (`hybridsearch keys add`)")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("keys", help="API keys of the HTTP service")
    acts = s.add_subparsers(dest="action", required=True, metavar="{add,list,revoke}")
    k = acts.add_parser("add", help="make a key; it is printed once, as the last line of stdout",
                        description="Only the key's SHA-256 is stored. Example: hybridsearch keys add analysts "
                        "--file keys.json --rights open,restricted --indices papers")
    k.add_argument("name", help="the key's name (letters, digits, - and _); logged instead of the key")
    k.add_argument("--file", required=True, help="the keys file")
    k.add_argument("--rights", default="open", help="licence classes it may see: open, restricted (default: open)")
    k.add_argument("--indices", help="indices it may read, comma-separated (default: all)")
    k.set_defaults(func=cmd_keys)
    k = acts.add_parser("list", help="the keys, without their secrets",
                        description="Example: hybridsearch keys list --file keys.json")
    k.add_argument("--file", required=True, help="the keys file")
    k.add_argument("--json", action="store_true", help="print JSON")
    k.set_defaults(func=cmd_keys)
    k = acts.add_parser("revoke", help="revoke a key (a running service refuses it at once)",
                        description="Example: hybridsearch keys revoke analysts --file keys.json")
    k.add_argument("name", help="the key's name")
    k.add_argument("--file", required=True, help="the keys file")
    k.set_defaults(func=cmd_keys)

    s = sub.add_parser("demo", parents=[common], help="index the bundled demo corpus and answer sample queries")
    s.add_argument("-k", type=int, default=5, help="results per sample query (default: 5)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_demo)

    from hybridsearch.engines.opensearch.admin_cli import add_parsers as add_admin_parsers
    from hybridsearch.engines.opensearch.node_cli import add_parser as add_opensearch_parser

    add_opensearch_parser(sub)
    add_admin_parsers(sub)
    _add_examples(p, [])
    return p


EXAMPLES = {
    "ingest": "hybridsearch ingest ../shared/data/scifact --index-dir idx",
    "embed": "hybridsearch embed --index-dir idx --enqueue --wait",
    "search": "hybridsearch search \"Brouwer fixed point\" --profile hybrid -k 5 --subject topology",
    "stats": "hybridsearch stats --index-dir idx --json",
    "eval": "hybridsearch eval ../shared/data/scifact --profiles lexical,hybrid --json out.json",
    "demo": "hybridsearch demo -k 3",
    "jobs retry": "hybridsearch jobs retry embed-20260101-120000-abc123 --wait",
    "opensearch start": "export HYBRIDSEARCH_OPENSEARCH_URL=$(hybridsearch opensearch start -q | tail -1)",
    "opensearch stop": "hybridsearch opensearch stop",
    "opensearch status": "hybridsearch opensearch status --json",
    "indices status": "hybridsearch indices status papers",
    "indices create": "hybridsearch indices create papers",
    "indices delete": "hybridsearch indices delete papers --yes",
    "indices reindex": "hybridsearch indices reindex papers",
    "indices prune": "hybridsearch indices prune papers --keep 1 --yes",
    "snapshot repo-add": "hybridsearch snapshot repo-add",
    "snapshot create": "hybridsearch snapshot create nightly-1 --index papers",
    "snapshot list": "hybridsearch snapshot list --json",
    "snapshot restore": "hybridsearch snapshot restore nightly-1 --index papers --yes",
    "snapshot delete": "hybridsearch snapshot delete nightly-1 --yes",
}


def _add_examples(parser: argparse.ArgumentParser, path: list[str]) -> None:
    """Give every command without an example in its description the one from EXAMPLES."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                _add_examples(sp, [*path, name])
    example = EXAMPLES.get(" ".join(path))
    if example and "Example" not in (parser.description or ""):
        parser.description = (parser.description + "\n\n" if parser.description else "") + f"Example: {example}"


class _StderrWarnings(logging.Handler):
    """The library's warnings (e.g. a derived index rebuilt from the journal) as `warning:` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"warning: {record.getMessage()}", file=sys.stderr)


def _warnings_to_stderr() -> None:
    log = logging.getLogger("hybridsearch")
    if not any(isinstance(h, _StderrWarnings) for h in log.handlers):
        handler = _StderrWarnings(logging.WARNING)
        log.addHandler(handler)


def _not_text(args: argparse.Namespace, argv: list[str]) -> str | None:
    """The name of the first argument that is not UTF-8 text (bytes the shell passed that Python
    kept as lone surrogates, which no engine, file or query can hold), or None."""
    for dest, value in vars(args).items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    option = "--" + dest.replace("_", "-")
                    return option if any(a == option or a.startswith(option + "=") for a in argv) else dest
    return None


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # client libraries log each failed request with its traceback; the CLI reports errors itself
    for name in ("opensearch", "urllib3"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    args = build_parser().parse_args(argv)
    bad = _not_text(args, sys.argv[1:] if argv is None else argv)
    if bad is not None:
        print(f"error: {bad}: not valid UTF-8 text", file=sys.stderr)
        return 2
    chunk = getattr(args, "chunk", None)
    if chunk is not None and chunk < 1:
        print(f"error: --chunk must be >= 1, got {args.chunk}", file=sys.stderr)
        return 2
    if chunk is not None and not (getattr(args, "executor", None) == "celery" or getattr(args, "enqueue", False)):
        sends = "--executor celery" if hasattr(args, "executor") else "--enqueue"
        print(f"error: --chunk sizes the worker tasks that {sends} sends; without it the work is done here",
              file=sys.stderr)
        return 2
    if hasattr(args, "chunk") and chunk is None:
        args.chunk = CHUNK
    if getattr(args, "wait", False) and getattr(args, "enqueue", True) is False:
        print("error: --wait follows the job that --enqueue sends; without --enqueue the work is done here",
              file=sys.stderr)
        return 2
    if getattr(args, "concurrency", 1) is not None and getattr(args, "concurrency", 1) < 1:
        print("error: --concurrency must be >= 1", file=sys.stderr)
        return 2
    if getattr(args, "k", 1) is not None and getattr(args, "k", 1) < 1:
        print("error: -k must be >= 1", file=sys.stderr)
        return 2
    _warnings_to_stderr()
    try:
        from hybridsearch.config import get_settings

        get_settings()  # a bad HYBRIDSEARCH_* value is one line here, whatever the command
        return int(args.func(args))
    except HybridSearchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except sqlite3.DatabaseError as e:  # a damaged store met outside the checks at open
        print(f"error: an index store is damaged ({e}); nothing was written", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hybridsearch search ... | head`: the reader has gone; so has our output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
