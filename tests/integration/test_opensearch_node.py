"""The local OpenSearch launcher against a real node: install, start, plugins, k-NN, analyzers, restart after
SIGKILL, stop, and its failure messages. Skips without mvn or a JDK 11..21 unless
HYBRIDSEARCH_REQUIRE_OPENSEARCH=1."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridsearch.config import Settings
from hybridsearch.engines.opensearch import node as node_mod
from hybridsearch.engines.opensearch.admin import Admin
from hybridsearch.engines.opensearch.engine import OpenSearchEngine
from hybridsearch.engines.opensearch.node import (
    RELEASES,
    SERVICE_USER,
    JavaHome,
    LocalNode,
    choose_java_home,
    default_release,
    java_unsuitable_reason,
    parse_java_version,
)
from hybridsearch.engines.opensearch.node_cli import add_parser
from hybridsearch.errors import ConfigError, EngineUnavailableError
from hybridsearch.models import Document

NODE_MARKS = [pytest.mark.integration, pytest.mark.opensearch, pytest.mark.slow]
SETTINGS_ENV = ("HYBRIDSEARCH_OPENSEARCH_PORT", "HYBRIDSEARCH_OPENSEARCH_HOME", "HYBRIDSEARCH_OPENSEARCH_START_TIMEOUT")


def _require() -> bool:
    return os.environ.get("HYBRIDSEARCH_REQUIRE_OPENSEARCH", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    if _require():
        pytest.fail(f"HYBRIDSEARCH_REQUIRE_OPENSEARCH is set but {reason}")
    pytest.skip(reason)


def _call(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=30) as r:
        return json.loads(r.read().decode())


def _procs_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions text (launcher, JVM helpers, the node)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and node_mod.pid_alive(int(p.name)):
            try:
                if text in (p / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def _cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hybridsearch")
    add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return int(args.func(args))


# ------------------------------------------------------------------------------------------ unit level


@pytest.mark.parametrize(("text", "expected"), [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment (build 17.0.15+6)', (17, "17.0.15")),
    ('java version "1.8.0_392"\nJava(TM) SE Runtime Environment', (8, "1.8.0_392")),
    ('openjdk version "25.0.3" 2026-04-21 LTS', (25, "25.0.3")),
    ('openjdk version "21-ea" 2023-09-19', (21, "21-ea")),
    ('Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "11.0.22" 2024-01-16', (11, "11.0.22")),
    ("no version here", None),
])
def test_parse_java_version(text: str, expected: tuple[int, str] | None) -> None:
    assert parse_java_version(text) == expected


V2, V3 = RELEASES["2.19.1"], RELEASES["3.6.0"]


def test_java_suitability() -> None:
    assert java_unsuitable_reason(17, V2) is None
    assert java_unsuitable_reason(11, V2) is None
    assert java_unsuitable_reason(21, V2) is None
    assert "Security Manager" in (java_unsuitable_reason(25, V2) or "")
    assert "--version 3.6.0" in (java_unsuitable_reason(24, V2) or "")
    assert java_unsuitable_reason(8, V2) is not None
    # 3.x: Java 21 or newer, no upper bound
    assert java_unsuitable_reason(21, V3) is None and java_unsuitable_reason(25, V3) is None
    assert java_unsuitable_reason(17, V3) == "OpenSearch 3.6.0 supports Java 21 or newer (preferably 21 or 25), not 17"
    assert java_unsuitable_reason(17) == java_unsuitable_reason(17, default_release())


def _fake_jdk(root: Path, name: str, version: str) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f'#!/bin/sh\necho \'openjdk version "{version}" 2024-01-01\' >&2\n')
    java.chmod(0o755)
    return home


@pytest.fixture
def no_java_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("JAVA_HOME", "OPENSEARCH_JAVA_HOME", "HYBRIDSEARCH_OPENSEARCH_JAVA_HOME"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no `java` on PATH: only the fake JDKs count


def test_choose_java_prefers_17_then_21(tmp_path: Path, no_java_env: None) -> None:
    jvm = tmp_path / "jvm"
    for name, version in [("jdk-25", "25.0.1"), ("jdk-11", "11.0.22"), ("jdk-21", "21.0.2"), ("jdk-17", "17.0.9"),
                          ("jdk-8", "1.8.0_392")]:
        _fake_jdk(jvm, name, version)
    assert choose_java_home(jvm_dir=jvm, release=V2) == JavaHome((jvm / "jdk-17").resolve(), 17, "17.0.9")
    assert choose_java_home(jvm_dir=jvm, release=V3).major == 21
    shutil.rmtree(jvm / "jdk-17")
    assert choose_java_home(jvm_dir=jvm, release=V2).major == 21
    shutil.rmtree(jvm / "jdk-21")
    assert choose_java_home(jvm_dir=jvm, release=V2).major == 11
    assert choose_java_home(jvm_dir=jvm, release=V3).major == 25
    shutil.rmtree(jvm / "jdk-25")
    with pytest.raises(ConfigError, match=r"^no JDK 21 or newer for OpenSearch 3\.6\.0 found \(.*jdk-11 \(Java 11"):
        choose_java_home(jvm_dir=jvm, release=V3)


def test_choose_java_refuses_24_plus_and_names_what_it_found(tmp_path: Path, no_java_env: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    jvm = tmp_path / "jvm"
    j25 = _fake_jdk(jvm, "temurin-25", "25.0.3")
    _fake_jdk(jvm, "jdk-8", "1.8.0_392")
    with pytest.raises(ConfigError) as err:
        choose_java_home(jvm_dir=jvm, release=V2)
    msg = str(err.value)
    assert "temurin-25" in msg and "Security Manager" in msg and "jdk-8" in msg
    # an explicit JDK that does not fit is an error, not silently replaced
    with pytest.raises(ConfigError, match="Security Manager"):
        choose_java_home(j25, jvm_dir=jvm, release=V2)
    # JAVA_HOME that does not fit is passed over for one that does
    j17 = _fake_jdk(jvm, "jdk-17", "17.0.9")
    monkeypatch.setenv("JAVA_HOME", str(j25))
    assert choose_java_home(jvm_dir=jvm, release=V2).path == j17.resolve()
    assert choose_java_home(jvm_dir=jvm, release=V3).path == j25


def test_a_home_with_whitespace_is_refused_before_anything(tmp_path: Path) -> None:
    home = tmp_path / "my home"
    with pytest.raises(ConfigError, match=r"holds whitespace, which the node's launcher cannot pass to Java; "
                                          r"choose another \(--home, HYBRIDSEARCH_OPENSEARCH_HOME\)$"):
        LocalNode(home).start(timeout=5)
    assert not home.exists()


def test_bad_start_options_and_homes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hybridsearch.cli import main

    for argv, why in ((["--port", "0"], "argument --port: a port is a whole number from 1 to 65535, got '0'"),
                      (["--port", "70000"], "from 1 to 65535, got '70000'"),
                      (["--timeout", "nan"], "argument --timeout: a number of seconds above 0, got 'nan'"),
                      (["--timeout", "-1"], "a number of seconds above 0, got '-1'"),
                      (["--version", "2.11.0"], "argument --version: invalid choice: '2.11.0' (choose from "
                                                "'2.19.1', '3.6.0')")):
        with pytest.raises(SystemExit) as done:
            main(["opensearch", "start", *argv])
        assert done.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("error: ") and why in line, line
    afile = tmp_path / "afile"
    afile.write_text("")
    for action in ("stop", "start"):
        assert main(["opensearch", action, "--home", str(afile / "sub")]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: OpenSearch node 'default' (home {afile / 'sub'}): Not a directory"), line


def test_missing_mvn_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    monkeypatch.setattr(node_mod.shutil, "which", lambda cmd, *a, **k: None if cmd == "mvn" else real_which(cmd))
    with pytest.raises(EngineUnavailableError, match=r"apt-get install -y maven"):
        node_mod.fetch_artifacts(tmp_path / "downloads")


# ----------------------------------------------------------------------------------------- a real node


@pytest.fixture(scope="module")
def prereqs() -> JavaHome:
    if shutil.which("mvn") is None:
        _unavailable("mvn is not on PATH (apt-get install -y maven): the node is assembled from Maven Central")
    try:
        return choose_java_home()
    except ConfigError as e:
        _unavailable(str(e))
        raise


@pytest.fixture(scope="module")
def node_env() -> Iterator[None]:
    """Settings from the developer's environment must not steer the test nodes; a smaller heap is enough."""
    with pytest.MonkeyPatch.context() as mp:
        for var in SETTINGS_ENV:
            mp.delenv(var, raising=False)
        mp.setenv("HYBRIDSEARCH_OPENSEARCH_HEAP", "512m")
        yield


@pytest.fixture(scope="module")
def node_home(tmp_path_factory: pytest.TempPathFactory, prereqs: JavaHome, node_env: None) -> Iterator[Path]:
    """A fresh home. As root the node runs as the service user, which cannot get through pytest's
    /tmp/pytest-of-root (mode 700), so then the home is a world-searchable dir of its own in /tmp."""
    if os.geteuid() != 0:
        yield tmp_path_factory.mktemp("opensearch-home")
        return
    home = Path(tempfile.mkdtemp(prefix="hybridsearch-node-test-"))
    home.chmod(0o755)
    try:
        yield home
    finally:
        for d in sorted((home / "nodes").glob("*")):
            LocalNode(home, d.name).stop(timeout=10)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def running(node_home: Path) -> Iterator[tuple[LocalNode, str]]:
    node = LocalNode(node_home, "it")
    url = node.start(timeout=240, progress=lambda m: None)
    try:
        yield node, url
    finally:
        node.stop(timeout=10)


@pytest.mark.integration
@pytest.mark.opensearch
@pytest.mark.slow
class TestLocalNode:
    def test_start_answers_with_version_plugins_and_modules(self, running: tuple[LocalNode, str]) -> None:
        node, url = running
        assert url.startswith("http://127.0.0.1:")
        assert _call("GET", url)["version"]["number"] == node.release.version == default_release().version
        health = _call("GET", f"{url}/_cluster/health")
        assert health["status"] in ("green", "yellow") and health["cluster_name"] == "hybridsearch"
        components = {row["component"] for row in _call("GET", f"{url}/_cat/plugins?format=json")}
        assert {"opensearch-knn", "opensearch-neural-search"} <= components
        (info,) = _call("GET", f"{url}/_nodes/plugins")["nodes"].values()
        modules = {m["name"] for m in info["modules"]}
        assert {"lang-painless", "analysis-common", "reindex", "transport-netty4"} <= modules
        assert {"opensearch-knn", "opensearch-neural-search"} <= {p["name"] for p in info["plugins"]}
        assert node.data_dir.is_dir() and any(node.data_dir.iterdir())

    def test_second_start_returns_the_same_node(self, running: tuple[LocalNode, str]) -> None:
        node, url = running
        pid = node.pid
        assert pid is not None
        assert node.start(timeout=30) == url
        again = LocalNode(node.home, node.name)  # another process would see it through the state file
        assert again.start(timeout=30) == url
        assert again.pid == pid

    def test_a_node_keeps_its_release(self, running: tuple[LocalNode, str]) -> None:
        node, url = running
        held = node.release.version
        assert node.release_file.read_text().strip() == held
        other = next(v for v in RELEASES if v != held)
        with pytest.raises(ConfigError, match=rf"^version: node 'it' holds data of OpenSearch {held} \(in .*\); start "
                                              rf"it with --version {held}, or choose another name for {other}$"):
            LocalNode(node.home, node.name, other).start(timeout=30)
        # without a version asked for, the node's own, whatever the setting names
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("HYBRIDSEARCH_OPENSEARCH_VERSION", other)
            assert LocalNode(node.home, node.name).release.version == held
            assert LocalNode(node.home, "new").release.version == other
        assert LocalNode(node.home, node.name, held).start(timeout=30) == url

    def test_status_reports_running(self, running: tuple[LocalNode, str]) -> None:
        node, url = running
        st = node.status()
        assert st.running and st.url == url and st.pid == node.pid
        assert st.version == node.release.version
        assert st.java_home and (Path(st.java_home) / "bin" / "java").exists()
        assert st.home == str(node.home) and st.installed

    def test_node_does_not_run_as_root(self, running: tuple[LocalNode, str]) -> None:
        node, _ = running
        assert node.pid is not None
        uid = _uid_of(node.pid)
        if os.geteuid() == 0:
            assert uid != 0
            assert uid == pwd.getpwnam(SERVICE_USER).pw_uid
        else:
            assert uid == os.geteuid()

    def test_lucene_binary_hamming_knn(self, running: tuple[LocalNode, str]) -> None:
        _, url = running
        _call("PUT", f"{url}/bits", {
            "settings": {"index": {"knn": True, "number_of_shards": 1, "number_of_replicas": 0}},
            "mappings": {"properties": {"v": {
                "type": "knn_vector", "dimension": 16, "data_type": "binary",
                "method": {"name": "hnsw", "engine": "lucene", "space_type": "hamming"}}}},
        })
        vectors = {"a": [0, 0], "b": [15, 0], "c": [-1, -1]}  # 16 bits as 2 signed bytes
        for doc_id, v in vectors.items():
            _call("PUT", f"{url}/bits/_doc/{doc_id}?refresh=true", {"v": v})
        hits = _call("POST", f"{url}/bits/_search", {"size": 3, "query": {"knn": {"v": {"vector": [1, 0], "k": 3}}}})
        assert [h["_id"] for h in hits["hits"]["hits"]] == ["a", "b", "c"]  # hamming 1, 3, 15

    def test_english_analyzer(self, running: tuple[LocalNode, str]) -> None:
        _, url = running
        out = _call("POST", f"{url}/_analyze", {"analyzer": "english", "text": "The foxes were running"})
        assert [t["token"] for t in out["tokens"]] == ["fox", "were", "run"]

    def test_cli_start_and_status(self, running: tuple[LocalNode, str], capsys: pytest.CaptureFixture[str]) -> None:
        node, url = running
        base = ["--home", str(node.home), "--name", node.name]
        assert _cli(["opensearch", "start", *base]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == url
        assert _cli(["opensearch", "status", *base, "--json"]) == 0
        st = json.loads(capsys.readouterr().out)
        assert st["running"] is True and st["url"] == url and st["pid"] == node.pid
        assert _cli(["opensearch", "status", *base]) == 0
        assert f"url: {url}" in capsys.readouterr().out.splitlines()

    def test_restart_after_sigkill_keeps_port_and_data(self, running: tuple[LocalNode, str]) -> None:
        node, url = running
        _call("PUT", f"{url}/survivor/_doc/1?refresh=true", {"text": "still here"})
        pid = node.kill()
        assert pid is not None and not node_mod.pid_alive(pid)
        assert node.state_file.exists()  # a crash leaves the state behind
        assert not node.is_running() and not node.status().running
        assert node.start(timeout=240) == url  # same port, taken from the stale state
        assert node.pid not in (None, pid)
        assert _call("GET", f"{url}/survivor/_doc/1")["_source"] == {"text": "still here"}

    def test_refuses_faiss_fields_the_node_cannot_load(self, running: tuple[LocalNode, str]) -> None:
        # the k-NN zip has no native libraries: a faiss field would kill the node at its first refresh
        _, url = running
        attrs = _call("GET", f"{url}/_cat/nodeattrs?format=json")
        assert ("knn_native_libraries", "absent") in [(a["attr"], a["value"]) for a in attrs]
        faiss = Settings(opensearch_knn_engine="faiss")
        refused = (r"^opensearch_knn_engine: 'faiss' needs the k-NN plugin's native libraries, which node it lacks "
                   r".*use 'lucene'$")
        engine = OpenSearchEngine(url, index="faiss-refused", settings=faiss)
        with pytest.raises(ConfigError, match=refused):
            engine.write([Document(id="d1", title="t", text="a chunk")])
        assert not [i for i in _call("GET", f"{url}/_cat/indices?format=json") if "faiss" in i["index"]]
        templates = _call("GET", f"{url}/_index_template")["index_templates"]
        assert "hybridsearch-faiss-refused" not in {t["name"] for t in templates}
        # nor does a reindex move a Lucene index onto faiss: refused before anything changes
        OpenSearchEngine(url, index="on-lucene", settings=Settings()).write([Document(id="d1", title="t", text="x")])
        with pytest.raises(ConfigError, match=refused):
            Admin(url, settings=faiss).reindex("on-lucene")
        assert [i["index"] for i in _call("GET", f"{url}/_cat/indices/on-lucene-*?format=json")] == ["on-lucene-v1"]
        # a snapshot records each index's k-NN engine, and a restore checks it before anything
        # changes; a faiss index's snapshot is one another cluster made (this node cannot hold one)
        admin = Admin(url, settings=Settings())
        admin.repo_add("faiss-check")
        made = admin.snapshot_create("lucene-snap", "faiss-check", ["on-lucene"])
        meta = admin.client.snapshot.get(repository="faiss-check", snapshot="lucene-snap")["snapshots"][0]["metadata"]
        assert meta["hybridsearch"] == {"indices": made["indices"], "knn_engines": {"on-lucene": "lucene"},
                                        "graphs": {}}  # no graph built, so no graph index
        admin.client.snapshot.create(repository="faiss-check", snapshot="faiss-snap", body={
            "indices": "on-lucene-v1", "include_global_state": False, "metadata": {"hybridsearch": {
                "indices": {"on-lucene": "on-lucene-v1"}, "knn_engines": {"on-lucene": "faiss"}}}},
            params={"wait_for_completion": "true"})
        admin.delete("on-lucene")
        with pytest.raises(ConfigError, match=r"^snapshot 'faiss-snap': index 'on-lucene' \(k-NN engine 'faiss'\) "
                                              r"needs the k-NN plugin's native libraries, .*; restore it on a "
                                              r"cluster that has them$"):
            admin.snapshot_restore("faiss-snap", "faiss-check")
        assert not _call("GET", f"{url}/_cat/indices/on-lucene-*?format=json")
        assert admin.snapshot_restore("lucene-snap", "faiss-check")["indices"] == {"on-lucene": "on-lucene-v1"}
        admin.close()
        assert _call("GET", f"{url}/_cluster/health")["status"] in ("green", "yellow")

    def test_starts_with_a_red_index_and_names_it(self, running: tuple[LocalNode, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
        # a primary with no node to go to stays red however long one waits: the node must still
        # come up, so that the index can be restored or deleted, and say which index is red
        node, url = running
        _call("PUT", f"{url}/stranded?wait_for_active_shards=0", {"settings": {
            "number_of_shards": 1, "number_of_replicas": 0, "index.routing.allocation.require._name": "nowhere"}})
        try:
            assert node.kill() is not None  # a crash keeps the port
            began = time.monotonic()
            assert node.start(timeout=120) == url
            assert time.monotonic() - began < 100
            st = node.status()
            assert st.running and st.health == "red" and st.red_indices == ["stranded"]
            base = ["--home", str(node.home), "--name", node.name]
            assert _cli(["opensearch", "start", *base]) == 0  # already running: it warns too
            out, err = capsys.readouterr()
            assert out.splitlines()[-1] == url
            assert "cluster is red: a primary shard of stranded is unassigned" in err
            assert f"curl -X DELETE {url}/stranded" in err
            assert _cli(["opensearch", "status", *base]) == 0
            assert {"health: red", "red_indices: stranded"} <= set(capsys.readouterr().out.splitlines())
        finally:
            _call("DELETE", f"{url}/stranded")
        st = node.status()
        assert st.health in ("green", "yellow") and st.red_indices == []

    def test_too_short_timeout_fails_with_log_tail_and_leaves_nothing(self, running: tuple[LocalNode, str]) -> None:
        node = LocalNode(running[0].home, "short")
        with pytest.raises(EngineUnavailableError) as err:
            node.start(timeout=0.5)
        msg = str(err.value)
        assert "did not answer" in msg and "0.5 s" in msg
        assert f"{node.log_file}" in msg and f"last lines of {node.launch_log}" in msg
        time.sleep(1.0)  # anything the launcher had forked would have shown up by now
        assert _procs_mentioning(str(node.node_dir)) == []
        assert not node.is_running() and not node.state_file.exists()

    def test_node_dying_at_start_fails_at_once(self, running: tuple[LocalNode, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        node = LocalNode(running[0].home, "dies")
        node.logs_dir.mkdir(parents=True)
        node.log_file.write_text("[INFO ][o.o.n.Node] an earlier run of this node: stopped, closed\n")
        write = LocalNode._write_config

        def bad_config(self: LocalNode, port: int, transport_port: int) -> None:
            write(self, port, transport_port)
            with (self.config_dir / "opensearch.yml").open("a") as f:
                f.write("no.such.setting: 1\n")

        monkeypatch.setattr(LocalNode, "_write_config", bad_config)
        began = time.monotonic()
        with pytest.raises(EngineUnavailableError, match="exited during start-up") as err:
            node.start(timeout=200)
        assert time.monotonic() - began < 60
        assert "no.such.setting" in str(err.value) and "an earlier run" not in str(err.value)
        assert _procs_mentioning(str(node.node_dir)) == []

    def test_status_exits_3_while_the_node_does_not_answer(self, running: tuple[LocalNode, str],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
        node, url = running
        assert node.pid is not None
        base = ["--home", str(node.home), "--name", node.name, "--json"]
        os.kill(node.pid, signal.SIGSTOP)
        try:
            assert _cli(["opensearch", "status", *base]) == 3
        finally:
            os.kill(node.pid, signal.SIGCONT)
        st = json.loads(capsys.readouterr().out)
        assert st["running"] is True and st["answering"] is False and st["url"] == url
        assert _cli(["opensearch", "status", *base]) == 0
        assert json.loads(capsys.readouterr().out)["answering"] is True

    def test_a_start_ended_or_killed_never_strands_its_node(self, running: tuple[LocalNode, str]) -> None:
        node = LocalNode(running[0].home, "late")
        argv = [sys.executable, "-m", "hybridsearch.cli", "opensearch", "start", "-q", "--home", str(node.home),
                "--name", node.name, "--timeout", "240"]

        def launching() -> subprocess.Popen[str]:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 120
            while node.running_pid() is None:  # the JVM is up, not yet answering
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.05)
            return proc

        # SIGTERM (`timeout`, a CI cancel) ends the start and the node it was starting
        first = launching()
        first.terminate()
        assert first.wait(60) == 128 + signal.SIGTERM
        time.sleep(1.0)
        assert node.running_pid() is None and _procs_mentioning(str(node.node_dir)) == []
        # a second start while the first is still starting waits for it and prints the same URL
        first = launching()
        url = node.start(timeout=240)
        out, _ = first.communicate(timeout=240)
        assert first.returncode == 0 and out.splitlines()[-1] == url
        node.stop()
        # a start killed outright leaves its node starting: the next start takes it over
        first = launching()
        first.kill()
        first.wait(10)
        assert node.start(timeout=240) == url  # the port kept across the stop
        state = json.loads(node.state_file.read_text())
        assert state["pid"] == node.pid and "starting" not in state and state["version"] == node.release.version
        st = node.status()
        assert st.running and st.answering and st.url == url
        node.stop()
        assert json.loads(node.state_file.read_text()) == {"name": "late", "port": state["port"],
                                                             "transport_port": state["transport_port"]}

    def test_stop(self, running: tuple[LocalNode, str], capsys: pytest.CaptureFixture[str]) -> None:
        node, _ = running
        pid = node.pid
        assert pid is not None
        assert node.stop() == pid
        assert not node_mod.pid_alive(pid)
        st = node.status()
        assert not st.running and st.url is None and st.pid is None
        assert set(json.loads(node.state_file.read_text())) == {"name", "port", "transport_port"}
        base = ["--home", str(node.home), "--name", node.name]
        assert _cli(["opensearch", "stop", *base]) == 0
        assert "not running" in capsys.readouterr().out
        assert _cli(["opensearch", "status", *base]) == 1
        assert "running: false" in capsys.readouterr().out.splitlines()

    def test_bad_pin_fails_naming_the_artifact(self, tmp_path: Path, prereqs: JavaHome,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        bad = "0" * 64
        release = default_release()
        (good,) = [p for p in release.pins if p.artifact == "neural-search"]
        pins = tuple(node_mod.Pin(bad, p.coords, p.use) if p is good else p for p in release.pins)
        monkeypatch.setitem(RELEASES, release.version, dataclasses.replace(release, pins=pins))
        home = tmp_path / "fresh"
        with pytest.raises(EngineUnavailableError) as err:
            LocalNode(home, "x").install()
        msg = str(err.value)
        assert f"org.opensearch.plugin:neural-search:{release.version}.0:zip" in msg
        assert f"expected {bad}" in msg and good.sha256 in msg
        assert not (home / f"opensearch-{release.version}").exists()
        assert stat.S_ISDIR((home / "downloads").stat().st_mode)


def test_process_exists_until_it_is_gone(monkeypatch) -> None:
    """What a lock holder's pid says: a running process exists, a zombie or a reaped one does not,
    and one /proc hides (hidepid) but that answers a signal still exists."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert node_mod.process_exists(child.pid)
        monkeypatch.setattr(node_mod, "_proc_state_of", lambda path: None)  # as /proc with hidepid=2 shows it
        assert not node_mod.pid_alive(child.pid) and node_mod.process_exists(child.pid)
        monkeypatch.undo()
    finally:
        child.kill()
    deadline = time.time() + 10
    while node_mod._proc_state(child.pid) not in ("Z", "X") and time.time() < deadline:
        time.sleep(0.05)
    assert not node_mod.process_exists(child.pid)  # a zombie, not reaped yet
    child.wait()
    assert not node_mod.process_exists(child.pid)
