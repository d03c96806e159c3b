from __future__ import annotations

import pytest

from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.errors import QueryError
from indexer.loaders import BeirLoader, LoadReport
from query_service.searcher import Searcher, adhoc_profile
from tests.conftest import DEMO


@pytest.fixture
def kbs(tmp_path, encoder):
    docs = list(BeirLoader().load(DEMO, LoadReport()))
    topo = [d for d in docs if d.id.startswith("topo-")]
    alg = [d for d in docs if d.id.startswith("alg-")]
    engines = {}
    for name, part in (("topology", topo), ("algebra", alg)):
        e = EmbeddedEngine(tmp_path / name)
        enc = e.hdc_encoder()
        e.write(part, encoder.encode([d.dense_text for d in part]), [enc.encode_document(d) for d in part])
        engines[name] = e
    yield engines
    for e in engines.values():
        e.close()


def test_one_call_searches_several_knowledge_bases(kbs, encoder) -> None:
    s = Searcher(kbs, encoder=encoder)
    res = s.search("fundamental group and Galois group", adhoc_profile(["bm25", "dense", "hdc"]), k=20,
                   with_documents=True)
    kbs_hit = {h.id.split(":", 1)[0] for h in res.hits}
    assert kbs_hit == {"topology", "algebra"}
    assert all(h.document is not None for h in res.hits)
    only = s.search("fundamental group and Galois group", adhoc_profile(["bm25", "dense"]), k=20,
                    kb_names=["algebra"])
    assert {h.id.split(":", 1)[0] for h in only.hits} == {"algebra"}
    with pytest.raises(QueryError, match="unknown knowledge bases"):
        s.search("x", "lexical", kb_names=["nope"])
    s.close()


def test_bm25_lists_are_merged_on_each_kb_top_score(kbs) -> None:
    s = Searcher(kbs)
    res = s.search("group", "lexical", k=50)
    tops = [h for h in res.hits if h.score == pytest.approx(1.0)]
    assert {h.id.split(":", 1)[0] for h in tops} == {"topology", "algebra"}
    s.close()


def test_the_domain_check_spans_the_selected_knowledge_bases(kbs, encoder) -> None:
    s = Searcher(kbs, encoder=encoder)
    sample = s.engine.vector_sample(1000)
    assert sample.shape[0] == s.engine.count() == sum(e.count() for e in kbs.values()) == 82
    # shares in proportion to each base's chunks (45 topology, 37 algebra), n rows at most
    assert s.engine.vector_sample(41).shape[0] == 22 + 18
    res = s.search("ring sizes for engagement rings", "hybrid")
    assert not res.hits and "centroid" in res.diagnostics["reason"]
    # algebra alone holds 37 vectors, too few to place a centroid: only the floor judges there
    alone = s.search("ring sizes for engagement rings", "hybrid", kb_names=["algebra"])
    assert alone.hits and "reason" not in alone.diagnostics
    s.close()


def test_citation_expansion_and_authority_work_within_each_knowledge_base(tmp_path, encoder) -> None:
    from indexer.graph import update_graph

    docs = list(BeirLoader().load(DEMO, LoadReport()))
    engines = {}
    for name, prefix in (("geometry", "geom-"), ("topology", "topo-")):
        part = [d for d in docs if d.id.startswith(prefix)]
        e = EmbeddedEngine(tmp_path / name)
        e.write(part, encoder.encode([d.dense_text for d in part]))
        update_graph(e)
        engines[name] = e
    s = Searcher(engines, encoder=encoder)
    res = s.search("what to read before the Gauss-Bonnet theorem", "hybrid", k=10)
    expand = res.diagnostics["stages"]["expand"]
    assert "skipped" not in expand and "geometry:geom-gauss-bonnet" in expand["seeds"]
    hits = {h.id: h for h in res.hits}
    # Gauss-Bonnet cites Gaussian curvature in the same base; its work ids are qualified like its chunks
    assert hits["geometry:geom-gaussian-curvature"].components["citation"] > 0.3
    assert "geometry:geom-gaussian-curvature" in [h.id for h in res.hits[:5]]
    assert any(h.components.get("authority", 0) > 0 for h in res.hits)
    info = s.engine.doc_info(["topology:topo-euler-characteristic"])["topology:topo-euler-characteristic"]
    assert info.work_id == "topology:topo-euler-characteristic"
    s.close()
    for e in engines.values():
        e.close()


def test_hdc_codes_are_searched_and_scored_across_knowledge_bases(kbs) -> None:
    s = Searcher(kbs)
    codes = s.engine.hdc_encoder().encode_query("fundamental group and Galois group")
    merged = s.engine.hamming(codes, 10)
    assert set(merged) == set(codes) and len(codes) >= 2
    for f in codes:
        union = sorted(((sc, f"{kb}:{i}") for kb, e in kbs.items() for i, sc in e.hamming(codes, 10)[f].items()),
                       key=lambda x: (-x[0], x[1]))[:10]
        assert merged[f].channel == f"hdc:{f}" and list(merged[f].items()) == [(i, sc) for sc, i in union]
    ids = sorted({i for rl in merged.values() for i in rl.ids}) + ["algebra:missing", "nope:x", "unqualified"]
    scores = s.engine.hamming_score(codes, ids)
    for kb, e in kbs.items():
        local = e.hamming_score(codes, [i.split(":", 1)[1] for i in ids if i.startswith(f"{kb}:")])
        for f in codes:
            assert {i: v for i, v in scores[f].items() if i.startswith(f"{kb}:")} == {
                f"{kb}:{i}": v for i, v in local[f].items()}
    assert all(i.split(":", 1)[0] in kbs for f in codes for i in scores[f])
    s.close()


def test_knowledge_bases_with_different_hdc_tie_rules_are_refused_together(kbs) -> None:
    """An index encoded before the content tie rule keeps the fixed one; searched together with a
    new one, one of them would be scored with a query encoded the other way."""
    old = kbs["algebra"]
    old.store.set_meta("hdc", {"ngrams": False})  # as an index made before the rule stored it
    old._hdc_encoder = None
    s = Searcher(kbs)
    with pytest.raises(QueryError, match=r"encode HDC differently \(ngrams, or the tie rule"):
        s.engine.hdc_encoder()
    s.close()
