"""The bench scripts refuse bad input with one `error:` line before any work (no model, no server),
and never delete what they did not make."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import DEMO, REPO

BENCH = REPO / "bench"


def bench(script: str, *args: str, cwd: Path | None = None, path: str | None = None
          ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def load(script: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{script}", BENCH / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(out: subprocess.CompletedProcess[str], message: str) -> None:
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout == ""


# -- embedded.py ------------------------------------------------------------------------------------
def test_embedded_keeps_a_directory_it_did_not_build(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    out = bench("embedded.py", str(DEMO), "--index-dir", str(tmp_path))
    refused(out, "not an index this benchmark built")
    assert out.stderr.count("\n") == 1
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_embedded_never_deletes_the_working_directory(tmp_path: Path) -> None:
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "file.py").write_text("")
    for target in (".", str(tmp_path)):
        refused(bench("embedded.py", str(DEMO), "--index-dir", target, "--overwrite", cwd=work),
                "choose a directory of its own")
    assert (work / "file.py").exists()


def test_embedded_rebuilds_only_its_own_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    embedded = load("embedded", monkeypatch)
    own = tmp_path / "own"
    own.mkdir()
    (own / embedded.MARKER).write_text("")
    (own / "store.sqlite").write_text("")
    assert embedded.index_dir_for(own, overwrite=False) == own and not own.exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("")
    assert embedded.index_dir_for(other, overwrite=True) == other and not other.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert embedded.index_dir_for(empty, overwrite=False) == empty and empty.exists()


def test_embedded_refuses_a_missing_dataset(tmp_path: Path) -> None:
    refused(bench("embedded.py", str(tmp_path / "nowhere")), "not a BEIR dataset directory")


# -- http_load.py -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["--scifact", "/nowhere"], "not a BEIR dataset directory"),
    (["--workers", "0"], "a whole number above 0"),
    (["--seconds", "0"], "a number of seconds above 0"),
    (["--synthetic", "-5"], "a whole number, 0 or more"),
])
def test_http_load_refuses_bad_arguments(args: list[str], message: str) -> None:
    refused(bench("http_load.py", "--scifact", str(DEMO), *args), message)


def test_http_load_verdict_names_what_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    http_load = load("http_load", monkeypatch)
    row = {"p50": 100.0, "p95": 300.0, "errors": 0}
    assert http_load.slo(row) == "met"
    assert http_load.slo({**row, "errors": 3}) == "MISSED (3 errors)"
    assert http_load.slo({**row, "p50": 2000.0, "p95": 5000.0}) == "MISSED (p50, p95)"
    assert http_load.slo({"p50": float("nan"), "p95": float("nan"), "errors": 9}) == "MISSED (p50, p95, 9 errors)"


# -- celery_ingest.py and graph.py ------------------------------------------------------------------
@pytest.mark.parametrize("script", ["celery_ingest.py", "graph.py"])
def test_redis_benches_need_redis_server_on_path(script: str) -> None:
    refused(bench(script, str(DEMO), path=str(Path(sys.executable).parent)), "redis-server is not on PATH")


@pytest.mark.parametrize(("script", "args", "message"), [
    ("celery_ingest.py", ["--workers", "0"], "a whole number above 0"),
    ("celery_ingest.py", ["--workers", "-1"], "a whole number above 0"),
    ("celery_ingest.py", ["--hdc-docs", "-1"], "a whole number, 0 or more"),
    ("celery_ingest.py", ["--timeout", "0"], "a number of seconds above 0"),
    ("graph.py", ["--runs", "0"], "a whole number above 0"),
])
def test_redis_benches_refuse_bad_numbers(script: str, args: list[str], message: str) -> None:
    refused(bench(script, str(DEMO), *args), message)


@pytest.mark.parametrize("script", ["celery_ingest.py", "graph.py"])
def test_redis_benches_refuse_a_missing_dataset(script: str, tmp_path: Path) -> None:
    refused(bench(script, str(tmp_path)), "not a BEIR dataset directory")


def test_graph_refuses_an_unreachable_node_first() -> None:
    out = subprocess.run([sys.executable, str(BENCH / "graph.py"), str(DEMO)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "HYBRIDSEARCH_OPENSEARCH_URL": "http://127.0.0.1:1"},
                         timeout=60)
    refused(out, "cannot reach OpenSearch at http://127.0.0.1:1")


def test_a_dead_worker_ends_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridsearch.errors import HybridSearchError

    celery_ingest = load("celery_ingest", monkeypatch)
    log = tmp_path / "worker.log"
    log.write_text("worker: lost its broker\n")
    worker = subprocess.Popen([sys.executable, "-c", "pass"])
    worker.wait()
    with pytest.raises(HybridSearchError, match="worker exited with status 0: worker: lost its broker"):
        celery_ingest.timed([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ),
                            worker=worker, log=log)
    with pytest.raises(HybridSearchError, match="ran past --timeout 0.5 s"):
        celery_ingest.timed([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), timeout=0.5)


@pytest.mark.slow  # a worker's start-up and its broker check: about 5 s
def test_a_worker_that_cannot_start_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridsearch.errors import HybridSearchError

    celery_ingest = load("celery_ingest", monkeypatch)
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "HYBRIDSEARCH_REDIS_URL": f"redis://127.0.0.1:{celery_ingest.free_port()}/0"}
    with pytest.raises(HybridSearchError, match="worker exited with status .*does not answer"):
        celery_ingest.start_worker(env, 1, tmp_path / "worker.log", timeout=60)


# -- vector_compression.py --------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["--levels", "1x,8x"], "--levels: '1x,8x' is not a list of 1x, 4x, 32x"),
    (["--oversample", "0.5"], "--oversample: '0.5' is not a list of factors from 1 to 100"),
    (["--oversample", "three"], "--oversample: 'three' is not a list of factors from 1 to 100"),
    ([], "cannot reach OpenSearch at http://127.0.0.1:1"),
])
def test_vector_compression_refuses_bad_arguments_before_any_work(args: list[str], message: str) -> None:
    out = bench("vector_compression.py", "--docs", "100", "--url", "http://127.0.0.1:1", *args)
    refused(out, message)
    assert out.stderr.count("\n") == 1


# -- opensearch.py and ops.py -----------------------------------------------------------------------
@pytest.mark.parametrize("script", ["opensearch.py", "ops.py"])
def test_opensearch_benches_refuse_an_unreachable_node_before_the_model_loads(script: str) -> None:
    out = bench(script, str(DEMO), "--url", "http://127.0.0.1:1", "--queries", "5")
    refused(out, "cannot reach OpenSearch at http://127.0.0.1:1")
    assert out.stderr.count("\n") == 1


@pytest.mark.parametrize("script", ["opensearch.py", "ops.py"])
@pytest.mark.parametrize(("args", "message"), [
    (["--queries", "0"], "a whole number above 0"),
    (["--queries", "-3"], "a whole number above 0"),
])
def test_opensearch_benches_refuse_bad_numbers(script: str, args: list[str], message: str) -> None:
    refused(bench(script, str(DEMO), "--url", "http://127.0.0.1:1", *args), message)


@pytest.mark.parametrize("script", ["opensearch.py", "ops.py"])
def test_opensearch_benches_refuse_a_missing_dataset(script: str, tmp_path: Path) -> None:
    refused(bench(script, str(tmp_path), "--url", "http://127.0.0.1:1"), "not a BEIR dataset directory")


# -- hdc.py -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["million", "--n", "100"], "--queries 200: each query is drawn from a different one of the first 100"),
    (["million", "--n", "50", "--queries", "10"], "needs at least 100 codes"),
    (["million", "--n", "-5"], "a whole number above 0"),
    (["million", "--queries", "0"], "a whole number above 0"),
    (["million", "--m", "0"], "a whole number above 0"),
    (["million", "--query-tokens", "0"], "a number above 0"),
    (["encode", "--data"], "expected at least one argument"),
    (["encode", "--data", "/nowhere"], "not a BEIR dataset directory"),
    (["quality", "--data", str(DEMO), "/nowhere"], "not a BEIR dataset directory"),
])
def test_hdc_refuses_bad_arguments(args: list[str], message: str) -> None:
    refused(bench("hdc.py", *args), message)


# -- query_layer.py, rerank.py, tune_hybrid.py, tune_rerank.py --------------------------------------
@pytest.mark.parametrize(("script", "args", "message"), [
    ("query_layer.py", ["eval"], "eval needs at least one DATASET"),
    ("query_layer.py", ["eval", "/nowhere"], "not a BEIR dataset directory"),
    ("query_layer.py", ["stages", str(DEMO)], "stages takes no DATASET"),
    ("rerank.py", ["--queries", "0"], "a whole number above 0"),
    ("rerank.py", ["--queries", "-60"], "a whole number above 0"),
    ("rerank.py", ["/nowhere"], "not a BEIR dataset directory"),
    ("tune_hybrid.py", [str(DEMO), "--step", "0"], "divides 1 evenly"),
    ("tune_hybrid.py", [str(DEMO), "--step", "0.3"], "divides 1 evenly"),
    ("tune_hybrid.py", [str(DEMO), "--step=-0.1"], "divides 1 evenly"),
    ("tune_hybrid.py", [str(DEMO), "--split", "test"], "never on test"),
    ("tune_hybrid.py", [str(DEMO), "--split", "dev"], "no qrels for split 'dev'"),
    ("tune_hybrid.py", ["/nowhere"], "not a BEIR dataset directory"),
    ("tune_rerank.py", ["--scifact", "/nowhere"], "not a BEIR dataset directory"),
    ("tune_rerank.py", ["--scifact", str(DEMO), "--report", "/nowhere"], "not a BEIR dataset directory"),
    ("tune_rerank.py", ["--scifact", str(DEMO), "--step", "0.3"], "divides 1 evenly"),
])
def test_eval_benches_refuse_bad_arguments(script: str, args: list[str], message: str) -> None:
    refused(bench(script, *args), message)
