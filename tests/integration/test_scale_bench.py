"""bench/scale.py end to end at a small size: a generated corpus ingested by the CLI, vectors written,
queries measured, the table printed and the JSON written (500 works, generated vectors, 20 queries:
well under a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED_DATA

SCALE = REPO / "bench" / "scale.py"
KEYS = {"docs", "ingest_docs_per_s", "peak_rss_mb", "disk_mb", "graph_build_s", "bm25_p50_ms", "bm25_p95_ms",
        "dense_p50_ms", "dense_p95_ms", "dense_recall_at_10", "hybrid_p50_ms", "update_1pct_s", "open_s",
        "open_rss_mb", "vectors_per_s"}


def scale(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(SCALE), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


@pytest.mark.integration
def test_scale_bench_runs_small(tmp_path: Path) -> None:
    if not all((SHARED_DATA / d / "corpus.jsonl").is_file() for d in ("scifact", "cacm")):
        pytest.skip("the scifact and cacm corpora are not under ../shared/data")
    out_json, work = tmp_path / "scale.json", tmp_path / "work"
    out = scale("--docs", "500", "--real-vectors-max", "0", "--centres", "32", "--queries", "20",
                "--json", str(out_json), "--work-dir", str(work))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| lexical profile p50 |" in out.stdout and "| knn recall@10 against exact |" in out.stdout
    assert "CPU features:" in out.stdout
    for phase in ("corpus:", "ingest:", "vectors:", "open:", "queries:", "update:"):
        assert phase in out.stderr
    (entry,) = json.loads(out_json.read_text())
    assert set(entry) >= KEYS and entry["engine"] == "embedded" and entry["docs"] == 500
    assert entry["dense_recall_at_10"] == 1.0  # exact search below the IVF threshold
    assert all(entry[k] is not None and entry[k] > 0 for k in KEYS - {"graph_build_s"})
    lines = (work / "corpus.jsonl").read_text().splitlines()
    assert len(lines) == 500
    first = json.loads(lines[0])
    assert first["id"] == "w0000000" and {"title", "text", "cites", "subjects", "year", "month"} <= set(first)
    assert all(len(json.loads(line)["text"].split()) <= 300 for line in lines)  # one chunk per work


def test_scale_bench_refuses_bad_arguments(tmp_path: Path) -> None:
    for args, message in ((["--docs", "0"], "a whole number above 0"),
                          (["--docs", "10", "--engine", "opensearch"], "no OpenSearch URL"),
                          (["--docs", "10", "--url", "http://127.0.0.1:9", "--engine", "embedded"], "--url")):
        env_url = {k: v for k, v in os.environ.items() if k != "HYBRIDSEARCH_OPENSEARCH_URL"}
        out = subprocess.run([sys.executable, str(SCALE), *args], capture_output=True, text=True, timeout=60,
                             env={**env_url, "PYTHONPATH": str(REPO)})
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    (tmp_path / "notes.txt").write_text("mine")
    out = scale("--docs", "10", "--work-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2 and "not a work directory of this benchmark" in out.stderr
    assert out.stderr.count("\n") == 1 and (tmp_path / "notes.txt").read_text() == "mine"
