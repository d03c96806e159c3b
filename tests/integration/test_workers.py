"""A real Celery worker on a real Redis embeds chunks that were ingested without vectors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hybridsearch.engines.embedded import EmbeddedEngine
from indexer.loaders import BeirLoader, LoadReport
from tests.conftest import DEMO, demo_subset

EXE = str(Path(sys.executable).with_name("hybridsearch"))


@pytest.fixture(autouse=True)
def _no_embedding_cache(monkeypatch) -> None:  # noqa: ANN001
    """Faults must strike while vectors are computed, and each test counts its own embedding: no
    chunk comes from the machine's embedding cache (tests/integration/test_embedding_cache.py)."""
    monkeypatch.setenv("HYBRIDSEARCH_EMBEDDING_CACHE_MAX_MB", "0")


def start_worker(env: dict[str, str]) -> subprocess.Popen[str]:
    """A real Celery worker process (one task at a time) on the test's Redis."""
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker",
                             "--pool", "solo", "--concurrency", "1", "--loglevel", "WARNING",
                             "--without-gossip", "--without-mingle", "--without-heartbeat"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(done: Callable[[], bool], timeout: float, message: str, worker: subprocess.Popen[str] | None = None,
              poll: float = 0.5) -> None:
    """Poll `done()` until it is true; fail with `message` after `timeout` seconds, or at once, with
    its log, if `worker` has exited."""
    deadline = time.time() + timeout
    while not done():
        if worker is not None:
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
        assert time.time() < deadline, message
        time.sleep(poll)


@pytest.mark.integration
@pytest.mark.redis
def test_celery_worker_embeds_and_the_owner_applies(redis_url, tmp_path, encoder) -> None:
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url}
    docs = list(BeirLoader().load(DEMO, LoadReport()))[:30]
    engine = EmbeddedEngine(tmp_path / "idx")
    engine.write(docs)
    assert len(engine.vectors([d.id for d in docs])) == 0
    worker = start_worker(env)
    try:
        out = subprocess.run([EXE, "embed", "--enqueue", "--chunk", "10", "--index-dir",
                              str(tmp_path / "idx")], env=env, capture_output=True, text=True, check=True)
        assert "queued 30 chunks in 3 tasks" in out.stdout
        _wait_for(lambda: engine.store.count_vectors() >= 30, 180, "the worker did not embed the chunks in time",
                  worker)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    # the owner sees the worker's journal entries without a restart
    assert len(engine.vectors([d.id for d in docs])) == 30
    for d in docs[:5]:
        assert engine.knn(encoder.encode([d.dense_text])[0], 1).ids == [d.id]
    engine.close()


@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.opensearch
def test_celery_worker_embeds_through_the_opensearch_engine(redis_url, opensearch_index, encoder) -> None:
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url}
    engine = opensearch_index
    docs = list(BeirLoader().load(DEMO, LoadReport()))[:20]
    engine.write(docs)
    assert engine.stats().vectors == 0
    worker = start_worker(env)
    try:
        out = subprocess.run([EXE, "embed", "--enqueue", "--chunk", "8", "--engine", "opensearch",
                              "--index", engine.index], env=env, capture_output=True, text=True, check=True)
        assert "queued 20 chunks in 3 tasks" in out.stdout
        _wait_for(lambda: engine.stats().vectors >= 20, 180, "the worker did not embed the chunks in time", worker)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    for d in docs[:5]:
        assert engine.knn(encoder.encode([d.dense_text])[0], 1).ids == [d.id]
    out = subprocess.run([EXE, "embed", "--enqueue", "--chunk", "0", "--engine", "opensearch", "--index",
                          engine.index], env=env, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr == "error: --chunk must be >= 1, got 0\n"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.slow
def test_worker_command_survives_a_killed_pool_process(redis_url, tmp_path, encoder) -> None:
    """`hybridsearch worker` (prefork, one process): its pool process is SIGKILLed while it runs
    the first task; the task goes back to the queue, a new pool process runs it, the job completes."""
    import signal

    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url}
    docs = list(BeirLoader().load(DEMO, LoadReport()))[:30]
    engine = EmbeddedEngine(tmp_path / "idx")
    engine.write(docs)
    worker = subprocess.Popen([EXE, "worker", "--queues", "embed", "--concurrency", "1", "--loglevel", "WARNING",
                               "--hostname", f"kill-test-{os.getpid()}@%h"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        out = subprocess.run([EXE, "embed", "--enqueue", "--chunk", "10", "--index-dir", str(tmp_path / "idx")],
                             env=env, capture_output=True, text=True, check=True)
        assert "queued 30 chunks in 3 tasks" in out.stdout
        deadline = time.time() + 60
        while not _children(worker.pid):
            assert worker.poll() is None and time.time() < deadline, "the worker started no pool process"
            time.sleep(0.2)
        first = _children(worker.pid)
        from workers import jobs

        r = jobs.client(redis_url)
        while not r.hlen("unacked"):  # a task is delivered and not yet acknowledged
            assert time.time() < deadline, "no task was delivered"
            time.sleep(0.05)
        # killed while the job is under way (a model already in the page cache loads in well under a
        # second, so the first task may be done by now: the pool process then holds the next one)
        assert engine.store.count_vectors() < 30
        for pid in first:
            os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: engine.store.count_vectors() >= 30, 240,
                  "the job did not complete after the pool process was killed", worker)
        assert set(_children(worker.pid)).isdisjoint(first)  # a new pool process did the work
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    log = worker.stderr.read() if worker.stderr else ""
    # it died holding a task, which went back to the queue (task_reject_on_worker_lost)
    assert "Task handler raised error: WorkerLostError('Worker exited prematurely: signal 9 (SIGKILL)" in log, log
    assert len(engine.vectors([d.id for d in docs])) == 30
    engine.close()


@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.slow
def test_a_batch_whose_process_keeps_dying_is_dead_lettered(redis_url, tmp_path) -> None:
    """The pool process running a batch is SIGKILLed on each of its first three deliveries (as a
    batch that runs out of memory would die): the fourth delivery dead-letters it instead of
    running it, the job ends as failed saying why, and `jobs retry --wait` (counts cleared)
    completes it."""
    import signal

    from workers import jobs

    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/7"}
    docs = list(BeirLoader().load(DEMO, LoadReport()))[:10]
    with EmbeddedEngine(tmp_path / "idx") as engine:
        engine.write(docs)
    worker = subprocess.Popen([EXE, "worker", "--queues", "embed", "--concurrency", "1", "--loglevel", "WARNING",
                               "--hostname", f"lost-test-{os.getpid()}@%h"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        job = _enqueue(env, tmp_path / "idx", 10)
        r = jobs.client(env["HYBRIDSEARCH_REDIS_URL"])
        for n in (1, 2, 3):  # the n-th delivery has begun in a pool process: kill that process
            _wait_for(lambda n=n: int(r.hget(jobs.PREFIX + job + ":deliveries", "0:0") or 0) >= n, 120,
                      f"delivery {n} never began", worker, poll=0.05)
            for pid in _children(worker.pid):
                os.kill(pid, signal.SIGKILL)
        st = _wait_job(env, job, 120)
        assert (st["status"], st["failed"], st["done"]) == ("failed", 1, 0), st
        assert jobs.failures(r, job) == {0: "WorkerLost: the process running this batch died 3 times (out of "
                                            "memory, or killed); it is not delivered again"}
        fixed = subprocess.run([EXE, "jobs", "retry", job, "--wait", "-q"], env=env, capture_output=True, text=True,
                               timeout=300)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    assert fixed.returncode == 0, fixed.stderr
    assert f"job {job}: embed, 10 of 10 chunks in 1 of 1 batches" in fixed.stdout and ", done" in fixed.stdout


def test_broker_down_or_malformed_is_one_line(tmp_path) -> None:
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": "redis://127.0.0.1:1/0"}
    EmbeddedEngine(tmp_path / "idx").close()
    for args in (["worker"], ["embed", "--enqueue", "--index-dir", str(tmp_path / "idx")]):
        out = subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr.startswith("error: the Celery broker at redis://127.0.0.1:1/0 "
                                                             "does not answer"), out.stderr
        assert len(out.stderr.splitlines()) == 1
    out = subprocess.run([EXE, "worker"], env={**env, "HYBRIDSEARCH_REDIS_URL": "http://nope"}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("error: HYBRIDSEARCH_REDIS_URL: 'http://nope' is not a "
                                                         "Redis URL"), out.stderr
    out = subprocess.run([EXE, "worker", "--queues", "embed,nope"], env=env, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr == "error: --queues: unknown queue nope; valid: embed, hdc, graph\n"


@pytest.mark.integration
def test_derived_work_is_done_once_on_a_directory(tmp_path, encoder) -> None:
    """The plain functions the tasks call: a batch run twice does nothing the second time (no second
    journal entry), a result for text that changed meanwhile is dropped, and a directory that is
    not an index is refused, never created."""
    from hybridsearch.engines.embedded.store import Store
    from hybridsearch.errors import ConfigError, IndexNotFoundError
    from indexer.pipeline import embed_ids_at, encode_hdc_ids, graph_at

    docs = list(BeirLoader().load(DEMO, LoadReport()))[:12]
    ids = [d.id for d in docs]
    engine = EmbeddedEngine(tmp_path / "idx")
    engine.write(docs)
    engine.close()
    target = str(tmp_path / "idx")
    assert embed_ids_at(target, encoder, ids[:5]) == 5
    assert embed_ids_at(target, encoder, ids) == 7  # the first five are done
    assert embed_ids_at(target, encoder, ids) == 0
    assert encode_hdc_ids(target, ids) == 12 and encode_hdc_ids(target, ids) == 0
    store = Store(tmp_path / "idx" / "store.sqlite")
    ops = [e.op for e in store.journal_since(0)]
    assert ops.count("vector") == 12 and ops.count("hdc") == 12
    # a worker's vector for text that has changed since it read it is not stored
    engine = EmbeddedEngine(tmp_path / "idx")
    engine.write([docs[0].model_copy(update={"text": "a different statement"})])
    engine.close()
    stale = encoder.encode([docs[0].dense_text])
    assert store.set_vectors([ids[0]], stale, encoder.name, texts=[docs[0].dense_text],
                             only_missing=True) == 0
    store.close()
    assert embed_ids_at(target, encoder, ids) == 1  # the new text is embedded once
    summary, built = graph_at(target)
    assert built and summary.works == 12 and graph_at(target) == (summary, False)
    with pytest.raises(IndexNotFoundError):
        embed_ids_at(str(tmp_path / "nothing"), encoder, ids)
    with pytest.raises(IndexNotFoundError):
        graph_at(str(tmp_path / "nothing"))
    assert not (tmp_path / "nothing").exists()
    # a worker whose variant lexicon is not the index's would store codes that match no query
    other = tmp_path / "other"
    with EmbeddedEngine(other) as engine:
        engine.write(docs[:2])
    store = Store(other / "store.sqlite")
    store.set_meta("lexicon", "lexicon-of-another-deployment")
    store.close()
    with pytest.raises(ConfigError, match="analysed with variant lexicon lexicon-of-another-deployment"):
        encode_hdc_ids(str(other), ids[:2])
    store = Store(other / "store.sqlite")
    assert len(store.missing_codes(ids[:2])) == 2  # nothing stored
    store.close()


@pytest.mark.integration
@pytest.mark.opensearch
def test_derived_work_is_done_once_and_only_on_hybridsearch_indexes(opensearch_index, encoder) -> None:
    from hybridsearch.errors import HybridSearchError, IndexNotFoundError
    from indexer.pipeline import embed_ids_at, encode_hdc_ids, graph_at

    docs = list(BeirLoader().load(DEMO, LoadReport()))[:12]
    ids = [d.id for d in docs]
    osx = opensearch_index
    osx.write(docs)
    url = osx.raw_url
    assert embed_ids_at(url, encoder, ids, index=osx.index) == 12
    assert embed_ids_at(url, encoder, ids, index=osx.index) == 0
    assert osx.stats().vectors == 12
    summary, built = graph_at(url, osx.index)
    assert built and summary.works == 12 and graph_at(url, osx.index) == (summary, False)
    assert osx.neighbors(ids[:1])[ids[0]].authority is not None
    with pytest.raises(IndexNotFoundError):
        encode_hdc_ids(url, ids, index="no-such-index")
    osx.client.indices.create(index="not-ours-idx", body={"aliases": {"not-ours": {}}})
    try:
        with pytest.raises(HybridSearchError, match="was not made by hybridsearch"):
            embed_ids_at(url, encoder, ids, index="not-ours")
        with pytest.raises(HybridSearchError, match="was not made by hybridsearch"):
            graph_at(url, "not-ours")
    finally:
        osx.client.indices.delete(index="not-ours-idx")


@pytest.mark.integration
@pytest.mark.redis
def test_job_records_are_atomic_and_counted_once(redis_url) -> None:
    """jobs.record against a real Redis: a batch counts once however often it is recorded, a late
    dead-letter of a done batch is ignored, a dead-lettered batch that succeeds later clears it,
    and a job whose state expired is never recreated half-made."""
    from workers import jobs

    r = jobs.client(redis_url)
    job = jobs.create(r, "embed", "/x", None, [["a", "b"], ["c"]], 600)
    jobs.record(r, job, 0, docs=2)
    jobs.record(r, job, 0, docs=2)  # delivered again
    jobs.record(r, job, 0, error="late")  # a dead-letter after it was done
    st = jobs.state(r, job)
    assert (st.status, st.done, st.failed, st.docs_done) == ("running", 1, 0, 2)
    jobs.record(r, job, 1, error="IndexNotFoundError: gone")
    st = jobs.state(r, job)
    assert (st.status, st.done, st.failed) == ("failed", 1, 1)
    assert jobs.failures(r, job) == {1: "IndexNotFoundError: gone"}
    assert jobs.unfinished(r, job) == {1: ["c"]}
    jobs.reopen(r, job, [1])
    assert jobs.state(r, job).status == "running"
    jobs.record(r, job, 1, docs=1)
    st = jobs.state(r, job)
    assert (st.status, st.done, st.failed, st.docs_done) == ("done", 2, 0, 3) and st.finished is not None
    # a batch dead-lettered by one delivery whose redelivered copy succeeds later: the job is done,
    # with no `jobs retry` in between
    other = jobs.create(r, "embed", "/x", None, [["a"], ["b"]], 600)
    jobs.record(r, other, 0, docs=1)
    jobs.record(r, other, 1, error="EngineUnavailableError: down")
    assert jobs.state(r, other).status == "failed"
    jobs.record(r, other, 1, docs=1)
    st = jobs.state(r, other)
    assert (st.status, st.done, st.failed, st.docs_done) == ("done", 2, 0, 2) and jobs.failures(r, other) == {}
    r.delete(jobs.PREFIX + job)  # expired
    jobs.record(r, job, 1, docs=1)
    assert not r.exists(jobs.PREFIX + job)
    with pytest.raises(Exception, match="no job"):
        jobs.state(r, job)
    assert all(s.id != job for s in jobs.jobs(r))
    with pytest.raises(Exception, match="not reachable"):
        jobs.state(jobs.client("redis://127.0.0.1:1/0", timeout=1), job)


@pytest.mark.redis
def test_a_running_batch_reports_its_progress_until_it_ends(redis_url) -> None:
    from workers import jobs

    r = jobs.client(redis_url)
    job = jobs.create(r, "embed", "/x", None, [["a", "b", "c"], ["d", "e"]], 600)
    jobs.progress(r, job, 0, 2)
    jobs.progress(r, job, 1, 1)
    st = jobs.state(r, job)
    assert (st.docs_done, st.docs_partial) == (0, 3)
    jobs.record(r, job, 0, docs=3)
    st = jobs.state(r, job)
    assert (st.docs_done, st.docs_partial) == (3, 1)  # the batch done counts whole, its partial is gone
    jobs.record(r, job, 1, error="x")
    assert jobs.state(r, job).docs_partial == 0
    assert not r.exists(jobs.PREFIX + job + ":partial")  # nothing left behind once every batch ended


@pytest.mark.integration
@pytest.mark.redis
def test_a_worker_reports_progress_inside_a_batch(redis_url, tmp_path) -> None:
    """One batch of 40 chunks: the job's bar moves before the batch ends (every second or so)."""
    from workers import jobs

    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/4"}
    idx = _ingested(env, tmp_path, 40)
    worker = _worker(env, 1)
    try:
        job = _enqueue(env, idx, 40)
        r = jobs.client(env["HYBRIDSEARCH_REDIS_URL"])
        seen: list[tuple[int, int]] = []
        st = jobs.follow(r, job, lambda st: seen.append((st.docs_done, st.docs_partial)), poll=0.2, timeout=300)
        assert st.status == "done" and st.docs_done == 40 and st.docs_partial == 0
        partial = [p for done, p in seen if done == 0 and p > 0]
        assert partial and partial == sorted(partial) and max(partial) < 40, seen
    finally:
        _stop(worker)


def _worker(env: dict[str, str], concurrency: int = 2) -> subprocess.Popen[str]:  # noqa: D103
    return subprocess.Popen([EXE, "worker", "--concurrency", str(concurrency), "--loglevel", "WARNING",
                             "--hostname", f"w{concurrency}-{os.getpid()}-{time.time_ns()}@%h"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _stop(worker: subprocess.Popen[str]) -> None:
    worker.terminate()
    worker.wait(timeout=60)


@pytest.mark.integration
@pytest.mark.redis
def test_ingest_with_celery_equals_inline(redis_url, tmp_path) -> None:
    """`ingest --executor celery` with two worker processes: every chunk gets its vector, its codes
    and its neighbour lists (those of the inline executor), and the hybrid top-10 equals the inline
    executor's, scores within 1e-5."""
    from query_service.searcher import Searcher

    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url}
    corpus = demo_subset(tmp_path / "corpus", 80)
    inline = subprocess.run([EXE, "ingest", str(corpus), "--index-dir", str(tmp_path / "inline"), "-q"], env=env,
                            capture_output=True, text=True)
    assert inline.returncode == 0, inline.stderr
    worker = _worker(env)
    try:
        out = subprocess.run([EXE, "ingest", str(corpus), "--index-dir", str(tmp_path / "celery"), "--executor",
                              "celery", "--chunk", "20", "-q"], env=env, capture_output=True, text=True, timeout=600)
    finally:
        _stop(worker)
    assert out.returncode == 0, out.stderr
    assert "loaded 80, rejected 0, indexed 80, embedded 80" in out.stdout
    assert out.stdout.count(", done") == 3 and "80 of 80 chunks in 4 of 4 batches" in out.stdout
    assert "graph, 1 of 1 batches" in out.stdout and "citation graph: 80 works" in out.stdout
    took = float(re.search(r"embedded 80, in ([0-9.]+)s", out.stdout)[1])  # the workers' time included
    assert took >= max(float(s) for s in re.findall(r"batches, ([0-9.]+)s, done", out.stdout)) > 0, out.stdout
    a, b = EmbeddedEngine(tmp_path / "inline"), EmbeddedEngine(tmp_path / "celery")
    assert (b.stats().vectors, b.stats().codes) == (80, 80)
    ids = [i for i in a.store.id_map().values()]
    na, nb = a.neighbors(ids), b.neighbors(ids)
    assert na == nb and len(nb) == 80 and all(n.authority is not None for n in nb.values())
    assert sum(len(n.cited_by) for n in nb.values()) > 100 and any(n.cocited for n in nb.values())
    sa, sb = Searcher(a), Searcher(b)
    for q in ("Brouwer fixed point theorem", "compact Hausdorff spaces", "prime number theorem proof",
              "Gödel incompleteness", "eigenvalues of symmetric matrices"):
        ra, rb = sa.search(q, "hybrid", k=10), sb.search(q, "hybrid", k=10)
        assert [h.id for h in ra.hits] == [h.id for h in rb.hits], q
        assert all(abs(x.score - y.score) <= 1e-5 for x, y in zip(ra.hits, rb.hits, strict=True)), q
    sa.close(), sb.close(), a.close(), b.close()
    listed = subprocess.run([EXE, "jobs", "--json"], env=env, capture_output=True, text=True)
    mine = [j for j in json.loads(listed.stdout) if j["target"] == str((tmp_path / "celery").resolve())]
    assert sorted(j["kind"] for j in mine) == ["embed", "graph", "hdc"] and all(j["status"] == "done" for j in mine)


@pytest.mark.integration
@pytest.mark.redis
def test_dead_lettered_batches_are_reported_and_retried(redis_url, tmp_path) -> None:
    """Batches whose index is gone fail for good (not retried): the job says so, exits 1 with how to
    retry; once the index is back, `jobs retry --wait` completes the job."""
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url}
    idx = _ingested(env, tmp_path, 60)
    queued = subprocess.run([EXE, "embed", "--enqueue", "--chunk", "20", "--index-dir", str(idx)], env=env,
                            capture_output=True, text=True)
    assert queued.returncode == 0, queued.stderr
    job = queued.stdout.split("(job ")[1].split(")")[0]
    away = tmp_path / "away"
    idx.rename(away)  # the index is gone when the workers take the batches
    worker = _worker(env, 1)
    try:
        st = _wait_job(env, job, 120)  # the worker dead-letters all three batches
        assert st["status"] == "failed" and st["failed"] == 3 and st["done"] == 0
        again = subprocess.run([EXE, "jobs", "retry", job, "--wait", "-q"], env=env, capture_output=True, text=True)
        assert again.returncode == 1
        assert f"3 batches of job {job} were dead-lettered (first: IndexNotFoundError: no index at" in again.stderr
        assert f"hybridsearch jobs retry {job}" in again.stderr
        away.rename(idx)
        fixed = subprocess.run([EXE, "jobs", "retry", job, "--wait", "-q"], env=env, capture_output=True, text=True,
                               timeout=300)
    finally:
        _stop(worker)
    assert fixed.returncode == 0, fixed.stderr
    assert f"job {job}: embed, 60 of 60 chunks in 3 of 3 batches" in fixed.stdout and ", done" in fixed.stdout
    engine = EmbeddedEngine(idx)
    assert engine.stats().vectors == 60
    engine.close()


@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.slow
def test_a_stalled_job_says_so_and_completes_once_a_worker_starts(redis_url, tmp_path) -> None:
    """`embed --enqueue --wait` with no worker warns (once) that nothing consumes the embed queue,
    keeps waiting, and completes when a worker starts; `graph --enqueue --wait` then finds the
    graph that ingest built already."""
    # a database of its own: workers of other tests on this Redis do not answer its broadcasts
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/5",
           "HYBRIDSEARCH_WORKER_STALL_WARNING": "2"}
    idx = _ingested(env, tmp_path, 60)
    follow = subprocess.Popen([EXE, "embed", "--enqueue", "--wait", "--chunk", "20", "--index-dir", str(idx), "-q"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = None
    try:
        assert follow.stderr is not None
        line = follow.stderr.readline()
        assert "has made no progress for 2 s; no worker consumes the embed queue" in line, line
        assert "Still waiting" in line and follow.poll() is None
        worker = _worker(env, 1)
        out, err = follow.communicate(timeout=300)
        graph = subprocess.run([EXE, "graph", "--index-dir", str(idx), "--enqueue", "--wait", "-q"], env=env,
                               capture_output=True, text=True, timeout=120)
    finally:
        follow.kill()
        if worker is not None:
            _stop(worker)
    assert follow.returncode == 0, err
    assert "60 of 60 chunks in 3 of 3 batches" in out and "no worker consumes" not in err
    assert graph.returncode == 0, graph.stderr
    assert "graph, 1 of 1 batches" in graph.stdout and ", done" in graph.stdout
    built = json.loads(subprocess.run([EXE, "graph", "--index-dir", str(idx), "--json"], env=env,
                                      capture_output=True, text=True).stdout)
    assert built["works"] == 60 and built["built"] is False and built["pagerank_sum"] == pytest.approx(1.0)


@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.slow
def test_batches_that_expire_in_the_queue_end_the_job_and_are_retried(redis_url, tmp_path) -> None:
    """Tasks that waited in the queue past HYBRIDSEARCH_WORKER_TASK_EXPIRES are discarded by the
    worker that takes them: their batches are dead-lettered as expired, so `--wait` ends (exit 1,
    saying so) instead of waiting forever; `jobs retry --wait` then completes the job."""
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/6"}
    idx = _ingested(env, tmp_path, 60)
    follow = subprocess.Popen([EXE, "embed", "--enqueue", "--wait", "--chunk", "20", "--index-dir", str(idx), "-q"],
                              env={**env, "HYBRIDSEARCH_WORKER_TASK_EXPIRES": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # every batch expires before a worker starts
    worker = _worker(env, 1)
    try:
        out, err = follow.communicate(timeout=120)
        assert follow.returncode == 1, (out, err)
        assert "0 of 60 chunks in 0 of 3 batches" in out and out.rstrip().endswith("failed")
        assert "3 batches of job" in err and "TaskExpired: waited in the queue longer than" in err
        job = re.search(r"job (\S+): embed", out)[1]
        fixed = subprocess.run([EXE, "jobs", "retry", job, "--wait", "-q"], env=env, capture_output=True, text=True,
                               timeout=300)
    finally:
        follow.kill()
        _stop(worker)
    assert fixed.returncode == 0, fixed.stderr
    assert f"job {job}: embed, 60 of 60 chunks in 3 of 3 batches" in fixed.stdout and ", done" in fixed.stdout


def _graph_works(idx: Path, works: int | None = None) -> int:
    """The works the stored graph's summary counts; with `works`, first make it say so (its input
    hash unchanged, so only a forced build replaces it)."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(idx / "store.sqlite")) as c, c:
        if works is not None:
            c.execute("UPDATE meta SET value = json_set(value, '$.works', ?) WHERE key = 'graph'", (works,))
        return int(json.loads(c.execute("SELECT value FROM meta WHERE key = 'graph'").fetchone()[0])["works"])


@pytest.mark.integration
@pytest.mark.redis
def test_an_enqueued_graph_job_keeps_force_and_prints_json(redis_url, tmp_path) -> None:
    """`graph --enqueue --force` builds an unchanged graph in the worker, and so does `jobs retry`
    of such a job (the worker used to find the input unchanged and do nothing); `--json` prints the
    job's state as `jobs --json` does, not text lines."""
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/8"}
    idx = _ingested(env, tmp_path, 242)  # the whole demo
    assert _graph_works(idx, 1) == 1
    queued = subprocess.run([EXE, "graph", "--index-dir", str(idx), "--enqueue", "--force", "--json"], env=env,
                            capture_output=True, text=True)
    assert queued.returncode == 0, queued.stderr
    st = json.loads(queued.stdout)
    assert (st["kind"], st["status"], st["force"], st["batches"]) == ("graph", "running", True, 1)
    away = tmp_path / "away"
    idx.rename(away)  # the forced batch is dead-lettered; `jobs retry` sends it again, forced
    worker = start_worker(env)
    try:
        assert _wait_job(env, st["id"], 120)["status"] == "failed"
        away.rename(idx)
        fixed = subprocess.run([EXE, "jobs", "retry", st["id"], "--wait", "-q"], env=env, capture_output=True,
                               text=True, timeout=120)
        assert fixed.returncode == 0 and ", done" in fixed.stdout, fixed.stderr
        assert _graph_works(idx) == 242
        _graph_works(idx, 1)
        runs = [subprocess.run([EXE, "graph", "--index-dir", str(idx), "--enqueue", "--wait", "--json", "-q", *force],
                               env=env, capture_output=True, text=True, timeout=120) for force in ([], ["--force"])]
        works = _graph_works(idx)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    plain, forced = (json.loads(r.stdout) for r in runs)
    assert (plain["status"], plain["force"], forced["status"], forced["force"]) == ("done", False, "done", True)
    assert works == 242 and all(r.returncode == 0 and r.stdout.count("\n") == 1 for r in runs)


def _wait_job(env: dict[str, str], job: str, timeout: float) -> dict:
    """The job as `jobs --json` lists it, once it is no longer running (or `timeout` seconds passed).
    It is polled in this process: a `hybridsearch` process every half second would take a core from
    the workers."""
    from workers import jobs

    r = jobs.client(env["HYBRIDSEARCH_REDIS_URL"])
    try:
        jobs.follow(r, job, lambda _: None, poll=0.5, timeout=timeout)
    finally:
        r.close()
    listed = {j["id"]: j for j in json.loads(subprocess.run([EXE, "jobs", "--json"], env=env,
                                                            capture_output=True, text=True).stdout)}
    return listed[job]


def _ingested(env: dict[str, str], tmp_path: Path, n: int) -> Path:
    """The index `tmp_path / "idx"` of the demo's first `n` documents, ingested without vectors."""
    idx = tmp_path / "idx"
    out = subprocess.run([EXE, "ingest", str(demo_subset(tmp_path / "corpus", n)), "--index-dir", str(idx),
                          "--no-embed", "-q"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return idx


def _enqueue(env: dict[str, str], idx: Path, chunk: int) -> str:
    queued = subprocess.run([EXE, "embed", "--enqueue", "--chunk", str(chunk), "--index-dir", str(idx)], env=env,
                            capture_output=True, text=True)
    assert queued.returncode == 0, queued.stderr
    return queued.stdout.split("(job ")[1].split(")")[0]


def _journal_ops(idx: Path, op: str) -> dict[str, int]:
    from collections import Counter

    from hybridsearch.engines.embedded.store import Store

    store = Store(idx / "store.sqlite")
    try:
        return dict(Counter(e.id for e in store.journal_since(0) if e.op == op))
    finally:
        store.close()


@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.slow
def test_a_killed_main_worker_loses_nothing_and_doubles_nothing(redis_url, tmp_path) -> None:
    """The whole worker (main process and pool) is SIGKILLed mid-job; with a short visibility
    timeout Redis hands its unacknowledged tasks to a new worker; the job completes and every
    chunk has exactly one vector entry in the journal."""
    import signal

    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url, "HYBRIDSEARCH_WORKER_VISIBILITY_TIMEOUT": "5"}
    idx = _ingested(env, tmp_path, 90)
    job = _enqueue(env, idx, 10)
    first = subprocess.Popen([EXE, "worker", "--concurrency", "1", "--loglevel", "WARNING", "--hostname",
                              f"first-{time.time_ns()}@%h"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_for(lambda: bool(_journal_ops(idx, "vector")), 120, "the first worker embedded nothing",
              poll=0.2)  # the first batch is in
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    done_before = len(_journal_ops(idx, "vector"))
    assert 0 < done_before < 90
    second = _worker(env, 1)
    try:
        st = _wait_job(env, job, 300)
    finally:
        _stop(second)
    assert st["status"] == "done" and st["done"] == st["batches"] == 9 and st["docs_done"] == 90
    ops = _journal_ops(idx, "vector")
    assert len(ops) == 90 and set(ops.values()) == {1}
    engine = EmbeddedEngine(idx)
    assert engine.stats().vectors == 90
    engine.close()


def _redis(port: int, directory: Path) -> subprocess.Popen[bytes]:
    from tests.integration.conftest import start_redis

    return start_redis(port, "--appendonly", "yes", "--appendfsync", "always", "--dir", str(directory))


@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.slow
def test_a_redis_restart_mid_job_loses_nothing(tmp_path) -> None:
    """Redis (append-only file) is SIGKILLed and started again while a worker runs a job: the worker
    reconnects, the job completes, every chunk has its vector, none twice."""
    import signal

    from tests.integration.conftest import _free_port

    port = _free_port()
    (tmp_path / "redis").mkdir()
    server = _redis(port, tmp_path / "redis")
    # tasks unacknowledged when Redis died come back after the visibility timeout
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": f"redis://127.0.0.1:{port}/0",
           "HYBRIDSEARCH_WORKER_VISIBILITY_TIMEOUT": "10"}
    worker = None
    try:
        idx = _ingested(env, tmp_path, 90)
        job = _enqueue(env, idx, 10)
        worker = _worker(env, 1)
        _wait_for(lambda: bool(_journal_ops(idx, "vector")), 120, "the worker embedded nothing", poll=0.2)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        time.sleep(2.0)  # the worker notices the broker is gone
        server = _redis(port, tmp_path / "redis")
        st = _wait_job(env, job, 300)
        assert worker.poll() is None
    finally:
        if worker is not None:
            _stop(worker)
        server.terminate()
        server.wait(timeout=10)
    log = worker.stderr.read() if worker is not None and worker.stderr else ""
    print(log)  # shown with a failure
    assert st["status"] == "done" and st["done"] == 9 and st["failed"] == 0, st
    ops = _journal_ops(idx, "vector")
    assert len(ops) == 90 and set(ops.values()) == {1}


@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.slow
def test_killing_the_index_owner_loses_nothing_acknowledged(redis_url, tmp_path) -> None:
    """`ingest --executor celery` (the process that owns the index) is SIGKILLed while workers write
    vectors into the journal: the workers finish the job, and after reopening every journaled vector
    is applied and searchable."""
    import signal

    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url}
    idx, corpus = tmp_path / "idx", demo_subset(tmp_path / "corpus", 90)
    worker = _worker(env, 1)
    try:
        owner = subprocess.Popen([EXE, "ingest", str(corpus), "--index-dir", str(idx), "--executor", "celery",
                                  "--chunk", "10", "-q"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        deadline = time.time() + 120
        while not (idx / "store.sqlite").exists() or not _journal_ops(idx, "vector"):
            assert owner.poll() is None and time.time() < deadline, owner.stderr.read() if owner.stderr else ""
            time.sleep(0.2)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        embed_job = [j for j in json.loads(subprocess.run([EXE, "jobs", "--json"], env=env, capture_output=True,
                                                          text=True).stdout)
                     if j["target"] == str(idx.resolve()) and j["kind"] == "embed"][0]
        st = _wait_job(env, embed_job["id"], 300)
    finally:
        _stop(worker)
    assert st["status"] == "done" and st["done"] == st["batches"] == 9
    engine = EmbeddedEngine(idx)  # the next owner applies the journal
    assert engine.count() == 90 and engine.stats().vectors == 90
    doc = engine.get(["topo-compact-space"])["topo-compact-space"]
    vec = engine.vectors(["topo-compact-space"])["topo-compact-space"]
    assert engine.knn(vec, 1).ids == [doc.id]
    engine.close()
