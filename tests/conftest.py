from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the session's query log on OpenSearch: daily indices of its own (deleted at its end), never those
# of a deployment or another run that share the node
QUERY_LOG_PREFIX = f"test-queries-{uuid.uuid4().hex[:8]}-"
os.environ["HYBRIDSEARCH_QUERY_LOG_PREFIX"] = QUERY_LOG_PREFIX

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "hybridsearch" / "data" / "demo"
SHARED_DATA = REPO.parent / "shared" / "data"


def demo_subset(directory: Path, n: int) -> Path:
    """A corpus (BEIR corpus.jsonl) of the demo's first `n` documents in `directory`: for tests whose
    point is not the corpus's size, since each document embedded costs them about a fifth of a second."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = (DEMO / "corpus.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    assert 0 < n <= len(lines)
    (directory / "corpus.jsonl").write_text("".join(lines[:n]), encoding="utf-8")
    return directory


@contextmanager
def opensearch_requests(engine: Any) -> Iterator[list[tuple[str, list[dict[str, Any]]]]]:
    """The searches an OpenSearch engine sends meanwhile, one entry per round trip: what it is for,
    and its bodies (one for a search, several for an `_msearch`)."""
    sent: list[tuple[str, list[dict[str, Any]]]] = []
    search, msearch = engine._search, engine._msearch
    engine._search = lambda body, what, **kw: sent.append((what, [body])) or search(body, what, **kw)
    engine._msearch = lambda bodies, what: sent.append((what, list(bodies))) or msearch(bodies, what)
    try:
        yield sent
    finally:
        del engine._search, engine._msearch


def before_vector_sample(monkeypatch: pytest.MonkeyPatch, before: Callable[[Any], None]) -> None:
    """Call `before(filters)` ahead of every real EmbeddedEngine.vector_sample: to note it, hold it
    or make it fail."""
    from hybridsearch.engines.embedded import EmbeddedEngine

    sample = EmbeddedEngine.vector_sample

    def spied(self: EmbeddedEngine, n: int, filters: Any = None) -> Any:
        before(filters)
        return sample(self, n, filters)

    monkeypatch.setattr(EmbeddedEngine, "vector_sample", spied)


@pytest.fixture(scope="session", autouse=True)
def _session_query_log() -> Iterator[None]:
    """At the session's end, delete its query-log indices, template and deletion policy from the node."""
    yield
    from hybridsearch.config import get_settings

    settings = get_settings()
    if not settings.opensearch_url:
        return
    from hybridsearch.engines.opensearch.engine import make_client
    from query_service.querylog import delete_log

    client = make_client(settings.opensearch_url, settings)
    try:
        delete_log(client, QUERY_LOG_PREFIX)
    finally:
        client.close()


def wait_ready(proc: Any, url: str, seconds: float = 180) -> None:
    """Wait until `hybridsearch serve` (the process `proc`) answers /readyz at `url` with 200;
    fails with its stderr if it exits first."""
    import time

    import httpx

    deadline = time.time() + seconds
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, "the service did not become ready"
        time.sleep(0.3)


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


@pytest.fixture(scope="session")
def opensearch_url() -> str:
    """The OpenSearch node the live tests use: $HYBRIDSEARCH_OPENSEARCH_URL. Not set: skip, or fail
    under HYBRIDSEARCH_REQUIRE_OPENSEARCH=1 (CI). Set but not answering: fail."""
    import json
    import urllib.request

    from hybridsearch.config import get_settings

    settings = get_settings()
    url = settings.opensearch_url
    if not url:
        reason = ("no OpenSearch node: set HYBRIDSEARCH_OPENSEARCH_URL "
                  "(`hybridsearch opensearch start` runs one and prints its URL)")
        if settings.require_opensearch:
            pytest.fail(f"HYBRIDSEARCH_REQUIRE_OPENSEARCH=1 but {reason}")
        pytest.skip(reason)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            json.load(r)["version"]["number"]
    except (OSError, ValueError, KeyError) as e:
        pytest.fail(f"HYBRIDSEARCH_OPENSEARCH_URL={url} is configured but does not answer: {e}")
    return url


@pytest.fixture
def opensearch_index(opensearch_url, request):
    """A fresh logical OpenSearch index for one test, dropped afterwards."""
    import re
    import uuid

    from hybridsearch.engines.opensearch import OpenSearchEngine

    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    engine = OpenSearchEngine(opensearch_url, index=f"test-{name}-{uuid.uuid4().hex[:6]}")
    yield engine
    engine.drop()
    engine.close()


def tiny_bert(directory: Path, words: list[str], *, hidden: int = 32, labels: int | None = None) -> Path:
    """A tiny BERT (2 layers, `hidden` wide, random weights from seed 0) with a word-level vocabulary
    of `words`, saved with its fast tokenizer: what a test's encoder or cross-encoder is built from,
    since no model can be downloaded here. `labels`: a sequence-classification head (a cross-encoder)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(w.lower() for w in words)]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(directory / "vocab.txt"), do_lower_case=True).save_pretrained(directory)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=128,
                        **({"num_labels": labels} if labels else {}))
    torch.manual_seed(0)
    model = BertForSequenceClassification(config) if labels else BertModel(config)
    model.save_pretrained(directory)
    return directory


def tiny_sentence_transformer(directory: Path) -> Path:
    """A tiny sentence-transformers model (mean pooling, 32-d) over the demo corpus's words."""
    import re

    from sentence_transformers import SentenceTransformer, models

    words = re.findall(r"[A-Za-z]+", (DEMO / "corpus.jsonl").read_text(encoding="utf-8"))
    bert = tiny_bert(directory / "bert", words)
    model = SentenceTransformer(modules=[models.Transformer(str(bert), max_seq_length=64),
                                         models.Pooling(32, "mean")], device="cpu")
    model.save(str(directory / "model"))
    return directory / "model"


def tiny_cross_encoder(directory: Path) -> Path:
    """A tiny cross-encoder (a BERT with one output, random weights from seed 0) over the demo's words."""
    import re

    words = re.findall(r"[A-Za-z]+", (DEMO / "corpus.jsonl").read_text(encoding="utf-8"))
    return tiny_bert(directory, words, labels=1)
