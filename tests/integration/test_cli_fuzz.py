"""The CLI driven by generated arguments and records: every command exits 0 or 2 with one error
line, never a traceback, and the index's document count never drops except by `delete`."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridsearch.cli import main
from hybridsearch.engines.embedded.store import Store

IDS = [f"d{i}" for i in range(8)] + ["d1#1", "w", "w#2", ""]
WORDS = ["compact", "space", "Brouwer", "théorème", "$x^2$", "fixed", "point", "∞", "", "\u2028", "C*-algebra"]
text = st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join)
value = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), text,
                  st.none(), st.lists(text, max_size=2))
record = st.fixed_dictionaries(
    {"id": st.sampled_from(IDS), "title": text},
    optional={"text": st.one_of(text, st.just(" ".join(["long"] * 700))), "year": value, "month": value,
              "subjects": value, "cites": st.lists(st.sampled_from(IDS), max_size=3), "kind": value,
              "unknown_field": value})
profile = st.sampled_from(["hybrid", "lexical", "kb-fast", "aico", "semantic", "nope", "kb-thinkingdb"])
channels = st.sampled_from(["bm25", "bm25,dense", "bm25+hdc", ",,,", "+", "nonsense", "dense,hdc", " "])
k = st.one_of(st.none(), st.integers(-3, 20_000))
date = st.one_of(st.none(), st.sampled_from(["1990", "2001-02", "19x5", "2020-13", "-5"]))

command = st.one_of(
    st.tuples(st.just("ingest"), st.lists(st.one_of(record, st.just("not json"), st.just("\ufeff{}")), max_size=5)),
    st.tuples(st.just("search"), text, profile, st.one_of(st.none(), channels), k, date,
              st.one_of(st.none(), st.sampled_from(["topology", "Analysis", ""]))),
    st.tuples(st.just("delete"), st.lists(st.sampled_from(IDS[:-1]), max_size=3), st.booleans()),
    st.tuples(st.just("stats")),
    st.tuples(st.just("graph")),
)


def _argv(cmd: tuple, idx: str, tmp: Path) -> list[str]:
    name = cmd[0]
    if name == "ingest":
        f = tmp / "fuzz.jsonl"
        f.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in cmd[1]))
        return ["ingest", str(f), "--index-dir", idx, "--no-embed", "-q"]
    if name == "search":
        _, q, prof, chans, kk, since, subject = cmd
        argv = ["search", q, "--index-dir", idx, "--profile", prof]
        argv += [] if chans is None else ["--channels", chans]
        argv += [] if kk is None else ["-k", str(kk)]
        argv += [] if since is None else ["--date-from", since]
        return argv + ([] if subject is None else ["--subject", subject])
    if name == "delete":
        _, ids, by_work = cmd
        return ["delete", *([] if by_work else ids), *(a for i in ids for a in ("--work", i) if by_work),
                "--index-dir", idx]
    return [name, "--index-dir", idx]


def _count(idx: Path) -> int:
    if not (idx / "store.sqlite").exists():
        return 0
    store = Store(idx / "store.sqlite")
    try:
        return store.count()
    finally:
        store.close()


@pytest.mark.integration
def test_generated_cli_runs_exit_0_or_2_and_lose_nothing(tmp_path_factory, encoder) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    idx = tmp / "idx"
    os.environ["HYBRIDSEARCH_QUERY_LOG"] = "false"

    @settings(max_examples=int(os.environ.get("HYBRIDSEARCH_FUZZ_EXAMPLES", "40")), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(command, min_size=1, max_size=4))
    def run(commands: list[tuple]) -> None:
        for cmd in commands:
            argv = _argv(cmd, str(idx), tmp)
            before = _count(idx)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except SystemExit as e:  # argparse's own usage errors
                    code = int(e.code or 0)
            after = _count(idx)
            assert code in (0, 2), (argv, code, err.getvalue())
            assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
            errors = [x for x in err.getvalue().splitlines() if x.startswith("error:")]
            assert code == 0 or len(errors) == 1, (argv, err.getvalue())
            if cmd[0] != "delete":
                assert after >= before, (argv, before, after)

    try:
        run()
    finally:
        os.environ.pop("HYBRIDSEARCH_QUERY_LOG", None)
