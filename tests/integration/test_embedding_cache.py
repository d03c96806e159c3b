"""One corpus embedded once on a machine: an ingest, a second index, an eval, a Celery worker and an
OpenSearch index all take the first run's vectors from the embedding cache, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridsearch.engines import open_engine
from tests.conftest import demo_subset

EXE = str(Path(sys.executable).with_name("hybridsearch"))


def run(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def vectors(target: str, ids: list[str], **options: str) -> dict[str, np.ndarray]:
    engine = open_engine(target, **options)
    try:
        vecs = engine.vectors(ids)
        passages = engine.passage_vectors(ids)
    finally:
        engine.close()
    return {i: np.vstack([vecs[i][None, :], passages[i]]) for i in ids}


@pytest.mark.integration
@pytest.mark.opensearch
def test_a_corpus_is_embedded_once_across_indexes_engines_and_eval(tmp_path, opensearch_index) -> None:
    env = {**os.environ, "HYBRIDSEARCH_EMBEDDING_CACHE": str(tmp_path / "cache")}
    corpus = demo_subset(tmp_path / "corpus", 30)
    first = run(env, "ingest", str(corpus), "--index-dir", str(tmp_path / "a"), "-q")
    assert "embedded 30," in first and "from the embedding cache" not in first
    second = run(env, "ingest", str(corpus), "--index-dir", str(tmp_path / "b"), "-q")
    assert "embedded 30," in second and "(30 of them from the embedding cache)" in second
    os_run = run(env, "ingest", str(corpus), "--url", opensearch_index.url, "--index", opensearch_index.index, "-q")
    assert "(30 of them from the embedding cache)" in os_run
    stats = json.loads(run(env, "cache", "--json"))
    assert stats["entries"] == 30 and list(stats["encoders"].values()) == [30]
    assert stats["path"] == str(tmp_path / "cache" / "embeddings.sqlite")

    ids = [json.loads(line)["_id"] for line in (corpus / "corpus.jsonl").open()]
    # what an embed worker runs, on an index ingested without vectors: with a model that cannot encode
    run(env, "ingest", str(corpus), "--index-dir", str(tmp_path / "c"), "--no-embed", "-q")
    code = ("import sys; from hybridsearch.embeddings import MiniLMEncoder, default_encoder; "
            "from indexer.pipeline import embed_ids_at; MiniLMEncoder.encode = None; "
            "print(embed_ids_at(sys.argv[1], default_encoder(), sys.argv[2:]))")
    worker = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c"), *ids], env=env, capture_output=True,
                            text=True, timeout=300)
    assert worker.stdout.strip() == "30", worker.stderr[-2000:]
    want = vectors(str(tmp_path / "a"), ids)
    for got in (vectors(str(tmp_path / "b"), ids), vectors(str(tmp_path / "c"), ids),
                vectors(opensearch_index.url, ids, index=opensearch_index.index)):
        assert all(np.array_equal(want[i], got[i]) for i in ids)

    assert run(env, "cache", "clear").startswith("removed 30 entries")
    assert json.loads(run(env, "cache", "--json"))["entries"] == 0
