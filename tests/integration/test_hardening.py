"""Reproductions of answers that were silently wrong and of tracebacks where one line belongs: each
test failed before its fix."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hybridsearch
from hybridsearch.analysis import ANALYSIS_RULES, Analyzer
from hybridsearch.cli import main
from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.errors import IndexNotFoundError
from tests.conftest import DEMO

EXE = str(Path(sys.executable).with_name("hybridsearch"))
LONG = " ".join(f"word{i} filler text about manifolds" for i in range(240))  # about 1,200 words


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def jsonl(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# -- silently wrong answers ------------------------------------------------------------------------

@pytest.mark.integration
def test_chunks_without_vectors_are_never_hidden_by_a_cosine_rule(demo_copy, tmp_path) -> None:
    f = jsonl(tmp_path / "new.jsonl", {"id": "zz-1", "title": "Quillen–Suslin theorem on projective modules",
                                       "text": "Finitely generated projective modules over polynomial rings are free."})
    with hybridsearch.open(demo_copy) as h:
        h.ingest(f, embed=False)
        for profile in ("hybrid", "aico"):
            res = h.search("Quillen–Suslin theorem on projective modules", profile, k=5)
            assert "zz-1" in [x.id for x in res.hits], (profile, res.diagnostics)
            assert "hybridsearch embed" in res.diagnostics["vectors_missing"]
    # an index with no vectors at all: hybrid answers from the lexical channels, and says why
    bare = hybridsearch.create(tmp_path / "bare")
    bare.ingest(DEMO, embed=False)
    res = bare.search("Brouwer fixed point theorem", "hybrid", k=3)
    assert res.hits and res.hits[0].id.startswith("topo-brouwer"), res.diagnostics
    assert "reason" not in res.diagnostics and "vectors_missing" in res.diagnostics
    bare.close()


@pytest.mark.integration
def test_reingesting_a_work_replaces_all_of_it(tmp_path, capsys) -> None:
    idx = str(tmp_path / "idx")
    long = jsonl(tmp_path / "long.jsonl", {"id": "w", "title": "A long work", "text": LONG + " zebraword"})
    assert run(capsys, "ingest", str(long), "--index-dir", idx, "--no-embed", "-q")[0] == 0
    with hybridsearch.open(idx) as h:
        chunks = h.engine.work_chunks(["w"])
        assert len(chunks) > 2 and h.search("zebraword", "lexical").hits
    short = jsonl(tmp_path / "short.jsonl", {"id": "w", "title": "A short work", "text": "Brief now."})
    code, out, _ = run(capsys, "update", str(short), "--index-dir", idx, "--no-embed", "-q")
    assert code == 0 and f"removed {len(chunks)} chunks" in out
    with hybridsearch.open(idx) as h:
        assert list(h.engine.work_chunks(["w"])) == ["w"] and h.search("zebraword", "lexical").hits == []
        assert h.search("brief", "lexical").hits[0].id == "w"


def test_a_work_whose_chunks_are_apart_in_the_input_keeps_them_all(tmp_path) -> None:
    from indexer.pipeline import ingest

    def chunk(n: int, words: str) -> dict:
        return {"id": f"w#{n}", "work_id": "w", "chunk_no": n, "title": "Split work", "text": words}

    filler = [{"id": f"f{i}", "title": f"filler {i}", "text": "other things"} for i in range(5)]
    f = jsonl(tmp_path / "split.jsonl", chunk(0, "first part"), *filler, chunk(1, "second part"))
    with EmbeddedEngine(tmp_path / "idx") as engine:
        s = ingest(engine, f, hdc=False, graph=False, progress=False, batch_size=2)
        assert s.indexed == 7 and s.replaced == 0
        assert list(engine.work_chunks(["w"])) == ["w#0", "w#1"]
        # a new version without the old chunk 1 still replaces the old version whole
        shorter = jsonl(tmp_path / "shorter.jsonl", chunk(0, "first part again"), *filler)
        s = ingest(engine, shorter, hdc=False, graph=False, progress=False, batch_size=2)
        assert s.replaced == 1 and list(engine.work_chunks(["w"])) == ["w#0"]


@pytest.mark.integration
def test_derived_indexes_of_another_store_are_rebuilt(tmp_path, capsys) -> None:
    idx = tmp_path / "idx"
    a = jsonl(tmp_path / "a.jsonl", *({"id": f"a{i}", "title": f"alpha{i} topic", "text": "first corpus"}
                                      for i in range(30)))
    b = jsonl(tmp_path / "b.jsonl", {"id": "b0", "title": "beta topic", "text": "second corpus"})
    assert run(capsys, "ingest", str(a), "--index-dir", str(idx), "--no-embed", "-q")[0] == 0
    for f in idx.glob("store.sqlite*"):
        f.unlink()
    code, _, err = run(capsys, "ingest", str(b), "--index-dir", str(idx), "--no-embed", "-q")
    assert code == 0 and "rebuilding the BM25 index from the journal" in err, err
    with hybridsearch.open(idx) as h:
        assert h.search("alpha1", "lexical").hits == [] and [x.id for x in h.search("beta", "lexical").hits] == ["b0"]
        st = h.engine.stats().details
        assert st["bm25_applied_seq"] <= st["journal_seq"] and st["bm25_docs"] == 1


@pytest.mark.integration
def test_a_chunk_id_never_collides_with_a_record_id(tmp_path, capsys) -> None:
    f = jsonl(tmp_path / "c.jsonl", {"id": "c", "title": "Chunked", "text": LONG},
              {"id": "c#1", "title": "Collides", "text": "a record named like a chunk"},
              {"id": "ok", "title": "Unrelated", "text": "kept"})
    idx = str(tmp_path / "idx")
    code, out, _ = run(capsys, "ingest", str(f), "--index-dir", idx, "--no-embed", "-q")
    assert code == 0 and "rejected 1" in out
    assert f"{f}:2" in out and f"chunk id 'c#1' is taken by an earlier record ('c', {f}:1)" in out
    later = jsonl(tmp_path / "later.jsonl", {"id": "c#2", "title": "Again", "text": "a standalone work"},
                  {"id": "ok2", "title": "Also kept", "text": "fine"})
    code, out, _ = run(capsys, "ingest", str(later), "--index-dir", idx, "--no-embed", "-q")
    assert code == 0 and "id 'c#2' is a chunk of work 'c' in the index" in out and "indexed 1" in out
    with hybridsearch.open(idx) as h:
        got = h.engine.get(["ok", "ok2", "c#2"])
        assert set(got) == {"ok", "ok2", "c#2"} and got["c#2"].work_id == "c"
    # an input whose every record is refused so indexes nothing: exit 2, saying why
    only = jsonl(tmp_path / "only.jsonl", {"id": "c#3", "title": "Again", "text": "another standalone work"})
    code, _, err = run(capsys, "ingest", str(only), "--index-dir", idx, "--no-embed", "-q")
    assert code == 2 and "nothing to index: every record was rejected (1; first: " in err
    assert "id 'c#3' is a chunk of work 'c' in the index" in err


@pytest.mark.integration
def test_an_index_refuses_another_variant_lexicon(tmp_path) -> None:
    lex = tmp_path / "extra.lex"
    lex.write_text("zorn lemma = zorns lemma | kuratowski zorn lemma\n")
    idx = str(tmp_path / "idx")
    docs = jsonl(tmp_path / "d.jsonl", {"id": "z", "title": "Kuratowski Zorn lemma", "text": "maximal chains"})
    env = {**os.environ, "HYBRIDSEARCH_LEXICON": str(lex), "HYBRIDSEARCH_QUERY_LOG": "false"}
    assert subprocess.run([EXE, "ingest", str(docs), "--index-dir", idx, "--no-embed", "-q"], env=env,
                          capture_output=True).returncode == 0
    same = subprocess.run([EXE, "search", "zorns lemma", "--index-dir", idx, "--profile", "lexical"], env=env,
                          capture_output=True, text=True)
    assert same.returncode == 0 and " z " in same.stdout
    other = subprocess.run([EXE, "search", "zorns lemma", "--index-dir", idx, "--profile", "lexical"],
                           env={**env, "HYBRIDSEARCH_LEXICON": ""}, capture_output=True, text=True)
    assert other.returncode == 2 and "HYBRIDSEARCH_LEXICON" in one_error_line(other.stderr)


@pytest.mark.integration
def test_an_index_analysed_with_older_rules_is_reanalysed(tmp_path, monkeypatch, caplog) -> None:
    idx = tmp_path / "idx"
    docs = jsonl(tmp_path / "d.jsonl", {"id": "lp", "title": r"Interpolation in $L^\infty$", "text": "bounded maps"})
    joined = Analyzer.joined  # what analyze gives, and what both engines index
    with monkeypatch.context() as m:  # as an older version tokenised TeX's \infty: apart from L^∞
        m.setattr(Analyzer, "joined", lambda self, text: joined(self, text.replace("\\infty", "infinity")))
        with hybridsearch.create(idx) as h:
            h.ingest(docs, embed=False)
            assert not h.search("L^∞", "lexical", k=3).hits
    # the index as that version left it: no analysis rules recorded
    with EmbeddedEngine(idx) as e:
        e.store.set_meta("analysis", None)
    applied = idx / "bm25" / "applied.json"
    applied.write_text(json.dumps({k: v for k, v in json.loads(applied.read_text()).items() if k != "analysis"}))
    with caplog.at_level("WARNING", logger="hybridsearch"), hybridsearch.open(idx) as h:
        assert [x.id for x in h.search("L^∞", "lexical", k=3).hits] == ["lp"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert ("rebuilding the BM25 index from the journal: it was analysed with rules older than recorded ones, "
            f"and these are rules {ANALYSIS_RULES}") in warned
    assert "holds HDC codes made with analysis rules older than recorded ones" in warned
    assert "ingest the corpus again into it" in warned
    assert json.loads(applied.read_text())["analysis"] == ANALYSIS_RULES
    # the codes are brought up to date by ingesting the corpus again: all of it, not a part
    more = jsonl(tmp_path / "more.jsonl", {"id": "lq", "title": "Lorentz spaces", "text": "weak L^p"})
    every = tmp_path / "all.jsonl"
    every.write_text(docs.read_text() + more.read_text())
    with hybridsearch.open(idx) as h:
        h.ingest(more, embed=False)
        assert h.engine.get_meta("analysis") is None  # "lp" still holds codes of the older rules
        h.ingest(docs, embed=False)
        assert h.engine.get_meta("analysis") is None  # a run that wrote part of the index cannot tell
        h.ingest(every, embed=False)
        assert h.engine.get_meta("analysis") == ANALYSIS_RULES
    caplog.clear()
    with caplog.at_level("WARNING", logger="hybridsearch"):
        hybridsearch.open(idx).close()
    assert not [r for r in caplog.records if "rules" in r.getMessage()]
    # an index made with these rules records them, and opens without either message
    caplog.clear()
    hybridsearch.create(tmp_path / "new").close()
    with caplog.at_level("WARNING", logger="hybridsearch"), hybridsearch.open(tmp_path / "new") as h:
        h.ingest(docs, embed=False)
        assert h.engine.get_meta("analysis") == ANALYSIS_RULES
    hybridsearch.open(tmp_path / "new").close()
    assert not [r for r in caplog.records if "rules" in r.getMessage()]


@pytest.mark.integration
def test_empty_input_is_an_error(tmp_path, capsys) -> None:
    idx = str(tmp_path / "idx")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "nosupported").mkdir()
    (tmp_path / "nosupported" / "a.pdf").write_bytes(b"%PDF")
    bad = jsonl(tmp_path / "bad.jsonl", {"id": "x"}, {"title": "no id"})
    for path, why in ((tmp_path / "empty.jsonl", "holds no records"), (tmp_path / "emptydir", "holds no records"),
                      (tmp_path / "nosupported", "holds no records"), (bad, "every record was rejected (2")):
        code, _, err = run(capsys, "ingest", str(path), "--index-dir", idx, "-q")
        assert code == 2 and "nothing to index" in one_error_line(err) and why in err, (path, err)


def test_open_never_creates(tmp_path) -> None:
    with pytest.raises(IndexNotFoundError, match="hybridsearch.create"):
        hybridsearch.open(tmp_path / "typo")
    assert not (tmp_path / "typo").exists()
    hybridsearch.create(tmp_path / "made").close()
    hybridsearch.open(tmp_path / "made").close()


# -- one line, never a traceback ---------------------------------------------------------------------

@pytest.mark.integration
def test_bad_arguments_are_one_line(demo_copy, tmp_path, capsys) -> None:
    idx = str(demo_copy)
    cases = [
        (["search", "x", "--index-dir", idx, "--channels", "bm25", "-k", "100000"], "whole number between 1 and 10000"),
        (["search", "x", "--index-dir", idx, "--channels", ",,,"], "no channel named"),
        (["search", "x", "--index-dir", idx, "--channels", "bm25", "--fuser", "rfr"], "no fuser named 'rfr'"),
        (["eval", str(DEMO), "--index-dir", str(tmp_path / "ev"), "--channels", "+"], "names no channel"),
        (["eval", str(tmp_path / "nope"), "--channels", "bm25"], "nope: no such file or directory"),
        (["eval", str(DEMO / "corpus.jsonl"), "--channels", "bm25"], "corpus.jsonl: eval needs a BEIR directory"),
        (["eval", str(DEMO), "--index-dir", str(tmp_path / "ev"), "--fuser", "nosuch"], "no fuser named 'nosuch'"),
        (["eval", str(DEMO), "--index-dir", str(tmp_path / "ev"), "--channels", "bm25,bm2"], "no channel named 'bm2'"),
        (["search", "x", "--index-dir", str(DEMO / "corpus.jsonl")], "a file, not an index directory"),
        (["search", "x", "--index-dir", idx, "--date-from", "19x5"], "--date-from/--date-to: expected YYYY or YYYY-MM"),
        (["search", "x", "--index-dir", idx, "--date-from", "2000", "--date-to", "1990"],
         "--date-from/--date-to: the range is empty: '2000' is after '1990'"),
        # options that had no effect, silently: --index on the embedded engine, --fuser without --channels
        (["search", "x", "--index-dir", idx, "--index", "papers"], "--index papers names an OpenSearch index"),
        (["stats", "--index-dir", idx, "--index", "nosuch"], "--index nosuch names an OpenSearch index"),
        (["search", "x", "--index-dir", idx, "--fuser", "weighted"], "--fuser weighted picks the fuser of --channels"),
        (["eval", str(DEMO), "--index-dir", str(tmp_path / "ev"), "--profiles", "lexical", "--fuser", "rrf"],
         "--fuser rrf picks the fuser of fused --channels runs"),
        (["eval", str(DEMO), "--index-dir", str(tmp_path / "ev"), "--ablation", "--fuser", "rrf"],
         "--fuser rrf picks the fuser of fused --channels runs"),
        (["eval", str(DEMO), "--index-dir", str(tmp_path / "ev"), "--profiles", "lexical", "--json", str(tmp_path)],
         f"--json {tmp_path}: a directory, not a file to write"),
        (["eval", str(DEMO), "--index-dir", str(tmp_path / "ev"), "--profiles", "lexical", "--plot", str(tmp_path)],
         f"--plot {tmp_path}: a directory, not a file to write"),
    ]
    for argv, message in cases:
        code, _, err = run(capsys, *argv)
        assert code == 2 and message in one_error_line(err), (argv, err)
    assert not (tmp_path / "ev").exists()  # a misspelt run fails before eval builds its index


@pytest.mark.integration
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_an_eval_whose_json_cannot_be_written_is_one_line(tmp_path, capsys) -> None:
    code, out, err = run(capsys, "eval", str(DEMO), "--index-dir", str(tmp_path / "ev"), "--profiles", "lexical",
                         "--json", "/dev/full", "-q")
    assert code == 2 and "lexical" in out and "Traceback" not in err  # the table first; the index was built
    assert err.splitlines()[-1] == "error: --json /dev/full: cannot write it (No space left on device)", err


@pytest.mark.integration
def test_serve_on_a_port_in_use_is_one_line(demo_copy, tmp_path, capsys) -> None:
    """The port is tried before the start-up: one line naming --port, exit 2 (it was uvicorn's own
    ERROR line, exit 3)."""
    import socket

    keys = tmp_path / "keys.json"
    assert run(capsys, "keys", "add", "a", "--file", str(keys))[0] == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run(capsys, "serve", "--index-dir", str(demo_copy), "--keys", str(keys), "--port", str(port))
    assert code == 2 and one_error_line(err) == f"error: --port {port}: 127.0.0.1:{port} is in use; pick another port"
    code, _, err = run(capsys, "serve", "--index-dir", str(demo_copy), "--keys", str(keys), "--host", "nosuch.invalid")
    assert code == 2 and one_error_line(err).startswith("error: --host nosuch.invalid: not an address to listen on")


def test_serve_tries_every_address_its_host_name_has(monkeypatch) -> None:
    """A host name of two addresses (localhost as 127.0.0.1 and ::1, where the resolver says so; this
    machine's says 127.0.0.1 alone, so the resolver's answer is given here) is refused when the port
    is taken on either, as the server binds both."""
    import socket

    from hybridsearch.cli import _check_listen
    from hybridsearch.errors import HybridSearchError

    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        both = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0))]
        monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: both)
        with pytest.raises(HybridSearchError, match=f"--port {port}: dual.example:{port} is in use"):
            _check_listen("dual.example", port)
        monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: both[:1])
        _check_listen("dual.example", port)  # 127.0.0.1 alone is free
        monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: both)
        # several workers share one socket that uvicorn binds itself: IPv4 for a name without a colon
        _check_listen("127.0.0.1", port, workers=2)
        with pytest.raises(HybridSearchError, match="is in use"):
            _check_listen("::1", port, workers=2)
    # a machine without IPv6: the server skips ::1, and so does the check
    import errno

    real = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: object, **kwargs: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socket", no_ipv6)
    _check_listen("dual.example", port)


@pytest.mark.integration
def test_bad_settings_are_one_line(tmp_path) -> None:
    for name, value in (("HYBRIDSEARCH_EMBEDDING_BATCH_SIZE", "abc"), ("HYBRIDSEARCH_GRAPH_DAMPING", "nan"),
                        ("HYBRIDSEARCH_SEARCH_MAX_K", "0")):
        out = subprocess.run([EXE, "search", "x", "--index-dir", str(tmp_path)], capture_output=True, text=True,
                             env={**os.environ, name: value})
        assert out.returncode == 2 and name in one_error_line(out.stderr), (name, out.stderr)


@pytest.mark.integration
def test_damaged_checkpoints_are_rebuilt_and_a_damaged_store_refused(demo_copy, capsys) -> None:
    idx = str(demo_copy)
    (demo_copy / "dense.npz").write_bytes((demo_copy / "dense.npz").read_bytes()[:1000])  # truncated
    (demo_copy / "hdc_topic.npz").write_bytes(b"garbage" * 100)
    code, out, err = run(capsys, "search", "Brouwer fixed point theorem", "--index-dir", idx, "--channels",
                         "dense,hdc", "-k", "3")
    assert code == 0 and "topo-brouwer" in out, err
    assert "rebuilding the dense index from the journal: its checkpoint could not be read" in err
    assert "rebuilding the hdc:topic index" in err
    code, out, err = run(capsys, "search", "Brouwer fixed point theorem", "--index-dir", idx, "--channels", "dense")
    assert code == 0 and "rebuilding" not in err  # the owner wrote a good checkpoint on close
    store = demo_copy / "store.sqlite"
    raw = bytearray(store.read_bytes())
    page = 4096
    raw[page * 3:page * 3 + 512] = os.urandom(512)  # a garbage page inside the chunks table
    store.write_bytes(bytes(raw))
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    code, _, err = run(capsys, "ingest", str(DEMO), "--index-dir", idx, "--no-embed", "-q")
    assert code == 2 and "damaged" in one_error_line(err)
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before


@pytest.mark.integration
def test_an_empty_store_beside_derived_indexes_is_refused(demo_copy, tmp_path, capsys) -> None:
    """A 0-byte (or table-less) store.sqlite in a directory that holds derived indexes is a damaged
    store, not a new index: made anew, a plain search rebuilt every derived index from its empty
    journal, wiping them. An empty store in an otherwise empty directory still makes a new index."""
    import sqlite3

    from hybridsearch.errors import EngineError
    from indexer.pipeline import open_target

    def derived() -> dict[str, str]:
        return {str(p.relative_to(demo_copy)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(demo_copy.rglob("*")) if p.is_file() and "store.sqlite" not in p.name
                and p.name != "owner.lock" and p.parent.name != "querylog"}

    for f in demo_copy.glob("store.sqlite*"):
        f.unlink()
    store = demo_copy / "store.sqlite"
    store.write_bytes(b"")
    before = derived()
    for argv in (["search", "Brouwer fixed point", "--profile", "lexical"], ["ingest", str(DEMO), "--no-embed", "-q"],
                 ["stats"]):
        code, _, err = run(capsys, *argv, "--index-dir", str(demo_copy))
        assert code == 2 and one_error_line(err) == (
            f"error: the index store {store} is damaged (it holds no tables: 0 bytes); nothing was written. "
            "Restore it from a snapshot or ingest into a new index"), (argv, err)
    with pytest.raises(EngineError, match="damaged"), open_target(str(demo_copy), None):  # nor does a worker
        pass
    with sqlite3.connect(store) as c:  # a database, but not an index store
        c.execute("PRAGMA user_version = 3")
    code, _, err = run(capsys, "search", "Brouwer", "--index-dir", str(demo_copy), "--profile", "lexical")
    assert code == 2 and "damaged (it holds no tables: 4096 bytes)" in one_error_line(err)
    assert derived() == before and store.stat().st_size == 4096
    new = tmp_path / "new"
    new.mkdir()
    (new / "store.sqlite").write_bytes(b"")
    code, out, err = run(capsys, "ingest", str(DEMO), "--index-dir", str(new), "--no-embed", "-q")
    assert code == 0 and "indexed 242" in out, err


def test_a_byte_order_mark_is_accepted_and_strict_says_what_was_committed(tmp_path, capsys) -> None:
    f = tmp_path / "bom.jsonl"
    f.write_bytes("\ufeff".encode() + b'{"id": "first", "title": "With a BOM", "text": "x"}\n')
    code, out, _ = run(capsys, "ingest", str(f), "--index-dir", str(tmp_path / "idx"), "--no-embed", "-q")
    assert code == 0 and "loaded 1, rejected 0" in out
    g = jsonl(tmp_path / "strict.jsonl", *({"id": f"s{i}", "title": "t", "text": "x"} for i in range(1500)),
              {"title": "no id"})
    code, _, err = run(capsys, "ingest", str(g), "--index-dir", str(tmp_path / "idx2"), "--no-embed", "-q",
                       "--strict")
    line = one_error_line(err)
    assert code == 2 and "strict.jsonl:1501" in line and "the 1024 chunks before it are committed" in line


@pytest.mark.integration
def test_an_interrupted_first_eval_is_resumed(tmp_path, capsys) -> None:
    from hybridsearch.engines import open_engine
    from indexer.loaders import BeirLoader, LoadReport
    from query_service.evaluate import corpus_fingerprint

    target = tmp_path / "ev"
    engine = open_engine(str(target))  # what an interrupted first eval leaves: a marker, some documents
    engine.set_meta("corpus_building", corpus_fingerprint(DEMO))
    engine.write(list(BeirLoader().load(DEMO, LoadReport()))[:10])
    engine.close()
    code, out, err = run(capsys, "eval", str(DEMO), "--index-dir", str(target), "--profiles", "lexical", "-q")
    assert code == 0 and "lexical" in out, err
    other = EmbeddedEngine(tmp_path / "other")
    other.write(list(BeirLoader().load(DEMO, LoadReport()))[:3])
    other.close()
    code, _, err = run(capsys, "eval", str(DEMO), "--index-dir", str(tmp_path / "other"), "--profiles", "lexical")
    # written by `ingest`, not by eval: eval cannot tell which corpus it holds, and says so
    assert code == 2 and "eval did not build this index" in one_error_line(err)


@pytest.mark.integration
def test_a_copy_of_the_dataset_is_the_same_corpus(tmp_path, capsys) -> None:
    import shutil

    from hybridsearch.engines import open_engine
    from query_service.evaluate import _path_fingerprint

    first, copy = tmp_path / "first", tmp_path / "copy"
    shutil.copytree(DEMO, first)
    target = str(tmp_path / "ev")
    code, out, err = run(capsys, "eval", str(first), "--index-dir", target, "--profiles", "lexical")
    assert code == 0 and "indexed" in err, err
    shutil.copytree(DEMO, copy)  # another path, another mtime, the same bytes: nothing is indexed again
    code, out, err = run(capsys, "eval", str(copy), "--index-dir", target, "--profiles", "lexical")
    assert code == 0 and "indexed" not in err and "lexical" in out, err
    engine = open_engine(target)  # an index that holds the path fingerprint of earlier versions
    engine.set_meta("corpus", _path_fingerprint(copy))
    engine.close()
    code, out, err = run(capsys, "eval", str(copy), "--index-dir", target, "--profiles", "lexical")
    assert code == 0 and "indexed" not in err and "lexical" in out, err
    with (copy / "corpus.jsonl").open("a") as f:  # an edited corpus is another one
        f.write('{"_id": "extra", "title": "Extra", "text": "one more document"}\n')
    code, _, err = run(capsys, "eval", str(copy), "--index-dir", target, "--profiles", "lexical")
    assert code == 2 and "holds another corpus" in one_error_line(err)


# -- what users expect -----------------------------------------------------------------------------

@pytest.mark.integration
def test_filters_on_the_command_line_and_k_keeps_the_profile_limit(demo_copy, capsys) -> None:
    idx = str(demo_copy)
    code, out, err = run(capsys, "search", "compact", "--index-dir", idx, "--profile", "kb-fast", "--json")
    assert code == 0 and 1 <= len(json.loads(out)["hits"]) <= 3, err  # kb-fast's max_results, not 10
    code, out, err = run(capsys, "search", "theorem", "--index-dir", idx, "--profile", "lexical", "-k", "50", "--json",
                         "--subject", "topology", "--kind", "theorem", "--license", "CC-BY-4.0",
                         "--date-from", "1900", "--date-to", "1950-06")
    hits = json.loads(out)["hits"]
    assert code == 0 and hits, err
    with hybridsearch.open(demo_copy) as h:
        docs = h.engine.get([x["id"] for x in hits])
    for d in docs.values():
        assert "topology" in [s.lower() for s in d.subjects] and d.kind == "theorem" and d.license == "CC-BY-4.0"
        assert d.year is not None and 1900 <= d.year <= 1950


@pytest.mark.integration
def test_delete_and_update_are_seen_at_once_in_every_process(demo_copy, tmp_path) -> None:
    with hybridsearch.open(demo_copy) as h:  # this process reads; another one deletes
        first = h.search("Brouwer fixed point theorem", "lexical", k=3).hits[0].id
        out = subprocess.run([EXE, "delete", first, "missing-id", "--index-dir", str(demo_copy)],
                             capture_output=True, text=True)
        assert out.returncode == 0 and "deleted 1 chunks; not found: missing-id" in out.stdout, out.stderr
        assert first not in [x.id for x in h.search("Brouwer fixed point theorem", "lexical", k=10).hits]
        nothing = subprocess.run([EXE, "delete", "missing-id", "--index-dir", str(demo_copy)],
                                 capture_output=True, text=True)
        assert nothing.returncode == 2 and "nothing deleted" in one_error_line(nothing.stderr)
        f = jsonl(tmp_path / "u.jsonl", {"id": first, "title": "Brouwer fixed point theorem (revised)",
                                         "text": "Every continuous self-map of a closed ball has a fixed point."})
        upd = subprocess.run([EXE, "update", str(f), "--index-dir", str(demo_copy), "--no-embed", "-q"],
                             capture_output=True, text=True)
        assert upd.returncode == 0, upd.stderr
        assert h.engine.get([first])[first].title.endswith("(revised)")
        assert h.delete(works=[first]) == [first] and h.engine.get([first]) == {}
    gone = subprocess.run([EXE, "update", str(f), "--index-dir", str(tmp_path / "nothing"), "-q"],
                          capture_output=True, text=True)
    assert gone.returncode == 2 and "no index at" in one_error_line(gone.stderr)
