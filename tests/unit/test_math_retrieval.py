"""Math-aware retrieval on the demo index (real MiniLM vectors, the citation graph built at
ingest): intent-directed citation expansion, the transparent reranker, their time budgets, and
licence fail-closed on every path a restricted document could take."""

from __future__ import annotations

import math
import time

import pytest

from hybridsearch.engines.embedded import EmbeddedEngine
from query_service.evidence import EvidenceConfig
from query_service.rerank import COMPONENTS, WEIGHTS, MathConfig
from query_service.searcher import Searcher, get_profile
from tests.conftest import before_vector_sample

PREREQ = "what to read before the Gauss-Bonnet theorem"
RELATED = "results similar to Brouwer fixed point theorem"


@pytest.fixture
def searcher(demo_copy, encoder):
    with EmbeddedEngine(demo_copy) as engine:
        s = Searcher(engine, encoder=encoder)
        yield s
        s.close()


def test_prereq_follows_what_the_seeds_cite(searcher) -> None:
    res = searcher.search(PREREQ, "hybrid", k=10)
    d = res.diagnostics
    assert d["intent"] == {"name": "prereq", "focus": "the Gauss-Bonnet theorem", "rule": "read-before"}
    expand = d["stages"]["expand"]
    assert expand["directions"] == ["cites"] and "geom-gauss-bonnet" in expand["seeds"]
    assert 0 < d["embed_ms"] < d["stages"]["channels"]["ms"]  # the query is embedded inside the channels' stage
    top5 = [h.id for h in res.hits[:5]]
    # Gauss-Bonnet cites Gaussian curvature and the Euler characteristic
    assert {"geom-gaussian-curvature", "topo-euler-characteristic"} <= set(top5), top5
    for h in res.hits:
        if h.id in ("geom-gaussian-curvature", "topo-euler-characteristic"):
            assert h.components["citation"] > 0.5 and h.contributions["citation"] > 0
    # without expansion they are not both in the top 5
    plain = searcher.search(PREREQ, get_profile("hybrid").model_copy(update={"citation": None}), k=10)
    assert not {"geom-gaussian-curvature", "topo-euler-characteristic"} <= {h.id for h in plain.hits[:5]}


def test_related_follows_cocitation_and_citing(searcher) -> None:
    res = searcher.search(RELATED, "hybrid", k=10)
    assert res.diagnostics["stages"]["expand"]["directions"] == ["cocited", "cited_by"]
    assert res.diagnostics["intent"]["focus"] == "Brouwer fixed point theorem"
    cited = [h for h in res.hits if h.components.get("citation", 0) > 0]
    assert cited, "no candidate reached by co-citation or citing"
    # a given intent overrides the classifier, and the direction follows it
    given = searcher.search(RELATED, "hybrid", k=10, intent="prereq")
    assert given.diagnostics["intent"]["rule"] == "given"
    assert given.diagnostics["stages"]["expand"]["directions"] == ["cites"]


def test_reranker_contributions_sum_to_the_score_and_components_lie_in_0_1(searcher) -> None:
    for query in (PREREQ, RELATED, "overview of the different notions of curvature", "Heine-Borel theorem"):
        res = searcher.search(query, "hybrid", k=20)
        assert res.hits, query
        weights = res.diagnostics["stages"]["rerank"]["weights"]
        assert math.isclose(sum(weights.values()), 1.0)
        for h in res.hits:
            assert set(h.components) <= set(COMPONENTS)
            assert all(0.0 <= v <= 1.0 for v in h.components.values()), h
            assert math.isclose(sum(h.contributions.values()), h.score, abs_tol=1e-12), h
            for name, v in h.components.items():
                assert math.isclose(h.contributions[name], weights[name] * v)
        assert [h.score for h in res.hits] == sorted((h.score for h in res.hits), reverse=True)
    # deterministic: the same query gives the same ranking and scores
    a, b = (searcher.search(PREREQ, "hybrid", k=20) for _ in range(2))
    assert [(h.id, h.score) for h in a.hits] == [(h.id, h.score) for h in b.hits]


def test_the_semantic_component_is_half_the_chunk_half_its_best_passage(searcher) -> None:
    """Each on the dense list's scale: the chunk's own cosine and its best passage's (its title or
    one sentence, embedded alone). The passage half lifts the chunk one of whose sentences answers."""
    query = "every continuous map of a closed ball into itself has a fixed point"
    shares = {s: searcher.search(query, get_profile("hybrid").model_copy(update={
        "reranker_config": {"passage_share": s}}), k=20) for s in (0.0, 0.5, 1.0)}
    chunk, best = ({h.id: h.components["semantic"] for h in shares[s].hits} for s in (0.0, 1.0))
    engine = searcher.engine
    vec = searcher.encoder.encode([query], query=True)[0]
    cos, passage = engine.vector_score(vec, list(chunk)), engine.passage_score(vec, list(chunk))
    assert set(passage) == set(chunk)  # ingest embedded every chunk's passages
    moved = 0
    for h in shares[0.5].hits:
        if h.id in chunk and h.id in best:
            assert h.components["semantic"] == pytest.approx(0.5 * chunk[h.id] + 0.5 * best[h.id], abs=1e-12)
            if 0 < chunk[h.id] < 1 and 0 < best[h.id] < 1:  # unclipped: the order of the raw cosines
                assert (best[h.id] > chunk[h.id]) == (passage[h.id] > cos[h.id])
                moved += best[h.id] != chunk[h.id]
    assert moved >= 5


def test_exact_name_match_survives_notation(searcher) -> None:
    # the title "C*-algebra" matches the query's "C-star algebra" through the variant lexicon
    res = searcher.search("C-star algebra definition and examples", "hybrid", k=5)
    named = [h for h in res.hits if h.components.get("field_match") == 1.0]
    assert named and res.hits[0].id == named[0].id, [(h.id, h.components) for h in res.hits]
    # a hyphenated name typed with a space, or the other way round, is the same name
    for query, named_id in (("Gauss Bonnet theorem", "geom-gauss-bonnet"), ("Borsuk Ulam theorem", "topo-borsuk-ulam"),
                            ("Levi Civita connection", "geom-levi-civita-connection"),
                            ("path-connected-space", "topo-path-connected-space")):
        top = searcher.search(query, "hybrid", k=3).hits[0]
        assert top.id == named_id and top.components["field_match"] == 1.0, (query, top)


def test_time_budgets_fall_back_and_say_so(searcher) -> None:
    hybrid = get_profile("hybrid")
    fused = searcher.search(PREREQ, hybrid.model_copy(update={"reranker": None}), k=10)
    slow = hybrid.model_copy(update={"reranker_config": {"budget_ms": 1e-6}})
    res = searcher.search(PREREQ, slow, k=10)
    assert "time budget" in res.diagnostics["stages"]["rerank"]["degraded"]
    # the fused order stands (expansion's additions, unscored, come after it)
    assert [h.id for h in res.hits] == [h.id for h in fused.hits]
    no_expand = hybrid.model_copy(update={"citation": hybrid.citation.model_copy(update={"budget_ms": 1e-6})})
    res = searcher.search(PREREQ, no_expand, k=10)
    assert "time budget" in res.diagnostics["stages"]["expand"]["degraded"]
    assert all(h.components.get("citation", 0.0) == 0.0 for h in res.hits)


def test_the_reranker_stops_at_its_budget_instead_of_after_all_its_work(demo_copy, encoder) -> None:
    """Past its budget the reranker stops at the next engine request: the last of them (authority)
    is never asked for; before, every component was computed and then thrown away."""
    class Counting:
        def __init__(self, engine: EmbeddedEngine) -> None:
            self.engine, self.authority_calls = engine, 0

        def __getattr__(self, name: str):  # noqa: ANN204 - the engine's own attributes
            return getattr(self.engine, name)

        def authority(self, ids):  # noqa: ANN001, ANN201
            self.authority_calls += 1
            return self.engine.authority(ids)

    hybrid = get_profile("hybrid")
    with EmbeddedEngine(demo_copy) as real:
        engine = Counting(real)
        s = Searcher(engine, encoder=encoder)
        s.search(PREREQ, hybrid, k=10)
        assert engine.authority_calls == 1
        res = s.search(PREREQ, hybrid.model_copy(update={"reranker_config": {"budget_ms": 1e-6}}), k=10)
        s.close()
    assert "time budget" in res.diagnostics["stages"]["rerank"]["degraded"]
    assert engine.authority_calls == 1


def test_a_k_above_rerank_top_reranks_every_hit_returned(searcher) -> None:
    """k=250 over rerank_top=100: every hit carries the reranker's components and one scale of
    score, never increasing down the list (fused scores were appended below reranked ones)."""
    res = searcher.search("compact sets in metric spaces", "hybrid", k=250)
    scores = [h.score for h in res.hits]
    assert len(res.hits) > 100 and scores == sorted(scores, reverse=True)
    assert all(h.components for h in res.hits)


def test_low_confidence_flag(searcher) -> None:
    res = searcher.search("Heine-Borel theorem statement", "hybrid", k=10)
    assert "low_confidence" not in res.diagnostics["stages"]["rerank"]
    strict = get_profile("hybrid").model_copy(update={"reranker_config": {"low_margin": 1.0}})
    res = searcher.search("Heine-Borel theorem statement", strict, k=10)
    assert res.diagnostics["stages"]["rerank"]["low_confidence"].startswith("top two within")
    # above the semantic floor, but weakly: the top hit's cosine is below 0.40
    res = searcher.search("how to frobnicate a widget in a compact space", "hybrid", k=10)
    assert res.diagnostics["stages"]["rerank"]["low_confidence"].startswith("top hit's cosine"), res.diagnostics


def test_a_query_that_asks_for_recent_work_weights_freshness(searcher) -> None:
    # no intent's row weights freshness; "recent" moves a quarter of every weight onto it
    query = "recent advances in topology"
    res = searcher.search(query, "hybrid", k=5)
    assert res.diagnostics["intent"]["recency"] == "recent advances"
    rerank = res.diagnostics["stages"]["rerank"]
    lookup = dict(zip(COMPONENTS, WEIGHTS["lookup"], strict=True))
    assert rerank["recency"] == "recent advances"
    assert rerank["weights"] == pytest.approx({c: 0.75 * w + (0.25 if c == "freshness" else 0.0)
                                               for c, w in lookup.items()})
    # the Poincare conjecture's proof (2003) is the newest topology unit: freshness 1
    top = {h.id: h for h in res.hits}
    assert "topo-poincare-conjecture" in top, list(top)
    assert top["topo-poincare-conjecture"].components["freshness"] == 1.0
    for h in res.hits:
        assert math.isclose(sum(h.contributions.values()), h.score, abs_tol=1e-12), h
    # without the share, or without the request, it is not in the top 5 and freshness weighs nothing
    off = get_profile("hybrid").model_copy(update={"reranker_config": {"recency": 0.0}})
    unshared = searcher.search(query, off, k=5)
    assert "topo-poincare-conjecture" not in {h.id for h in unshared.hits}
    assert "recency" not in unshared.diagnostics["stages"]["rerank"]
    plain = searcher.search("advances in topology", "hybrid", k=5)
    assert "recency" not in plain.diagnostics["intent"]
    assert plain.diagnostics["stages"]["rerank"]["weights"]["freshness"] == 0.0
    assert "topo-poincare-conjecture" not in {h.id for h in plain.hits}


def test_weights_are_validated() -> None:
    from hybridsearch.errors import ValidationError

    bad = get_profile("hybrid").model_copy(update={"reranker_config": {"weights": {"prereq": {
        "lexical": 0.5, "semantic": 0.5, "citation": 0.5, "field_match": 0, "freshness": 0, "authority": 0}}}})
    with pytest.raises(ValidationError, match="weights must sum to 1"):
        bad.check_plugins()
    assert set(MathConfig().weights) == {"lookup", "survey", "compare", "prereq", "related"}


# -- licence fail-closed: a restricted document never leaves the index for an `open` caller ------
RESTRICTED = {"geom-gauss-bonnet", "geom-gaussian-curvature"}


@pytest.fixture
def restricted(demo_copy, encoder):
    with EmbeddedEngine(demo_copy) as engine:
        docs = engine.get(sorted(RESTRICTED))
        engine.write([d.model_copy(update={"license": "proprietary"}) for d in docs.values()])
        from indexer.pipeline import embed_missing

        embed_missing(engine, encoder, progress=False)
        s = Searcher(engine, encoder=encoder)
        yield s
        s.close()


def _evidence_profile():
    return get_profile("hybrid").model_copy(update={"evidence": EvidenceConfig()})


def test_restricted_is_never_a_seed(restricted) -> None:
    res = restricted.search(PREREQ, "hybrid", k=10, rights={"open"})
    assert not RESTRICTED & set(res.diagnostics["stages"]["expand"]["seeds"])
    full = restricted.search(PREREQ, "hybrid", k=10, rights={"open", "restricted"})
    assert "geom-gauss-bonnet" in full.diagnostics["stages"]["expand"]["seeds"]


def test_restricted_never_comes_through_expansion(restricted) -> None:
    # the restated Gauss-Bonnet (open) still cites Gaussian curvature (restricted)
    res = restricted.search(PREREQ, "hybrid", k=50, rights={"open"})
    assert not RESTRICTED & {h.id for h in res.hits}
    assert not RESTRICTED & set(res.diagnostics["stages"]["expand"]["seeds"])
    full = restricted.search(PREREQ, "hybrid", k=50, rights={"open", "restricted"})
    assert "geom-gaussian-curvature" in {h.id for h in full.hits}


def test_a_restricted_citer_never_links_what_the_caller_sees(tmp_path, encoder) -> None:
    """R (restricted) alone cites both A and B: for a caller who may not see R, B is not co-cited
    with A, and R is not reached; for one who may, B is co-cited with A."""
    from hybridsearch.models import Document
    from indexer.graph import update_graph
    from indexer.pipeline import embed_missing

    docs = [Document(id="A", title="Brouwer fixed point theorem", license="CC-BY-4.0",
                     text="Every continuous map of a closed disk to itself has a fixed point."),
            Document(id="B", title="Hairy ball theorem", license="CC-BY-4.0",
                     text="No nonvanishing continuous tangent vector field exists on the two-sphere."),
            Document(id="C", title="Jordan curve theorem", license="CC-BY-4.0",
                     text="A simple closed curve divides the plane into an inside and an outside."),
            Document(id="R", title="Topological methods", license="proprietary", cites=["A", "B"],
                     text="Fixed points of disk maps and vector fields on spheres.")]
    with EmbeddedEngine(tmp_path / "idx") as engine:
        engine.write(docs)
        embed_missing(engine, encoder, progress=False)
        update_graph(engine)
        assert engine.neighbors(["A"])["A"].cocited == ("B",)
        s = Searcher(engine, encoder=encoder)
        try:
            query = "Brouwer fixed point theorem"
            seen = s.search(query, "hybrid", k=10, rights={"open"}, intent="related")
            citation = {h.id: h.components["citation"] for h in seen.hits}
            assert "R" not in citation and citation["B"] == 0.0, citation
            full = s.search(query, "hybrid", k=10, rights={"open", "restricted"}, intent="related")
            assert {h.id: h.components["citation"] for h in full.hits}["B"] > 0
        finally:
            s.close()


def test_a_restricted_cited_work_is_neither_followed_nor_counted(tmp_path, encoder) -> None:
    """A (open) cites H (restricted) and Z (open). With one link followed per seed, a caller who may
    not see H still reaches Z, and the works reached count Z alone (H's existence does not show)."""
    from hybridsearch.models import Document
    from indexer.graph import update_graph
    from indexer.pipeline import embed_missing

    docs = [Document(id="A", title="Brouwer fixed point theorem", license="CC-BY-4.0", cites=["H", "Z"],
                     text="Every continuous map of a closed disk to itself has a fixed point."),
            Document(id="H", title="Simplicial approximation", license="proprietary",
                     text="Continuous maps between polyhedra are approximated by simplicial maps."),
            Document(id="Z", title="Sperner's lemma", license="CC-BY-4.0",
                     text="Every Sperner colouring of a triangulated simplex has a fully coloured cell.")]
    prof = get_profile("hybrid")
    prof = prof.model_copy(update={"citation": prof.citation.model_copy(update={"fan_out": 1})})
    with EmbeddedEngine(tmp_path / "idx") as engine:
        engine.write(docs)
        embed_missing(engine, encoder, progress=False)
        update_graph(engine)
        assert engine.neighbors(["A"])["A"].cites == ("H", "Z")
        s = Searcher(engine, encoder=encoder)
        try:
            query = "Brouwer fixed point theorem"
            seen = s.search(query, prof, k=10, rights={"open"}, intent="prereq")
            assert seen.diagnostics["stages"]["expand"]["works"] == 1
            assert {h.id: h.components["citation"] for h in seen.hits}["Z"] > 0
            assert "H" not in {h.id for h in seen.hits}
            full = s.search(query, prof, k=10, rights={"open", "restricted"}, intent="prereq")
            assert full.diagnostics["stages"]["expand"]["works"] == 1  # fan_out 1: H alone
            assert {h.id: h.components["citation"] for h in full.hits}["H"] > 0
        finally:
            s.close()


def test_restricted_never_reaches_evidence(restricted) -> None:
    res = restricted.search(PREREQ, _evidence_profile(), k=20, rights={"open"})
    assert res.evidence is not None and res.evidence.items
    assert not RESTRICTED & {item.id for item in res.evidence.items}
    full = restricted.search(PREREQ, _evidence_profile(), k=20, rights={"open", "restricted"})
    assert RESTRICTED & {item.id for item in full.evidence.items}


def test_restricted_never_reaches_a_snippet(restricted) -> None:
    secret = restricted.engine.get(["geom-gaussian-curvature"])["geom-gaussian-curvature"].text[:60]
    res = restricted.search(PREREQ, _evidence_profile(), k=20, rights={"open"}, with_documents=True)
    shown = " ".join([item.text for item in res.evidence.items] + [h.document.text for h in res.hits])
    assert secret not in shown
    full = restricted.search(PREREQ, _evidence_profile(), k=20, rights={"open", "restricted"}, with_documents=True)
    assert secret in " ".join(item.text for item in full.evidence.items)


# restricted documents of everyday life, far from the corpus's mathematics
EVERYDAY = [
    ("Engagement ring sizes", "Ring sizes for engagement rings run from 3 to 13; a jeweller measures the finger."),
    ("Resizing a wedding ring", "A jeweller can resize a gold wedding band by one or two sizes."),
    ("Choosing a diamond", "Cut, colour, clarity and carat decide the price of a diamond ring."),
    ("Sourdough bread", "Feed the starter, mix flour and water, fold the dough and bake it in a hot oven."),
    ("Tomato soup", "Simmer tomatoes with onion and garlic, blend, and season with salt and basil."),
    ("Pruning roses", "Prune roses in late winter, cutting above an outward-facing bud."),
    ("Watering a lawn", "Water the lawn deeply twice a week in the early morning."),
    ("Football offside rule", "A player is offside when nearer the goal line than the ball and the last defender."),
    ("Marathon training", "Build weekly mileage slowly and taper for three weeks before the race."),
    ("Cleaning an oven", "Spread baking soda paste inside the oven, leave it overnight and wipe it off."),
    ("Packing for a holiday", "Roll clothes, pack a charger and keep passports in hand luggage."),
    ("Houseplants in winter", "Move houseplants away from radiators and water them less in winter."),
]


def test_restricted_never_decides_the_domain(demo_copy, encoder) -> None:
    """The domain check judges a query against the documents the caller may see: restricted ones
    elsewhere in vector space neither widen an open caller's domain nor leak that they exist."""
    from hybridsearch.models import Document
    from indexer.pipeline import embed_missing

    query = "ring sizes for engagement rings"
    with EmbeddedEngine(demo_copy) as engine:
        engine.write([Document(id=f"life-{i}", title=t, text=x, license="proprietary")
                      for i, (t, x) in enumerate(EVERYDAY)])
        embed_missing(engine, encoder, progress=False)
        s = Searcher(engine, encoder=encoder)
        res = s.search(query, "hybrid", rights={"open"})
        assert not res.hits and "centroid" in res.diagnostics["reason"], res.diagnostics.get("reason")
        full = s.search(query, "hybrid", rights={"open", "restricted"})
        assert full.hits and full.hits[0].id == "life-0"
        again = s.search(query, "hybrid", rights={"open"})  # each licence set keeps its own domain
        assert not again.hits and again.diagnostics["reason"] == res.diagnostics["reason"]
        s.close()


def test_the_domain_is_measured_again_beside_the_searches(demo_copy, encoder, monkeypatch) -> None:
    """Once the domain check has a measure, no search waits for another: when the index has grown
    by a tenth, searches keep the last measure while a new one is taken in the background."""
    import threading

    from hybridsearch.models import Document
    from indexer.pipeline import embed_missing

    query = "ring sizes for engagement rings"
    threads: list[str] = []  # the thread that took each sample
    before_vector_sample(monkeypatch, lambda filters: threads.append(threading.current_thread().name))
    with EmbeddedEngine(demo_copy) as engine:
        s = Searcher(engine, encoder=encoder)
        before = s.search(query, "hybrid")
        assert not before.hits and "centroid" in before.diagnostics["reason"]
        assert threads == [threading.current_thread().name]  # the first measure: taken by the search
        # nothing about rings: the query stays below the gate, and its distance to the centroid decides
        unrelated = EVERYDAY[3:]
        grown = [Document(id=f"life-{r}-{i}", title=t, text=x) for r in range(3) for i, (t, x) in enumerate(unrelated)]
        assert len(grown) * 10 > engine.count()
        engine.write(grown)
        embed_missing(engine, encoder, progress=False)
        def measure(res) -> str:  # the domain check's part of the reason: the two cosines
            return str(res.diagnostics.get("reason")).partition("(cosine with the centroid")[2]

        stale = s.search(query, "hybrid")  # grown by more than a tenth: the last measure still decides
        assert not stale.hits and measure(stale) == measure(before) != ""
        deadline = time.monotonic() + 30
        while measure(after := s.search(query, "hybrid")) == measure(before):
            assert time.monotonic() < deadline, "the domain was not measured again"
            time.sleep(0.05)
        assert len(threads) == 2 and threads[1].startswith("domain")
        fresh = Searcher(engine, encoder=encoder)  # the new measure is the one a first search takes now
        assert measure(fresh.search(query, "hybrid")) == measure(after)
        fresh.close()
        s.close()


def test_a_failed_measure_keeps_the_last_and_is_tried_again(demo_copy, encoder, monkeypatch, caplog) -> None:
    """A measure that fails in the background (the engine unreachable a moment) leaves the last
    measure deciding, says so in the log, and is taken again DOMAIN_RESAMPLE_S later."""
    import query_service.searcher as searcher_mod
    from hybridsearch.errors import EngineUnavailableError
    from hybridsearch.models import Document
    from indexer.pipeline import embed_missing

    monkeypatch.setattr(searcher_mod, "DOMAIN_RESAMPLE_S", 0.5)
    query = "ring sizes for engagement rings"
    calls: list[str] = []

    def second_fails(filters) -> None:  # the fault: the second sample finds the engine gone
        calls.append("sample")
        if len(calls) == 2:
            raise EngineUnavailableError("the engine went away")

    before_vector_sample(monkeypatch, second_fails)
    with EmbeddedEngine(demo_copy) as engine:
        s = Searcher(engine, encoder=encoder)
        reason = s.search(query, "hybrid").diagnostics["reason"]
        engine.write([Document(id=f"life-{r}-{i}", title=t, text=x) for r in range(3) for i, (t, x) in
                      enumerate(EVERYDAY[3:])])
        embed_missing(engine, encoder, progress=False)
        with caplog.at_level("WARNING", logger="hybridsearch.search"):
            assert s.search(query, "hybrid").diagnostics["reason"] == reason  # starts the measure, which fails
            deadline = time.monotonic() + 30
            while "measuring the index again failed" not in caplog.text:
                assert time.monotonic() < deadline, "the failure was not logged"
                time.sleep(0.05)
        assert "the engine went away" in caplog.text
        assert s.search(query, "hybrid").diagnostics["reason"] == reason  # the last measure still decides
        while s.search(query, "hybrid").diagnostics["reason"] == reason:
            assert time.monotonic() < deadline, "the failed measure was not tried again"
            time.sleep(0.1)
        assert len(calls) == 3
        s.close()


def test_closing_drops_the_measures_not_begun(demo_copy, encoder, monkeypatch) -> None:
    """`close` lets a background measure under way finish and drops the ones queued behind it; no
    measure starts after it, and a search after it is refused as the engine being unavailable
    (the service answers 503)."""
    import threading

    from hybridsearch.errors import EngineUnavailableError
    from hybridsearch.models import Document, Filters
    from indexer.pipeline import embed_missing

    query = "ring sizes for engagement rings"
    gate, started = threading.Event(), threading.Event()
    sampled: list[str] = []

    def held(filters) -> None:  # background measures wait at the gate
        sampled.append(threading.current_thread().name)
        if threading.current_thread().name.startswith("domain"):
            started.set()
            assert gate.wait(30), "the gate was never opened"

    before_vector_sample(monkeypatch, held)
    with EmbeddedEngine(demo_copy) as engine:
        s = Searcher(engine, encoder=encoder)
        held_out = Filters(license=["cc-by-4.0"])
        reasons = {None: s.search(query, "hybrid").diagnostics["reason"],
                   "held": s.search(query, "hybrid", filters=held_out).diagnostics["reason"]}
        assert len(sampled) == 2
        grown = [Document(id=f"life-{r}-{i}", title=t, text=x)  # nothing about rings: still out of the domain
                 for r in range(3) for i, (t, x) in enumerate(EVERYDAY[3:])]
        assert len(grown) * 10 > engine.count()
        engine.write(grown)
        embed_missing(engine, encoder, progress=False)
        # grown by more than a tenth: each key's next search queues a measure, the second behind the first
        assert s.search(query, "hybrid").diagnostics["reason"] == reasons[None]
        assert started.wait(30)
        assert s.search(query, "hybrid", filters=held_out).diagnostics["reason"] == reasons["held"]
        closing = threading.Thread(target=s.close)
        closing.start()
        closing.join(0.5)
        assert closing.is_alive()  # waits for the measure under way
        gate.set()
        closing.join(30)
        assert not closing.is_alive() and len(sampled) == 3 and not s._measuring
        with pytest.raises(EngineUnavailableError, match="^the searcher is closed$"):
            s.search(query, "hybrid", filters=held_out)
        assert len(sampled) == 3  # nothing measured after close


def test_a_first_measure_holds_up_only_searches_of_its_own_key(demo_copy, encoder, monkeypatch) -> None:
    """While one licence set's first measure is being taken, searches with another go on, and a
    second search with the same set waits for that measure rather than taking its own. At most
    DOMAIN_KEYS measures are kept (a request's licence filter makes a key of its own), the one used
    longest ago dropped first."""
    import threading
    from concurrent.futures import Future

    import query_service.searcher as searcher_mod
    from hybridsearch.models import Filters
    from indexer.pipeline import embed_missing

    query = "ring sizes for engagement rings"
    gate, started = threading.Event(), threading.Event()
    sampled: list[tuple[str, ...] | None] = []

    def held(filters) -> None:  # the first sample for "held" waits at the gate
        lic = None if filters is None else tuple(filters.license)
        sampled.append(lic)
        if lic == ("held",):
            started.set()
            assert gate.wait(30), "the gate was never opened"

    before_vector_sample(monkeypatch, held)
    monkeypatch.setattr(searcher_mod, "DOMAIN_KEYS", 2)
    waiting = threading.Event()  # set when the second search waits for the first one's measure
    result = Future.result

    def watched(self, timeout=None):
        if threading.current_thread().name == "second" and self in list(s._measuring.values()):
            waiting.set()
        return result(self, timeout)

    monkeypatch.setattr(Future, "result", watched)
    with EmbeddedEngine(demo_copy) as engine:
        s = Searcher(engine, encoder=encoder)
        # copies of the unit the query comes nearest (cosine 0.418: gated) under two licences
        top = s.search(query, "hybrid", overrides={"domain_check": None}).hits[0].id
        unit = engine.get([top])[top]
        engine.write([unit.model_copy(update={"id": f"{lic}-copy", "work_id": f"{lic}-copy", "license": lic})
                      for lic in ("held", "other")])
        embed_missing(engine, encoder, progress=False)
        everyone = s.search(query, "hybrid").diagnostics.get("reason")  # the key of all licences
        results: dict[str, str | None] = {}

        def search_held(name: str) -> None:
            results[name] = s.search(query, "hybrid", filters=Filters(license=["held"])).diagnostics.get("reason")

        first = threading.Thread(target=search_held, args=("first",))
        first.start()
        assert started.wait(30)
        second = threading.Thread(target=search_held, args=("second",), name="second")
        second.start()
        assert s.search(query, "hybrid").diagnostics.get("reason") == everyone  # not held up
        assert first.is_alive()  # still measuring
        assert waiting.wait(30), "the second search did not wait for the first one's measure"
        gate.set()
        first.join(30)
        second.join(30)
        assert sampled.count(("held",)) == 1 and results["first"] == results["second"]
        assert sampled.count(None) == 1
        s.search(query, "hybrid")  # the key of all licences, measured first, used last
        s.search(query, "hybrid", filters=Filters(license=["other"]))  # a third key drops "held"
        s.search(query, "hybrid")
        assert sampled.count(None) == 1
        s.search(query, "hybrid", filters=Filters(license=["held"]))
        assert sampled.count(("held",)) == 2
        s.close()


def test_ablation_rows_and_what_citation_buys(demo_copy, encoder) -> None:
    from query_service.evaluate import ablation_specs, run_eval
    from tests.conftest import DEMO

    specs = ablation_specs()
    assert [s.name for s in specs] == ["lexical", "vector", "hybrid-no-citation", "hybrid+citation",
                                       "hybrid+citation+reranker"]
    # the citation-only row reranks on lexical, semantic and citation alone, renormalised
    cfg = specs[3].profile.reranker_config["weights"]
    assert all(w.field_match == w.freshness == w.authority == 0 for w in cfg.values())
    assert specs[2].profile.citation is None and specs[2].profile.reranker is None
    res = run_eval(DEMO, specs[2:], target=demo_copy, encoder=encoder, progress=False, log=lambda m: None)
    # prerequisite questions are answered by what the named result cites
    assert res["hybrid+citation@prereq"]["ndcg@10"] > res["hybrid-no-citation@prereq"]["ndcg@10"] + 0.2
    assert res["hybrid+citation+reranker"]["ndcg@10"] > res["hybrid-no-citation"]["ndcg@10"]
