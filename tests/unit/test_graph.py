"""The citation graph's plain functions: PageRank against known values and networkx, orientation
by date, missing targets, co-citation, the authority cap and the input hash."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from hybridsearch.engines import WorkLinks
from indexer import graph
from indexer.graph import authority, build, links_hash, pagerank


def ranks(edges: list[tuple[int, int]], n: int, damping: float = 0.85) -> np.ndarray:
    arr = np.array(edges, dtype=np.int64).reshape(-1, 2)
    return pagerank(n, arr[:, 0], arr[:, 1], damping)


def test_pagerank_that_does_not_converge_says_so(caplog) -> None:
    chain = [(i + 1, i) for i in range(2999)]
    ranks(chain, 3000, damping=0.85)
    assert "did not converge" not in caplog.text
    ranks(chain, 3000, damping=0.999)
    assert "PageRank did not converge in 1000 rounds (damping 0.999" in caplog.text


def test_pagerank_known_values() -> None:
    # A->B, A->C, B->C, C->A: the solution of PR = 0.05 + 0.85 * (in-links' PR / out-degree)
    pr = ranks([(0, 1), (0, 2), (1, 2), (2, 0)], 3)
    assert pr == pytest.approx([0.387789, 0.214811, 0.397400], abs=1e-6)
    assert ranks([(0, 1), (1, 2), (2, 0)], 3) == pytest.approx([1 / 3] * 3, abs=1e-12)
    # a dangling node spreads its rank over all: A->B, B cites nothing
    a = ranks([(0, 1)], 2)
    assert a.sum() == pytest.approx(1.0, abs=1e-12)
    assert a[0] == pytest.approx(0.075 + 0.425 * a[1], abs=1e-12)
    assert a[1] == pytest.approx(0.075 + 0.85 * a[0] + 0.425 * a[1], abs=1e-12)


def test_pagerank_matches_networkx_with_dangling_nodes_and_duplicates() -> None:
    rng = np.random.default_rng(7)
    n = 60
    edges = [(int(a), int(b)) for a, b in rng.integers(0, n, size=(240, 2)) if a != b and a < 45]  # 45.. dangle
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    expected = nx.pagerank(g, alpha=0.85, tol=1e-14, max_iter=10_000)
    pr = ranks(edges + edges[:10], n)  # duplicate edges count once
    assert pr == pytest.approx([expected[i] for i in range(n)], abs=1e-9)
    assert pr.sum() == pytest.approx(1.0, abs=1e-12)


def test_links_oriented_by_date_and_missing_targets_kept() -> None:
    links = [
        WorkLinks("new", 197001, ("old", "same", "undated", "gone", "new")),  # a self-citation is dropped
        WorkLinks("old", 196001, ("new",)),       # a links.tsv pair: becomes new -> old only
        WorkLinks("same", 197001, ("new",)),      # same date: both directions stay
        WorkLinks("undated", None, ("new",)),     # no date: both stay
        WorkLinks("chunked", 198001, ("old#2",)),  # a chunk id stands for its work
    ]
    works, s = build(links)
    assert (s.works, s.missing, s.oriented) == (5, 1, 1)
    assert works["new"].cites == ("gone", "old", "same", "undated") and works["old"].cites == ()
    assert works["old"].cited_by == ("chunked", "new") and works["same"].cites == ("new",)
    assert works["new"].cited_by == ("same", "undated")
    # edges: new->4, same->new, undated->new, chunked->old; dangling: old and the missing "gone"
    assert (s.edges, s.dangling) == (7, 2)
    assert s.pagerank_sum == pytest.approx(1.0, abs=1e-9)
    assert sum(w.pagerank or 0 for w in works.values()) < 1.0  # the missing node holds the rest


def test_a_year_alone_orders_nothing_within_it_and_a_missing_chunk_is_its_work() -> None:
    works, s = build([WorkLinks("june", 200106, ("year",)), WorkLinks("year", 200100, ("june",)),
                      WorkLinks("later", 200200, ("year",)), WorkLinks("year2", 200200, ("later",))])
    assert works["june"].cites == ("year",) and works["year"].cites == ("june",)  # 2001 vs 2001-06: both stay
    assert s.oriented == 0
    # a missing target cited as x#1 and as x is one missing work, in either order
    for order in ((("a", ("x#1",)), ("b", ("x",))), (("a", ("x",)), ("b", ("x#1",)))):
        works, s = build([WorkLinks(w, None, c) for w, c in order])
        assert s.missing == 1 and works["a"].cites == works["b"].cites == ("x",)


def test_cocitation_counts_and_limit() -> None:
    links = [WorkLinks("x", None, ("a", "b", "c", "gone")), WorkLinks("y", None, ("a", "b")),
             WorkLinks("z", None, ("a", "c")), WorkLinks("a", None, ()), WorkLinks("b", None, ()),
             WorkLinks("c", None, ())]
    works, _ = build(links)
    assert works["a"].cocited == ("b", "c")  # b twice (x, y), c twice (x, z): ties by id
    assert works["b"].cocited == ("a", "c") and works["x"].cocited == ()
    assert build(links, cocited_max=1)[0]["c"].cocited == ("a",)
    assert build(links, cocited_max=0)[0]["a"].cocited == ()


def test_cocitation_over_many_blocks_equals_counting_by_hand(monkeypatch) -> None:
    """Co-citation is computed a block of works at a time (memory): over 700 works, across block
    edges, it equals counting the citing works by hand (most first, ties by id, at most 20)."""
    from collections import Counter

    monkeypatch.setattr(graph, "_COCITATION_PRODUCTS", 64)  # dozens of blocks
    rng = np.random.default_rng(3)
    names = [f"w{i:03d}" for i in range(700)]
    cites = {w: tuple(names[j] for j in rng.choice(700, rng.integers(0, 12), replace=False) if names[j] != w)
             for w in names}
    works, _ = build([WorkLinks(w, None, c) for w, c in cites.items()])
    for w in names:
        counts = Counter(o for c in cites.values() if w in c for o in c if o != w)
        want = tuple(sorted(counts, key=lambda o: (-counts[o], o))[:20])
        assert works[w].cocited == want, w


def test_blocked_cocitation_equals_the_whole_matrix_and_reports_progress(monkeypatch) -> None:
    """Blocks bounded by products (a survey's cited works alone exceed a block and get one each)
    give what the whole co-citation matrix A^T A gives, and each block reports its progress."""
    rng = np.random.default_rng(11)
    n_works, n = 400, 430  # nodes 400.. are missing works: cited, never listed
    edges = {(int(a), int(b)) for a, b in zip(rng.integers(0, n_works, 3000), rng.zipf(1.3, 3000) % n, strict=True)}
    edges |= {(7, int(b)) for b in rng.choice(n, 150, replace=False)}  # a survey
    edges = sorted((a, b) for a, b in edges if a != b)
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*edges, strict=True))
    a = np.zeros((n, n_works), dtype=np.int64)
    inside = dst < n_works
    a[src[inside], dst[inside]] = 1
    co = a.T @ a
    np.fill_diagonal(co, 0)
    calls: list[tuple[str, int, int]] = []
    monkeypatch.setattr(graph, "_COCITATION_PRODUCTS", 500)
    name = [f"w{i:03d}" if i < n_works else f"x{i}" for i in range(n)]
    links = [WorkLinks(name[w], None, tuple(name[b] for a, b in edges if a == w)) for w in range(n_works)]
    works, _ = build(links, cocited_max=6, progress=lambda *c: calls.append(c))
    for i in range(n_works):
        others = np.flatnonzero(co[i])
        want = others[np.lexsort((others, -co[i, others]))][:6]
        assert works[name[i]].cocited == tuple(name[j] for j in want), i
    assert len(calls) > 5 and [c[0] for c in calls] == ["citation graph: co-citations"] * len(calls)
    assert [c[1] for c in calls] == sorted({c[1] for c in calls}) and calls[-1][1:] == (n_works, n_works)


def test_build_equals_the_plain_per_edge_definition() -> None:
    """On a random graph with chunk ids, missing works, self-citations and dated pairs citing each
    other, the neighbour lists and counts are those of the definition applied edge by edge."""
    rng = np.random.default_rng(5)
    ids = [f"w{i:03d}" for i in rng.permutation(300)]
    dates = {w: None if rng.random() < 0.2 else int(rng.integers(1990, 1996) * 100 + rng.integers(0, 13))
             for w in ids}
    targets = ids + [f"{w}#1" for w in ids[:30]] + [f"gone{i}" for i in range(20)] + [f"gone{i}#2" for i in range(5)]
    cites = {w: [targets[j] for j in rng.integers(0, len(targets), rng.integers(0, 8))] for w in ids}
    for a, b in rng.integers(0, 300, (120, 2)).tolist():  # links.tsv pairs
        cites[ids[a]].append(ids[b])
        cites[ids[b]].append(ids[a])
    works, s = build([WorkLinks(w, dates[w], tuple(cites[w])) for w in ids])
    pairs = {(w, t.partition("#")[0]) for w, c in cites.items() for t in c if t.partition("#")[0] != w}
    oriented = 0
    for a, b in sorted(pairs):
        if a < b and (b, a) in pairs and dates.get(a) is not None and dates.get(b) is not None:
            ya, yb = dates[a], dates[b]
            if ya % 100 == 0 or yb % 100 == 0:
                ya, yb = ya // 100, yb // 100
            if ya != yb:
                pairs.discard((a, b) if ya < yb else (b, a))
                oriented += 1
    missing = {b for _, b in pairs if b.startswith("gone")}
    assert (s.edges, s.oriented, s.missing) == (len(pairs), oriented, len(missing)) and oriented > 10
    for w in ids:
        assert works[w].cites == tuple(sorted(b for a, b in pairs if a == w)), w
        assert works[w].cited_by == tuple(sorted(a for a, b in pairs if b == w)), w


def test_authority_is_capped_and_log_scaled() -> None:
    pr = np.array([0.001] * 90 + [0.02] * 9 + [0.3])
    pr = pr / pr.sum()
    a = authority(pr, np.ones(len(pr), dtype=bool))
    assert a.min() == 0.0 and a.max() == 1.0 and np.all((a >= 0) & (a <= 1))
    assert a[-1] == 1.0 and 0 < a[95] < 1  # the most-cited work is capped, not dominant
    assert np.all(np.diff(a[np.argsort(pr)]) >= 0)  # monotone in PageRank
    # no work stands out (no citations): nobody has authority
    assert authority(np.full(5, 0.2), np.ones(5, dtype=bool)).tolist() == [0.0] * 5
    works, s = build([WorkLinks("p", None, ()), WorkLinks("q", None, ())])
    assert (s.edges, s.dangling) == (0, 2) and works["p"].authority == 0.0 and works["p"].pagerank == 0.5


def test_a_hub_in_a_mostly_uncited_corpus_has_authority() -> None:
    """300 works, 100 citing one classic: its PageRank is 67 times the average, but the 99th
    percentile is the average (under 1 % stand out), so the cap falls to the top work instead of
    giving every work 0."""
    links = [WorkLinks("hub", None, ())] + [WorkLinks(f"w{i:03d}", None, ("hub",) if i < 100 else ())
                                             for i in range(300)]
    works, _ = build(links)
    assert works["hub"].authority == 1.0 and works["hub"].pagerank > 50 / 301
    assert all(works[f"w{i:03d}"].authority == 0.0 for i in range(300))


def test_links_hash_covers_input_and_parameters() -> None:
    base = [WorkLinks("a", 190001, ("b", "c")), WorkLinks("b", None, ())]
    h = links_hash(base, 0.85, 20)
    assert links_hash([WorkLinks("a", 190001, ("c", "b")), WorkLinks("b", None, ())], 0.85, 20) == h
    assert links_hash([WorkLinks("a", 190002, ("b", "c")), WorkLinks("b", None, ())], 0.85, 20) != h
    assert links_hash(base[:1], 0.85, 20) != h
    assert links_hash(base, 0.9, 20) != h and links_hash(base, 0.85, 5) != h
    assert build([])[1].works == 0


def test_pairs_are_ordered_by_one_key_or_by_two_where_they_do_not_fit_one() -> None:
    major, minor = np.array([3, 0, 3, 1]), np.array([5, 9, 2, 0])
    assert graph._ordered(major, minor).tolist() == [1, 3, 2, 0]
    assert graph._ordered(major << 40, minor << 30).tolist() == [1, 3, 2, 0]  # 42 + 33 bits: lexsort
