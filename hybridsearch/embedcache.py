"""The embedding cache: a chunk's vector and passage vectors by encoder and text, shared by every
index, engine, eval and worker on the machine, so that no text is embedded twice.

One SQLite file (`embeddings.sqlite` under HYBRIDSEARCH_EMBEDDING_CACHE) in WAL mode: several
processes read and write it at once, and a crash loses at most the entries of the transaction it
interrupted, never leaves half of one (each entry also carries a CRC of its vectors, checked on
every read, so a damaged page is a miss, not a wrong vector). The key is a SHA-256 of the encoder's
identity (model, runtime, precision, export and passage method: `Encoder.identity`), the chunk's
dense text and its passages. Past `max_bytes` the entries used longest ago are evicted.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hybridsearch.errors import ConfigError

FILE = "embeddings.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB PRIMARY KEY,
    encoder TEXT NOT NULL,
    vectors BLOB NOT NULL,   -- float32 rows: the chunk's vector, then its passage vectors
    crc INTEGER NOT NULL,
    used REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_used ON entries(used);
"""
log = logging.getLogger("hybridsearch.embeddings")


@dataclass(frozen=True)
class CacheStats:
    path: Path
    entries: int
    bytes: int
    max_bytes: int
    encoders: dict[str, int]


def key(identity: str, text: str, passages: Sequence[str]) -> bytes:
    """The cache key of a chunk: its encoder's identity, its dense text and its passages."""
    h = hashlib.sha256(identity.encode())
    for part in (text, *passages):
        h.update(b"\x00" + part.encode("utf-8", "surrogatepass"))
    return h.digest()


class EmbeddingCache:
    """Vectors by key; see the module's docstring. Thread-safe; one connection per instance."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.path = directory / FILE
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=60)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise ConfigError(f"cannot open the embedding cache {self.path}: {e}") from e

    def get(self, keys: Sequence[bytes], dim: int) -> dict[bytes, np.ndarray]:
        """The cached rows (1 + passages, dim) of the keys found; each use marks them recent."""
        if not keys:
            return {}
        found: dict[bytes, np.ndarray] = {}
        with self._lock:
            for i in range(0, len(keys), 500):
                part = list(keys[i:i + 500])
                rows = self._conn.execute(
                    f"SELECT key, vectors, crc FROM entries WHERE key IN ({','.join('?' * len(part))})", part)
                for k, blob, crc in rows:
                    if zlib.crc32(blob) == crc and len(blob) % (4 * dim) == 0 and len(blob) >= 4 * dim:
                        found[bytes(k)] = np.frombuffer(blob, dtype=np.float32).reshape(-1, dim)
            if found:
                with contextlib.suppress(sqlite3.OperationalError):  # busy for a minute: recency is a hint
                    self._conn.executemany("UPDATE entries SET used = ? WHERE key = ?",
                                           [(time.time(), k) for k in found])
        return found

    def put(self, identity: str, entries: Sequence[tuple[bytes, np.ndarray]]) -> None:
        """Store (key, rows) entries in one transaction, then evict past max_bytes."""
        if not entries:
            return
        now = time.time()
        rows = []
        for k, arr in entries:
            blob = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
            rows.append((k, identity, blob, zlib.crc32(blob), now))
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?)", rows)
                self._conn.execute("COMMIT")
                self._evict()
            except sqlite3.Error as e:  # a full disk or a locked file: the vectors are not lost, only not kept
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                log.warning("embedding cache: could not store %d entries in %s (%s)", len(rows), self.path, e)

    def _used_bytes(self) -> int:
        pages, free, size = (self._conn.execute(f"PRAGMA {p}").fetchone()[0]
                             for p in ("page_count", "freelist_count", "page_size"))
        return int((pages - free) * size)

    def _evict(self) -> None:
        """Delete the least recently used tenth of the entries until the file's used pages fit."""
        while self._used_bytes() > self.max_bytes:
            n = self._conn.execute("SELECT count(*) FROM entries").fetchone()[0]
            if not n:
                return
            self._conn.execute("DELETE FROM entries WHERE key IN (SELECT key FROM entries ORDER BY used LIMIT ?)",
                               (max(1, n // 10),))

    def stats(self) -> CacheStats:
        with self._lock:
            encoders = dict(self._conn.execute("SELECT encoder, count(*) FROM entries GROUP BY encoder"))
            return CacheStats(self.path, sum(encoders.values()), self._used_bytes(), self.max_bytes, encoders)

    def clear(self) -> int:
        """Delete every entry (and give the space back); returns how many there were."""
        with self._lock:
            n = int(self._conn.execute("SELECT count(*) FROM entries").fetchone()[0])
            self._conn.execute("DELETE FROM entries")
            self._conn.execute("VACUUM")
            return n

    def close(self) -> None:
        with self._lock:
            self._conn.close()


_cache: EmbeddingCache | None = None
_cache_for: tuple[Path, int] | None = None


def embedding_cache() -> EmbeddingCache | None:
    """The process's cache, from HYBRIDSEARCH_EMBEDDING_CACHE and _EMBEDDING_CACHE_MAX_MB (0: no
    cache); None when it is off or cannot be opened (logged once: embedding goes on without it)."""
    global _cache, _cache_for
    from hybridsearch.config import get_settings

    s = get_settings()
    want = (s.embedding_cache, s.embedding_cache_max_mb)
    if _cache_for != want:
        if _cache is not None:
            _cache.close()
        _cache, _cache_for = None, want
        if s.embedding_cache_max_mb > 0:
            try:
                _cache = EmbeddingCache(s.embedding_cache, s.embedding_cache_max_mb << 20)
            except ConfigError as e:
                log.warning("%s; embedding without a cache", e)
    return _cache
