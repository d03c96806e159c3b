from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "hybridsearch" / "data" / "demo"
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def encoder():
    from hybridsearch.embeddings import default_encoder

    return default_encoder()


@pytest.fixture(scope="session")
def demo_index(tmp_path_factory, encoder) -> Path:
    """The demo corpus indexed once with real MiniLM vectors; tests copy it before writing."""
    from query_service.evaluate import prepare_index

    path = tmp_path_factory.mktemp("demo-index")
    engine = prepare_index(DEMO, path, need_vectors=True, encoder=encoder, progress=False,
                           log=lambda m: None)
    engine.close()
    return path


@pytest.fixture
def demo_copy(demo_index, tmp_path) -> Path:
    dst = tmp_path / "index"
    shutil.copytree(demo_index, dst, ignore=shutil.ignore_patterns("owner.lock"))
    return dst
