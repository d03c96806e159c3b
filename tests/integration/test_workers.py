"""A real Celery worker on a real Redis embeds chunks that were ingested without vectors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridsearch.engines.embedded import EmbeddedEngine
from indexer.loaders import BeirLoader, LoadReport
from tests.conftest import DEMO

EXE = str(Path(sys.executable).with_name("hybridsearch"))


def start_worker(env: dict[str, str]) -> subprocess.Popen[str]:
    """A real Celery worker process (one task at a time) on the test's Redis."""
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker",
                             "--pool", "solo", "--concurrency", "1", "--loglevel", "WARNING",
                             "--without-gossip", "--without-mingle", "--without-heartbeat"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.integration
@pytest.mark.redis
def test_celery_worker_embeds_and_the_owner_applies(redis_url, tmp_path, encoder) -> None:
    env = {**os.environ, "HYBRIDSEARCH_REDIS_URL": redis_url}
    docs = list(BeirLoader().load(DEMO, LoadReport()))[:30]
    engine = EmbeddedEngine(tmp_path / "idx")
    engine.write(docs)
    assert engine.stats().details["dense_vectors"] == 0
    worker = start_worker(env)
    try:
        out = subprocess.run([EXE, "embed", "--enqueue", "--chunk", "10", "--index-dir",
                              str(tmp_path / "idx")], env=env, capture_output=True, text=True, check=True)
        assert "queued 30 chunks in 3 tasks" in out.stdout
        deadline = time.time() + 180
        while engine.store.count_vectors() < 30:
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            assert time.time() < deadline, "the worker did not embed the chunks in time"
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    # the owner sees the worker's journal entries without a restart
    assert engine.stats().details["dense_vectors"] == 30
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
        deadline = time.time() + 180
        while engine.stats().vectors < 20:
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            assert time.time() < deadline, "the worker did not embed the chunks in time"
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    for d in docs[:5]:
        assert engine.knn(encoder.encode([d.dense_text])[0], 1).ids == [d.id]
    out = subprocess.run([EXE, "embed", "--enqueue", "--chunk", "0", "--engine", "opensearch", "--index",
                          engine.index], env=env, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr == "error: --chunk must be >= 1, got 0\n"
