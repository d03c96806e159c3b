"""`hybridsearch templates|indices|snapshot ...`: index lifecycle commands for ops.

Each takes `--url` (default $HYBRIDSEARCH_OPENSEARCH_URL) and `--json`. Destructive commands ask
for confirmation on a terminal and need `--yes` otherwise. Errors are raised as HybridSearchError;
the main CLI prints them as one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from hybridsearch.errors import HybridSearchError


def confirm(question: str, yes: bool) -> None:
    """Go on if `yes`, or if the user answers y on a terminal; otherwise raise."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise HybridSearchError(f"{question.rstrip('?')}: refused without --yes (stdin is not a terminal)")
    try:
        answer = input(f"{question} [y/N] ").strip().lower()
    except EOFError:
        answer = ""
    if answer not in ("y", "yes"):
        raise HybridSearchError("cancelled")


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _emit(args: argparse.Namespace, data: Any, text: Callable[[], str]) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text())


def add_parsers(sub: Any) -> None:
    """Add `templates`, `indices` and `snapshot` to an argparse subparsers object."""
    from hybridsearch.cli import seconds

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="OpenSearch URL (default: $HYBRIDSEARCH_OPENSEARCH_URL)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    yes = argparse.ArgumentParser(add_help=False)
    yes.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    p = sub.add_parser("templates", help="index templates, search pipelines and policies on OpenSearch")
    acts = p.add_subparsers(dest="action", required=True, metavar="{apply}")
    s = acts.add_parser("apply", parents=[common], help="put every template where missing or out of date "
                        "(idempotent; prints what changed)",
                        description="Example: hybridsearch templates apply --url http://127.0.0.1:9200")
    s.add_argument("--index", action="append", help="logical index whose index template to apply "
                   "(repeatable; default: every existing one)")
    s.set_defaults(func=cmd_templates)

    p = sub.add_parser("indices", help="logical indices on OpenSearch: list, status, create, reindex, merge, "
                       "prune, delete")
    acts = p.add_subparsers(dest="action", required=True,
                            metavar="{list,status,create,delete,reindex,merge,prune}")
    s = acts.add_parser("list", parents=[common], help="one row per logical index",
                        description="Example: hybridsearch indices list --json")
    s = acts.add_parser("status", parents=[common], help="versions, aliases, counts and warnings of one index")
    s.add_argument("name", help="the logical index (its alias)")
    s = acts.add_parser("create", parents=[common], help="create NAME-v1 with the aliases NAME and NAME-write",
                        description="Example: hybridsearch indices create papers --shards 3 --replicas 1")
    s.add_argument("name", help="the logical index (its alias)")
    s.add_argument("--shards", type=int, default=None, help="primary shards (default: $HYBRIDSEARCH_OPENSEARCH_SHARDS, "
                   "else the chunk template's: 1); `indices reindex` keeps them")
    s.add_argument("--replicas", type=int, default=None, help="copies of each shard on other nodes (default: "
                   "$HYBRIDSEARCH_OPENSEARCH_REPLICAS, else the chunk template's: 0)")
    s = acts.add_parser("delete", parents=[common, yes], help="delete every version of an index")
    s.add_argument("name", help="the logical index (its alias)")
    s = acts.add_parser("reindex", parents=[common], help="build the next version and swap the aliases "
                        "with no downtime", description="Builds NAME-v<N+1> from the current templates, copies "
                        "the live version into it with a server-side _reindex task, checks the count and swaps "
                        "both aliases atomically. Searches keep working throughout; writes wait until the swap and "
                        "then land in the new version. The old version is kept until `indices prune`.")
    s.add_argument("name", help="the logical index (its alias)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s = acts.add_parser("merge", parents=[common], help="drop the deleted and replaced copies of chunks that "
                        "still count in BM25's statistics", description="Every update of a chunk (the graph build, "
                        "workers' vectors or codes, a re-ingest) leaves a copy that Lucene counts in BM25's statistics "
                        "until a merge drops it. This waits until OpenSearch's retention leases release the copies "
                        "(they advance every 30 s), then merges the segments that hold them. Searches and writes go "
                        "on meanwhile. Example: hybridsearch indices merge demo")
    s.add_argument("name", help="the logical index (its alias)")
    s.add_argument("--timeout", type=seconds, default=120.0, help="seconds to wait for the retention leases "
                   "(default 120)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    s = acts.add_parser("prune", parents=[common, yes], help="delete old versions")
    s.add_argument("name", help="the logical index (its alias)")
    s.add_argument("--keep", type=int, default=1, help="versions to keep, the live one included (default 1)")
    p.set_defaults(func=cmd_indices)

    p = sub.add_parser("snapshot", help="snapshots of logical indices in an fs repository under path.repo")
    acts = p.add_subparsers(dest="action", required=True, metavar="{repo-add,create,list,restore,delete}")
    repo = argparse.ArgumentParser(add_help=False)
    repo.add_argument("--repo", help="repository (default: $HYBRIDSEARCH_OPENSEARCH_SNAPSHOT_REPO or hybridsearch)")
    s = acts.add_parser("repo-add", parents=[common], help="register an fs repository (location under path.repo)")
    s.add_argument("repo", nargs="?", help="repository name (default: $HYBRIDSEARCH_OPENSEARCH_SNAPSHOT_REPO or "
                   "hybridsearch)")
    s.add_argument("--location", help="directory, relative to the node's path.repo (default: the repository name)")
    s = acts.add_parser("create", parents=[common, repo], help="snapshot the live version of logical indices")
    s.add_argument("name", help="the snapshot's name")
    s.add_argument("--index", action="append", help="logical index (repeatable; default: all)")
    acts.add_parser("list", parents=[common, repo], help="snapshots in the repository")
    s = acts.add_parser("restore", parents=[common, repo, yes], help="restore logical indices with their aliases "
                        "(an existing one is replaced after confirmation)")
    s.add_argument("name", help="the snapshot to restore (`snapshot list` names them)")
    s.add_argument("--index", action="append", help="logical index (repeatable; default: all in the snapshot)")
    s = acts.add_parser("delete", parents=[common, repo, yes], help="delete a snapshot (after confirmation)")
    s.add_argument("name", help="the snapshot to delete (`snapshot list` names them)")
    p.set_defaults(func=cmd_snapshot)


def _admin(args: argparse.Namespace) -> Any:
    from hybridsearch.engines.opensearch.admin import Admin

    return Admin(args.url)


def cmd_templates(args: argparse.Namespace) -> int:
    admin = _admin(args)
    try:
        changes = admin.apply_templates(args.index)
    finally:
        admin.close()
    data = [c.__dict__ for c in changes]
    _emit(args, data, lambda: _table(data, ["action", "kind", "name", "note"]))
    return 0


def cmd_indices(args: argparse.Namespace) -> int:
    admin = _admin(args)
    try:
        return _indices(admin, args)
    finally:
        admin.close()


def _indices(admin: Any, args: argparse.Namespace) -> int:
    if args.action == "list":
        rows = [ix.row() for ix in admin.indices()]
        shown = [{**r, "size": _human(r["size_bytes"]), "aliases": ",".join(r["aliases"]),
                  "versions": ",".join(map(str, r["versions"]))} for r in rows]
        _emit(args, rows, lambda: _table(shown, ["name", "version", "index", "docs", "size", "health", "aliases",
                                                 "versions"]) if rows else "no hybridsearch indices")
    elif args.action == "status":
        st = admin.status(args.name)

        def text() -> str:
            head = {k: ", ".join(v) if isinstance(v, list) else v for k, v in st.items()
                    if k not in ("versions", "warnings", "shards")}
            lines = [f"{k:>16}: {v}" for k, v in head.items()]
            if st.get("shards"):
                lines.append(f"{'shard copies':>16}: " + "; ".join(
                    f"{r['shard']}{'p' if r['primary'] else 'r'} {r['node'] or '-'}"
                    + ("" if r["state"] == "STARTED" else f" ({r['state'].lower()})") for r in st["shards"]))
            lines += ["", _table([{**v, "size": _human(v["bytes"]), "aliases": ",".join(v["aliases"])}
                                  for v in st["versions"]],
                                 ["index", "version", "docs", "deleted", "size", "health", "aliases",
                                  "write_blocked"])]
            lines += [f"warning: {w}" for w in st["warnings"]]
            return "\n".join(lines)

        _emit(args, st, text)
    elif args.action == "create":
        row = admin.create(args.name, args.shards, args.replicas).row()
        _emit(args, row, lambda: f"created {row['index']} with aliases {', '.join(row['aliases'])}")
    elif args.action == "delete":
        ix = admin.get(args.name)
        confirm(f"delete index {args.name!r} ({len(ix.versions)} versions, "
                f"{ix.row()['docs']} documents live) at {admin.url}?", args.yes)
        gone = admin.delete(args.name)
        _emit(args, {"deleted": gone}, lambda: f"deleted {', '.join(gone)}")
    elif args.action == "reindex":
        res = _reindex(admin, args)
        _emit(args, res.as_dict(), lambda: (f"reindexed {res.name}: {res.old} -> {res.new}, {res.docs} documents in "
                                            f"{res.seconds:.1f} s; aliases swapped; {res.old} kept until "
                                            f"`hybridsearch indices prune {res.name}`"
                                            + (f" (removed unfinished {', '.join(res.removed)})" if res.removed
                                               else "")
                                            + (f"; kept from {res.old}: "
                                               + ", ".join(f"{k}={v}" for k, v in res.carried.items())
                                               if res.carried else "")))
    elif args.action == "merge":
        quiet = args.quiet or args.json
        res = admin.merge(args.name, progress=None if quiet else lambda line: print(line, file=sys.stderr,
                                                                                        flush=True),
                          timeout=args.timeout)
        _emit(args, res.as_dict(), lambda: f"merged {res.index}: dropped {res.dropped} deleted or replaced copies in "
              f"{res.seconds:.1f} s" + (f"; {res.remaining} remain (written meanwhile, or still retained)"
                                        if res.remaining else ""))
    elif args.action == "prune":
        doomed = admin.prunable(args.name, args.keep)
        if doomed:
            confirm(f"delete {', '.join(doomed)} at {admin.url}?", args.yes)
        gone = admin.prune(args.name, args.keep, only=doomed)
        _emit(args, {"deleted": gone}, lambda: f"deleted {', '.join(gone)}" if gone else "nothing to prune")
    return 0


def _reindex(admin: Any, args: argparse.Namespace) -> Any:
    from tqdm import tqdm

    bars: list[Any] = []

    def progress(done: int, total: int) -> None:
        if not bars:  # the copy has started
            bars.append(tqdm(desc=f"reindex {args.name}", unit="doc", total=total, file=sys.stderr,
                             disable=args.quiet or args.json))
        bars[0].n = done
        bars[0].refresh()

    try:
        return admin.reindex(args.name, progress=progress)
    finally:
        for b in bars:
            b.close()


def cmd_snapshot(args: argparse.Namespace) -> int:
    admin = _admin(args)
    try:
        if args.action == "repo-add":
            res = admin.repo_add(args.repo, args.location)
            _emit(args, res, lambda: f"repository {res['repository']!r} ({res['type']}, location "
                  f"{res['settings']['location']!r}) verified on {res['verified_nodes']} node(s)")
        elif args.action == "create":
            res = admin.snapshot_create(args.name, args.repo, args.index)
            _emit(args, res, lambda: f"snapshot {res['snapshot']!r}: {res['state']}, "
                  f"{', '.join(f'{k} ({v})' for k, v in res['indices'].items())} in {res['seconds']:.1f} s")
        elif args.action == "list":
            snaps = admin.snapshots(args.repo)
            shown = [{**s, "logical": ",".join(s["logical"]), "indices": ",".join(s["indices"])} for s in snaps]
            _emit(args, snaps, lambda: _table(shown, ["snapshot", "state", "logical", "indices", "start", "seconds"])
                  if snaps else f"no snapshots in {args.repo or admin.settings.opensearch_snapshot_repo!r}")
        elif args.action == "restore":
            conflicts = admin.restore_conflicts(args.name, args.repo, args.index)
            if conflicts:
                confirm(f"replace {', '.join(conflicts)} at {admin.url} with snapshot {args.name!r}?", args.yes)
            res = admin.snapshot_restore(args.name, args.repo, args.index, replace=True)
            _emit(args, res, lambda: f"restored {', '.join(f'{k} ({v})' for k, v in res['indices'].items())} from "
                  f"{res['snapshot']!r} in {res['seconds']:.1f} s"
                  + (f"; replaced {', '.join(res['replaced'])}" if res["replaced"] else ""))
        elif args.action == "delete":
            res = admin.snapshot_delete(args.name, args.repo, ask=lambda stored, state: confirm(
                f"delete snapshot {args.name!r} ({', '.join(stored)}) at {admin.url}"
                + ("" if state == "SUCCESS" else f", which is {state} (deleting it stops it)") + "?", args.yes))
            _emit(args, res, lambda: f"deleted snapshot {res['snapshot']!r} "
                  f"({', '.join(res['indices'])}) from {res['repository']!r}")
    finally:
        admin.close()
    return 0
