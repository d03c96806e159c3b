"""The query log: records from real searches, the bounded buffer, failing sinks, JSONL files and
pruning by age."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from query_service.querylog import JsonlSink, QueryLog, parse_age, prune_files

EXE = str(Path(sys.executable).with_name("hybridsearch"))
FIELDS = {"@timestamp", "query", "profile", "engine", "index", "origin", "k", "hits", "ms", "stage_ms",
          "channel_hits", "zero_result", "out_of_domain", "reason", "top_ids"}


class Blocking:
    """A sink that holds its first batch until released, then records what it got."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.got: list[dict] = []

    def write(self, records) -> None:
        self.release.wait(10)
        self.got += records

    def close(self) -> None:
        pass


class Failing:
    def write(self, records) -> None:
        raise ConnectionError("sink is down")

    def close(self) -> None:
        pass


def test_a_full_buffer_drops_and_counts_without_blocking() -> None:
    sink = Blocking()
    log = QueryLog(sink, capacity=5, batch=2)
    accepted = [log.put({"@timestamp": "2026-01-01T00:00:00Z", "n": i}) for i in range(50)]
    # the writer holds at most one batch; the buffer holds 5 more; the rest are dropped
    assert sum(accepted) <= 5 + 2 and log.dropped == 50 - sum(accepted) and log.dropped > 0
    sink.release.set()
    assert log.flush(5)
    assert log.written == sum(accepted) == len(sink.got)
    log.close()
    assert not log.put({"@timestamp": "2026-01-01T00:00:00Z"}) and log.dropped == 51 - sum(accepted)


def test_a_failing_sink_counts_failures(tmp_path) -> None:
    log = QueryLog(Failing(), batch=10)
    for i in range(3):
        assert log.put({"@timestamp": "2026-01-01T00:00:00Z", "n": i})
    assert log.flush(5)
    st = log.stats()
    assert (st["failed"], st["written"], st["dropped"]) == (3, 0, 0)
    assert st["last_error"] == "ConnectionError: sink is down"
    log.close()


def test_api_searches_write_one_record_each(demo_copy, monkeypatch) -> None:
    import hybridsearch

    monkeypatch.setenv("HYBRIDSEARCH_OPENSEARCH_PASSWORD", "s3cret-never-logged")
    with hybridsearch.open(demo_copy) as h:
        found = h.search("Gödel incompleteness", "lexical", k=3)
        ood = h.search("best pizza recipe near me")
    files = list((demo_copy / "querylog").glob("queries-*.jsonl"))
    assert len(files) == 1
    text = files[0].read_text()
    assert "s3cret" not in text
    first, second = [json.loads(line) for line in text.splitlines()]
    assert set(first) == FIELDS
    assert (first["query"], first["profile"], first["engine"], first["origin"]) == (
        "Gödel incompleteness", "lexical", "embedded", "api")
    assert first["top_ids"] == [x.id for x in found.hits] and first["hits"] == 3 and first["k"] == 3
    assert first["channel_hits"]["bm25"] > 0 and first["stage_ms"]["channels"] > 0
    assert first["zero_result"] is False and first["out_of_domain"] is False
    assert not ood.hits and second["zero_result"] is True and second["out_of_domain"] is True
    assert second["reason"].startswith("out of domain") and second["profile"] == "hybrid"
    assert files[0].name == f"queries-{first['@timestamp'][:10]}.jsonl"


def test_escalation_and_citation_hits_are_counted_as_channels(demo_copy) -> None:
    """The dashboards' "Channel hit counts" panel sums channel_hits.<channel> for every channel: a
    kb-balanced search that escalates to HDC counts its HDC hits, and a hybrid search counts the
    candidates its citation expansion scored."""
    import hybridsearch

    with hybridsearch.open(demo_copy) as h:
        escalated = h.search("Borsuk", "kb-balanced", k=5)
        expanded = h.search("Brouwer fixed point theorem", "hybrid", k=5)
    assert escalated.diagnostics["escalated"] is True
    (f,) = (demo_copy / "querylog").glob("queries-*.jsonl")
    first, second = [json.loads(line) for line in f.read_text().splitlines()]
    stages = escalated.diagnostics["stages"]
    assert first["channel_hits"] == {"bm25": stages["channels"]["hits"]["bm25"],
                                     "hdc": stages["escalation"]["hits"]} and first["channel_hits"]["hdc"] > 0
    cited = [x for x in expanded.hits if x.contributions.get("citation", 0) > 0]
    assert cited and second["channel_hits"]["citation"] == expanded.diagnostics["stages"]["expand"]["cited"]
    assert second["channel_hits"]["citation"] >= len(cited)


def test_cli_search_logs_unless_turned_off(demo_copy, tmp_path) -> None:
    import os

    env = {**os.environ, "HYBRIDSEARCH_QUERY_LOG_DIR": str(tmp_path / "log")}
    out = subprocess.run([EXE, "search", "Gödel", "--index-dir", str(demo_copy), "--profile", "lexical"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    (record,) = [json.loads(x) for f in (tmp_path / "log").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert record["origin"] == "cli" and record["query"] == "Gödel"
    off = subprocess.run([EXE, "search", "Gödel", "--index-dir", str(demo_copy)], capture_output=True, text=True,
                         env={**env, "HYBRIDSEARCH_QUERY_LOG": "false"})
    assert off.returncode == 0
    assert sum(len(f.read_text().splitlines()) for f in (tmp_path / "log").glob("*.jsonl")) == 1


def test_prune_files_by_age(tmp_path) -> None:
    sink = JsonlSink(tmp_path)
    today = dt.datetime.now(dt.UTC).date().isoformat()
    for day in ("2026-09-01", "2026-10-22", "2026-10-23", today):
        sink.write([{"@timestamp": f"{day}T12:00:00Z", "query": "q"}])
    now = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)
    assert prune_files(tmp_path, parse_age("30d"), now) == ["queries-2026-09-01.jsonl", "queries-2026-10-22.jsonl"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["queries-2026-10-23.jsonl", f"queries-{today}.jsonl"]
    with pytest.raises(Exception, match="--older-than"):
        parse_age("0d")
    for age in ("1000000d", "99999999999d", "900000h"):
        with pytest.raises(Exception, match="is more than 36500 days"):
            parse_age(age)
    assert prune_files(tmp_path, parse_age("36500d"), now) == []
    out = subprocess.run([EXE, "logs", "prune", "--older-than", "1d", "--index-dir", str(tmp_path)],
                         capture_output=True, text=True, input="", env={"HYBRIDSEARCH_QUERY_LOG_DIR": str(tmp_path),
                                                                      "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "refused without --yes" in out.stderr
    out = subprocess.run([EXE, "logs", "prune", "--older-than", "1d", "--yes", "--json"], capture_output=True,
                         text=True, env={"HYBRIDSEARCH_QUERY_LOG_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"deleted": ["queries-2026-10-23.jsonl"]}


def test_an_empty_log_dir_variable_is_unset_not_the_working_directory(monkeypatch) -> None:
    from hybridsearch.config import Settings

    monkeypatch.setenv("HYBRIDSEARCH_QUERY_LOG_DIR", "")  # what `${UNSET}` in a compose file gives
    monkeypatch.setenv("HYBRIDSEARCH_INDEX_DIR", "")
    s = Settings()
    assert s.query_log_dir is None and s.index_dir == Settings.model_fields["index_dir"].default


def test_the_query_log_prefix_is_checked_as_an_index_name_prefix(monkeypatch) -> None:
    import os

    from hybridsearch.config import Settings, get_settings
    from hybridsearch.errors import ConfigError

    monkeypatch.delenv("HYBRIDSEARCH_QUERY_LOG_PREFIX")
    assert Settings().query_log_prefix == "hybridsearch-queries-"
    for bad in ("Queries-", "-queries-", "q*", "a b", "logs/"):
        monkeypatch.setenv("HYBRIDSEARCH_QUERY_LOG_PREFIX", bad)
        with pytest.raises(ConfigError, match=r"^HYBRIDSEARCH_QUERY_LOG_PREFIX: .*not an index-name prefix") as e:
            get_settings()
        assert "\n" not in str(e.value)
    out = subprocess.run([EXE, "logs", "prune", "--older-than", "1d", "--url", "http://127.0.0.1:1", "--yes"],
                         capture_output=True, text=True, env={**os.environ, "HYBRIDSEARCH_QUERY_LOG_PREFIX": "Bad*"})
    assert out.returncode == 2 and out.stderr.startswith("error: HYBRIDSEARCH_QUERY_LOG_PREFIX: ")
    assert out.stderr.count("\n") == 1 and "(got 'Bad*')" in out.stderr


def test_the_longest_accepted_query_is_kept_whole_for_the_dashboards() -> None:
    from hybridsearch.config import Settings
    from hybridsearch.engines.opensearch.queries import template

    mapping = template("hybridsearch-queries")["template"]["mappings"]["properties"]["query"]
    assert mapping["ignore_above"] >= Settings.model_fields["http_max_query_chars"].default
    assert mapping["ignore_above"] * 4 <= 32_766  # Lucene's longest term, in UTF-8 bytes


def test_a_log_that_cannot_be_written_says_so(tmp_path, caplog) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")  # a file where the log's directory should be
    log = QueryLog(JsonlSink(blocked), batch=1)
    with caplog.at_level("WARNING", logger="hybridsearch.querylog"):
        for i in range(3):
            assert log.put({"@timestamp": "2026-11-24T10:00:00Z", "query": f"q{i}"})
        assert log.flush()
        log.close()
    s = log.stats()
    assert s["written"] == 0 and s["failed"] == 3 and "FileExistsError" in s["last_error"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "could not be written" in w]) == 1  # the first failure only
    assert any(w.startswith("query log closed: 0 records written, 0 dropped, 3 failed") for w in warnings)


_POOL = """
import json, multiprocessing as mp, sys
import hybridsearch

h = hybridsearch.open(sys.argv[1])
if __name__ == "__main__":
    h.search("Gödel", "lexical", k=3)  # the parent's log and its writer thread run before the fork


def work(q):
    return len(h.search(q, "lexical", k=3).hits)


if __name__ == "__main__":
    with mp.get_context(sys.argv[2]).Pool(2) as pool:  # leaving it terminates the children
        print(json.dumps(pool.map(work, ["Brouwer", "Urysohn", "compact", "prime"])))
"""


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_searches_in_multiprocessing_children_are_logged(demo_copy, tmp_path, start) -> None:
    """A pool's child processes log their own searches, even when the pool terminates them: a
    multiprocessing child writes each record as it comes (a forked one would otherwise wait for
    the parent's writer thread, which does not survive the fork)."""
    script = tmp_path / "pool.py"
    script.write_text(_POOL)
    out = subprocess.run([sys.executable, str(script), str(demo_copy), start], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [3, 3, 3, 3]
    records = [json.loads(x) for f in (demo_copy / "querylog").glob("*.jsonl") for x in f.read_text().splitlines()]
    queries = sorted(r["query"] for r in records if r["query"] != "Gödel")
    assert queries == ["Brouwer", "Urysohn", "compact", "prime"]
    assert all(r["origin"] == "api" and r["hits"] == 3 for r in records)


def test_a_closed_log_is_freed(demo_copy) -> None:
    """Nothing keeps a closed log alive (its queue, its sink, an OpenSearch client), however many
    a long-lived process opens and closes."""
    import gc
    import multiprocessing.util  # noqa: F401 - loaded in any real process (torch, uvicorn, celery)
    import weakref

    import hybridsearch

    refs = []
    for _ in range(3):
        with hybridsearch.open(demo_copy) as h:
            h.search("compact", "lexical", k=3)
            refs.append(weakref.ref(h._searcher.query_log))
    del h
    gc.collect()
    assert all(r() is None for r in refs)


def test_logical_index_names_stay_clear_of_the_query_log(monkeypatch) -> None:
    """A logical index may not be named like the query log's indices, nor be made with its index
    template (`hybridsearch-<name>`); other names that merely share the log's first letters are fine."""
    from hybridsearch.engines.opensearch.engine import check_index_name, check_new_index_name
    from hybridsearch.errors import ConfigError

    monkeypatch.setenv("HYBRIDSEARCH_QUERY_LOG_PREFIX", "hybridsearch-queries-")
    with pytest.raises(ConfigError, match="'queries' would have the index template hybridsearch-queries, which is "
                                          "the query log's"):
        check_new_index_name("queries")
    assert check_index_name("queries") == "queries"  # one made before the rule still opens
    for name in ("hybridsearch-queries", "hybridsearch-queries-2026.01.01"):
        with pytest.raises(ConfigError, match="is not a valid logical index name"):
            check_index_name(name)
    monkeypatch.setenv("HYBRIDSEARCH_QUERY_LOG_PREFIX", "q-")
    assert check_index_name("quantum") == "quantum" and check_index_name("queries") == "queries"
    for name in ("q", "q-2026.01.01"):
        with pytest.raises(ConfigError, match="is not a valid logical index name"):
            check_index_name(name)
