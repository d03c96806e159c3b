"""The embedding cache: bit-identical vectors by encoder and text, LRU eviction, damaged entries
missed, several processes at once, and `embed` serving from it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hybridsearch.embedcache import EmbeddingCache, embedding_cache, key
from hybridsearch.models import Document
from indexer.pipeline import embed


def rows(seed: int, n: int = 3, dim: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def test_entries_come_back_bit_identical_and_keys_name_the_encoder(tmp_path) -> None:
    cache = EmbeddingCache(tmp_path, 1 << 30)
    k = key("enc|a", "text", ["p1", "p2"])
    cache.put("enc|a", [(k, rows(1))])
    assert np.array_equal(cache.get([k], 8)[k], rows(1))
    # another encoder, text or passage split is another key
    assert len({k, key("enc|b", "text", ["p1", "p2"]), key("enc|a", "text2", ["p1", "p2"]),
                key("enc|a", "text", ["p1 p2"]), key("enc|a", "tex", ["tp1", "p2"])}) == 5
    assert cache.stats().encoders == {"enc|a": 1}
    assert cache.clear() == 1 and cache.get([k], 8) == {}


def test_a_damaged_entry_is_a_miss_not_a_wrong_vector(tmp_path) -> None:
    cache = EmbeddingCache(tmp_path, 1 << 30)
    k = key("enc", "t", [])
    cache.put("enc", [(k, rows(2))])
    with sqlite3.connect(cache.path) as c:  # a bit flipped, then a torn blob
        (blob,) = c.execute("SELECT vectors FROM entries").fetchone()
        c.execute("UPDATE entries SET vectors = ?", (bytes([blob[0] ^ 1]) + blob[1:],))
    assert cache.get([k], 8) == {}
    with sqlite3.connect(cache.path) as c:
        c.execute("UPDATE entries SET vectors = ?", (blob[:40],))
    assert cache.get([k], 8) == {}


def test_past_its_size_the_least_recently_used_entries_go(tmp_path) -> None:
    cache = EmbeddingCache(tmp_path, 1 << 30)
    big = [(key("enc", str(i), []), rows(i, 64, 384)) for i in range(40)]  # 98 KB each
    cache.put("enc", big[:20])
    cache.get([big[0][0]], 384)  # used again: now the most recent
    cache.max_bytes = 2_500_000
    cache.put("enc", big[20:])
    left = cache.get([k for k, _ in big], 384)
    assert cache.stats().bytes <= 2_500_000 and 10 < len(left) < 40
    assert big[0][0] in left and big[1][0] not in left and big[39][0] in left


def test_several_processes_write_and_read_at_once(tmp_path) -> None:
    code = textwrap.dedent(f"""
        import sys, numpy as np
        from pathlib import Path
        from hybridsearch.embedcache import EmbeddingCache, key
        c = EmbeddingCache(Path({str(tmp_path)!r}), 1 << 30)
        me = int(sys.argv[1])
        for i in range(60):
            c.put("enc", [(key("enc", f"{{me}}-{{i}}", []), np.full((2, 8), me * 1000 + i, np.float32))])
            assert len(c.get([key("enc", f"{{(me + 1) % 3}}-{{j}}", []) for j in range(i)], 8)) <= i
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)], stderr=subprocess.PIPE, text=True)
             for n in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    cache = EmbeddingCache(tmp_path, 1 << 30)
    got = cache.get([key("enc", f"{n}-{i}", []) for n in range(3) for i in range(60)], 8)
    assert len(got) == 180 and all(np.all(v == v[0, 0]) for v in got.values())


class Counting:
    """An encoder with an identity: every text it encodes is counted."""

    name, dim, identity = "counting", 4, "counting|v1"

    def __init__(self) -> None:
        self.texts: list[str] = []

    def encode(self, texts, *, batch_size=None, progress=False, query=False) -> np.ndarray:  # noqa: ANN001
        self.texts += texts
        return np.array([[len(t), 1, 0, 0] for t in texts], dtype=np.float32)


def test_embed_serves_what_the_cache_holds_and_encodes_the_rest(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HYBRIDSEARCH_EMBEDDING_CACHE", str(tmp_path))
    docs = [Document(id=str(i), title=f"Title {i}", text=f"First {i}. Second sentence {i}.") for i in range(10)]
    first = Counting()
    want = embed(first, docs[:6])
    assert want.cached == 0 and len(first.texts) == 6 * 4
    again = Counting()
    seen: list[float] = []
    got = embed(again, docs, seen.append)
    assert got.cached == 6 and len(again.texts) == 4 * 4  # only the four new chunks were encoded
    assert np.array_equal(got.vectors[:6], want.vectors)
    assert all(np.array_equal(a, b) for a, b in zip(got.passages[:6], want.passages, strict=True))
    assert seen[0] == pytest.approx(0.6) and seen[-1] == 1.0
    other = Counting()
    other.identity = "counting|v2"  # another encoder (model, runtime or precision): nothing served
    assert embed(other, docs[:2]).cached == 0
    monkeypatch.setenv("HYBRIDSEARCH_EMBEDDING_CACHE_MAX_MB", "0")
    assert embedding_cache() is None and embed(Counting(), docs[:2]).cached == 0
