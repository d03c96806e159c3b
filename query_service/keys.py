"""API keys of the HTTP service: a JSON file holding, per key, its name, the SHA-256 of the key
(never the key), its licence rights, the indices it may read, and when it was revoked.

A key is `hs_` plus 32 random URL-safe bytes; `add` returns it once. Rights are licence classes:
`open` (documents whose licence is one of HYBRIDSEARCH_OPEN_LICENSES) and `restricted` (every
other document, those without a licence included). A key without `restricted` never sees a
restricted document.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from hybridsearch.errors import ConfigError, ValidationError

RIGHTS = ("open", "restricted")


@dataclass(frozen=True)
class ApiKey:
    name: str
    hash: str
    rights: tuple[str, ...]
    indices: tuple[str, ...] | None  # None: every index the service serves
    created: float
    revoked: float | None = None

    def may_read(self, index: str) -> bool:
        return self.indices is None or index in self.indices


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """The keys file; re-read when it changes on disk, so `keys revoke` takes effect in a running
    service at its next request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._by_hash: dict[str, ApiKey] = {}

    def _load(self) -> list[ApiKey]:
        if not self.path.exists():
            return []
        try:
            raw = json.loads(self.path.read_text())
            return [ApiKey(k["name"], k["hash"], tuple(k["rights"]), None if k.get("indices") is None
                           else tuple(k["indices"]), float(k["created"]), k.get("revoked")) for k in raw["keys"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"keys file {self.path}: unreadable ({type(e).__name__}: {e})") from e

    def _save(self, keys: Sequence[ApiKey]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".keys-")
        with os.fdopen(fd, "w") as f:
            json.dump({"keys": [asdict(k) for k in keys]}, f, indent=2)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    @contextmanager
    def _changing(self) -> Iterator[list[ApiKey]]:
        """The keys, to change in place and save, with the file locked against every other
        process changing it meanwhile (two changes at once would otherwise keep only one: a
        revoke undone by a concurrent add)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            keys = self._load()
            yield keys
            self._save(keys)

    def add(self, name: str, rights: Sequence[str], indices: Sequence[str] | None) -> str:
        """Store a new key's hash under `name`; returns the key (shown once)."""
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ValidationError("a key name is letters, digits, - and _", field="name")
        bad = [r for r in rights if r not in RIGHTS]
        if bad or not rights:
            raise ValidationError(f"rights {list(rights)}: choose from {', '.join(RIGHTS)}", field="rights")
        with self._changing() as keys:
            if any(k.name == name and k.revoked is None for k in keys):
                raise ValidationError(f"a key named {name!r} exists; revoke it first", field="name")
            key = "hs_" + secrets.token_urlsafe(32)
            keys.append(ApiKey(name, digest(key), tuple(dict.fromkeys(rights)),
                               None if not indices else tuple(indices), time.time()))
        return key

    def revoke(self, name: str) -> int:
        with self._changing() as keys:
            hits = [k for k in keys if k.name == name and k.revoked is None]
            if not hits:
                raise ValidationError(f"no live key named {name!r}", field="name")
            keys[:] = [ApiKey(**{**asdict(k), "revoked": time.time()}) if k in hits else k for k in keys]
        return len(hits)

    def list(self) -> list[ApiKey]:
        return self._load()

    def find(self, key: str) -> ApiKey | None:
        """The live key `key` is, or None (unknown or revoked)."""
        with self._lock:
            try:
                mtime = self.path.stat().st_mtime_ns
            except OSError:
                mtime = None
            if mtime != self._mtime:
                self._by_hash = {k.hash: k for k in self._load()}
                self._mtime = mtime
            found = self._by_hash.get(digest(key))
        return found if found is not None and found.revoked is None else None
