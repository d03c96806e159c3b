"""The embedded engine's graph update: from the last build's state, reading and writing only what
changed, it must store exactly what a build of the whole graph gives (lists, counts and hash; the
ranks to within the PageRank tolerance), through writes, rewrites, moves and deletions."""

from __future__ import annotations

import random

import pytest

from hybridsearch.engines import Neighbors
from hybridsearch.engines.embedded.engine import EmbeddedEngine
from hybridsearch.models import Document
from indexer.graph import build, update_graph


def _doc(rnd: random.Random, id_: str, pool: list[str]) -> Document:
    cites = rnd.sample(pool, min(len(pool), rnd.randrange(0, 6)))
    cites += [f"gone{rnd.randrange(8)}"] * (rnd.random() < 0.2)  # never indexed: a missing target
    if pool and rnd.random() < 0.2:
        cites.append(f"{rnd.choice(pool)}#{rnd.randrange(1, 3)}")  # a chunk of a work, or what names it
    date = rnd.choice([{}, {"year": 1990 + rnd.randrange(4)},
                       {"year": 1990 + rnd.randrange(4), "month": 1 + rnd.randrange(12)}])
    return Document(id=id_, title=f"work {id_}", text="text", cites=cites, **date)


def _expected(engine: EmbeddedEngine) -> tuple[dict[str, Neighbors], object]:
    return build(engine.store.citation_links())


def _check(engine: EmbeddedEngine, ids: list[str]) -> None:
    works, summary = _expected(engine)
    got = engine.graph_summary()
    assert got is not None
    assert (got.hash, got.works, got.edges, got.oriented, got.missing, got.dangling) == (
        summary.hash, summary.works, summary.edges, summary.oriented, summary.missing, summary.dangling)
    assert got.pagerank_sum == pytest.approx(1.0)
    stored = engine.store._read().execute("SELECT count(*) FROM graph_works").fetchone()[0]
    assert stored == summary.works  # no row left for a work that left the index
    docs = engine.get(ids)
    for id_, nb in engine.neighbors(list(docs)).items():
        want = works[docs[id_].work_id]
        assert (nb.cites, nb.cited_by, nb.cocited) == (want.cites, want.cited_by, want.cocited), id_
        assert nb.pagerank == pytest.approx(want.pagerank, abs=1e-11) and nb.pagerank > 0
        assert nb.authority == pytest.approx(want.authority, abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_updates_store_what_a_whole_build_gives(tmp_path, monkeypatch, seed) -> None:
    monkeypatch.setenv("HYBRIDSEARCH_GRAPH_COCITED_MAX", "3")  # cut lists: their order and ties matter
    rnd = random.Random(seed)
    ids = [f"w{i}" for i in range(60)]
    with EmbeddedEngine(tmp_path / "idx") as engine:
        engine.write([_doc(rnd, i, ids[:k]) for k, i in enumerate(ids)])
        engine.write([Document(id=f"w{i}#2", title="second chunk", text="t", cites=[rnd.choice(ids)])
                      for i in range(0, 60, 7)])
        assert update_graph(engine)[1]
        _check(engine, ids)
        full_builds = []
        whole = engine.set_graph
        monkeypatch.setattr(engine, "set_graph", lambda *a: full_builds.append(1) or whole(*a))
        reads = []
        links = engine.citation_links
        monkeypatch.setattr(engine, "citation_links", lambda: reads.append(1) or links())
        live = list(ids)
        for step in range(12):
            kind = step % 4
            if kind == 0:  # rewrites: other citations, other dates
                engine.write([_doc(rnd, i, live) for i in rnd.sample(live, 5)])
            elif kind == 1:  # new works, one of them named like a missing target
                new = [f"n{seed}_{step}_{k}" for k in range(3)] + [f"gone{rnd.randrange(8)}"]
                engine.write([_doc(rnd, i, live) for i in new if i not in live])
                live += [i for i in new if i not in live]
            elif kind == 2:  # deletions: some works still cited stay as missing targets
                gone = rnd.sample(live, 3)
                engine.delete(gone)
                live = [i for i in live if i not in gone]
            else:  # a chunk moved to another work, and a rewrite that changes nothing the graph reads
                moved = rnd.choice([i for i in live if "#" not in i])
                engine.write([engine.get([moved])[moved].model_copy(update={"id": f"{moved}#9", "work_id": moved})])
                same = rnd.choice(live)
                engine.write([engine.get([same])[same].model_copy(update={"text": "new words"})])
            steps: list[tuple[str, int, int]] = []
            summary, built = update_graph(engine, progress=lambda *a, into=steps: into.append(a))
            assert steps[0] == ("citation graph: update", 0, 3)
            assert not built or steps[1:] == [("citation graph: update", k, 3) for k in (1, 2, 3)]
            _check(engine, live)
        assert not full_builds and not reads  # every update above read only the works it changed
        # nothing changed: nothing built; a chunk not naming its work changes what citing it means: a full build
        assert update_graph(engine) == (engine.graph_summary(), False)
        engine.write([Document(id="part", work_id=live[0], title="a part", text="p")])
        assert update_graph(engine)[1] and full_builds and reads
        _check(engine, live + ["part"])
        # so does a work whose id reads as a chunk's (work#n): leaving, it would be cited as `work`
        full_builds.clear()
        engine.write([Document(id="odd#1", work_id="odd#1", title="odd", text="o", cites=[live[1]])])
        assert update_graph(engine)[1] and full_builds
        _check(engine, live + ["part", "odd#1"])


def test_an_old_graph_layout_is_read_until_the_next_build(tmp_path) -> None:
    """A store whose graph rows held their ranks (an older version's, perhaps over what a newer
    one left there) is moved to the node layout when it opens, and built anew at the next update."""
    with EmbeddedEngine(tmp_path / "idx") as engine:
        engine.write([Document(id="a", title="A", text="x", cites=["b"]), Document(id="b", title="B", text="y")])
        update_graph(engine)
        before = engine.neighbors(["a", "b"])
        c = engine.store.conn
        c.execute("CREATE TABLE graph(work_id TEXT PRIMARY KEY, cites TEXT NOT NULL, cited_by TEXT NOT NULL,"
                  " cocited TEXT NOT NULL, pagerank REAL NOT NULL, authority REAL NOT NULL)")
        c.execute("INSERT INTO graph SELECT work_id, cites, cited_by, cocited, 0.25, 0.5 FROM graph_works"
                  " ORDER BY work_id DESC")
        c.execute("UPDATE graph_works SET node = node + 7")  # what the newer version had: not the old rows'
        c.execute("UPDATE meta SET value = json_set(value, '$.hash', 'an older hash') WHERE key = 'graph'")
    with EmbeddedEngine(tmp_path / "idx") as engine:
        nb = engine.neighbors(["a", "b"])
        assert nb["a"].cites == before["a"].cites and nb["b"].cited_by == ("a",)
        assert (nb["a"].pagerank, nb["a"].authority, nb["b"].pagerank) == (0.25, 0.5, 0.25)
        assert engine.graph_state() is None
        assert update_graph(engine)[1] and engine.neighbors(["a", "b"]) == before


def test_an_update_of_older_changes_than_the_stored_graph_writes_nothing(tmp_path) -> None:
    """Two processes updating one graph: the one that read fewer changes does not overwrite the
    other's (nor drop the record of works that chunks left, which the newer state has taken)."""
    import dataclasses

    with EmbeddedEngine(tmp_path / "idx") as engine:
        engine.write([Document(id="a", title="A", text="x", cites=["b"]), Document(id="b", title="B", text="y")])
        update_graph(engine)
        stale = engine.graph_state()
        summary = engine.graph_summary()
        engine.write([Document(id="c", title="C", text="z", cites=["a"])])
        assert update_graph(engine)[1]
        newer = engine.neighbors(["a"])["a"]
        assert newer.cited_by == ("c",)
        old_rows = {"a": Neighbors(("b",), (), (), 0.5, 0.0)}
        engine.update_graph_rows(old_rows, [0], [], stale, summary)
        engine.set_graph(old_rows, summary, dataclasses.replace(stale, names=["a"]))
        assert engine.neighbors(["a"])["a"] == newer and engine.graph_state().seq > stale.seq
