"""The domain sample's key: Java's String.hashCode of a chunk id, mixed by fmix32, low 24 bits,
the same in numpy as in OpenSearch's painless (the engine contract checks the engines agree)."""

from __future__ import annotations

import numpy as np

from hybridsearch.engines import sample_keys, sample_order


def java_key(s: str) -> int:
    """The formula written out once more, one UTF-16 unit at a time, as Java computes it."""
    units = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h & 0xFFFFFF


def test_keys_follow_the_java_formula_for_any_id() -> None:
    ids = ["a", "", "doc-1", "Heine–Borel", "𝔽-field", "a𝔽b", "日本語", "x" * 300, "ab\x00", "a\x00b"]
    ids += [f"{i}:{'é' * (i % 7)}" for i in range(70_000)]  # more than one vectorised block
    keys = sample_keys(ids)
    assert keys.dtype == np.int64 and keys.shape == (len(ids),)
    assert [int(k) for k in keys] == [java_key(s) for s in ids]
    assert java_key("a") != java_key("b") and keys.min() >= 0 and keys.max() < 2**24


def test_order_is_by_key_then_id() -> None:
    ids = [f"d{i}" for i in range(1000)]
    keys = sample_keys(ids)
    assert sample_order(ids, 5) == sorted(range(1000), key=lambda i: (int(keys[i]), ids[i]))[:5]
    assert sample_order(ids, 5000) == sorted(range(1000), key=lambda i: (int(keys[i]), ids[i]))
    assert sample_order([], 3) == [] and sample_order(ids, 0) == []
