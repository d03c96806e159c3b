"""The CLI on the OpenSearch engine: ingest, stats, search, embed and eval against a real node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.conftest import DEMO, demo_subset

pytestmark = [pytest.mark.integration, pytest.mark.opensearch]
EXE = str(Path(sys.executable).with_name("hybridsearch"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture
def index(opensearch_url):
    from hybridsearch.engines.opensearch import OpenSearchEngine

    name = f"cli-{uuid.uuid4().hex[:8]}"
    yield name
    for n in (name, f"{name}-eval"):
        OpenSearchEngine(opensearch_url, index=n).drop()


def test_ingest_stats_search_embed_eval(opensearch_url, index, tmp_path) -> None:
    corpus = demo_subset(tmp_path, 80)
    out = run("ingest", str(corpus), "--engine", "opensearch", "--index", index, "--no-embed", "-q")
    assert out.returncode == 0, out.stderr
    assert "loaded 80, rejected 0, indexed 80, embedded 0" in out.stdout
    stats = json.loads(run("stats", "--engine", "opensearch", "--index", index, "--json").stdout)
    assert stats["documents"] == 80 and stats["vectors"] == 0 and stats["hdc_codes"] == 80
    assert stats["engine"] == "opensearch" and stats["concrete_index"] == f"{index}-v1"
    found = json.loads(run("search", "Theorema Egregium", "--url", opensearch_url, "--index", index,
                           "--profile", "lexical", "--json", "-k", "3").stdout)
    assert found["hits"][0]["id"] == "geom-theorema-egregium" and found["hits"][0]["document"]["title"]
    # the graph build went into the graph index: no chunk was rewritten, no replaced copy is left
    assert "replaced copies" not in out.stdout, out.stdout
    out = run("embed", "--engine", "opensearch", "--index", index, "-q")
    assert out.returncode == 0 and "embedded 80 chunks" in out.stdout, out.stderr
    # the vectors' updates each left one (a merge may drop some meanwhile)
    left = re.search(rf"(\d+) replaced copies of chunks count in BM25's statistics until `hybridsearch indices "
                     rf"merge {index}`", out.stdout)
    assert left is not None and 0 < int(left[1]) <= 80, out.stdout
    stats = json.loads(run("stats", "--engine", "opensearch", "--index", index, "--json").stdout)
    assert stats["vectors"] == 80
    out = run("search", "Brouwer fixed point", "--engine", "opensearch", "--index", index, "--explain")
    assert out.returncode == 0 and "topo-brouwer-fixed-point" in out.stdout and "dense" in out.stdout
    report = Path(f"/tmp/{index}.json")
    out = run("eval", str(DEMO), "--engine", "opensearch", "--index", f"{index}-eval", "--channels", "bm25",
              "--json", str(report), "-q")
    assert out.returncode == 0, out.stderr
    assert json.loads(report.read_text())["bm25"]["ndcg@10"] > 0.6
    report.unlink()


def test_errors_are_one_line(opensearch_url, index) -> None:
    out = run("search", "anything", "--engine", "opensearch", "--index", index, "--profile", "lexical")
    assert out.returncode == 2 and out.stderr.startswith(f"error: no index '{index}'") and "Traceback" not in out.stderr
    out = run("stats", "--engine", "opensearch", "--index", index, "--json")
    assert out.returncode == 2
    assert out.stderr == f"error: no index '{index}' at {opensearch_url}; ingest into it first\n"
    # `update` needs the index, as on the embedded engine: it creates none
    changed = Path(tempfile.mkdtemp()) / "changed.jsonl"
    changed.write_text('{"id": "a", "title": "Heat kernels", "text": "The heat kernel."}\n')
    out = run("update", str(changed), "--engine", "opensearch", "--index", index, "--no-embed", "-q")
    assert out.returncode == 2
    assert out.stderr == f"error: no index '{index}' at {opensearch_url}; ingest into it first\n"
    from opensearchpy import OpenSearch

    assert OpenSearch(opensearch_url).indices.get(index=f"{index}*", params={"expand_wildcards": "all"}) == {}
    for url in ("localhost:9200", "http://h:abc"):
        out = run("stats", "--url", url)
        assert out.returncode == 2 and out.stderr.startswith(f"error: url: '{url}' is not an OpenSearch URL")
    # an index whose template would be the query log's is not made (the default log's, here)
    out = subprocess.run([EXE, "indices", "create", "queries", "--url", opensearch_url], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HYBRIDSEARCH_QUERY_LOG_PREFIX": "hybridsearch-queries-"})
    assert out.returncode == 2 and "'queries' would have the index template hybridsearch-queries" in out.stderr
    assert OpenSearch(opensearch_url).indices.get(index="queries-v*", params={"expand_wildcards": "all"}) == {}
    out = run("stats", "--engine", "opensearch", "--index", "Bad Name")
    assert out.returncode == 2 and "index: 'Bad Name' is not a valid logical index name" in out.stderr


def test_create_with_shards_and_replicas_which_status_shows_and_reindex_keeps(opensearch_url, index) -> None:
    """`indices create --shards --replicas` on the suite's one node: the shard copies `indices
    status` lists, with the replicas a single node cannot hold unassigned and said so; BM25 scores
    as on one shard (the DFS phase gathers every shard's statistics); a reindex keeps the shards."""
    from hybridsearch.engines.opensearch import OpenSearchEngine
    from hybridsearch.engines.opensearch.admin import Admin

    out = run("indices", "create", index, "--url", opensearch_url, "--shards", "2", "--replicas", "1")
    assert out.returncode == 0, out.stderr
    st = json.loads(run("indices", "status", index, "--url", opensearch_url, "--json").stdout)
    assert st["number_of_shards"] == 2 and st["number_of_replicas"] == 1
    assert sorted((r["shard"], r["primary"], r["state"]) for r in st["shards"]) == [
        (0, False, "UNASSIGNED"), (0, True, "STARTED"), (1, False, "UNASSIGNED"), (1, True, "STARTED")]
    assert any("2 shard copies" in w and "unassigned" in w for w in st["warnings"])
    text = run("indices", "status", index, "--url", opensearch_url).stdout
    assert "shard copies: 0p " in text and "0r - (unassigned)" in text
    bad = run("indices", "create", f"{index}-x", "--url", opensearch_url, "--shards", "0")
    assert bad.returncode == 2 and "shards: 0 is not a shard count from 1 to 1024" in bad.stderr
    # the same documents on one shard and on two score the same
    one = OpenSearchEngine(opensearch_url, index=f"{index}-eval")
    two = OpenSearchEngine(opensearch_url, index=index)
    from indexer.pipeline import ingest

    for engine in (one, two):
        ingest(engine, DEMO, progress=False, graph=False)
    for q in ("Brouwer fixed point", "Godel incompleteness theorem", "compact operator spectrum"):
        a, b = one.bm25(q, k=300), two.bm25(q, k=300)  # every match: equal scores may come in either order
        sa, sb = dict(zip(a.ids, a.scores, strict=True)), dict(zip(b.ids, b.scores, strict=True))
        assert sa.keys() == sb.keys() and all(abs(sa[i] - sb[i]) < 1e-4 for i in sa), q
    admin = Admin(opensearch_url)
    try:
        admin.reindex(index)
        again = admin.status(index)
    finally:
        admin.close()
    assert again["version"] == 2 and again["number_of_shards"] == 2 and again["number_of_replicas"] == 1
