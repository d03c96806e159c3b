"""The embedded engine on a real on-disk index: writes, updates, deletes, filters, reopen."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from hybridsearch.engines import Bm25Options, Engine, LexicalSearch, VectorSearch
from hybridsearch.engines.embedded import EmbeddedEngine
from hybridsearch.errors import QueryError, ValidationError
from hybridsearch.models import DateRange, Document, Filters


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


DOCS = [
    Document(id="a", title="Compact space", text="Every open cover has a finite subcover.",
             subjects=["Topology"], year=1923, month=4, kind="definition", license="CC-BY-4.0",
             source="topology.pdf"),
    Document(id="b", title="Heine–Borel theorem", text="A subset of R^n is compact iff closed and bounded.",
             subjects=["analysis"], year=1895, kind="theorem", license="CC-BY-NC-4.0", source="analysis.pdf"),
    Document(id="c", title="C*-algebra", text="A Banach algebra with an involution and the C* identity.",
             subjects=["analysis", "operator algebras"], year=1943, kind="definition", license="CC-BY-4.0"),
]
VECS = unit_vectors(3)


@pytest.fixture
def engine(tmp_path):
    e = EmbeddedEngine(tmp_path / "idx")
    e.write(DOCS, VECS)
    yield e
    e.close()


def test_protocols(engine) -> None:
    assert isinstance(engine, Engine) and isinstance(engine, LexicalSearch)
    assert isinstance(engine, VectorSearch)


def test_bm25_and_dense_find_written_documents(engine) -> None:
    assert engine.bm25("compact").ids == ["a", "b"]
    assert engine.bm25("C-star algebra").ids == ["c"]
    assert engine.knn(VECS[1], 1).ids == ["b"]
    assert engine.knn(VECS[1], 1).scores[0] == pytest.approx(1.0, abs=1e-5)
    scores = engine.vector_score(VECS[0], ["a", "b", "missing"])
    assert set(scores) == {"a", "b"} and scores["a"] == pytest.approx(1.0, abs=1e-5)
    assert scores["b"] == pytest.approx(float(VECS[0] @ VECS[1]), abs=1e-5)


def test_field_weights_change_the_order(engine) -> None:
    # "compact" is in a's title and b's text: title weight 1.5 puts a first, text-only puts b first
    assert engine.bm25("compact", {"text": 1.0}).ids == ["b"]
    both = engine.bm25("compact", {"title": 1.5, "text": 1.0})
    title_only = engine.bm25("compact", {"title": 1.0})
    assert both.ids[0] == "a" and title_only.ids == ["a"]


def test_most_fields_sums_and_best_fields_takes_the_max(engine) -> None:
    # 'a' has "compact" in the title and "cover ... subcover" elsewhere: add a text match
    engine.write([DOCS[0].model_copy(update={"text": "A compact space; every open cover is finite."})])
    t = engine.bm25("compact", {"title": 1.0}).scores[0]
    x = dict(engine.bm25("compact", {"text": 1.0}, 3).items())["a"]
    most = dict(engine.bm25("compact", {"title": 1.0, "text": 1.0}, 3).items())["a"]
    best0 = dict(engine.bm25("compact", {"title": 1.0, "text": 1.0}, 3,
                             options=Bm25Options("best_fields", tie_breaker=0.0)).items())["a"]
    best5 = dict(engine.bm25("compact", {"title": 1.0, "text": 1.0}, 3,
                             options=Bm25Options("best_fields", tie_breaker=0.5)).items())["a"]
    assert most == pytest.approx(t + x, rel=1e-5)
    assert best0 == pytest.approx(max(t, x), rel=1e-5)
    assert best5 == pytest.approx(max(t, x) + 0.5 * min(t, x), rel=1e-5)


def test_role_boost_multiplies(engine) -> None:
    base = engine.bm25("compact").scores
    boosted = engine.bm25("compact", options=Bm25Options(role_boost=2.0)).scores
    assert boosted == pytest.approx([2 * s for s in base])


@pytest.mark.parametrize(("filters", "bm25_ids", "dense_ids"), [
    (Filters(subjects=["topology"]), {"a"}, {"a"}),
    (Filters(subjects=["ANALYSIS"]), {"b"}, {"b", "c"}),
    (Filters(kind=["theorem"]), {"b"}, {"b"}),
    (Filters(license=["cc-by-4.0"]), {"a"}, {"a", "c"}),
    (Filters(sources=["analysis.pdf"]), {"b"}, {"b"}),
    (Filters(date_range=DateRange(gte="1900", lte="1930")), {"a"}, {"a"}),
    (Filters(date_range=DateRange(gte="1923-05")), set(), {"c"}),
    (Filters(date_range=DateRange(lte=1900)), {"b"}, {"b"}),
    (Filters(subjects=["analysis"], date_range=DateRange(gte=1940)), set(), {"c"}),
])
def test_filters_mean_the_same_in_both_channels(engine, filters, bm25_ids, dense_ids) -> None:
    assert set(engine.bm25("compact", k=10, filters=filters).ids) == bm25_ids
    assert set(engine.knn(VECS[0], 10, filters).ids) == dense_ids


def test_update_replaces_and_delete_removes_in_every_channel(engine) -> None:
    new_vec = unit_vectors(1, seed=9)
    engine.write([Document(id="a", title="Connectedness", text="No separation into open sets.")], new_vec)
    assert "a" not in engine.bm25("compact").ids
    assert engine.bm25("connectedness").ids == ["a"]
    assert engine.knn(new_vec[0], 1).ids == ["a"]
    assert engine.knn(VECS[0], 3).ids.count("a") == 1
    assert engine.get(["a"])["a"].title == "Connectedness"
    assert engine.delete(["b", "nope"]) == ["b"]
    assert "b" not in engine.bm25("compact").ids and "b" not in engine.knn(VECS[1], 3).ids
    assert engine.count() == 2 and engine.get(["b"]) == {}


def test_text_change_without_vector_drops_the_stale_vector(engine) -> None:
    engine.write([DOCS[1].model_copy(update={"text": "Entirely new statement."})])
    assert "b" not in engine.knn(VECS[1], 3).ids
    assert [i for i, _ in engine.missing_vectors()] == ["b"]
    engine.set_vectors(["b"], VECS[1:2])
    assert engine.knn(VECS[1], 1).ids == ["b"]


def test_reopen_keeps_everything(tmp_path) -> None:
    with EmbeddedEngine(tmp_path / "idx") as e:
        e.write(DOCS, VECS)
        e.delete(["c"])
    with EmbeddedEngine(tmp_path / "idx") as e:
        assert e.count() == 2
        assert e.bm25("compact").ids == ["a", "b"]
        assert e.knn(VECS[1], 5).ids[0] == "b" and "c" not in e.knn(VECS[2], 5).ids


def test_bad_vectors_and_options_are_rejected(engine) -> None:
    bad = VECS.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValidationError, match="row 1 has a non-finite"):
        engine.write(DOCS, bad)
    with pytest.raises(ValidationError, match=r"shape"):
        engine.write(DOCS, VECS[:2])
    with pytest.raises(QueryError, match="mode must be one of most_fields, best_fields"):
        engine.bm25("x", options=Bm25Options(mode="sum"))  # type: ignore[arg-type]
    with pytest.raises(QueryError, match="tie_breaker"):
        engine.bm25("x", options=Bm25Options(tie_breaker=float("nan")))
    # nothing of the rejected batch was stored
    assert engine.get(["a"])["a"].title == "Compact space"


def test_hnsw_above_the_exact_threshold(tmp_path) -> None:
    n = 400
    vecs = unit_vectors(n, seed=3)
    docs = [Document(id=f"d{i}", title=f"doc {i}", text="filler") for i in range(n)]
    with EmbeddedEngine(tmp_path / "idx", exact_max=100) as e:
        e.write(docs, vecs)
        assert e.stats().details["dense_mode"] == "hnsw"
        hits = sum(e.knn(vecs[i], 1).ids == [f"d{i}"] for i in range(0, n, 10))
        assert hits >= 38
        e.delete(["d0"])
        e.write([Document(id="d1", title="moved", text="x")], unit_vectors(1, seed=77))
        assert "d0" not in e.knn(vecs[0], 5).ids
        assert e.knn(vecs[1], 5).ids.count("d1") <= 1 and e.knn(unit_vectors(1, 77)[0], 1).ids == ["d1"]
    with EmbeddedEngine(tmp_path / "idx", exact_max=100) as e:
        assert e.stats().details["dense_mode"] == "hnsw" and e.knn(vecs[5], 1).ids == ["d5"]


def test_concurrent_readers_while_the_owner_writes(tmp_path) -> None:
    path = tmp_path / "idx"
    owner = EmbeddedEngine(path)
    owner.write(DOCS, VECS)
    errors: list[Exception] = []
    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                seen.append(len(owner.bm25("filler", k=1000).ids))
                owner.knn(VECS[0], 5)
        except Exception as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for b in range(10):
        owner.write([Document(id=f"n{b}-{i}", title="filler", text="x") for i in range(20)],
                    unit_vectors(20, seed=b))
    stop.set()
    for t in threads:
        t.join()
    assert not errors and seen == sorted(seen)
    # a second process is a reader: it sees the owner's commits, including later ones
    code = ("import sys; from hybridsearch.engines.embedded import EmbeddedEngine as E; "
            f"e = E({str(path)!r}); print(e.owner, len(e.bm25('filler', k=1000).ids))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "200"]
    owner.close()
