from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridsearch.errors import ValidationError
from query_service.profiles import Profile
from query_service.searcher import get_profile

EXE = str(Path(sys.executable).with_name("hybridsearch"))


def test_overrides_apply_and_are_validated() -> None:
    p = get_profile("kb-balanced").with_overrides({"min_score": 0.2, "bm25.tie_breaker": 0.3,
                                                     "bm25.k": 50, "fuser.bonus": 0.1})
    assert p.min_score == 0.2 and p.channels["bm25"].k == 50
    assert p.channels["bm25"].config == {"tie_breaker": 0.3} and p.fuser_config == {"bonus": 0.1}
    with pytest.raises(ValidationError, match=r"field 'min_score'.*less than or equal to 1"):
        get_profile("kb-balanced").with_overrides({"min_score": 1.5})
    with pytest.raises(ValidationError, match=r"field 'gap'.*finite"):
        get_profile("kb-balanced").with_overrides({"gap": float("nan")})
    with pytest.raises(ValidationError, match=r"field 'bm25.tie_breaker'.*less than or equal to 1"):
        get_profile("kb-balanced").with_overrides({"bm25.tie_breaker": 2})
    with pytest.raises(ValidationError, match=r"field 'fuser.bonus'.*finite"):
        get_profile("kb-balanced").with_overrides({"fuser.bonus": float("inf")})
    with pytest.raises(ValidationError, match=r"field 'dense.k'.*unknown parameter"):
        get_profile("kb-balanced").with_overrides({"dense.k": 5})


def test_fuser_weights_merge_into_the_profiles_and_all_zero_is_refused() -> None:
    """Retuning the two channels hybrid runs leaves HDC at 0 (replaced, it fell back to weight 1
    and was run, carrying half the weight); weights that are all 0 would score every hit 0."""
    base = get_profile("hybrid").fuser_config["weights"]
    assert base["hdc"] == 0
    p = get_profile("hybrid").with_overrides({"fuser.weights": {"bm25": 0.7, "dense": 0.3}})
    assert p.fuser_config["weights"] == {**base, "bm25": 0.7, "dense": 0.3}
    with pytest.raises(ValidationError, match=r"field 'fuser.weights'.*every channel's weight is 0"):
        get_profile("hybrid").with_overrides({"fuser.weights": {"bm25": 0, "dense": 0}})


@pytest.mark.parametrize(("name", "overrides", "embeds"), [
    ("lexical", {}, False),
    ("kb-balanced", {}, False),  # bm25 and hdc: codes from text
    ("lexical", {"min_semantic": 0.3}, True),  # a semantic rule needs the query's cosine
    ("semantic", {}, True),
    ("hybrid", {}, True),
    ("kb-thinkingdb", {}, True),  # no dense channel, but its math reranker weighs the cosine
])
def test_which_profiles_embed_the_query(name, overrides, embeds) -> None:
    assert get_profile(name).with_overrides(overrides).embeds_query() is embeds


def test_yaml_profile(tmp_path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("name: mine\nchannels:\n  bm25: {k: 50, config: {mode: best_fields}}\n  hdc: {k: 50}\n"
                 "fuser: agreement\nmax_results: 5\ngap: 0.2\n")
    p = get_profile(str(f))
    assert isinstance(p, Profile) and p.fuser == "agreement" and p.channels["bm25"].config["mode"] == "best_fields"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nchannels:\n  bm25: {config: {mode: sum}}\n")
    with pytest.raises(ValidationError, match=r"bad.yaml.*bm25.mode|field 'bm25.mode'"):
        get_profile(str(bad))


def test_an_unreadable_yaml_profile_is_one_line(tmp_path) -> None:
    """Bytes that are not UTF-8 were a UnicodeDecodeError traceback; a YAML syntax error was a
    message of several lines."""
    from hybridsearch.errors import ConfigError

    binary, broken = tmp_path / "p6.yaml", tmp_path / "p7.yaml"
    binary.write_bytes(b"\xff\xfe")
    broken.write_text("a: [\n")
    for f, message in ((binary, "not UTF-8 text (byte 0)"),
                       (broken, "line 2, column 1: expected the node content, but found '<stream end>'")):
        with pytest.raises(ConfigError) as e:
            get_profile(str(f))
        assert str(e.value) == f"cannot read profile {f}: {message}"


def test_cli_explain_and_set(demo_copy) -> None:
    out = subprocess.run([EXE, "search", "Brouwer fixed point", "--profile", "kb-balanced", "--explain",
                          "--set", "gap=0.5", "--index-dir", str(demo_copy)], capture_output=True, text=True,
                         check=True).stdout
    assert "explanation (final score = sum of contributions):" in out and " = bm25 " in out
    out = subprocess.run([EXE, "search", "recent advances in topology", "--explain", "-k", "5",
                          "--index-dir", str(demo_copy)], capture_output=True, text=True, check=True).stdout
    assert ("intent lookup (default); focus: recent advances in topology; asks for recent work "
            "('recent advances')") in out
    assert "topo-poincare-conjecture: " in out and "freshness 0.2500" in out, out
    res = json.loads(subprocess.run([EXE, "search", "Brouwer fixed point", "--profile", "kb-balanced",
                                     "--set", "gap=0.9", "--json", "--index-dir", str(demo_copy)],
                                    capture_output=True, text=True, check=True).stdout)
    top = res["hits"][0]["score"]
    assert all(h["score"] >= 0.9 * top for h in res["hits"])
    bad = subprocess.run([EXE, "search", "x", "--profile", "kb-balanced", "--set", "min_score=7",
                          "--index-dir", str(demo_copy)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "min_score" in bad.stderr


def test_reranker_stage_runs_a_registered_reranker(demo_copy) -> None:
    from pydantic import BaseModel

    from hybridsearch import plugins
    from hybridsearch.engines.embedded import EmbeddedEngine
    from hybridsearch.errors import PluginConflictError
    from query_service.candidates import Candidate, Candidates
    from query_service.searcher import Searcher

    class ShortTitleFirst:
        """A toy reranker: shorter titles first."""

        class Config(BaseModel):
            pass

        def __init__(self, config: BaseModel) -> None:
            pass

        def rerank(self, query, cands, engine):
            docs = engine.get(cands.ids)
            order = sorted(cands.ids, key=lambda i: (len(docs[i].title), i))
            items = [Candidate(i, 1.0 / (1 + n), {"rerank": 1.0 / (1 + n)}) for n, i in enumerate(order)]
            return Candidates(items, cands.lists), {}

    plugins.register("rerankers", "short-title-first", ShortTitleFirst)
    with pytest.raises(PluginConflictError):
        plugins.register("rerankers", "short-title-first", ShortTitleFirst)
    # the reranker sees the top rerank_top fused candidates, and never fewer than the hits returned
    # (a hit it did not see would keep a score on the fuser's scale)
    prof = get_profile("lexical").model_copy(update={"reranker": "short-title-first", "rerank_top": 5,
                                                      "max_results": 3})
    with EmbeddedEngine(demo_copy) as e:
        s = Searcher(e)
        plain = s.search("compact space theorem", "lexical", k=10, with_documents=True)
        res = s.search("compact space theorem", prof, with_documents=True)
        wide = s.search("compact space theorem", prof, k=10, with_documents=True)
        s.close()
    shortest = sorted(plain.hits[:5], key=lambda h: (len(h.document.title), h.id))
    assert [h.id for h in res.hits] == [h.id for h in shortest[:3]]
    assert res.hits[0].contributions == {"rerank": 1.0} and res.diagnostics["stages"]["rerank"]["hits"] == 5
    assert wide.diagnostics["stages"]["rerank"]["hits"] == 10
    assert [h.id for h in wide.hits] == [h.id for h in sorted(plain.hits, key=lambda h: (len(h.document.title), h.id))]
