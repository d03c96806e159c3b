"""`hybridsearch opensearch start|stop|status`: run a local OpenSearch node, or a cluster of local
nodes (`start --nodes N`), on loopback.

`start` prints a node's URL as the last line of stdout (CI: `URL=$(hybridsearch opensearch start | tail -1)`);
progress goes to stderr. Errors are raised as HybridSearchError; the main CLI prints them and exits 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridsearch.errors import ConfigError

if TYPE_CHECKING:
    from hybridsearch.engines.opensearch.node import LocalCluster


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `opensearch` subcommand (start|stop|status) to an argparse subparsers object."""
    from hybridsearch.cli import fixed_port, seconds
    from hybridsearch.engines.opensearch.node import RELEASES

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", type=Path, default=None,
                        help="distribution and node directory (default: $HYBRIDSEARCH_OPENSEARCH_HOME, else "
                        "~/.cache/hybridsearch/opensearch, or /var/cache/hybridsearch/opensearch as root)")
    common.add_argument("--name", default="default", help="node (or cluster) name; each has its own data, logs "
                        "and ports (default: %(default)s)")

    p = sub.add_parser("opensearch", help="run a local OpenSearch node (2.19.1 or 3.6.0), or a cluster of them, on "
                       "127.0.0.1",
                       description="A local OpenSearch node (or a cluster of them: start --nodes N) on 127.0.0.1, "
                       "assembled from Maven Central artifacts: 2.19.1 (needs mvn and a JDK 11..21) or 3.6.0 (a JDK 21 "
                       "or newer). As root it runs as the user 'hybridsearch'.")
    actions = p.add_subparsers(dest="opensearch_action", required=True, metavar="{start,stop,status}")

    s = actions.add_parser("start", parents=[common], help="install if needed, start, print the URL",
                           description="Start the node (fetching and assembling OpenSearch the first time) and "
                           "print its URL as the last line of stdout; a running node prints its URL again.")
    s.add_argument("--port", type=fixed_port, default=None, help="HTTP port (default: "
                   "$HYBRIDSEARCH_OPENSEARCH_PORT, else the node's previous port if free, else a free port)")
    s.add_argument("--timeout", type=seconds, default=None, metavar="S", help="seconds to wait for the node to answer "
                   "(default: $HYBRIDSEARCH_OPENSEARCH_START_TIMEOUT or 180)")
    s.add_argument("--nodes", type=node_count, default=None, metavar="N",
                   help="a cluster of N nodes on loopback, one JVM each, named NAME, NAME.2 ... NAME.N (default: "
                   "1, or the size of the cluster NAME already is); a node of it that is down is started again")
    s.add_argument("--version", default=None, choices=list(RELEASES), dest="release",
                   help="the OpenSearch release of a new node (default: the setting opensearch_version, "
                   "$HYBRIDSEARCH_OPENSEARCH_VERSION); a node keeps the release its data was written by, and another "
                   "is refused")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")

    actions.add_parser("stop", parents=[common], help="stop the node, or every node of the cluster (SIGTERM, "
                       "SIGKILL after 30 s)")

    s = actions.add_parser("status", parents=[common], help="whether the node runs, its URL, pid, version",
                           description="Print the node's status as key: value lines, with each node of a cluster "
                           "in `nodes` (exit 0 if it runs and answers, 1 if it does not run, 3 if it runs but does "
                           "not answer: starting, or hung).")
    s.add_argument("--json", action="store_true", help="print JSON")

    p.set_defaults(func=cmd_opensearch)
    return p


def cmd_opensearch(args: argparse.Namespace) -> int:
    """Run `hybridsearch opensearch start|stop|status`; returns the exit status."""
    from hybridsearch.engines.opensearch.node import LocalCluster

    node = LocalCluster(home=args.home, name=args.name, version=getattr(args, "release", None))
    try:
        return _act(node, args)
    except OSError as e:  # the home or a file in it cannot be used
        where = f": {e.filename}" if e.filename else ""
        raise ConfigError(f"OpenSearch node {node.name!r} (home {node.home}): {e.strerror or e}{where}") from e


def node_count(text: str) -> int:
    """--nodes: a whole number of nodes from 1 to MAX_CLUSTER_NODES."""
    from hybridsearch.engines.opensearch.node import MAX_CLUSTER_NODES

    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_CLUSTER_NODES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node count from 1 to {MAX_CLUSTER_NODES}")
    return n


def _act(node: LocalCluster, args: argparse.Namespace) -> int:
    import sys

    from hybridsearch.engines.opensearch.node import red_indices, stderr_progress

    action = args.opensearch_action
    if action == "start":
        was = node.status()
        if was.running and args.port is not None and was.url is not None and not was.url.endswith(f":{args.port}"):
            print(f"node {node.name!r} already runs at {was.url}; --port {args.port} ignored", file=sys.stderr)
        url = node.start(args.nodes, port=args.port, timeout=args.timeout,
                         progress=None if args.quiet else stderr_progress)
        if was.running and all(n["running"] for n in was.nodes) and not args.quiet:
            print(f"node {node.name!r} is already running (pid {was.pid})", file=sys.stderr)
        try:
            red = red_indices(url)
        except (OSError, ValueError):
            red = []  # the health is checked again by whatever uses the node
        if red:
            shown = next((i for i in red if not i.startswith(".")), red[0])
            print(f"warning: the node is up, but its cluster is red: a primary shard of {', '.join(red)} is "
                  f"unassigned; `curl '{url}/_cluster/allocation/explain?pretty'` says why; restore it from a "
                  f"snapshot, or delete it (`curl -X DELETE {url}/{shown}`)", file=sys.stderr)
        print(url, flush=True)
        return 0
    if action == "stop":
        for name, pid in node.stop():
            if pid is None:
                print(f"OpenSearch node {name!r} is not running (home {node.home})")
            else:
                print(f"stopped OpenSearch node {name!r} (pid {pid})")
        return 0
    if action == "status":
        st = node.status().to_dict()
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            for key, value in st.items():
                if key == "nodes":
                    value = ", ".join(f"{n['name']} ({_node_line(n)})" for n in value)
                elif isinstance(value, list):
                    value = ", ".join(value) or None
                print(f"{key}: {'-' if value is None else str(value).lower() if isinstance(value, bool) else value}")
        return 0 if st["answering"] else 3 if st["running"] else 1
    raise AssertionError(f"unknown action {action!r}")  # argparse only lets the three through


def _node_line(node: dict[str, Any]) -> str:
    """One node of `status`: pid and URL, or why it has none."""
    if not node["running"]:
        return "not running"
    return f"pid {node['pid']}, {node['url']}" + ("" if node["answering"] else ", not answering")
