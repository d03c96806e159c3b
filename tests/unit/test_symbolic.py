"""Symbolic expansion (kb-thinkingdb): facts from conditions, procedures, claims and
`metadata.facts`; the bounded closure (depth, nodes, time) with its 0.35 discount per hop, shown
in the explanation; licence fail-closed. On both engines, through the engine contract."""

from __future__ import annotations

import pytest

from hybridsearch.errors import ValidationError
from hybridsearch.models import Document, Fact, validate_record
from indexer.facts import facts_of, node_key
from query_service.searcher import Searcher
from query_service.symbolic import names

UNITS = [
    Document(id="tietze", title="Tietze extension theorem", license="CC-BY-4.0",
             text="Every continuous function on a closed subset of a normal space extends to the whole space.",
             condition="X is a normal space and A is a closed subset of X.",
             metadata={"facts": [["Tietze extension theorem", "follows from", "Urysohn lemma"]]}),
    Document(id="normal", title="Normal space", license="CC-BY-4.0",
             text="A normal space is a topological space in which disjoint closed sets have disjoint neighbourhoods."),
    Document(id="topo", title="Topological space", license="CC-BY-4.0",
             text="A topological space is a set with a family of open subsets closed under unions."),
    Document(id="urysohn", title="Urysohn lemma", license="CC-BY-4.0",
             text="Disjoint closed sets of a normal space are separated by a continuous function."),
    Document(id="closed", title="Closed subset", license="proprietary",
             text="A closed subset is the complement of an open subset."),
    Document(id="galois", title="Galois extension", license="CC-BY-4.0",
             text="A field extension that is normal and separable."),
    Document(id="sylow", title="Sylow theorems", license="CC-BY-4.0", text="Existence of p-subgroups."),
]
QUERY = "Tietze extension theorem"


def test_facts_from_conditions_procedures_claims_and_metadata() -> None:
    got = {str(f) for f in facts_of(UNITS[0])}
    assert got == {"Tietze extension theorem follows from Urysohn lemma",
                   "Tietze extension theorem requires normal space",
                   "Tietze extension theorem requires closed subset of X"}
    assert {str(f) for f in facts_of(UNITS[1])} == {"Normal space is_a topological space"}
    euler = Document(id="e", title="Euler's theorem",
                     text="Euler's theorem generalizes Fermat's little theorem to composite moduli. "
                          "The proof applies Lagrange's theorem to the group of units. "
                          "Pairwise independence does not imply mutual independence. "
                          "Convergence in measure does not necessarily imply pointwise convergence. "
                          "Pairwise independence doesn't imply mutual independence. "
                          "Weak convergence can’t imply strong convergence. "
                          "Pairwise independence does not, in general, imply mutual independence. "
                          "Euler's theorem is classical, which implies nothing about its proof.",
                     procedure="Compute the totient of n; then apply the Chinese remainder theorem.")
    assert {str(f) for f in facts_of(euler)} == {
        "Euler's theorem generalizes Fermat's little theorem",
        "Euler's theorem uses Lagrange's theorem",  # "the proof" stands for the unit's topic
        "Euler's theorem uses totient of n",
        "Euler's theorem uses Chinese remainder theorem"}  # a negated claim states no fact, nor
    # one whose subject a comma cut away (it is not the unit's own)
    baire = Document(id="b", title="Baire space", text="This implies the Baire category theorem. "
                     "Therefore, this requires the axiom of choice. "
                     "Even when the space is not compact, Tychonoff's theorem requires choice.")
    assert {str(f) for f in facts_of(baire)} == {  # a negation in an earlier clause is not the claim's
        "Baire space implies Baire category theorem", "Baire space requires axiom of choice",
        "Tychonoff's theorem requires choice"}
    # notation and inflection variants meet in one key
    assert node_key("C*-algebras") == node_key("C-star algebra")
    assert names(node_key("Urysohn's lemma"), node_key("Urysohn lemma repeatedly"))
    assert not names(node_key("Fermat's last theorem"), node_key("Fermat's little theorem"))
    assert not names(node_key("Cantor set"), node_key("set"))


@pytest.mark.parametrize(("bad", "field"), [([["a", "b"]], "metadata.facts[0]"), ([["a", "r", "c"], ["a", "", "c"]],
                                             "metadata.facts[1]"), ("a implies b", "metadata.facts"),
                                            ([{"subject": "a", "object": "c"}], "metadata.facts[0]")])
def test_malformed_facts_are_one_clear_error_on_input(bad, field) -> None:
    with pytest.raises(ValidationError, match="expected") as e:
        validate_record(Document, {"id": "x", "title": "t", "metadata": {"facts": bad}}, source="c.jsonl", line=3)
    assert str(e.value).startswith(f"c.jsonl:3, record 'x', field '{field}'")
    # a stored document is read whatever its metadata holds: malformed items are passed over
    stored = Document(id="y", title="t", metadata={"facts": [{"subject": "a", "relation": "r", "object": "c"},
                                                             ("b", "r", "d"), ["x"]]})
    assert stored.facts == [Fact("a", "r", "c"), Fact("b", "r", "d")]


@pytest.fixture(params=["embedded", pytest.param("opensearch", marks=pytest.mark.opensearch)])
def searcher(request, tmp_path, encoder):
    if request.param == "opensearch":
        engine = request.getfixturevalue("opensearch_index")
    else:
        from hybridsearch.engines import open_engine

        engine = open_engine(str(tmp_path / "idx"))
    engine.write(UNITS)
    s = Searcher(engine, encoder=encoder)
    yield s
    s.close()
    if request.param == "embedded":
        engine.close()


def test_closure_reaches_units_hop_by_hop_discounted_and_explained(searcher) -> None:
    res = searcher.search(QUERY, "kb-thinkingdb", rights={"restricted"})
    stage = res.diagnostics["stages"]["symbolic"]
    assert stage["seeds"][0] == "tietze" and stage["hops"] == 2 and "degraded" not in stage
    terms = {t["term"]: t for t in stage["terms"]}
    assert terms["normal space"]["hop"] == 1 and terms["normal space"]["weight"] == pytest.approx(0.35)
    assert terms["topological space"]["hop"] == 2 and terms["topological space"]["weight"] == pytest.approx(0.35 ** 2)
    assert terms["topological space"]["via"] == ("Tietze extension theorem requires normal space; "
                                                 "Normal space is_a topological space")
    hits = {h.id: h for h in res.hits}
    assert {"normal", "urysohn", "topo", "closed"} <= set(hits), list(hits)
    assert hits["normal"].components["citation"] == pytest.approx(0.35)
    assert hits["urysohn"].components["citation"] == pytest.approx(0.35)  # an explicit fact
    assert hits["topo"].components["citation"] == pytest.approx(0.35 ** 2)
    assert hits["topo"].via == ("Tietze extension theorem requires normal space; Normal space is_a topological "
                                "space (hop 2, weight 0.122)")
    assert hits["tietze"].via == "" and res.hits[0].id == "tietze"
    assert "galois" not in hits or hits["galois"].components["citation"] == 0.0
    for h in res.hits:
        assert sum(h.contributions.values()) == pytest.approx(h.score)
    # one hop: nothing reaches the hop-2 unit
    plain = searcher.search(QUERY, "kb-thinkingdb", overrides={"symbolic.depth": 1}, rights={"restricted"})
    assert plain.diagnostics["stages"]["symbolic"]["hops"] == 1
    assert "topo" not in {h.id for h in plain.hits}


def test_closure_bounds_nodes_and_time(searcher) -> None:
    small = searcher.search(QUERY, "kb-thinkingdb", overrides={"symbolic.max_nodes": 2})
    stage = small.diagnostics["stages"]["symbolic"]
    assert stage["nodes"] == 2 and stage["truncated"] == "node limit 2 reached"
    late = searcher.search(QUERY, "kb-thinkingdb", overrides={"symbolic.budget_ms": 1e-6})
    assert "time budget" in late.diagnostics["stages"]["symbolic"]["degraded"]
    assert late.hits and late.hits[0].id == "tietze"  # the search goes on with what the closure had
    with pytest.raises(ValidationError, match="symbolic.discount"):
        searcher.search(QUERY, "kb-thinkingdb", overrides={"symbolic.discount": 0})


def test_closure_never_reaches_a_unit_the_caller_may_not_see(searcher) -> None:
    res = searcher.search(QUERY, "kb-thinkingdb", rights={"open"})
    assert "closed" not in {h.id for h in res.hits}
    assert {"normal", "urysohn"} <= {h.id for h in res.hits}
    # the restricted unit's own facts never feed the closure, so its words never become terms
    terms = {t["term"] for t in res.diagnostics["stages"]["symbolic"]["terms"]}
    assert "complement of an open subset" not in terms and "topological space" in terms
    seen = searcher.search(QUERY, "kb-thinkingdb", rights={"restricted"})
    assert "complement of an open subset" in {t["term"] for t in seen.diagnostics["stages"]["symbolic"]["terms"]}


def test_a_unit_named_by_overlap_goes_on_under_its_own_title(tmp_path, encoder) -> None:
    """"Urysohn lemma repeatedly" names the unit "Urysohn's lemma" by overlap; that unit's facts use
    its own title, so the closure goes on from the title and reaches what the lemma requires, one
    hop further (0.35 x 0.35)."""
    from hybridsearch.engines.embedded import EmbeddedEngine

    units = [
        Document(id="tietze", title="Tietze extension theorem", text="Extends continuous functions.",
                 metadata={"facts": [["Tietze extension theorem", "follows from", "Urysohn lemma repeatedly"]]}),
        Document(id="urysohn", title="Urysohn's lemma", text="Separates closed sets by functions.",
                 metadata={"facts": [["Urysohn's lemma", "requires", "normal space"]]}),
        Document(id="normal", title="Normal space", text="Disjoint closed sets have disjoint neighbourhoods."),
    ]
    with EmbeddedEngine(tmp_path / "idx") as engine:
        engine.write(units, encoder.encode([d.dense_text for d in units]))
        s = Searcher(engine, encoder=encoder)
        res = s.search("Tietze extension theorem", "kb-thinkingdb", overrides={"symbolic.depth": 3})
        s.close()
    hits = {h.id: h for h in res.hits}
    assert hits["urysohn"].components["citation"] == pytest.approx(0.35)
    assert hits["normal"].components["citation"] == pytest.approx(0.35 ** 2)
    assert hits["normal"].via.startswith("Tietze extension theorem follows from Urysohn lemma repeatedly; "
                                         "Urysohn's lemma requires normal space")


def test_the_seeds_own_phrases_count_against_the_node_limit(tmp_path, encoder) -> None:
    from hybridsearch.engines.embedded import EmbeddedEngine

    facts = [["Big theorem", "uses", f"lemma number {i} of big theorem"] for i in range(60)]
    unit = Document(id="big", title="Big theorem", text="A theorem with many lemmas.", metadata={"facts": facts})
    with EmbeddedEngine(tmp_path / "idx") as engine:
        engine.write([unit], encoder.encode([unit.dense_text]))
        s = Searcher(engine, encoder=encoder)
        query = "big theorem lemma number " + " ".join(str(i) for i in range(60))
        stage = s.search(query, "kb-thinkingdb", overrides={"symbolic.max_nodes": 5}).diagnostics["stages"]["symbolic"]
        s.close()
    assert stage["nodes"] == 5 and stage["truncated"] == "node limit 5 reached"
