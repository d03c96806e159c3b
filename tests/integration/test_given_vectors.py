"""Vectors computed elsewhere, given on input (a JSONL `vector` and `passage_vectors`, a BEIR
corpus.npy, Python objects): checked line by line and written on both engines without embedding."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hybridsearch
from hybridsearch.engines import open_engine
from hybridsearch.models import Document
from indexer.pipeline import ingest


class NoModel:
    """An encoder that must not be called: every vector here is given."""

    name, dim, identity = "none", 384, "none"

    def encode(self, texts, **_) -> np.ndarray:  # noqa: ANN001
        raise AssertionError(f"embedded {len(texts)} texts")


def unit(rng: np.random.Generator, *shape: int) -> np.ndarray:
    v = rng.normal(size=shape)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


@pytest.fixture(params=["embedded", pytest.param("opensearch", marks=pytest.mark.opensearch)])
def target(request, tmp_path):
    if request.param == "opensearch":
        engine = request.getfixturevalue("opensearch_index")
        yield engine
        return
    engine = open_engine(str(tmp_path / "idx"))
    yield engine
    engine.close()


def test_given_vectors_are_written_as_they_came(target, tmp_path) -> None:
    rng = np.random.default_rng(0)
    vec, pas = rng.normal(size=384) * 7.0, unit(rng, 3, 384)  # any length: stored at unit length
    lines = [{"id": "a", "title": "Compact space", "text": "Every cover has a subcover. It is finite.",
              "vector": vec.tolist(), "passage_vectors": pas.tolist()},
             {"id": "b", "title": "Only a vector", "text": "One sentence.", "vector": unit(rng, 384).tolist()},
             {"id": "c", "title": "Short", "text": "x", "vector": unit(rng, 100).tolist()},  # another dimension
             {"id": "d", "title": "Bad", "text": "x", "vector": [1.0] * 383 + [float("nan")]},
             {"id": "e", "title": "Rows", "text": "One. Two.", "vector": unit(rng, 384).tolist(),
              "passage_vectors": unit(rng, 2, 384).tolist()}]  # three passages: title, One., Two.
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))  # Python writes NaN, as some tools do
    summary = ingest(target, path, encoder=NoModel(), progress=False)
    assert summary.indexed == 2 and summary.given == 2 and summary.embedded == 0
    errors = sorted(str(e) for e in summary.rejected)
    assert errors == [
        f"{path}:3, record 'c', field 'vector': expected 384 numbers (the index's dimension), got 100",
        f"{path}:4, record 'd': vector: every value must be finite",
        f"{path}:5, record 'e', field 'passage_vectors': expected 3 rows, one per passage (the title, then each "
        "sentence of the text), got 2"]
    got, got_pas = target.vectors(["a", "b"]), target.passage_vectors(["a", "b"])
    assert np.allclose(got["a"], vec / np.linalg.norm(vec), atol=1e-6)
    assert np.allclose(got_pas["a"], pas, atol=1e-6)
    assert np.allclose(got_pas["b"], got["b"][None, :], atol=1e-6)  # no passages given: its own vector
    assert target.missing_vectors() == []  # complete: `embed` has nothing to do
    assert target.knn(got["b"], 1).ids == ["b"]


def test_a_beir_corpus_takes_its_vectors_from_corpus_npy(tmp_path) -> None:
    rng = np.random.default_rng(1)
    (tmp_path / "ds").mkdir()
    rows = [{"_id": str(i), "title": f"T{i}", "text": "Some text."} for i in range(4)]
    (tmp_path / "ds" / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    vecs = unit(rng, 3, 384).astype(np.float32)  # one row short
    np.save(tmp_path / "ds" / "corpus.npy", vecs)
    engine = open_engine(str(tmp_path / "idx"))
    try:
        summary = ingest(engine, tmp_path / "ds", encoder=NoModel(), progress=False)
        assert summary.given == 3 and [str(e) for e in summary.rejected] == [
            f"{tmp_path / 'ds' / 'corpus.jsonl'}:4, field 'vector': corpus.npy has 3 rows, none for this line"]
        got = engine.vectors(["0", "1", "2"])
        assert all(np.allclose(got[str(i)], vecs[i], atol=1e-6) for i in range(3))
    finally:
        engine.close()
    np.save(tmp_path / "ds" / "corpus.npy", np.zeros((4,), dtype=np.float32))
    engine = open_engine(str(tmp_path / "idx2"))
    try:
        with pytest.raises(Exception, match=r"corpus.npy: expected a 2-d array of numbers .* got shape \(4,\)"):
            ingest(engine, tmp_path / "ds", encoder=NoModel(), progress=False)
    finally:
        engine.close()


def test_the_python_api_ingests_objects(tmp_path) -> None:
    rng = np.random.default_rng(2)
    v = unit(rng, 384)
    with hybridsearch.create(str(tmp_path / "idx")) as index:
        summary = index.ingest([{"id": "a", "title": "Banach fixed point", "text": "A contraction has one.",
                                 "vector": v.tolist()},
                                Document(id="b", title="Brouwer fixed point", text="Every map of the ball."),
                                {"id": "c", "title": 3}], embed=False)
        assert summary.indexed == 2 and summary.given == 1
        assert [str(e) for e in summary.rejected] == ["objects:3, record 'c', field 'title': Input should be a "
                                                      "valid string"]
        assert np.allclose(index.engine.vectors(["a"])["a"], v, atol=1e-6)
        assert index.engine.missing_vectors()[0][0] == "b"  # no vector given, none embedded
        with pytest.raises(Exception, match="objects: expected a Path, or an iterable of Documents"):
            index.ingest({"id": "x"})  # type: ignore[arg-type]
