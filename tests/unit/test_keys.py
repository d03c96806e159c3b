"""The keys file under concurrent changes from several processes."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from query_service.keys import KeyStore


def _revoke(path: Path, go: mp.synchronize.Event) -> None:  # type: ignore[name-defined]
    go.wait()
    KeyStore(path).revoke("leaked")


def _add(path: Path, go: mp.synchronize.Event, name: str) -> None:  # type: ignore[name-defined]
    go.wait()
    KeyStore(path).add(name, ["open"], None)


def test_a_revoke_and_an_add_at_once_both_stick(tmp_path) -> None:
    """Two processes change the keys file at the same moment: the revoked key is refused and the
    added key works, every time (unlocked, the last writer dropped the other's change: a revoke
    reported done while the key still worked, or a key handed out that never worked)."""
    ctx = mp.get_context("fork")
    path = tmp_path / "keys.json"
    for run in range(20):
        path.unlink(missing_ok=True)
        leaked = KeyStore(path).add("leaked", ["open", "restricted"], None)
        go = ctx.Event()
        procs = [ctx.Process(target=_revoke, args=(path, go)), ctx.Process(target=_add, args=(path, go, f"n{run}"))]
        for p in procs:
            p.start()
        go.set()
        for p in procs:
            p.join()
            assert p.exitcode == 0
        keys = KeyStore(path)
        assert keys.find(leaked) is None, f"run {run}: the revoked key still works"
        assert [k.name for k in keys.list() if k.revoked is None] == [f"n{run}"], f"run {run}"
