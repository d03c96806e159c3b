"""Encoders are plugins: a local sentence-transformers model (a tiny one built here) embeds and
searches an index of its own dimension; an index records its encoder and refuses another."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from hybridsearch import plugins
from hybridsearch.embeddings import default_encoder
from hybridsearch.engines import open_engine
from hybridsearch.errors import ConfigError
from indexer.pipeline import embed_missing, ingest
from query_service.searcher import Searcher
from tests.conftest import demo_subset, tiny_sentence_transformer


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tiny_sentence_transformer(tmp_path_factory.mktemp("tiny-encoder"))


@pytest.fixture
def tiny(tiny_model, monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRIDSEARCH_ENCODER", "sentence-transformers")
    monkeypatch.setenv("HYBRIDSEARCH_ENCODER_MODEL_DIR", str(tiny_model))
    monkeypatch.setenv("HYBRIDSEARCH_EMBEDDING_CACHE", str(tmp_path / "cache"))
    return default_encoder()


def test_the_built_in_encoders_are_plugins(tiny) -> None:
    assert {"minilm", "sentence-transformers"} <= set(plugins.names("encoders"))
    assert tiny.dim == 32 and tiny._model is None  # the dimension is read from the files, not the model
    vecs = tiny.encode(["Brouwer fixed point theorem", "compact space"])
    assert vecs.shape == (2, 32) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_an_index_keeps_to_the_encoder_that_made_its_vectors(tiny, tmp_path, monkeypatch) -> None:
    corpus = demo_subset(tmp_path / "corpus", 20)
    engine = open_engine(str(tmp_path / "idx"))
    try:
        ingest(engine, corpus, encoder=tiny, progress=False)
        assert engine.dim == 32 and engine.get_meta("encoder") == {
            "name": tiny.name, "dim": 32, "fingerprint": tiny.fingerprint}
        searcher = Searcher(engine)
        hits = searcher.search("Brouwer fixed point theorem", "semantic", k=3).hits
        assert len(hits) == 3 and all("dense" in h.channels for h in hits)
        searcher.close()
    finally:
        engine.close()
    engine = open_engine(str(tmp_path / "idx"))  # opened again: its dimension comes from its record
    try:
        assert engine.dim == 32 and engine.knn(np.eye(1, 32, dtype=np.float32)[0], 2).ids
        monkeypatch.setenv("HYBRIDSEARCH_ENCODER", "minilm")
        want = (f"the index holds vectors of {tiny.name} (32-d, {tiny.fingerprint}); the configured encoder is "
                "all-MiniLM-L6-v2 (384-d, all-MiniLM-L6-v2)")
        with pytest.raises(ConfigError, match=want.replace("(", r"\(").replace(")", r"\)")):
            Searcher(engine).search("Brouwer fixed point theorem", "semantic", k=3)
        with pytest.raises(ConfigError, match="the configured encoder is all-MiniLM-L6-v2"):
            ingest(engine, corpus, encoder=default_encoder(), progress=False)
        assert Searcher(engine).search("Brouwer fixed point theorem", "lexical", k=3).hits  # no query vector
    finally:
        engine.close()


def test_an_index_from_before_the_record_holds_minilm_vectors(tiny, demo_copy) -> None:
    with sqlite3.connect(demo_copy / "store.sqlite") as db:  # as a version before the record left it
        db.execute("DELETE FROM meta WHERE key = 'encoder'")
    engine = open_engine(str(demo_copy))
    try:
        assert engine.get_meta("encoder") is None and engine.dim == 384
        with pytest.raises(ConfigError, match=r"holds vectors of all-MiniLM-L6-v2 \(384-d\); the configured encoder "
                                              r"is sentence-transformers:model \(32-d"):
            Searcher(engine).search("compact space", "hybrid", k=3)
    finally:
        engine.close()


@pytest.mark.opensearch
def test_opensearch_refuses_an_encoder_of_another_dimension(tiny, opensearch_index, tmp_path) -> None:
    corpus = demo_subset(tmp_path / "corpus", 5)
    ingest(opensearch_index, corpus, encoder=None, progress=False)
    with pytest.raises(ConfigError, match=r"the index holds 384-d vectors \(its mapping\); the configured encoder "
                                          r"sentence-transformers:model gives 32-d"):
        embed_missing(opensearch_index, tiny, progress=False)
