from __future__ import annotations

import numpy as np
import pytest

from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.models import DocInfo, Document
from query_service.diversity import diversify, mmr
from query_service.evidence import EvidenceConfig, pack
from query_service.profiles import DiversityConfig
from query_service.searcher import Searcher, get_profile


def info(work: str, source: str | None = None, page: int | None = None, authors=(), venue=None) -> DocInfo:
    return DocInfo(work, source, page, tuple(authors), venue, None, work)


def test_rules_drop_what_they_should() -> None:
    ids = ["a1", "a2", "b", "c", "d", "e", "f"]
    infos = {"a1": info("A"), "a2": info("A"), "b": info("B", "x.pdf", 3), "c": info("C", "x.pdf", 3),
             "d": info("D", "x.pdf", 3), "e": info("E", authors=["Noether"]), "f": info("F", authors=["Noether"])}
    keep, dropped = diversify(ids, infos, near_duplicate=None, per_page=2, per_author=1)
    assert [ids[i] for i in keep] == ["a1", "b", "c", "e"]
    assert dropped == {"work": 1, "per_page": 1, "per_author": 1}


def test_near_duplicates_by_dense_cosine() -> None:
    v = np.eye(4, dtype=np.float32)
    near = (v[0] * 0.9 + v[1] * 0.1) / np.linalg.norm(v[0] * 0.9 + v[1] * 0.1)
    vecs = {"a": v[0], "b": near, "c": v[2]}
    keep, dropped = diversify(["a", "b", "c"], {k: info(k) for k in vecs}, vectors=vecs)
    assert keep == [0, 2] and dropped == {"near_duplicate": 1}


def test_mmr_prefers_novel_candidates() -> None:
    v = np.eye(3, dtype=np.float32)
    vecs = {"a": v[0], "a2": v[0], "b": v[1]}
    order = mmr(["a", "a2", "b"], [1.0, 0.95, 0.9], vecs.get, 3, lam=0.5)
    assert order == [0, 2, 1]


DOCS = {
    "t1": Document(id="t1", title="Brouwer fixed point theorem", text="word " * 60, kind="theorem",
                   subjects=["topology"], source="topo.pdf", page=4),
    "t1b": Document(id="t1b", work_id="t1", chunk_no=1, title="Brouwer, continued", text="word " * 60,
                    kind="remark", subjects=["topology"], source="topo.pdf", page=5),
    "t1c": Document(id="t1c", work_id="t1", chunk_no=2, title="Brouwer, more", text="word " * 60,
                    kind="theorem", subjects=["topology"], source="topo.pdf", page=6),
    "g": Document(id="g", title="Gauss curvature", text="word " * 60, kind="definition", subjects=["geometry"]),
    "h": Document(id="h", title="Hairy ball theorem", text="word " * 60, kind="theorem", subjects=["topology"]),
}


def test_pack_respects_budget_work_caps_and_exact_match() -> None:
    ids = ["h", "t1b", "t1c", "g", "t1"]
    scores = [1.0, 0.9, 0.85, 0.8, 0.5]
    ep = pack("Brouwer fixed point theorem statement", ids, scores, DOCS,
              EvidenceConfig(token_budget=300, max_per_work=2, min_unique_works=2, diversity_bias=0.0))
    packed = [i.id for i in ep.items]
    assert "t1" in packed and next(i for i in ep.items if i.id == "t1").exact_match
    assert sum(1 for i in ep.items if i.work_id == "t1") <= 2
    assert ep.tokens <= 300 and len({i.work_id for i in ep.items}) >= 2
    assert [c.index for c in ep.citation_map] == list(range(1, len(ep.items) + 1))
    t1 = next(i for i in ep.items if i.id == "t1")
    assert t1.marker == "[Source: topo.pdf, p.4]"
    g = pack("x", ["g"], [1.0], DOCS).items[0]
    assert g.marker == "[Source: g]"


def test_diversity_bias_spreads_categories() -> None:
    ids, scores = ["h", "t1", "g"], [1.0, 0.95, 0.9]
    none = pack("q", ids, scores, DOCS, EvidenceConfig(token_budget=200, diversity_bias=0.0, min_unique_works=0))
    some = pack("q", ids, scores, DOCS, EvidenceConfig(token_budget=200, diversity_bias=0.5, min_unique_works=0))
    assert [i.id for i in none.items] == ["h", "t1"]
    assert {i.id for i in some.items} == {"h", "g"}


def test_searcher_runs_diversity_and_evidence_stages(demo_copy) -> None:
    with EmbeddedEngine(demo_copy) as e:
        s = Searcher(e)
        prof = get_profile("lexical").model_copy(update={
            "diversity": DiversityConfig(), "evidence": EvidenceConfig(token_budget=400), "max_results": 10})
        res = s.search("Bolzano-Weierstrass theorem bounded sequence", prof)
        ids = [h.id for h in res.hits]
        assert not {"anal-bolzano-weierstrass", "anal-bolzano-weierstrass-restated"} <= set(ids)
        assert res.diagnostics["stages"]["diversity"]["dropped"].get("near_duplicate", 0) >= 1
        assert res.evidence is not None and res.evidence.tokens <= 400 and res.evidence.items
        plain = s.search("Bolzano-Weierstrass theorem bounded sequence", "lexical", k=10)
        assert {"anal-bolzano-weierstrass", "anal-bolzano-weierstrass-restated"} <= {h.id for h in plain.hits}
        s.close()


def test_kb_fast_and_empty_results_with_a_reason(demo_copy) -> None:
    with EmbeddedEngine(demo_copy) as e:
        s = Searcher(e)
        res = s.search("Heine-Borel theorem compact", "kb-fast")
        assert 1 <= len(res.hits) <= 3
        assert all(h.score >= 0.5 * res.hits[0].score for h in res.hits)
        none = s.search("qqqxv zzzyw", "kb-fast")
        assert none.hits == [] and none.diagnostics["reason"]
        thinking = s.search("Heine-Borel theorem", "kb-thinkingdb")
        assert thinking.hits and thinking.diagnostics["stages"]["symbolic"]["seeds"][0] == "topo-heine-borel"
        # reranked by the math reranker: the exact name first, contributions summing to the score
        assert thinking.hits[0].id == "topo-heine-borel" and thinking.hits[0].components["field_match"] == 1.0
        assert all(sum(h.contributions.values()) == pytest.approx(h.score) for h in thinking.hits)
        s.close()


@pytest.mark.parametrize("bad", [{"diversity.per_page": 0}, {"evidence.diversity_bias": float("nan")}])
def test_stage_overrides_are_validated(bad) -> None:
    from hybridsearch.errors import ValidationError

    with pytest.raises(ValidationError):
        get_profile("lexical").with_overrides(bad)
