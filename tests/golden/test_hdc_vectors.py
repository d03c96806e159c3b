"""Pinned hypervectors: identical across processes, machines and Python versions."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from hybridsearch.hdc import NBYTES, random_hv

PINNED = {
    "tok:godel": "57af87fc2afdd13ef4ea772607a98dd9",
    "field:topic": "41608d79c933c94d5ab73e8cc100c526",
    "__tie_break__": "9cbbeff981cfae44d12d9229a108676b",
}


@pytest.mark.parametrize(("key", "digest"), PINNED.items())
def test_pinned_digest(key: str, digest: str) -> None:
    v = random_hv(key)
    assert v.shape == (NBYTES,) and v.dtype.name == "uint8"
    assert hashlib.sha256(v.tobytes()).hexdigest()[:32] == digest


def test_same_vector_in_another_process_with_hash_randomisation() -> None:
    code = ("import hashlib; from hybridsearch.hdc import random_hv; "
            "print(hashlib.sha256(random_hv('tok:godel').tobytes()).hexdigest()[:32])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""})
    assert out.stdout.strip() == PINNED["tok:godel"]
