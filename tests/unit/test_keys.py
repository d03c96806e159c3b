"""The keys file: under concurrent changes from several processes, and missing or unreadable."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from hybridsearch.cli import main
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


def test_a_missing_or_unreadable_keys_file_is_one_line(tmp_path, capsys) -> None:
    """`keys list` and `keys revoke` on a file that is not there say so (list printed nothing and
    exited 0; revoke left a lock file behind); `serve` reads the file before it starts (it started,
    /readyz said ready, and every request was a 503)."""
    typo = tmp_path / "typo.json"
    for argv in (["keys", "list", "--file", str(typo)], ["keys", "list", "--file", str(typo), "--json"],
                 ["keys", "revoke", "x", "--file", str(typo)]):
        assert main(argv) == 2, argv
        out = capsys.readouterr()
        assert out.out == "" and out.err == f"error: --file {typo}: no keys file; `hybridsearch keys add NAME " \
            f"--file {typo}` makes one\n"
    assert list(tmp_path.iterdir()) == []
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    assert main(["serve", "--keys", str(bad), "--index-dir", str(tmp_path / "idx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: keys file {bad}: unreadable (JSONDecodeError") and err.count("\n") == 1
    assert main(["keys", "add", "a", "--file", str(typo)]) == 0  # add makes the file
    capsys.readouterr()
    assert main(["keys", "list", "--file", str(typo)]) == 0 and capsys.readouterr().out.startswith("a ")
