"""The scale benchmark ("a million chunks"): a synthetic corpus of --docs works, ingested, given
vectors and searched, each figure beside its target; prints a table.

    python bench/scale.py --docs 1000000 [--engine embedded|opensearch] [--url URL] [--json OUT]
                          [--work-dir DIR] [--seed N] [--real-vectors-max N] [--queries N]
                          [--centres N] [--batch N] [--keep]

The corpus (`corpus.jsonl`, written record by record, never held in memory): works `w0000000`,
`w0000001` ... whose titles and texts recombine sentences of ../shared/data scifact and cacm
around a "base" source abstract (one of --centres), about 170 words a work (title and text, spread
40 to about 340: a text stays within the chunker's window, so every work is one chunk); `cites`
averaging 3.4 per work (over-dispersed), popular works cited more (preferential attachment),
mostly earlier ids, about 2 % dangling (`ext...` ids, in no corpus); 1 to 3 `subjects` of 30;
`year` rising with the id, and `month`. Same --docs, --seed and --centres: the same corpus.

Vectors (`vectors.npy`, float32 (docs, 384), written as a memmap): up to --real-vectors-max works,
the real all-MiniLM-L6-v2 vectors of their dense texts; above, generated "near real" ones: each
work's base abstract's real vector plus gaussian noise, normalised, deterministic from the seed.
Queries: --queries texts of scifact and cacm queries.jsonl (10 more to warm up), and their real
vectors; their exact top-10 comes from a numpy brute force over the memmap, 100k rows at a time.

Each phase that reports memory runs in a process of its own:
- ingest: `hybridsearch ingest corpus.jsonl --no-embed` (HDC codes and the citation graph
  included), timed whole; the graph's own seconds read from its summary line ("built in X s");
  peak RSS of that process (wait4);
- vectors: `engine.set_vectors` in batches of --batch, the index closed (saved) at the end;
- open: a fresh process imports hybridsearch, opens the index and runs one `lexical` search:
  seconds to its first result, and its peak RSS;
- queries, one at a time after 10 warm-up queries, top-10: the `lexical` profile (the
  Searcher, no documents fetched); `engine.knn` against the exact top-10 (a hit counts when its
  exact cosine reaches the exact 10th's: ties); the `hybrid` profile with the query's
  vector given (see HYBRID_NOTE);
- update: 1 % of the works, with changed text and one more citation each, ingested again by the
  same command, timed whole (graph included).

`--work-dir DIR` keeps the corpus, the vectors and the queries for the next run with the same
parameters (the index is rebuilt each run); without it everything lives in a temporary directory
removed at the end. A directory that is neither empty nor one this benchmark made is refused.
`--engine opensearch` (or `--url`) ingests into a fresh index `bench-scale-<random>` on that node,
dropped at the end unless --keep; disk is the index's primary store size, and RSS figures are those
of the client processes. Its queries wait until the node has finished merging the index (a quiet
node: the k-NN graphs of a large load merge for minutes; `quiet_wait_s` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cleanup, count, cpu_line, node_version, positive_int, run_main, verdict  # noqa: E402

from hybridsearch.errors import ConfigError, HybridSearchError  # noqa: E402
from hybridsearch.metrics import percentile  # noqa: E402

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SHARED = REPO.parent / "shared" / "data"
SOURCES = ("scifact", "cacm")
EXE = str(Path(sys.executable).with_name("hybridsearch"))
MANIFEST = "scale-bench.json"  # marks a work directory this benchmark made, and what it holds
GENERATOR = 2  # version of the corpus generator: part of what a work directory's data is reused for
DIM = 384
WARMUP = 10
K = 10
EXACT_CHUNK = 100_000  # rows of the memmap per brute-force step (and per generated-vector step)
MAX_TEXT_WORDS = 300  # indexer.chunking.WINDOW_WORDS: a longer text splits into several chunks
MIN_WORDS = 40
MAX_WORDS = 400
CITES_MEAN = 3.4  # drawn per work (a gamma-Poisson mixture); small corpora lose a few to duplicates
HYBRID_NOTE = ("the `hybrid` profile end to end through query_service.searcher.Searcher, with the query's vector "
               "given by an encoder stand-in (Searcher(encoder=...)) that returns the precomputed vector: no public "
               "argument takes a query vector, so the model's query embedding is not in these milliseconds")
SUBJECTS = (  # the first 15 for scifact's biomedical bases, the others for cacm's
            "immunology", "oncology", "neuroscience", "genetics", "cardiology", "epidemiology", "microbiology",
            "pharmacology", "cell biology", "metabolism", "endocrinology", "virology", "public health",
            "biochemistry", "structural biology", "algorithms", "programming languages", "operating systems",
            "numerical analysis", "data structures", "compilers", "databases", "information retrieval",
            "computer graphics", "artificial intelligence", "computer networks", "formal languages",
            "statistics", "combinatorics", "linear algebra")
TITLE_PREFIXES = ("On ", "A note on ", "Towards ", "Revisiting ", "A study of ", "Notes on ", "Evidence on ")
# (key, label, unit, comparison, target); None: reported, no target
TARGETS: tuple[tuple[str, str, str, str | None, float | None], ...] = (
    ("ingest_docs_per_s", "ingest without vectors (whole command)", "docs/s", ">=", 3000),
    ("peak_rss_mb", "peak RSS of the ingest process", "MB", "<=", 4096),
    ("graph_build_s", "citation graph build (inside the ingest)", "s", "<=", 60),
    ("vectors_per_s", "vectors written (set_vectors, index saved)", "vectors/s", ">=", 20000),
    ("disk_mb", "index on disk", "MB", None, None),
    ("open_s", "open + first lexical result, fresh process", "s", "<=", 2),
    ("open_rss_mb", "peak RSS of that process", "MB", "<=", 1024),
    ("bm25_p50_ms", "lexical profile p50", "ms", "<=", 10),
    ("bm25_p95_ms", "lexical profile p95", "ms", None, None),
    ("dense_p50_ms", "knn p50 (k=10)", "ms", "<=", 10),
    ("dense_p95_ms", "knn p95 (k=10)", "ms", None, None),
    ("dense_recall_at_10", "knn recall@10 against exact", "", ">=", 0.95),
    ("hybrid_p50_ms", "hybrid profile p50, query vector given", "ms", "<=", 50),
    ("update_1pct_s", "re-ingest 1 % of the works (graph included)", "s", None, None),
)
# the single OpenSearch node's targets where they differ (None: reported, no target)
OPENSEARCH_TARGETS: dict[str, float | None] = {"ingest_docs_per_s": 1500, "bm25_p50_ms": 20, "peak_rss_mb": None,
                                               "vectors_per_s": None, "open_s": None, "open_rss_mb": None,
                                               "dense_p50_ms": None, "dense_recall_at_10": None, "hybrid_p50_ms": None}


# -- progress ----------------------------------------------------------------------------------------
class Clock:
    """Progress lines on stderr, each with the seconds since the run began."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def log(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.t0:8.1f}s] {message}", file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def doc_id(i: int) -> str:
    return f"w{i:07d}"


def row_of(id_: str) -> int:
    return int(id_[1:])


# -- the corpus --------------------------------------------------------------------------------------
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")


class SourcePool:
    """The sentences and titles of the source corpora, and which source documents can be bases
    (a text of at least 3 sentences)."""

    def __init__(self, dirs: list[Path]) -> None:
        self.titles: list[str] = []
        self.texts: list[list[str]] = []  # per source document: its sentences
        self.sentences: list[str] = []
        self.origin: list[int] = []  # per source document: which of `dirs` it came from
        for n, d in enumerate(dirs):
            with (d / "corpus.jsonl").open(encoding="utf-8") as f:
                for line in f:
                    obj = json.loads(line)
                    title = " ".join(str(obj.get("title") or "").split())
                    sents = [" ".join(s.split()) for s in _SENTENCE.split(str(obj.get("text") or "")) if s.strip()]
                    if title:
                        self.titles.append(title)
                        self.texts.append(sents)
                        self.origin.append(n)
                    self.sentences.extend(s for s in sents if len(s.split()) >= 4)
        self.bases = [i for i, s in enumerate(self.texts) if len(s) >= 3]
        if not self.bases or not self.sentences:
            raise ConfigError(f"no source texts under {', '.join(map(str, dirs))}")

    def dense_text(self, i: int) -> str:
        return f"{self.titles[i]} {' '.join(self.texts[i])}".strip()


def source_dirs() -> list[Path]:
    dirs = [SHARED / s for s in SOURCES]
    missing = [str(d) for d in dirs if not (d / "corpus.jsonl").is_file()]
    if missing:
        raise ConfigError(f"the source corpora are missing: {', '.join(missing)} (no corpus.jsonl)")
    return dirs


def pick_bases(pool: SourcePool, n_centres: int, seed: int) -> list[int]:
    """The source documents the works are built around (their real vectors are the centres)."""
    rnd = random.Random(f"bases-{seed}")
    return rnd.sample(pool.bases, min(n_centres, len(pool.bases)))


def _poisson(rnd: random.Random, lam: float) -> int:
    if lam > 30:
        return max(0, round(rnd.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, rnd.random()
    while p > limit:
        k += 1
        p *= rnd.random()
    return k


def _title(rnd: random.Random, pool: SourcePool, base: int) -> str:
    title = pool.titles[base]
    u = rnd.random()
    if u < 0.2:
        return rnd.choice(TITLE_PREFIXES) + title[:1].lower() + title[1:]
    if u < 0.35:
        other = pool.titles[rnd.randrange(len(pool.titles))].split()
        return f"{title.rstrip('.')}: {' '.join(other[:rnd.randint(3, 7)])}"
    return title


def _text(rnd: random.Random, pool: SourcePool, base: int, words_wanted: int) -> str:
    """Sentences of the base document in order (40-80 % of the words), then random others."""
    sents = pool.texts[base]
    start = rnd.randrange(len(sents))
    own = words_wanted * rnd.uniform(0.4, 0.8)
    words: list[str] = []
    for j in range(len(sents)):
        if len(words) >= own:
            break
        words += sents[(start + j) % len(sents)].split()
    while len(words) < words_wanted:
        words += pool.sentences[rnd.randrange(len(pool.sentences))].split()
    text = " ".join(words[:min(words_wanted, MAX_TEXT_WORDS)])
    return text if text[-1] in ".!?" else text + "."


def generate_corpus(path: Path, n: int, seed: int, pool: SourcePool, bases: list[int], clock: Clock
                    ) -> tuple[np.ndarray, dict[str, float]]:
    """Write `n` works to `path`, one JSON line each; returns each work's base (an index into
    `bases`: the centre of its generated vector) and the corpus's shape."""
    rnd = random.Random(f"corpus-{seed}")
    base_of = np.zeros(n, dtype=np.int32)
    cited = array("i")  # every in-corpus citation target so far: drawing from it favours the much cited
    subject_weights = [1 / (r + 1) for r in range(len(SUBJECTS))]
    words_total = cites_total = dangling = 0
    words_min, words_max = 1 << 30, 0
    step = max(n // 10, 1)
    t = time.perf_counter()
    tmp = path.with_suffix(".partial")
    with tmp.open("w", encoding="utf-8") as out:
        for i in range(n):
            b = rnd.randrange(len(bases))
            base_of[i] = b
            src = bases[b]
            title = _title(rnd, pool, src)
            total = min(MAX_WORDS, max(MIN_WORDS, int(rnd.lognormvariate(math.log(155), 0.5))))
            text = _text(rnd, pool, src, max(total - len(title.split()), 20))
            cites: list[str] = []
            for _ in range(_poisson(rnd, rnd.gammavariate(1.5, CITES_MEAN / 1.5))):
                u = rnd.random()
                if u < 0.02:
                    cites.append(f"ext{rnd.randrange(10 ** 7):07d}")
                    dangling += 1
                    continue
                if u < 0.07 or i == 0:  # any work, later ones too
                    target = rnd.randrange(n)
                elif u < 0.55 and cited:  # preferential attachment: popular works cited more
                    target = cited[rnd.randrange(len(cited))]
                else:  # an earlier work, recent ones more often
                    target = i - 1 - int(i * rnd.random() ** 2)
                if target != i:
                    cites.append(doc_id(target))
                    if target < i:
                        cited.append(target)
            cites = list(dict.fromkeys(cites))
            half = len(SUBJECTS) // 2
            subjects = [SUBJECTS[half * min(pool.origin[src], 1) + src % half]]
            subjects += rnd.choices(SUBJECTS, weights=subject_weights, k=rnd.randint(0, 2))
            record = {"id": doc_id(i), "title": title, "text": text, "subjects": list(dict.fromkeys(subjects)),
                      "year": 1950 + (74 * i) // n, "month": rnd.randint(1, 12), "cites": cites}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            words = len(title.split()) + len(text.split())
            words_total += words
            words_min, words_max = min(words_min, words), max(words_max, words)
            cites_total += len(cites)
            if (i + 1) % step == 0 and n >= 100_000:
                rate = (i + 1) / (time.perf_counter() - t)
                clock.log(f"  corpus: {i + 1:,} / {n:,} works ({rate:,.0f}/s, ETA {(n - i - 1) / rate:,.0f}s)")
    tmp.replace(path)
    shape = {"words_mean": words_total / n, "words_min": words_min, "words_max": words_max,
             "cites_mean": cites_total / n, "dangling_share": dangling / max(cites_total, 1)}
    return base_of, shape


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def write_update(corpus: Path, path: Path, n: int, seed: int, pool: SourcePool) -> int:
    """1 % of the works (at least one) with a changed text (a sentence replaced and one added) and
    one more citation each, so that the update moves every derived index and the graph."""
    rnd = random.Random(f"update-{seed}")
    chosen = set(rnd.sample(range(n), max(1, n // 100)))
    with path.open("w", encoding="utf-8") as out:
        for i, rec in enumerate(read_records(corpus)):
            if i not in chosen:
                continue
            words = rec["text"].split()
            new = pool.sentences[rnd.randrange(len(pool.sentences))].split()
            words = words[:max(MAX_TEXT_WORDS - len(new) - 12, 1)]
            rec["text"] = " ".join(["Revised:", *new, *words[len(new) // 2:]])
            rec["cites"] = [*rec["cites"], doc_id(rnd.randrange(i))] if i else rec["cites"]
            rec["cites"] = list(dict.fromkeys(rec["cites"]))
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return len(chosen)


# -- vectors -----------------------------------------------------------------------------------------
def real_vectors(corpus: Path, path: Path, n: int, encoder: Any, clock: Clock, batch: int = 512) -> None:
    """The encoder's vectors of every work's dense text, streamed into a memmap."""
    mm = np.lib.format.open_memmap(path.with_suffix(".partial.npy"), mode="w+", dtype=np.float32, shape=(n, DIM))
    texts: list[str] = []
    done, t, last = 0, time.perf_counter(), 0.0

    def flush() -> None:
        nonlocal done, last
        mm[done:done + len(texts)] = encoder.encode(texts)
        done += len(texts)
        texts.clear()
        if time.perf_counter() - last > 30 or done == n:
            last = time.perf_counter()
            rate = done / (last - t)
            clock.log(f"  real vectors: {done:,} / {n:,} ({rate:,.1f}/s, ETA {(n - done) / rate:,.0f}s)")

    for rec in read_records(corpus):
        texts.append(f"{rec['title']} {rec['text']}".strip())
        if len(texts) == batch:
            flush()
    if texts:
        flush()
    mm.flush()
    path.with_suffix(".partial.npy").replace(path)


def generated_vectors(path: Path, centres: np.ndarray, base_of: np.ndarray, seed: int, noise: float,
                      clock: Clock) -> None:
    """Each work's centre (its base's real vector) plus gaussian noise (a per-work scale around
    `noise` per component), normalised; `EXACT_CHUNK` rows at a time, each chunk seeded by
    (seed, chunk number), so the rows do not depend on how many are made at once."""
    n = len(base_of)
    mm = np.lib.format.open_memmap(path.with_suffix(".partial.npy"), mode="w+", dtype=np.float32, shape=(n, DIM))
    for c, s in enumerate(range(0, n, EXACT_CHUNK)):
        e = min(s + EXACT_CHUNK, n)
        rng = np.random.default_rng([seed, c])
        scale = (noise * rng.lognormal(0.0, 0.25, size=e - s)).astype(np.float32)
        rows = centres[base_of[s:e]] + rng.standard_normal((e - s, DIM), dtype=np.float32) * scale[:, None]
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        mm[s:e] = rows
        if n >= 2 * EXACT_CHUNK:
            clock.log(f"  generated vectors: {e:,} / {n:,}")
    mm.flush()
    path.with_suffix(".partial.npy").replace(path)


def pick_queries(nq: int, seed: int) -> list[str]:
    """`nq` + WARMUP distinct query texts of the source collections (the warm-up ones last)."""
    texts: list[str] = []
    for d in source_dirs():
        for rec in read_records(d / "queries.jsonl"):
            t = " ".join(str(rec.get("text") or "").split())
            if t:
                texts.append(t)
    texts = list(dict.fromkeys(texts))
    rnd = random.Random(f"queries-{seed}")
    rnd.shuffle(texts)
    want = nq + WARMUP
    while len(texts) < want:  # more asked for than the collections hold: variants of them
        texts.append(f"{texts[len(texts) % 1000]} {rnd.choice(SUBJECTS)}")
    return texts[:want]


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int, clock: Clock) -> tuple[np.ndarray, np.ndarray]:
    """The exact top-k rows (by inner product) of each query, EXACT_CHUNK rows of the memmap at a
    time; returns (rows, scores), best first."""
    nq, n = len(queries), len(vectors)
    best_s = np.full((nq, k), -np.inf, dtype=np.float32)
    best_i = np.full((nq, k), -1, dtype=np.int64)
    for s in range(0, n, EXACT_CHUNK):
        block = np.asarray(vectors[s:s + EXACT_CHUNK], dtype=np.float32)
        scores = queries @ block.T
        kk = min(k, scores.shape[1])
        part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        all_s = np.hstack([best_s, np.take_along_axis(scores, part, axis=1)])
        all_i = np.hstack([best_i, part + s])
        order = np.argsort(-all_s, axis=1, kind="stable")[:, :k]
        best_s, best_i = np.take_along_axis(all_s, order, axis=1), np.take_along_axis(all_i, order, axis=1)
        if n >= 2 * EXACT_CHUNK:
            clock.log(f"  exact top-{k}: {min(s + EXACT_CHUNK, n):,} / {n:,} rows")
    return best_i, best_s


# -- the work directory ------------------------------------------------------------------------------
def work_dir_for(path: Path) -> Path:
    """`--work-dir`: new, empty, or one this benchmark made (it holds MANIFEST); never a directory
    that holds the working directory or this checkout."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--work-dir {path}: a file, not a directory")
    resolved = path.resolve()
    for inside in (Path.cwd().resolve(), Path(__file__).resolve()):
        if inside == resolved or resolved in inside.parents:
            raise ConfigError(f"--work-dir {path}: holds {inside}; choose a directory of its own")
    if path.exists() and any(path.iterdir()) and not (path / MANIFEST).is_file():
        raise ConfigError(f"--work-dir {path}: not empty, and not a work directory of this benchmark "
                          f"(no {MANIFEST}); choose another directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def prepare_data(work: Path, args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    """Corpus, vectors, queries (with their exact top-10) and the update file in `work`, reusing
    what an earlier run with the same parameters left there."""
    n = args.docs
    real = n <= args.real_vectors_max
    key = {"generator": GENERATOR, "docs": n, "seed": args.seed, "centres": args.centres, "queries": args.queries,
           "vectors": "real" if real else f"generated, noise {args.noise}"}
    manifest_path = work / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        manifest = {}
    if manifest.get("key") != key:
        manifest = {"key": key, "done": {}}
    done: dict[str, Any] = manifest["done"]

    def save() -> None:
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")

    save()
    corpus, vectors = work / "corpus.jsonl", work / "vectors.npy"
    queries, update = work / "queries.npz", work / "update.jsonl"
    pool = SourcePool(source_dirs())
    bases = pick_bases(pool, args.centres, args.seed)
    encoder = None

    def enc() -> Any:
        nonlocal encoder
        if encoder is None:
            from hybridsearch.embeddings import default_encoder

            encoder = default_encoder()
            encoder.encode(["warm up"])
        return encoder

    if "corpus" in done and corpus.is_file() and (work / "base_of.npy").is_file():
        clock.log(f"corpus: reusing {corpus}")
    else:
        clock.log(f"corpus: generating {n:,} works (seed {args.seed}, {len(bases):,} bases) into {corpus}")
        base_of, shape = generate_corpus(corpus, n, args.seed, pool, bases, clock)
        np.save(work / "base_of.npy", base_of)
        done["corpus"] = shape
        done.pop("vectors", None)
        done.pop("queries", None)
        done.pop("update", None)
        save()
    shape = done["corpus"]
    clock.log(f"corpus: {n:,} works, {shape['words_mean']:.0f} words each on average ({shape['words_min']}-"
              f"{shape['words_max']}), {shape['cites_mean']:.2f} citations ({shape['dangling_share']:.1%} dangling), "
              f"{corpus.stat().st_size / 2 ** 20:,.0f} MB")
    if "vectors" in done and vectors.is_file():
        clock.log(f"vectors: reusing {vectors}")
    else:
        if real:
            clock.log(f"vectors: the encoder's real vectors of {n:,} works "
                      f"(--real-vectors-max {args.real_vectors_max})")
            real_vectors(corpus, vectors, n, enc(), clock)
        else:
            clock.log(f"vectors: embedding the {len(bases):,} base abstracts (the centres)")
            centres = enc().encode([pool.dense_text(b) for b in bases])
            clock.log(f"vectors: generating {n:,} near-real vectors (centre + noise {args.noise})")
            generated_vectors(vectors, centres, np.load(work / "base_of.npy"), args.seed, args.noise, clock)
        done["vectors"] = key["vectors"]
        done.pop("queries", None)
        save()
    if "queries" in done and queries.is_file():
        clock.log(f"queries: reusing {queries}")
    else:
        texts = pick_queries(args.queries, args.seed)
        clock.log(f"queries: embedding {len(texts)} query texts; exact top-{K} over {n:,} vectors")
        qv = enc().encode(texts, query=True)
        rows, scores = exact_top(np.load(vectors, mmap_mode="r"), qv[:args.queries], K, clock)
        np.savez(queries, texts=np.array(texts), vectors=qv, rows=rows, scores=scores)
        done["queries"] = len(texts)
        save()
    if "update" in done and update.is_file():
        clock.log(f"update: reusing {update}")
    else:
        done["update"] = write_update(corpus, update, n, args.seed, pool)
        save()
    return {"corpus": corpus, "vectors": vectors, "queries": queries, "update": update, "updated": done["update"],
            "real": real}


# -- phases in processes of their own ----------------------------------------------------------------
def child_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "HYBRIDSEARCH_QUERY_LOG": "false"}


def run_measured(cmd: list[str]) -> tuple[float, float, str]:
    """Run `cmd` (its stderr passed through, its stdout captured): seconds, the peak RSS (MB) of it
    and the processes it waited for, and its stdout. A failure is a HybridSearchError."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "; ".join(out.strip().splitlines()[-3:])
        raise HybridSearchError(f"{' '.join(cmd[:2])} ... exited with status {proc.returncode}" + (f": {tail}" if tail
                                                                                                   else ""))
    return seconds, usage.ru_maxrss / 1024, out


_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); import scale; scale.child_main()"


def child_main() -> None:
    """A child's entry: `function` (argv[2]) of this module with the JSON keyword arguments argv[3];
    its result as one JSON line on stdout (a HybridSearchError: one `error:` line, status 2)."""
    function, kwargs = getattr(sys.modules[__name__], sys.argv[2]), json.loads(sys.argv[3])
    run_main(lambda: print(json.dumps(function(**kwargs))))


def in_child(function: str, **kwargs: Any) -> dict[str, Any]:
    """`function(**kwargs)` of this module in a fresh process; its JSON result (last stdout line)."""
    _, _, out = run_measured([sys.executable, "-c", _CHILD, str(BENCH), function, json.dumps(kwargs)])
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# the open phase: as little as a user's process would run, timed from before hybridsearch's import
_OPEN = r"""
import json, sys, time
t0 = time.perf_counter()
import hybridsearch
t1 = time.perf_counter()
with hybridsearch.open(sys.argv[1], **json.loads(sys.argv[2])) as index:
    t2 = time.perf_counter()
    hits = index.search(sys.argv[3], "lexical", k=10).hits
    t3 = time.perf_counter()
peak = 0.0
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        peak = int(line.split()[1]) / 1024
print(json.dumps({"open_s": t3 - t0, "import_s": t1 - t0, "index_s": t2 - t1, "search_s": t3 - t2,
                  "hits": len(hits), "rss_mb": peak}))
"""


def target_options(index: str | None) -> dict[str, Any]:
    return {"index": index} if index else {}


def cli_target(target: str, index: str | None) -> list[str]:
    return ["--url", target, "--index", index] if index else ["--index-dir", target]


def write_vectors(target: str, index: str | None, vectors: str, batch: int) -> dict[str, Any]:
    """(child) Every work's vector through engine.set_vectors, `batch` at a time, the index closed
    (saved) at the end."""
    from hybridsearch.embeddings import default_encoder
    from hybridsearch.engines import open_engine
    from indexer.pipeline import claim_encoder

    clock = Clock()
    mm = np.load(vectors, mmap_mode="r")
    n = len(mm)
    engine = open_engine(target, **target_options(index))
    try:
        claim_encoder(engine, default_encoder(), target)  # the record a search checks its encoder against
        t = time.perf_counter()
        written, last = 0, t
        for s in range(0, n, batch):
            e = min(s + batch, n)
            written += engine.set_vectors([doc_id(i) for i in range(s, e)], np.asarray(mm[s:e]))
            if time.perf_counter() - last > 30:
                last = time.perf_counter()
                clock.log(f"  vectors: {e:,} / {n:,} ({e / (last - t):,.0f}/s)")
        set_s = time.perf_counter() - t
    finally:
        t2 = time.perf_counter()
        engine.close()
    close_s = time.perf_counter() - t2
    return {"written": written, "set_s": set_s, "close_s": close_s, "rss_mb": peak_rss_mb()}


class GivenQueryVector:
    """An encoder stand-in for the Searcher: a query's "embedding" is the vector set beforehand
    (its variants get the same); it names itself as the configured encoder, whose vectors the
    index holds."""

    def __init__(self) -> None:
        from hybridsearch.embeddings import default_encoder

        real = default_encoder()  # made, not loaded: the model is never run here
        self.name, self.dim = real.name, real.dim
        self.fingerprint = getattr(real, "fingerprint", None)
        self.vector: np.ndarray | None = None

    def encode(self, texts: Any, *, batch_size: int | None = None, progress: bool = False,
               query: bool = False) -> np.ndarray:
        if not query or self.vector is None:
            raise RuntimeError("the benchmark gives query vectors only")
        return np.tile(self.vector, (len(texts), 1))


def run_queries(target: str, index: str | None, queries: str, vectors: str) -> dict[str, Any]:
    """(child) Latency of the lexical profile, knn (with recall against the exact top-10) and the
    hybrid profile, one query at a time after WARMUP."""
    import hybridsearch
    from hybridsearch.engines import VectorSearch
    from query_service.searcher import Searcher

    data = np.load(queries)
    texts, qv, scores = [str(t) for t in data["texts"]], data["vectors"], data["scores"]
    nq = len(scores)
    mm = np.load(vectors, mmap_mode="r")
    out: dict[str, Any] = {}
    handle = hybridsearch.open(target, **target_options(index))
    try:
        engine = handle.engine
        if not isinstance(engine, VectorSearch):
            raise HybridSearchError(f"{target}: this engine has no vector search")
        given = GivenQueryVector()
        searcher = Searcher(engine, encoder=given, query_log=None)
        try:
            for name in ("lexical", "hybrid"):
                lat = []
                for j in [*range(nq, nq + WARMUP), *range(nq)]:
                    given.vector = qv[j]
                    t = time.perf_counter()
                    searcher.search(texts[j], name, k=K)
                    if j < nq:
                        lat.append((time.perf_counter() - t) * 1000)
                out[name] = lat
        finally:
            searcher.close()
        lat, recall = [], []
        want = min(K, len(mm))
        for j in [*range(nq, nq + WARMUP), *range(nq)]:
            t = time.perf_counter()
            ranked = engine.knn(qv[j], K)
            dt = (time.perf_counter() - t) * 1000
            if j >= nq:
                continue
            lat.append(dt)
            got = sorted(row_of(i) for i in ranked.ids[:want])
            exact = np.asarray(mm[got], dtype=np.float32) @ qv[j] if got else np.zeros(0)
            # a hit counts when its exact cosine reaches the exact 10th's (any of the ties is right)
            recall.append(min(int((exact >= scores[j][want - 1] - 1e-5).sum()), want) / want)
        out["dense"], out["recall"] = lat, float(np.mean(recall)) if recall else None
    finally:
        handle.close()
    out["rss_mb"] = peak_rss_mb()
    return out


# -- the run -----------------------------------------------------------------------------------------
def graph_seconds(summary: str) -> float | None:
    """The graph's seconds in an ingest summary ("... built in 1.23s"); None when it was unchanged."""
    m = re.search(r"citation graph: .*built in ([0-9.]+)s", summary)
    return float(m.group(1)) if m else None


def wait_for_merges(client: Any, index: str, clock: Clock, limit_s: float = 1200.0) -> float:
    """(OpenSearch) Wait until no merge runs on the index (its k-NN graphs are merged for minutes
    after a large load), so that the queries meet a quiet node: polled every 5 s, at most `limit_s`;
    returns the seconds waited."""
    start = last = time.perf_counter()
    while True:
        merges = client.indices.stats(index=index, metric="merge")["_all"]["total"]["merges"]
        waited = time.perf_counter() - start
        if not merges["current"] or waited >= limit_s:
            clock.log(f"merges: {merges['current']} running after {waited:.0f}s of waiting"
                      + (" (gave up)" if merges["current"] else ""))
            return waited
        if time.perf_counter() - last >= 30:
            last = time.perf_counter()
            clock.log(f"merges: {merges['current']} running, {merges['current_docs']:,} documents; waiting")
        time.sleep(5)


def disk_mb(path: Path) -> float:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file()) / 2 ** 20


def bench(args: argparse.Namespace, work: Path, clock: Clock) -> dict[str, Any]:
    data = prepare_data(work, args, clock)
    n = args.docs
    fig: dict[str, Any] = {"engine": args.engine, "docs": n, "seed": args.seed,
                           "vectors": "real" if data["real"] else "generated"}
    if args.engine == "embedded":
        index_dir = work / "index"
        if index_dir.exists():
            shutil.rmtree(index_dir)
        target, index = str(index_dir), None
    else:
        target, index = args.url, f"bench-scale-{uuid.uuid4().hex[:8]}"
        fig["index"] = index
    quiet = [] if sys.stderr.isatty() else ["-q"]
    try:
        clock.log(f"ingest: {n:,} works into {index or target} (hybridsearch ingest --no-embed)")
        seconds, rss, out = run_measured([EXE, "ingest", str(data["corpus"]), *cli_target(target, index),
                                          "--no-embed", "--loader", "jsonl", *quiet])
        fig["ingest_s"], fig["ingest_docs_per_s"], fig["peak_rss_mb"] = seconds, n / seconds, rss
        fig["graph_build_s"] = graph_seconds(out)
        m = re.search(r"indexed \d+, .* in ([0-9.]+)s", out)
        fig["ingest_internal_s"] = float(m.group(1)) if m else None  # the CLI's own figure, no start-up
        clock.log(f"ingest: {seconds:.1f}s, {n / seconds:,.0f} docs/s, peak RSS {rss:,.0f} MB; "
                  + "; ".join(out.strip().splitlines()[:2]))

        clock.log(f"vectors: set_vectors in batches of {args.batch:,}")
        t = time.perf_counter()
        v = in_child("write_vectors", target=target, index=index, vectors=str(data["vectors"]), batch=args.batch)
        fig["vectors_s"] = time.perf_counter() - t
        fig["vectors_per_s"] = n / (v["set_s"] + v["close_s"])
        clock.log(f"vectors: {v['written']:,} written in {v['set_s']:.1f}s + {v['close_s']:.1f}s to close (save), "
                  f"{fig['vectors_per_s']:,.0f}/s; peak RSS {v['rss_mb']:,.0f} MB")
        if v["written"] != n:
            raise HybridSearchError(f"set_vectors wrote {v['written']} vectors of {n}")

        if index is None:
            fig["disk_mb"] = disk_mb(Path(target))
        else:
            from hybridsearch.engines.opensearch.engine import OpenSearchEngine

            os_engine = OpenSearchEngine(target, index=index)
            try:
                fig["disk_mb"] = os_engine.stats().details["store_bytes"] / 2 ** 20
                fig["quiet_wait_s"] = wait_for_merges(os_engine.client, index, clock)
            finally:
                os_engine.close()
        clock.log(f"disk: {fig['disk_mb']:,.0f} MB")

        texts = [str(t) for t in np.load(data["queries"])["texts"]]
        _, _, out = run_measured([sys.executable, "-c", _OPEN, target, json.dumps(target_options(index)),
                                  texts[0]])
        o = json.loads(out.strip().splitlines()[-1])
        fig["open_s"], fig["open_rss_mb"] = o["open_s"], o["rss_mb"]
        clock.log(f"open: first lexical result after {o['open_s']:.2f}s (import {o['import_s']:.2f}s, open "
                  f"{o['index_s']:.2f}s, search {o['search_s']:.3f}s, {o['hits']} hits); "
                  f"peak RSS {o['rss_mb']:,.0f} MB")

        clock.log(f"queries: {args.queries} of each kind after {WARMUP} warm-up, top-{K}, one at a time")
        q = in_child("run_queries", target=target, index=index, queries=str(data["queries"]),
                     vectors=str(data["vectors"]))
        fig["bm25_p50_ms"], fig["bm25_p95_ms"] = percentile(q["lexical"], 50), percentile(q["lexical"], 95)
        fig["dense_p50_ms"], fig["dense_p95_ms"] = percentile(q["dense"], 50), percentile(q["dense"], 95)
        fig["dense_recall_at_10"] = q["recall"]
        fig["hybrid_p50_ms"], fig["hybrid_p95_ms"] = percentile(q["hybrid"], 50), percentile(q["hybrid"], 95)
        fig["serve_rss_mb"] = q["rss_mb"]
        fig["hybrid_method"] = "searcher, query vector given"
        clock.log(f"queries: lexical p50 {fig['bm25_p50_ms']:.2f} ms, knn p50 {fig['dense_p50_ms']:.2f} ms "
                  f"(recall@10 {fig['dense_recall_at_10']:.3f}), hybrid p50 {fig['hybrid_p50_ms']:.2f} ms; "
                  f"peak RSS {q['rss_mb']:,.0f} MB")

        clock.log(f"update: {data['updated']:,} works changed (1 %), ingested again")
        seconds, _, out = run_measured([EXE, "ingest", str(data["update"]), *cli_target(target, index),
                                        "--no-embed", "--loader", "jsonl", *quiet])
        fig["update_1pct_s"], fig["update_graph_s"] = seconds, graph_seconds(out)
        clock.log(f"update: {seconds:.1f}s ({seconds / fig['ingest_s']:.1%} of the full ingest); "
                  + "; ".join(out.strip().splitlines()[:2]))
    finally:
        if index is not None:
            if args.keep:
                print(f"kept OpenSearch index {index!r} at {target}", file=sys.stderr)
            else:
                from hybridsearch.engines.opensearch.engine import OpenSearchEngine

                dropper = OpenSearchEngine(target, index=index)
                cleanup(f"drop OpenSearch index {index}", dropper.drop)
                cleanup("close the OpenSearch client", dropper.close)
    return fig


def _show(value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit in ("docs/s", "vectors/s", "MB"):
        return f"{value:,.0f} {unit}"
    if unit == "":
        return f"{value:.3f}"
    return f"{value:,.2f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def print_table(fig: dict[str, Any], engine_line: str) -> None:
    print(f"\n## scale: {fig['docs']:,} works, engine {fig['engine']}, vectors {fig['vectors']}, seed {fig['seed']}\n")
    print(cpu_line())
    print(engine_line)
    print("\n| figure | value | target | verdict |\n|---|---|---|---|")
    for key, label, unit, op, target in TARGETS:
        if fig["engine"] == "opensearch":
            target = OPENSEARCH_TARGETS.get(key, target)
        value = fig.get(key)
        shown = _show(value, unit)
        if key == "update_1pct_s" and value is not None and fig.get("ingest_s"):
            shown += f" ({value / fig['ingest_s']:.1%} of the full ingest)"
        if op is None or target is None:
            print(f"| {label} | {shown} | - | - |")
            continue
        ok = value is not None and (value >= target if op == ">=" else value <= target)
        shown_target = f"{op} {target:g} {unit}".rstrip()
        print(f"| {label} | {shown} | {shown_target} | {verdict(ok) if value is not None else '-'} |")
    print(f"\nhybrid: {HYBRID_NOTE}.")


def save_json(path: Path, fig: dict[str, Any]) -> None:
    """One object per engine and size: an earlier file's list keeps its other entries."""
    entries: list[dict[str, Any]] = []
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            old = None
        if isinstance(old, list):
            entries = [e for e in old if isinstance(e, dict)
                       and (e.get("engine"), e.get("docs")) != (fig["engine"], fig["docs"])]
    keys = ("docs", "ingest_docs_per_s", "peak_rss_mb", "disk_mb", "graph_build_s", "bm25_p50_ms", "bm25_p95_ms",
            "dense_p50_ms", "dense_p95_ms", "dense_recall_at_10", "hybrid_p50_ms", "update_1pct_s", "open_s",
            "open_rss_mb", "vectors_per_s")
    entry = {"engine": fig["engine"], **{k: fig.get(k) for k in keys},
             **{k: v for k, v in fig.items() if k not in keys and k != "engine"}}
    entries.append(entry)
    path.write_text(json.dumps(entries, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=positive_int, required=True, help="works in the corpus (one chunk each)")
    ap.add_argument("--engine", choices=["embedded", "opensearch"], help="default: embedded, or opensearch with --url")
    ap.add_argument("--url", help="OpenSearch URL (default $HYBRIDSEARCH_OPENSEARCH_URL with --engine opensearch)")
    ap.add_argument("--json", type=Path, help="write (or add to) a JSON list: one object per engine and size")
    ap.add_argument("--work-dir", type=Path, help="keep corpus, vectors and queries here for the next run "
                    "(default: a temporary directory, removed at the end)")
    ap.add_argument("--seed", type=count, default=0)
    ap.add_argument("--real-vectors-max", type=count, default=20_000,
                    help="up to this many works, real embeddings; above, generated near-real vectors (20000)")
    ap.add_argument("--queries", type=positive_int, default=200, help="measured queries of each kind (200)")
    ap.add_argument("--centres", type=positive_int, default=2000,
                    help="source abstracts the works are built around, whose real vectors centre the generated ones")
    ap.add_argument("--noise", type=float, default=0.04,
                    help="scale of the gaussian noise per component of a generated vector (0.04: cosine about 0.8 "
                    "to its centre)")
    ap.add_argument("--batch", type=positive_int, default=10_000, help="vectors per set_vectors call (10000)")
    ap.add_argument("--keep", action="store_true", help="keep the OpenSearch index at the end")
    args = ap.parse_args()
    if args.engine is None:
        args.engine = "opensearch" if args.url else "embedded"
    if args.engine == "embedded" and args.url:
        ap.error("--url names an OpenSearch node: it goes with --engine opensearch")
    if args.engine == "opensearch":
        args.url = args.url or os.environ.get("HYBRIDSEARCH_OPENSEARCH_URL")
        if not args.url:
            ap.error("no OpenSearch URL: pass --url or set HYBRIDSEARCH_OPENSEARCH_URL")
    if not (math.isfinite(args.noise) and args.noise > 0):
        ap.error(f"--noise: a number above 0, got {args.noise}")
    if args.json is not None and not args.json.parent.is_dir():
        ap.error(f"--json {args.json}: no directory {args.json.parent}")
    work = work_dir_for(args.work_dir) if args.work_dir is not None else None
    source_dirs()
    engine_line = "engine: embedded (SQLite + tantivy + faiss)"
    if args.engine == "opensearch":
        engine_line = f"engine: OpenSearch {node_version(args.url)} at {args.url}"  # before any work
    clock = Clock()
    tmp = None
    if work is None:
        tmp = work = Path(tempfile.mkdtemp(prefix="hs-scale-"))
    free = shutil.disk_usage(work).free
    need = args.docs * 12_000  # corpus ~1.2 KB, vectors 1.5 KB, index ~9 KB a work (measured small)
    if free < need:
        clock.log(f"warning: {free / 2 ** 30:.1f} GiB free under {work}; this run may need about "
                  f"{need / 2 ** 30:.1f} GiB")
    clock.log(f"{cpu_line()}; work directory {work}")
    try:
        fig = bench(args, work, clock)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    clock.log("done")
    print_table(fig, engine_line)
    if args.json:
        save_json(args.json, fig)


if __name__ == "__main__":
    run_main(main)
