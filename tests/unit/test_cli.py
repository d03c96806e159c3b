"""The `hybridsearch` command, run as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEMO, REPO

EXE = str(Path(sys.executable).with_name("hybridsearch"))


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}: {out.stderr}")
    return out


def test_stats_and_search(demo_copy) -> None:
    stats = json.loads(cli("stats", "--index-dir", str(demo_copy), "--json").stdout)
    assert stats["documents"] == stats["vectors"] == stats["bm25_docs"] == 242
    res = json.loads(cli("search", "Holder inequality for integrals", "--channels", "bm25,dense",
                         "-k", "5", "--json", "--index-dir", str(demo_copy)).stdout)
    top = res["hits"][0]
    assert top["id"] == "anal-holder-inequality" and set(top["channels"]) == {"bm25", "dense"}
    assert top["document"]["title"] == "Hölder's inequality" and len(res["hits"]) == 5
    assert sum(top["contributions"].values()) == pytest.approx(top["score"])
    # notation folds: "C-star algebra" finds the unit titled "C*-algebra"; every field weighing 1,
    # `lexical` puts it second, behind a unit whose text says C*-algebra more often; the seeds'
    # title weight 1.5 (kb-fast) puts the exact name first
    text = cli("search", "C-star algebra", "--profile", "lexical", "--index-dir", str(demo_copy)).stdout
    assert "anal-c-star-algebra" in "\n".join(text.splitlines()[2:4])
    assert "embedding model" not in text.splitlines()[0]  # lexical embeds nothing
    # the model is loaded before a search that embeds its query: the search's time is its own
    header = cli("search", "C-star algebra", "--index-dir", str(demo_copy)).stdout.splitlines()[0]
    assert header.startswith("query: C-star algebra   (hybrid, ") and "; the embedding model loaded in " in header
    text = cli("search", "C-star algebra", "--profile", "kb-fast", "--index-dir", str(demo_copy)).stdout
    assert "anal-c-star-algebra" in text.splitlines()[2]


def test_eval_runs_and_json_contract(demo_copy, tmp_path) -> None:
    out = tmp_path / "m.json"
    png = tmp_path / "ndcg.png"
    res = cli("eval", str(DEMO), "--channels", "bm25,dense", "--index-dir", str(demo_copy),
              "--json", str(out), "-q", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    data = json.loads(out.read_text())
    intents = ["compare", "lookup", "prereq", "related", "survey"]  # the demo queries carry metadata.intent
    assert list(data) == [f"{run}{tail}" for run in ("bm25", "dense") for tail in ["", *(f"@{i}" for i in intents)]]
    keys = {"ndcg@10", "recall@20", "recall@100", "mrr@10", "p50_ms", "p95_ms"}
    assert all(set(m) == keys for m in data.values())
    assert "ndcg@10" in res.stdout.splitlines()[0] and "dense@prereq" in res.stdout
    # the per-intent rows split the run's judged queries: their weighted mean is the run's figure
    judged = [q for q in map(json.loads, (DEMO / "queries.jsonl").read_text().splitlines())
              if q["_id"] in (DEMO / "qrels" / "test.tsv").read_text()]
    counts = {i: sum(q["metadata"]["intent"] == i for q in judged) for i in intents}
    mean = sum(counts[i] * data[f"bm25@{i}"]["ndcg@10"] for i in intents) / sum(counts.values())
    assert mean == pytest.approx(data["bm25"]["ndcg@10"])
    cli("eval", str(DEMO), "--channels", "bm25+dense", "--fuser", "rrf", "--profiles",
        "lexical,lexical-best", "--index-dir", str(demo_copy), "--json", str(out), "-q")
    data = json.loads(out.read_text())
    assert [k for k in data if "@" not in k] == ["bm25+dense:rrf", "lexical", "lexical-best"]
    assert data["lexical"]["ndcg@10"] == pytest.approx(
        json.loads(out.read_text())["lexical"]["ndcg@10"])


def test_eval_scores_only_the_judged_queries_it_ran(demo_copy, tmp_path) -> None:
    """Judged queries missing from queries.jsonl are left out with a warning, never scored 0 (which
    lowered every figure alike, silently); a split with nothing relevant is one error line."""
    import shutil

    data = tmp_path / "demo"
    shutil.copytree(DEMO, data)
    test = (data / "qrels" / "test.tsv").read_text()
    (data / "qrels" / "ghost.tsv").write_text(test + "qa-99\tnope\t1\n")
    (data / "qrels" / "zero.tsv").write_text("".join(
        line.rsplit("\t", 1)[0] + "\t0\n" for line in test.splitlines()[1:]))
    figures = {}
    for split in ("test", "ghost"):
        out = tmp_path / f"{split}.json"
        res = cli("eval", str(data), "--channels", "bm25", "--split", split, "--index-dir", str(demo_copy),
                  "--json", str(out), "-q")
        figures[split] = json.loads(out.read_text())["bm25"]["ndcg@10"]
        assert ("warning: 1 judged queries of split 'ghost' are not in queries.jsonl (first: 'qa-99')"
                in res.stderr) is (split == "ghost")
    assert figures["ghost"] == figures["test"] > 0
    zero = cli("eval", str(data), "--channels", "bm25", "--split", "zero", "--index-dir", str(demo_copy),
               check=False)
    assert zero.returncode == 2 and zero.stderr.count("\n") == 1
    assert "no query of split 'zero' has a relevant document (a grade above 0)" in zero.stderr


def test_ingest_reports_rejects_and_strict_fails(tmp_path) -> None:
    f = tmp_path / "units.jsonl"
    f.write_text('{"id": "a", "title": "Baire category theorem"}\n{"id": "b", "title": 3}\n'
                 '{"id": "c", "text": "Urysohn lemma"}\n')
    out = cli("ingest", str(f), "--no-embed", "-q", "--index-dir", str(tmp_path / "i"))
    assert "loaded 2, rejected 1, indexed 2" in out.stdout
    assert "units.jsonl:2" in out.stdout and "'title'" in out.stdout
    bad = cli("ingest", str(f), "--strict", "-q", "--index-dir", str(tmp_path / "j"), check=False)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "units.jsonl:2" in bad.stderr
    assert "Traceback" not in bad.stderr
    hits = cli("search", "baire", "--profile", "lexical", "--index-dir", str(tmp_path / "i")).stdout
    assert " a" in hits


@pytest.mark.parametrize("args", [
    ("search", "x", "--index-dir", "/nonexistent/index"),
    ("eval", str(REPO), "--index-dir", "/tmp/never-used"),
    ("search", "x", "--fuser", "nope", "--channels", "bm25,dense", "--index-dir", str(DEMO)),
    ("ingest", "/nonexistent/file.jsonl", "--index-dir", "/tmp/never-used"),
    ("search", "x", "--fuser", "agreement", "--channels", "bm25,dense", "--index-dir", str(DEMO)),
    ("eval", str(DEMO), "--profiles", "lexical", "--json", "/nonexistent/dir/out.json"),
    ("serve", "--port", "99999"),
    ("search", "x", "--profile", "hybrid", "--set", 'fuser.weights={"nope": 1}', "--index-dir", str(DEMO)),
    ("keys", "add", "x", "--file", "/tmp/never-used-keys.json", "--rights", "open", "--indices", ""),
    ("graph", "--wait", "--index-dir", str(DEMO)),  # --wait without --enqueue was ignored
    ("embed", "--wait", "--index-dir", str(DEMO)),
])
def test_errors_are_one_clear_line(args, demo_copy) -> None:
    args = tuple(str(demo_copy) if a == str(DEMO) and args[0] in ("search", "graph", "embed") else a for a in args)
    out = cli(*args, check=False)
    assert out.returncode != 0
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr


def test_chunk_without_workers_is_refused(tmp_path) -> None:
    """--chunk sizes the tasks sent to workers; given without them it was ignored."""
    for args, sends in ((("ingest", str(DEMO), "--chunk", "10"), "--executor celery"),
                        (("embed", "--chunk", "10"), "--enqueue")):
        out = cli(*args, "-q", "--index-dir", str(tmp_path / args[0]), check=False)
        assert out.returncode == 2 and out.stderr == (f"error: --chunk sizes the worker tasks that {sends} sends; "
                                                      "without it the work is done here\n"), out.stderr
        assert not (tmp_path / args[0]).exists()


def test_an_argument_that_is_not_utf8_is_named(demo_copy) -> None:
    """Bytes the shell passes that are not UTF-8 were a traceback (delete) or an engine's message
    (search --kind); now one line names the argument."""
    for args, name in (([b"search", b"fixed \xff point"], "query"), ([b"search", b"x", b"--kind", b"\xff"], "--kind"),
                       ([b"delete", b"\xff"], "ids")):
        out = subprocess.run([EXE, *args, b"--index-dir", str(demo_copy).encode()], capture_output=True, timeout=300)
        assert out.returncode == 2 and out.stderr.decode() == f"error: {name}: not valid UTF-8 text\n", out.stderr


def test_a_search_of_an_index_without_vectors_loads_no_model_and_says_so(tmp_path) -> None:
    """Run as the command runs: neither torch nor ONNX Runtime is imported for it."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "bfp", "title": "Brouwer fixed point theorem", "text": "A map has a fixed "
                                  "point."}) + "\n" + json.dumps({"id": "x", "title": "Other", "text": "Text."}) + "\n")
    cli("ingest", str(corpus), "--index-dir", str(tmp_path / "idx"), "--no-embed", "-q")
    code = ("import sys; from hybridsearch.cli import main\n"
            "try:\n    main()\nfinally:\n"
            "    print('loaded:', sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, "search", "Brouwer fixed point", "--index-dir",
                          str(tmp_path / "idx"), "-k", "3"], capture_output=True, text=True, timeout=300)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and "embedding model" not in lines[0], out.stderr
    assert lines[1] == ("note: the index holds no vectors, so the hits were ranked without the dense channel and the "
                        "semantic rules; `hybridsearch embed` adds them")
    assert "bfp" in lines[3] and lines[-1] == "loaded: []"
