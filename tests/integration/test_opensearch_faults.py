"""Faults on a real OpenSearch node of the test's own: SIGKILL during a bulk ingest, then restart
and ingest again (every acknowledged write survives, every document ends up there exactly once);
a node that is down answers a search with one clear error."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

import hybridsearch
from hybridsearch.errors import EngineUnavailableError
from hybridsearch.models import Document

pytestmark = [pytest.mark.integration, pytest.mark.opensearch, pytest.mark.slow]
EXE = str(Path(sys.executable).with_name("hybridsearch"))
N = 5000
BATCH = 250
WORDS = ["spectral", "gap", "bound", "compact", "operator", "Banach", "space", "manifold", "curvature", "group",
         "ring", "field", "prime", "measure", "integral", "series", "convergence", "topology", "homotopy",
         "lattice", "graph", "matrix", "eigenvalue"]


def corpus() -> tuple[list[Document], np.ndarray]:
    rng = np.random.default_rng(7)
    docs = [Document(id=f"d{i:05d}", title=" ".join(rng.choice(WORDS, 4)),
                     text=" ".join(rng.choice(WORDS, 40)), year=int(rng.integers(1950, 2024))) for i in range(N)]
    vecs = rng.normal(size=(N, 384)).astype(np.float32)
    return docs, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


@pytest.fixture
def own_node(opensearch_url):
    """A second node from the same distribution as the suite's node (its own data and port), so
    that killing it disturbs no other test."""
    from hybridsearch.engines.opensearch.node import LocalNode

    node = LocalNode(name=f"faults-{uuid.uuid4().hex[:8]}")
    url = node.start()
    yield node, url
    node.stop()
    shutil.rmtree(node.node_dir, ignore_errors=True)


def _ingest(url: str, docs: list[Document], vecs: np.ndarray, acked: list[str], errors: list[BaseException],
            after_batch: threading.Event | None = None) -> None:
    from hybridsearch.engines.opensearch import OpenSearchEngine

    engine = OpenSearchEngine(url, index="faults")
    try:
        for i in range(0, len(docs), BATCH):
            engine.write(docs[i:i + BATCH], vecs[i:i + BATCH])
            acked.extend(d.id for d in docs[i:i + BATCH])  # acknowledged: write() returned
            if after_batch is not None:
                after_batch.set()
    except BaseException as e:  # noqa: BLE001 - handed to the test thread
        errors.append(e)
    finally:
        engine.close()


def test_sigkill_during_bulk_ingest_then_restart_and_ingest_again(own_node) -> None:
    from hybridsearch.engines.opensearch import OpenSearchEngine

    node, url = own_node
    docs, vecs = corpus()
    acked: list[str] = []
    errors: list[BaseException] = []
    progressed = threading.Event()
    writer = threading.Thread(target=_ingest, args=(url, docs, vecs, acked, errors, progressed))
    writer.start()
    while len(acked) < 4 * BATCH and writer.is_alive():
        progressed.wait(timeout=60)
        progressed.clear()
    assert writer.is_alive(), f"the ingest ended before the kill: {errors}"
    node.kill()
    writer.join(timeout=120)
    assert not writer.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], EngineUnavailableError), errors
    assert 4 * BATCH <= len(acked) < N

    # the node is down: a search is one clear error, in the CLI and in the Python API
    out = subprocess.run([EXE, "search", "spectral gap", "--url", url, "--index", "faults", "--profile", "lexical"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert out.stderr.startswith("error: cannot reach OpenSearch at"), out.stderr
    with hybridsearch.open(url, index="faults") as h, pytest.raises(EngineUnavailableError, match="cannot reach"):
        h.search("spectral gap", "lexical")

    assert node.start() == url, "restarted on another port"  # same data, same port
    engine = OpenSearchEngine(url, index="faults")
    try:
        assert len(engine.get(acked)) == len(acked), "an acknowledged write was lost"
        errors.clear()
        _ingest(url, docs, vecs, [], errors)  # the same ingest again, from the start
        assert not errors
        assert engine.count() == N
        assert len(engine.get([d.id for d in docs])) == N
        assert engine.knn(vecs[1234], 1).ids == [docs[1234].id]
    finally:
        engine.close()
