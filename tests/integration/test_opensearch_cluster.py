"""A local 3-node cluster of the test's own (`hybridsearch opensearch start --nodes 3`), and a lost
node that loses nothing: an index of 3 shards and 1 replica holding SciFact, searched in every
channel and through `hybrid` by two threads while a third writes, the elected cluster manager
SIGKILLed, then started again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridsearch.models import Document
from tests.conftest import SHARED_DATA

pytestmark = [pytest.mark.integration, pytest.mark.opensearch, pytest.mark.slow]
EXE = str(Path(sys.executable).with_name("hybridsearch"))
SCIFACT = SHARED_DATA / "scifact"
QUERIES = 12


class HashedWords:
    """The test's encoder: a text's vector is the normalised sum of its words' vectors, each drawn
    from a generator seeded by the word's CRC32 (384-d, the dimension the index template takes), so
    that all of SciFact has vectors in seconds, plus a direction all texts share (as a real model's
    vectors do), so that a query's best cosines pass the `hybrid` profile's domain gate. It names
    itself as the configured encoder, whose record the index holds."""

    def __init__(self) -> None:
        from hybridsearch.embeddings import default_encoder

        real = default_encoder()  # made, not loaded
        self.name, self.dim, self.fingerprint = real.name, real.dim, getattr(real, "fingerprint", None)
        self._shared = self._word("")

    def _word(self, w: str) -> np.ndarray:
        return np.random.default_rng(zlib.crc32(w.encode())).normal(size=self.dim).astype(np.float32)

    def encode(self, texts: Any, *, batch_size: int | None = None, progress: bool = False,
               query: bool = False) -> np.ndarray:
        words: dict[str, int] = {}
        rows = [[words.setdefault(w, len(words)) for w in t.lower().split()] for t in texts]
        table = np.stack([self._word(w) for w in words]) if words else np.zeros((0, self.dim), np.float32)
        out = np.stack([table[r].sum(axis=0) if r else np.zeros(self.dim, np.float32) for r in rows])
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9) + self._shared / np.linalg.norm(
            self._shared)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "opensearch", *args], capture_output=True, text=True, env=env, timeout=400)


@pytest.fixture(scope="module")
def cluster(opensearch_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A 3-node cluster started by the CLI from the suite node's distribution (heap 512m each);
    yields its name and the environment; stopped by the CLI and removed afterwards."""
    name = f"cluster-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "HYBRIDSEARCH_OPENSEARCH_HEAP": "512m"}
    env.pop("HYBRIDSEARCH_OPENSEARCH_PORT", None)
    started = _cli("start", "--name", name, "--nodes", "3", "-q", env=env)
    try:
        assert started.returncode == 0, started.stderr
        yield name, env
    finally:
        stopped = _cli("stop", "--name", name, env=env)
        from hybridsearch.engines.opensearch.node import LocalCluster

        nodes = LocalCluster(name=name).nodes()
        assert stopped.returncode == 0 and len(nodes) == 3 and not any(n.is_running() for n in nodes), stopped
        for node in nodes:
            shutil.rmtree(node.node_dir, ignore_errors=True)


def _status(name: str, env: dict[str, str]) -> dict[str, Any]:
    got = _cli("status", "--name", name, "--json", env=env)
    assert got.returncode == 0, got.stdout + got.stderr
    status: dict[str, Any] = json.loads(got.stdout)
    return status


def _manager(url: str) -> str:
    """The name of the elected cluster manager."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/_cat/nodes?h=name,cluster_manager&format=json", timeout=10) as r:
        return next(str(n["name"]) for n in json.load(r) if n["cluster_manager"] == "*")


def test_three_nodes_start_and_report(cluster: tuple[str, dict[str, str]]) -> None:
    name, env = cluster
    st = _status(name, env)
    assert st["health"] in ("green", "yellow") and [n["name"] for n in st["nodes"]] == [name, f"{name}.2", f"{name}.3"]
    assert all(n["running"] and n["answering"] and n["pid"] for n in st["nodes"])
    urls = [n["url"] for n in st["nodes"]]
    assert len(set(urls)) == 3
    from hybridsearch.engines.opensearch.admin import Admin

    admin = Admin(",".join(urls))
    try:
        assert admin.client.cluster.health()["number_of_nodes"] == 3
        # the nodes share one path.repo, so an fs snapshot repository verifies on all of them
        assert admin.repo_add("cluster-test")["verified_nodes"] == 3
    finally:
        admin.close()
    # a start of the cluster keeps its size; another size is refused in one line
    again = _cli("start", "--name", name, "--nodes", "2", env=env)
    assert again.returncode == 2 and "is a cluster of 3 nodes" in again.stderr and "Traceback" not in again.stderr
    # a node of the cluster is never started alone (it would start as a single-node cluster)
    alone = _cli("start", "--name", f"{name}.2", env=env)
    assert alone.returncode == 2 and f"is a node of the cluster {name!r}" in alone.stderr, alone.stderr
    # (a start that brings back a node that died: test_a_lost_node_loses_nothing)


def test_a_lost_node_loses_nothing(cluster: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    from hybridsearch.engines.opensearch import OpenSearchEngine
    from hybridsearch.engines.opensearch.admin import Admin
    from hybridsearch.engines.opensearch.node import LocalNode
    from indexer.pipeline import ingest
    from query_service.searcher import Searcher

    name, env = cluster
    before = {n["name"]: n["url"] for n in _status(name, env)["nodes"]}
    urls = ",".join(before.values())
    index = "scifact"
    # SciFact with the test encoder's vectors given on input (corpus.npy beside the corpus)
    encoder = HashedWords()
    corpus = tmp_path / "scifact"
    corpus.mkdir()
    shutil.copy(SCIFACT / "corpus.jsonl", corpus / "corpus.jsonl")
    rows = [json.loads(line) for line in (corpus / "corpus.jsonl").read_text().splitlines()]
    np.save(corpus / "corpus.npy", encoder.encode([f"{r.get('title', '')} {r['text']}" for r in rows]))
    admin = Admin(urls)
    try:
        admin.create(index, shards=3, replicas=1)
        engine = OpenSearchEngine(urls, index=index)
        # two batches: each write refreshes, and fewer, larger segments merge their HNSW graphs less
        summary = ingest(engine, corpus, progress=False, batch_size=2600)
        assert summary.indexed == summary.given == len(rows)
        admin.client.cluster.health(wait_for_status="green", params={"timeout": "120s"}, request_timeout=130)
        placed = admin.status(index)
    finally:
        admin.close()
    assert placed["number_of_shards"] == 3 and placed["number_of_replicas"] == 1
    by_shard: dict[int, set[str]] = {}
    for row in placed["shards"]:
        by_shard.setdefault(row["shard"], set()).add(row["node"])
    assert len(by_shard) == 3 and all(len(nodes) == 2 for nodes in by_shard.values())  # two copies, two nodes
    queries = [json.loads(line)["text"] for line in (SCIFACT / "queries.jsonl").read_text().splitlines()][:QUERIES]
    searcher = Searcher(engine, encoder=encoder, query_log=None)
    hdc = engine.hdc_encoder()

    def channels(q: str) -> dict[str, int]:
        vec = encoder.encode([q], query=True)[0]
        got = {"bm25": len(engine.bm25(q, k=10).ids), "dense": len(engine.knn(vec, 10).ids),
               "hybrid": len(searcher.search(q, "hybrid", k=10).hits)}
        got.update({f"hdc:{f}": len(rl.ids) for f, rl in engine.hamming(hdc.encode_query(q), 10).items()})
        return got

    baseline = {q: channels(q) for q in queries}
    assert all(n > 0 for q in queries for c, n in baseline[q].items() if c in ("bm25", "dense", "hybrid"))

    stop = threading.Event()
    failed: list[str] = []
    empty: list[tuple[str, str]] = []
    latency: list[tuple[float, float]] = []
    acked: list[str] = []

    def search_loop(offset: int) -> None:
        i = offset
        while not stop.is_set():
            q = queries[i % len(queries)]
            i += 1
            t = time.perf_counter()
            try:
                got = channels(q)
                empty.extend((q, c) for c, n in got.items() if n == 0 < baseline[q][c])
            except Exception as e:  # counted: the caller must see none
                failed.append(f"{type(e).__name__}: {e}")
            latency.append((time.monotonic(), time.perf_counter() - t))

    def write_loop() -> None:
        writer = OpenSearchEngine(urls, index=index)
        n = 0
        try:
            while not stop.is_set():
                docs = [Document(id=f"written-{n + j}", title=f"written during the fault {n + j}",
                                 text="cells written while a node of the cluster is lost") for j in range(20)]
                try:
                    writer.write(docs, encoder.encode([d.text for d in docs]))
                    acked.extend(d.id for d in docs)
                except Exception as e:
                    failed.append(f"write: {type(e).__name__}: {e}")
                n += 20
                time.sleep(0.1)
        finally:
            writer.close()

    threads = [threading.Thread(target=search_loop, args=(k,)) for k in (0, QUERIES // 2)]
    threads.append(threading.Thread(target=write_loop))
    for t in threads:
        t.start()
    try:
        time.sleep(4)  # searches before the fault: the latency's anchor
        victim = LocalNode(name=_manager(urls.split(",")[0]))
        killed_at = time.monotonic()
        assert victim.kill() is not None
        assert not next(n for n in _status(name, env)["nodes"] if n["name"] == victim.name)["running"]
        time.sleep(5)
        restart_at = time.monotonic()
        restarted = _cli("start", "--name", name, "-q", env=env)  # starts the node that is down
        time.sleep(2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert restarted.returncode == 0 and restarted.stdout.strip().splitlines()[-1] in before.values(), restarted
    after = {n["name"]: n for n in _status(name, env)["nodes"]}
    assert all(n["running"] and n["answering"] for n in after.values())
    assert after[victim.name]["url"] == before[victim.name]  # at its port
    health = engine.client.cluster.health(wait_for_status="green", params={"timeout": "120s"}, request_timeout=130)
    found = engine.get(acked)
    during = sorted(d for at, d in latency if killed_at <= at <= restart_at)
    ahead = sorted(d for at, d in latency if at < killed_at) or [0.0]
    print(f"\ncluster fault: {victim.name} (cluster manager) SIGKILLed; {len(latency)} searches "
          f"({len(during)} while it was down), {len(failed)} failed, {len(empty)} empty where there were hits; "
          f"{len(acked)} writes acknowledged, {len(found)} found; health {health['status']}; search latency while "
          f"down: p50 {1000 * during[len(during) // 2]:.0f} ms, max {1000 * during[-1]:.0f} ms (before: p50 "
          f"{1000 * ahead[len(ahead) // 2]:.0f} ms, max {1000 * ahead[-1]:.0f} ms; a search: every channel, hybrid)")
    engine.close()
    assert failed == [] and empty == []
    assert len(during) > 0 and len(acked) > 0
    assert sorted(found) == sorted(acked)
    assert health["status"] == "green" and not health["timed_out"]
