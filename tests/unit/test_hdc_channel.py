"""The HDC channel on a real index: Hamming search, rescoring, updates, escalation, agreement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.errors import QueryError
from hybridsearch.hdc import HdcEncoder, HdcWeights, combine, similarity
from hybridsearch.models import Document, RankedList
from query_service.channels import HdcChannel, QueryContext
from query_service.fusion import AgreementFuser
from query_service.searcher import Searcher, adhoc_profile

EXE = str(Path(sys.executable).with_name("hybridsearch"))

DOCS = [
    Document(id="godel", title="Gödel incompleteness theorem",
             text="No consistent formal system proves its own consistency.",
             role="theorem", utility_acts="bound provability"),
    Document(id="sylow", title="Sylow theorems", text="Finite groups have Sylow p-subgroups, all conjugate."),
    Document(id="no-title", title="", text="Incompleteness of arithmetic formal systems and consistency."),
]


@pytest.fixture
def engine(tmp_path):
    e = EmbeddedEngine(tmp_path / "idx")
    enc = e.hdc_encoder()
    e.write(DOCS, codes=[enc.encode_document(d) for d in DOCS])
    yield e
    e.close()


def test_hamming_search_and_exact_scores(engine) -> None:
    enc = engine.hdc_encoder()
    code = enc.encode_document(DOCS[1])["topic"]
    hits = engine.hamming({"topic": code}, 3)["topic"]
    assert hits.ids[0] == "sylow" and hits.scores[0] == 1.0
    assert "no-title" not in hits.ids  # an empty field has no code and never matches
    exact = engine.hamming_score({"topic": code}, ["sylow", "godel", "no-title", "missing"])["topic"]
    assert set(exact) == {"sylow", "godel"} and exact["sylow"] == 1.0
    with pytest.raises(QueryError, match="unknown HDC field 'tags'; valid: topic, claim, role, acts"):
        engine.hamming({"tags": code}, 3)


def test_channel_rescoring_follows_the_formula(engine) -> None:
    rl = HdcChannel().retrieve(QueryContext("Godel incompleteness consistency"), engine, 10)
    assert set(rl.ids[:2]) == {"godel", "no-title"} and rl.scores == sorted(rl.scores, reverse=True)
    q = HdcEncoder().encode_query("Godel incompleteness consistency")
    for doc in DOCS:
        if doc.id not in rl.ids:
            continue
        d = HdcEncoder().encode_document(doc)
        # fields present on both sides only; the title-less unit is scored on its claim alone
        expected = combine({f: similarity(q[f], d[f]) for f in q if f in d}, HdcWeights())
        assert rl.scores[rl.ids.index(doc.id)] == pytest.approx(expected)


def test_codes_follow_updates_deletes_and_reopen(tmp_path) -> None:
    path = tmp_path / "idx"
    with EmbeddedEngine(path) as e:
        enc = e.hdc_encoder()
        e.write(DOCS, codes=[enc.encode_document(d) for d in DOCS])
        new = Document(id="sylow", title="Lagrange theorem", text="Subgroup orders divide the group order.")
        e.write([new], codes=[enc.encode_document(new)])
        assert e.hamming({"topic": enc.encode_document(new)["topic"]}, 1)["topic"].ids == ["sylow"]
        assert e.hamming_score({"claim": enc.encode_document(new)["claim"]}, ["sylow"]) == {"claim": {"sylow": 1.0}}
        # the old claim shares two tokens (group, subgroup) with the new one: no longer its code
        assert e.hamming_score({"claim": enc.encode_document(DOCS[1])["claim"]}, ["sylow"])["claim"]["sylow"] < 0.7
        e.delete(["godel"])
        # an update written without codes drops the stale ones
        e.write([DOCS[2].model_copy(update={"text": "changed"})])
        assert e.stats().codes == 1
    with EmbeddedEngine(path) as e:
        # the HDC indexes open when a search needs them (and say nothing before)
        assert e.stats().details["hdc_indexed"] == dict.fromkeys(("topic", "claim", "role", "acts"))
        code = enc.encode_document(new)["topic"]
        assert e.hamming(dict.fromkeys(("topic", "claim", "role", "acts"), code), 5)["topic"].ids == ["sylow"]
        assert e.stats().details["hdc_indexed"] == {"topic": 1, "claim": 1, "role": 0, "acts": 0}
        assert [i for i, _ in e.missing_codes()] == ["no-title"]


def test_agreement_formula() -> None:
    fused = AgreementFuser().fuse({"bm25": RankedList.of("bm25", ["a", "b"], [10.0, 5.0]),
                                   "hdc": RankedList.of("hdc", ["b", "c"], [0.4, 0.2])}, 10)
    scores = dict(zip(fused.ids, fused.scores, strict=True))
    assert scores["a"] == pytest.approx(1.0)
    assert scores["b"] == pytest.approx(0.5 + 0.7 * 1.0 + 0.15)
    assert scores["c"] == pytest.approx(0.7 * 0.5)
    assert fused.ids == ["b", "a", "c"]
    assert fused.contributions[0] == pytest.approx({"bm25": 0.5, "hdc": 0.7, "agreement": 0.15})
    assert AgreementFuser().max_score(["bm25", "hdc"]) == pytest.approx(1.85)


def test_kb_balanced_escalates_only_when_bm25_finds_too_little(demo_copy) -> None:
    with EmbeddedEngine(demo_copy) as e:
        s = Searcher(e)
        rich = s.search("compact Hausdorff space theorem", "kb-balanced")
        assert rich.diagnostics["escalated"] is False and "escalation" not in rich.diagnostics["stages"]
        assert 0 < len(rich.hits) <= 7
        assert all(set(h.channels) == {"bm25"} for h in rich.hits)
        sparse = s.search("zzqv Brouwer", "kb-balanced")
        assert sparse.diagnostics["escalated"] is True
        assert sparse.diagnostics["stages"]["escalation"]["channel"] == "hdc"
        top = sparse.hits[0]
        assert set(top.contributions) == {"bm25", "hdc", "agreement"}
        assert sum(top.contributions.values()) == pytest.approx(top.score)
        always = s.search("zzqv Brouwer", adhoc_profile(["bm25", "hdc"], "agreement"))
        assert always.hits[0].id == top.id
        s.close()


def test_cli_hdc_channel_and_eval(demo_copy, tmp_path) -> None:
    out = subprocess.run([EXE, "search", "Godel incompleteness", "--channels", "hdc", "--json",
                          "--index-dir", str(demo_copy)], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    assert res["hits"][0]["id"].startswith("logic-godel") and set(res["hits"][0]["channels"]) == {"hdc"}
    from tests.conftest import DEMO

    subprocess.run([EXE, "eval", str(DEMO), "--channels", "hdc,bm25+hdc", "--fuser", "agreement",
                    "--profiles", "kb-balanced", "--index-dir", str(demo_copy), "--json",
                    str(tmp_path / "m.json"), "-q"], check=True, capture_output=True)
    data = json.loads((tmp_path / "m.json").read_text())
    assert [k for k in data if "@" not in k] == ["hdc", "bm25+hdc:agreement", "kb-balanced"]
    assert data["hdc"]["ndcg@10"] > 0.2
