"""Many bundles at once, compiled with numba: the document side of HDC encoding, where a field
bundles about a hundred tokens and numpy's cost per call would dominate. Imported only where
documents are encoded (a query's few tokens go through algebra.bit_counts and majority)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _bundles(table: np.ndarray, ids: np.ndarray, starts: np.ndarray, fields: np.ndarray, keys: np.ndarray,
             ties: np.ndarray) -> np.ndarray:  # pragma: no cover (compiled)
    rows, nbytes = len(starts) - 1, table.shape[1]
    lanes = np.zeros((8, nbytes), np.uint8)  # lane k, byte b: the ones of bit k of byte b (at most 255)
    counts = np.zeros(nbytes * 8, np.int32)
    out = np.zeros((rows, nbytes), np.uint8)
    for r in range(rows):
        counts[:] = 0
        pending = 0
        lo, hi = starts[r], starts[r + 1]
        for j in range(lo, hi):
            row = table[ids[j]]
            for k in range(8):
                lane = lanes[k]
                shift = np.uint8(7 - k)  # packed most significant bit first
                for b in range(nbytes):
                    lane[b] += (row[b] >> shift) & np.uint8(1)
            pending += 1
            if pending == 255 or j == hi - 1:
                for k in range(8):
                    for b in range(nbytes):
                        counts[b * 8 + k] += lanes[k, b]
                        lanes[k, b] = 0
                pending = 0
        n, key = hi - lo, keys[fields[r]]
        for b in range(nbytes):
            byte, tie = 0, ties[r, b]
            for k in range(8):
                c = counts[b * 8 + k]
                if key[b * 8 + k]:  # binding with the key flips the bit, and so its votes
                    c = n - c
                if 2 * c > n or (2 * c == n and (tie >> (7 - k)) & 1):
                    byte |= 1 << (7 - k)
            out[r, b] = byte
    return out


def bind_and_bundle(table: np.ndarray, ids: np.ndarray, starts: np.ndarray, fields: np.ndarray, keys: np.ndarray,
                    ties: np.ndarray) -> np.ndarray:
    """Packed codes (bundles, table width), bundle r the majority of the packed rows
    table[ids[starts[r]:starts[r + 1]]], each bound (XOR) to key row fields[r] of `keys` (unpacked
    bits, one per byte), a tied bit taking the bit of the packed ties[r]: what algebra.majority
    gives over algebra.bit_counts, for each bundle alone."""
    return _bundles(np.ascontiguousarray(table, dtype=np.uint8), np.asarray(ids, dtype=np.int64),
                    np.asarray(starts, dtype=np.int64), np.asarray(fields, dtype=np.int64),
                    np.ascontiguousarray(keys, dtype=np.uint8), np.ascontiguousarray(ties, dtype=np.uint8))
