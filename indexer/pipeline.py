"""Ingestion: load -> validate -> (embed) -> store through the engine's journal, in batches."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tqdm import tqdm

from hybridsearch import plugins
from hybridsearch.analysis import ANALYSIS_RULES, Analyzer, default_analyzer
from hybridsearch.analysis.normalize import Lexicon
from hybridsearch.config import get_settings
from hybridsearch.embedcache import embedding_cache
from hybridsearch.embedcache import key as cache_key
from hybridsearch.embeddings import (
    LEGACY_RECORD,
    Encoder,
    PassagePooling,
    check_encoder,
    encoder_record,
    usable_cores,
)
from hybridsearch.engines import (
    BinarySearch,
    Codes,
    DerivedIndexes,
    Engine,
    GraphStore,
    GraphSummary,
    VectorSearch,
    check_lexicon,
    is_url,
    open_engine,
)
from hybridsearch.engines.embedded.store import Store
from hybridsearch.errors import (
    ConfigError,
    HybridSearchError,
    IndexNotFoundError,
    UnsupportedCapabilityError,
    ValidationError,
)
from hybridsearch.hdc import FIELDS, NBYTES, HdcEncoder
from hybridsearch.hdc.encoder import document_texts
from hybridsearch.models import Document
from indexer.graph import update_graph
from indexer.loaders import JsonlLoader, Loader, LoadReport, detect_loader

_log = logging.getLogger("hybridsearch.ingest")
BATCH = 1024


@dataclass
class IngestSummary:
    loaded: int = 0
    rejected: list[ValidationError] = field(default_factory=list)
    indexed: int = 0
    embedded: int = 0
    kept: int = 0  # chunks whose stored vector is for the text they bring: not embedded again
    cached: int = 0  # chunks whose vectors came from the embedding cache
    given: int = 0  # chunks whose vectors came with them on input (not embedded)
    replaced: int = 0
    seconds: float = 0.0
    graph: GraphSummary | None = None
    graph_built: bool = False

    def lines(self) -> list[str]:
        kept = f" (kept the vectors of {self.kept} unchanged chunks)" if self.kept else ""
        cached = f" ({self.cached} of them from the embedding cache)" if self.cached else ""
        cached += f"; {self.given} chunks came with their vectors" if self.given else ""
        out = [f"loaded {self.loaded}, rejected {len(self.rejected)}, indexed {self.indexed}, "
               f"embedded {self.embedded}{kept}, in {self.seconds:.1f}s{cached}"]
        if self.replaced:
            out.append(f"removed {self.replaced} chunks that the new versions of their works no longer have")
        if self.graph is not None:
            out.append(graph_line(self.graph, self.graph_built))
        out += [f"  rejected: {e}" for e in self.rejected[:20]]
        if len(self.rejected) > 20:
            out.append(f"  ... and {len(self.rejected) - 20} more")
        return out


def claim_encoder(holder: Engine | Store, encoder: Encoder, where: str) -> None:
    """Before vectors of `encoder` are written: an index that records another encoder (or, from
    before the record, holds MiniLM vectors) refuses it in one line naming both; an index without
    vectors records it (on OpenSearch, whose mapping fixes the dimension, only an encoder of that
    dimension)."""
    stored = holder.get_meta("encoder")
    if stored is None:
        if isinstance(holder, Store | VectorSearch) and holder.has_vectors():
            stored = LEGACY_RECORD
        else:
            dim = holder.dim if isinstance(holder, VectorSearch) else encoder.dim
            if dim != encoder.dim:
                raise ConfigError(f"{where} holds {dim}-d vectors (its mapping); the configured encoder "
                                  f"{encoder.name} gives {encoder.dim}-d (HYBRIDSEARCH_ENCODER)")
            holder.set_meta("encoder", encoder_record(encoder))
            return
    check_encoder(stored, encoder, where)


def _binary(engine: Engine) -> BinarySearch:
    if not isinstance(engine, BinarySearch):
        raise UnsupportedCapabilityError("HDC codes need an engine with binary (Hamming) search")
    return engine


def load_documents(path: Path, loader: str | None, report: LoadReport, *,
                   strict: bool = False) -> Iterator[Document]:
    name = loader or detect_loader(path)
    if not path.exists():
        raise ValidationError("no such file or directory", source=str(path))
    impl: Loader = plugins.load("loaders", name)()
    return impl.load(path, report, strict=strict)


def graph_line(g: GraphSummary, built: bool) -> str:
    return (f"citation graph: {g.works} works, {g.edges} edges ({g.oriented} links oriented by date), "
            f"{g.missing} cited works not indexed, {g.dangling} dangling; "
            + (f"built in {g.seconds:.2f}s" if built else "unchanged"))


def ingest(engine: Engine, path: Path | Iterable[Document | Mapping[str, Any]], *, loader: str | None = None,
           strict: bool = False,
           encoder: Encoder | None = None, hdc: bool = True, graph: bool = True, progress: bool = True,
           batch_size: int = BATCH) -> IngestSummary:
    """Index a corpus. Each batch is HDC-encoded (and embedded, with an encoder) before it is
    written, so an acknowledged document is searchable in every channel at once (other processes
    reading an embedded index see it by the next BM25 commit of the bulk load, seconds, and all
    of it when this returns); then, with `graph`, the citation graph is brought up to date. A work
    is replaced whole: its chunks that the new version no longer has are deleted. A record whose
    id is a chunk of another work in the index is rejected. A chunk stored with a vector for the
    text it brings keeps that vector (it is not embedded again). A run that rewrote every chunk of
    the index (with HDC codes) records this version's analysis rules for it (ANALYSIS_RULES). An
    input with no record accepted is a ValidationError saying why. `path` may instead be Python
    objects: Documents, or mappings as the lines of a JSONL file (named "objects" and their place,
    from 1, in errors)."""
    hdc_encoder = _binary(engine).hdc_encoder() if hdc else None
    if encoder is not None:
        claim_encoder(engine, encoder, "the index")
    start = time.perf_counter()
    report = LoadReport()
    summary = IngestSummary()
    if isinstance(path, Path):
        docs, total, where = load_documents(path, loader, report, strict=strict), count_records(path), str(path)
    else:
        if isinstance(path, str | bytes | Mapping | Document):
            raise ValidationError("expected a Path, or an iterable of Documents or mappings (one record each)",
                                  source="objects")
        items = path
        total, where = (len(items) if isinstance(items, Sized) else None), "objects"
        docs = JsonlLoader().records(enumerate(items, 1), where, report, strict)
    bar = tqdm(desc="ingest", total=total, unit="record", mininterval=1.0, disable=not progress, leave=False)
    done = 0  # records behind the batches written
    written: set[str] = set()  # works with chunks written by this run
    chunks: set[str] = set()  # the chunks written by this run

    def advance(batch_records: int, fraction: float) -> None:
        bar.n = int(min(done + batch_records * fraction, bar.total or float("inf")))
        bar.refresh()

    ahead = HdcAhead.start(hdc_encoder, total, batch_size)
    if isinstance(engine, DerivedIndexes):
        engine.bulk = True  # committed by the checkpoint below, or by close
    gc.freeze()  # the objects alive before the load (modules, caches) are not scanned again and again
    try:
        for raw, seen, coded in ahead.batches(_work_batches(docs, batch_size), report):
            records = seen - done
            batch = _given_fit(engine, _claimable(engine, raw, report, strict), report, strict)
            if batch:
                given = [d for d in batch if d.given_vectors is not None]
                rest = [d for d in batch if d.given_vectors is None]
                kept = _vectors_to_keep(engine, rest) if encoder is not None else set()
                fresh = [d for d in rest if d.id not in kept]
                got = embed(encoder, fresh, partial(advance, records)) if encoder is not None and fresh else None
                vectors, passages = (None, None) if got is None else (got.vectors, got.passages)
                summary.cached += 0 if got is None else got.cached
                codes = coded() if hdc_encoder is not None else None
                # written without vectors, chunks whose text is unchanged keep the ones stored; given
                # vectors are written as they came
                parts = [([d for d in rest if d.id in kept], None, None), (fresh, vectors, passages)]
                if given:
                    parts.append((given, np.vstack([d.given_vectors.vector for d in given if d.given_vectors]),
                                  [d.given_vectors.rows() for d in given if d.given_vectors]))
                for part, vecs, pas in parts:
                    if part:
                        engine.write(part, vecs, None if codes is None else [codes[d.id] for d in part], pas)
                summary.given += len(given)
                summary.replaced += _drop_stale_chunks(engine, batch, written)
                summary.indexed += len(batch)
                chunks.update(d.id for d in batch)
                summary.embedded += 0 if vectors is None else len(fresh)
                summary.kept += len(kept)
            done += records
            advance(0, 0.0)
    except ValidationError as e:
        if strict and summary.indexed:
            e.message += f" (--strict: stopped here; the {summary.indexed} chunks before it are committed)"
            e.args = (e._render(),)
        raise
    finally:
        gc.unfreeze()
        ahead.close()
        bar.close()
        if isinstance(engine, DerivedIndexes):
            engine.bulk = False
    summary.loaded, summary.rejected = report.loaded, report.rejected
    if not summary.indexed:  # loaded records may still be rejected, their ids being other works' chunks
        why = (f"every record was rejected ({len(report.rejected)}; first: {report.rejected[0]})" if report.rejected
               else "it holds no records (an empty file, or a directory with no file the loader reads)")
        raise ValidationError(f"nothing to index: {why}", source=where)
    # every chunk of the index analysed and HDC-encoded again by this run: it is up to date with
    # this version's analysis rules, whichever an older version made it with
    if hdc_encoder is not None and engine.count() == len(chunks) and engine.get_meta("analysis") != ANALYSIS_RULES:
        try:
            engine.set_meta("analysis", ANALYSIS_RULES)
        except HybridSearchError as e:  # the documents are in: this is a note on them, not the work
            _log.warning("could not record the analysis rules of the index (a later full ingest will): %s", e)
    with PhaseBars(progress) as phases:
        if isinstance(engine, DerivedIndexes):  # its derived indexes brought up to date, one at a time
            engine.progress = phases
            try:
                engine.checkpoint()
            finally:
                engine.progress = None
        if graph and isinstance(engine, GraphStore):
            summary.graph, summary.graph_built = update_graph(engine, progress=phases)
    summary.seconds = time.perf_counter() - start
    return summary


class HdcAhead:
    """A batch's HDC codes, encoded in a helper process while the batch before it is written: ingest's
    two heaviest steps, HDC encoding and the writes (BM25 analysis, SQLite, tantivy), on two cores.
    Without a helper (one core, a small input, HYBRIDSEARCH_INGEST_HDC_PROCESS=false, no encoder)
    the codes are encoded here, when asked. A helper that dies is replaced by encoding here, with a
    warning; the codes are the same either way."""

    def __init__(self, encoder: HdcEncoder | None, helper: _Helper | None) -> None:
        self.encoder = encoder
        self._helper = helper

    @classmethod
    def start(cls, encoder: HdcEncoder | None, total: int | None, batch_size: int) -> HdcAhead:
        wanted = get_settings().ingest_hdc_process
        if wanted is None:
            wanted = usable_cores() >= 2 and (total is None or total >= 4 * batch_size)
        if encoder is None or not wanted:
            return cls(encoder, None)
        return cls(encoder, _Helper((encoder.analyzer.lexicon, encoder.ngrams, encoder.ties)))

    def batches(self, batches: Iterator[list[Document]], report: LoadReport
                ) -> Iterator[tuple[list[Document], int, Callable[[], dict[str, Codes]]]]:
        """(batch, records the loader had read when it was made, its codes by chunk id when
        called), the next batch read and sent to the helper before this one is yielded."""
        def read() -> tuple[list[Document], int, int | None] | ValidationError | None:
            try:
                batch = next(batches, None)
            except ValidationError as e:  # (--strict) raised once the batches before it are written
                return e
            if batch is None:
                return None
            seen = report.loaded + len(report.rejected)
            return batch, seen, None if self._helper is None else self._helper.submit(
                [document_texts(d) for d in batch])

        nxt = read()
        while nxt is not None:
            if isinstance(nxt, ValidationError):
                raise nxt
            batch, seen, ticket = nxt
            nxt = read()
            yield batch, seen, partial(self._codes, batch, ticket)

    def _codes(self, batch: list[Document], ticket: int | None) -> dict[str, Codes]:
        """The batch's codes; the texts the helper analysed are remembered by this process's
        analyzer, so that BM25 takes their tokens instead of analysing them again."""
        assert self.encoder is not None
        done = None if ticket is None or self._helper is None else self._helper.result(ticket)
        if done is not None:
            codes, present, joined = done
            remember = self.encoder.analyzer.remember
            for d, analysed in zip(batch, joined, strict=True):
                for text, tokens in zip(document_texts(d), analysed, strict=True):
                    if text and tokens is not None:
                        remember(text, tokens)
            return {d.id: {f: codes[i, j] for j, f in enumerate(FIELDS) if present[i, j]}
                    for i, d in enumerate(batch)}
        if ticket is not None and self._helper is not None:
            _log.warning("the HDC helper process ended; encoding HDC codes in this process")
            self.close()
        return dict(zip([d.id for d in batch], self.encoder.encode_documents(batch), strict=True))

    def close(self) -> None:
        if self._helper is not None:
            self._helper.close()
            self._helper = None


# a batch's codes (documents x FIELDS x bytes), which of them each document has, and each
# document's texts' tokens joined by spaces (None: an empty text)
Analysed = tuple[np.ndarray, np.ndarray, list[tuple[str | None, ...]]]


class _Helper:
    """The helper process: `_helper_main` in a new interpreter, pickles over its stdin and stdout,
    one thread writing requests and one reading answers, so that this process never waits on a
    pipe. Not multiprocessing: its spawned child imports the caller's `__main__` again, and a
    script without the `if __name__ == "__main__"` guard would run its own top-level code (an
    rmtree, another ingest) in the helper."""

    def __init__(self, options: tuple[Lexicon, bool, str]) -> None:
        root = str(Path(__file__).resolve().parents[1])  # where `indexer` imports from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen([sys.executable, "-c", "from indexer.pipeline import _helper_main; "
                                       "_helper_main()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._outbox: queue.Queue[tuple[int, Any] | None] = queue.Queue()
        self._answers: dict[int, Analysed] = {}
        self._gone = False
        self._cond = threading.Condition()
        self._next = 0
        self._outbox.put((-1, options))
        self._threads = [threading.Thread(target=f, name=f"hdc-helper-{f.__name__}", daemon=True)
                         for f in (self._write, self._read)]
        for t in self._threads:
            t.start()

    def submit(self, texts: list[tuple[str | None, ...]]) -> int:
        self._next += 1
        self._outbox.put((self._next, texts))
        return self._next

    def result(self, ticket: int) -> Analysed | None:
        """The answer to `ticket`, or None once the helper has ended without giving it."""
        with self._cond:
            self._cond.wait_for(lambda: ticket in self._answers or self._gone)
            return self._answers.pop(ticket, None)

    def _write(self) -> None:
        pipe = self._proc.stdin
        assert pipe is not None
        try:
            while (item := self._outbox.get()) is not None:
                pickle.dump(item, pipe, protocol=pickle.HIGHEST_PROTOCOL)
                pipe.flush()
        except (OSError, ValueError):  # the helper ended (a broken or closed pipe)
            pass
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    def _read(self) -> None:
        pipe = self._proc.stdout
        assert pipe is not None
        try:
            while True:
                ticket, answer = pickle.load(pipe)
                with self._cond:
                    self._answers[ticket] = answer
                    self._cond.notify_all()
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        finally:
            with self._cond:
                self._gone = True
                self._cond.notify_all()

    def close(self) -> None:
        """End the helper: the end of its input, then a kill if it has not left in 10 s."""
        self._outbox.put(None)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for t in self._threads:
            t.join(timeout=10)


def _helper_main() -> None:
    """The helper process: the index's options (lexicon, ngrams, ties), then (ticket, the texts of
    a batch's documents) in turn, each answered with (ticket, Analysed)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the ingest, which then ends this input
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answers' pipe
    _, (lexicon, ngrams, ties) = pickle.load(inp)
    encoder = HdcEncoder(Analyzer(lexicon), ngrams=ngrams, ties=ties)
    while True:
        try:
            ticket, texts = pickle.load(inp)
        except EOFError:
            return
        tokens = [encoder.analyse_texts(t) for t in texts]
        codes = np.zeros((len(texts), len(FIELDS), NBYTES), dtype=np.uint8)
        present = np.zeros((len(texts), len(FIELDS)), dtype=bool)
        for i, doc_codes in enumerate(encoder.encode_analysed(tokens)):
            for j, f in enumerate(FIELDS):
                if f in doc_codes:
                    codes[i, j], present[i, j] = doc_codes[f], True
        # read back from the analyzer, which keeps each text it just analysed joined
        joined = [tuple(encoder.analyzer.joined(t) if t else None for t in doc) for doc in texts]
        pickle.dump((ticket, (codes, present, joined)), out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()


class PhaseBars:
    """A progress bar for each phase of long work that reports (what, done, total): a new `what`
    closes the last bar and opens its own (with a rate and an ETA); nothing shows when disabled."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar: tqdm | None = None
        self._what = ""

    def __call__(self, what: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is None or what != self._what:
            self.close()
            self._bar, self._what = tqdm(desc=what, total=total, mininterval=1.0, leave=False), what
        self._bar.total = total
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> PhaseBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def count_records(path: Path) -> int | None:
    """About how many records a path holds (lines of a JSONL or BEIR corpus, files of a directory),
    for the progress bar's total and ETA; None when unknown."""
    corpus = path / "corpus.jsonl" if path.is_dir() and (path / "corpus.jsonl").is_file() else path
    if corpus.is_file():
        if corpus.suffix != ".jsonl":
            return 1
        with corpus.open("rb") as f:
            return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b"")) or 1
    if path.is_dir():
        return sum(1 for p in path.rglob("*") if p.suffix in (".md", ".txt") and p.is_file())
    return None


class Embedded(NamedTuple):
    vectors: np.ndarray  # (chunks, dim)
    passages: list[np.ndarray]  # a (passages, dim) matrix per chunk
    cached: int  # chunks whose vectors came from the embedding cache


def embed(encoder: Encoder, batch: Sequence[Document], progress: Callable[[float], None] | None = None
          ) -> Embedded:
    """The batch's vectors (of each dense text) and passage vectors (of each Document.passages, a
    matrix per chunk), from the machine's embedding cache (hybridsearch.embedcache) where it holds
    them for this encoder, else encoded and then kept there. An encoder without an `identity`
    is not cached."""
    identity = getattr(encoder, "identity", None)
    cache = embedding_cache() if identity else None
    if cache is None:
        return Embedded(*_encode(encoder, batch, progress), cached=0)
    identity = f"{identity}|passages={get_settings().passage_vectors}"
    keys = [cache_key(identity, d.dense_text, d.passages) for d in batch]
    hits = cache.get(keys, encoder.dim)
    todo = [i for i, k in enumerate(keys) if k not in hits]
    done = len(hits) / len(batch)  # a cache hit is about free
    if progress is not None and hits:
        progress(done)
    vectors, passages = _encode(encoder, [batch[i] for i in todo],
                                None if progress is None else lambda f: progress(done + f * (1 - done)))
    cache.put(identity, [(keys[i], np.vstack([vectors[n:n + 1], passages[n]])) for n, i in enumerate(todo)])
    out_vecs = np.zeros((len(batch), encoder.dim), dtype=np.float32)
    out_pas: list[np.ndarray] = [np.zeros((0, encoder.dim), dtype=np.float32)] * len(batch)
    for n, i in enumerate(todo):
        out_vecs[i], out_pas[i] = vectors[n], passages[n]
    for i, k in enumerate(keys):
        if k in hits:
            out_vecs[i], out_pas[i] = hits[k][0], hits[k][1:]
    return Embedded(out_vecs, out_pas, len(hits))


def _encode(encoder: Encoder, batch: Sequence[Document], progress: Callable[[float], None] | None = None
            ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The batch's vectors and passage vectors from the encoder. What is encoded forms one queue
    sorted by length, longest first, so that each model batch pads little, encoded a piece of about
    PIECE_CHARS at a time so that a progress bar moves at least every second or two (`progress` gets
    the fraction done). With HYBRIDSEARCH_PASSAGE_VECTORS=pooled and an encoder that pools, a
    chunk's passages are pooled from its own forward pass, and only those past the model's window
    are encoded alone."""
    texts = [d.dense_text for d in batch]
    passages = [d.passages for d in batch]
    vectors = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    found: list[list[np.ndarray | None]] = [[None] * len(ps) for ps in passages]
    total = sum(_read_chars(t) for t in texts + [p for ps in passages for p in ps]) or 1
    done = 0

    def tick(part: Sequence[str]) -> None:
        nonlocal done
        done += sum(_read_chars(t) for t in part)
        if progress is not None:
            progress(min(done / total, 1.0))

    pooler = encoder if get_settings().passage_vectors == "pooled" and isinstance(encoder, PassagePooling) else None
    pooled = pooler is not None
    if pooler is not None:
        for part in _pieces(texts):
            got = pooler.encode_pooled([texts[i] for i in part], [batch[i].passage_spans for i in part])
            if got is None:  # this encoder cannot pool here (another runtime): every text alone
                pooled = False
                break
            vectors[part] = got[0]
            for i, ps in zip(part, got[1], strict=True):
                found[i] = ps
            tick([texts[i] for i in part])
    # (chunk, -1) for a chunk's own text, (chunk, passage) for a passage encoded alone
    queue = [] if pooled else [(c, -1) for c in range(len(texts))]
    queue += [(c, j) for c, ps in enumerate(found) for j, v in enumerate(ps) if v is None]
    queued = [texts[c] if j < 0 else passages[c][j] for c, j in queue]
    for part in _pieces(queued):
        for i, row in zip(part, encoder.encode([queued[i] for i in part]), strict=True):
            c, j = queue[i]
            if j < 0:
                vectors[c] = row
            else:
                found[c][j] = row
        tick([queued[i] for i in part])
    return vectors, [np.vstack([v for v in ps if v is not None]) if ps else np.zeros((0, encoder.dim), dtype=np.float32)
                     for ps in found]


# characters of text per encode call of `embed`: about 16 texts the model truncates (256 word pieces,
# about 1,200 characters), a second of work on two cores, or about 200 sentences
PIECE_CHARS = 20_000
_TRUNCATED_CHARS = 1_200


def _read_chars(text: str) -> int:
    """About how much of a text the model reads: all of it up to _TRUNCATED_CHARS."""
    return min(len(text), _TRUNCATED_CHARS)


def _pieces(texts: Sequence[str]) -> Iterator[list[int]]:
    """The texts' indexes, longest text first, cut into pieces of about PIECE_CHARS read."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    part: list[int] = []
    size = 0
    for i in order:
        part.append(i)
        size += _read_chars(texts[i])
        if size >= PIECE_CHARS:
            yield part
            part, size = [], 0
    if part:
        yield part


def _work_batches(items: Iterable[Document], size: int) -> Iterator[list[Document]]:
    """Batches of about `size` chunks that never split a run of one work's chunks."""
    batch: list[Document] = []
    for d in items:
        if len(batch) >= size and d.work_id != batch[-1].work_id:
            yield batch
            batch = []
        batch.append(d)
    if batch:
        yield batch


def _vectors_to_keep(engine: Engine, batch: Sequence[Document]) -> set[str]:
    """Ids of the batch's chunks stored with a vector for the very text they bring (a corpus
    ingested again): the index's model made it from that text. (A change of the model's
    precision, bfloat16 or float32, is not a reason to embed again: their cosines agree to 1e-4.)"""
    try:
        stored = engine.get([d.id for d in batch])
    except IndexNotFoundError:  # an OpenSearch index before its first write
        return set()
    same = [d.id for d in batch if d.id in stored and stored[d.id].dense_text == d.dense_text]
    return set(same) - {i for i, _ in engine.missing_vectors(ids=same)} if same else set()


def _given_fit(engine: Engine, batch: list[Document], report: LoadReport, strict: bool) -> list[Document]:
    """The batch without the works one of whose chunks brings vectors the index cannot hold
    (another dimension, or an engine without vectors), each rejected naming its file, line and
    field (a work is written whole or not at all)."""
    dim = engine.dim if isinstance(engine, VectorSearch) else None
    bad: dict[str, ValidationError] = {}
    for d in batch:
        g = d.given_vectors
        if g is not None and (dim is None or len(g.vector) != dim):
            why = ("this engine holds no vectors" if dim is None else
                   f"expected {dim} numbers (the index's dimension), got {len(g.vector)}")
            bad.setdefault(d.work_id, ValidationError(why, field="vector", source=g.source, line=g.line,
                                                      record=d.work_id))
    for e in bad.values():
        report.reject(e, strict)
    return [d for d in batch if d.work_id not in bad] if bad else batch


def _claimable(engine: Engine, batch: list[Document], report: LoadReport, strict: bool) -> list[Document]:
    """The batch without the works one of whose chunk ids is, in the index, a chunk of another
    work (each such work rejected, naming the id)."""
    try:
        stored = engine.doc_info([d.id for d in batch])
    except IndexNotFoundError:  # an OpenSearch index before its first write
        return batch
    taken = {d.work_id: (d.id, stored[d.id].work_id) for d in batch
             if d.id in stored and stored[d.id].work_id != d.work_id}
    for work, (id_, other) in taken.items():
        report.reject(ValidationError(f"id {id_!r} is a chunk of work {other!r} in the index", field="id",
                                      record=work), strict)
    return [d for d in batch if d.work_id not in taken] if taken else batch


def _drop_stale_chunks(engine: Engine, batch: Sequence[Document], written: set[str]) -> int:
    """Delete the chunks of the batch's works that the batch does not have (an older, longer
    version's); returns how many. A work already in `written` (its chunks were apart in the
    input) lost its stale chunks with its first batch, and the chunks written since are kept."""
    works = {d.work_id for d in batch} - written
    written |= works
    ids = {d.id for d in batch}
    stale = [i for i in engine.work_chunks(sorted(works)) if i not in ids] if works else []
    return len(engine.delete(stale)) if stale else 0


def embed_missing(engine: Engine, encoder: Encoder, *, progress: bool = True,
                  batch_size: int = BATCH) -> int:
    """Embed every stored chunk that has no vector yet (resumable: done batches stay done). The
    bar moves with every piece of a batch that is encoded, showing documents/s and an ETA."""
    missing = engine.missing_vectors()
    if missing:
        claim_encoder(engine, encoder, "the index")
    bar = tqdm(total=len(missing), desc="embed", unit="doc", disable=not progress or not missing,
               leave=False, mininterval=1.0)
    try:
        for i in range(0, len(missing), batch_size):
            chunk = missing[i:i + batch_size]

            def advance(fraction: float, start: int = i, size: int = len(chunk)) -> None:
                bar.n = start + size * fraction
                bar.refresh()

            embed_ids(engine, encoder, [d for _, d in chunk], advance)
            bar.n = i + len(chunk)
            bar.refresh()
    finally:
        bar.close()
    return len(missing)


def embed_ids(engine: Engine, encoder: Encoder, docs: Sequence[Document],
              progress: Callable[[float], None] | None = None) -> None:
    """Embed the given documents and store their vectors and passage vectors, each only if its
    chunk's dense text is still the one embedded."""
    vectors, passages, _ = embed(encoder, docs, progress)
    engine.set_vectors([d.id for d in docs], vectors, texts=[d.dense_text for d in docs], passages=passages)


def embed_ids_at(target: str, encoder: Encoder, ids: Sequence[str], *, index: str | None = None,
                 progress: Callable[[float], None] | None = None) -> int:
    """Embed chunks by id and store their vectors: what a worker runs. A URL target is written
    through its engine (`index` names the logical index); a directory gets the vectors appended to
    its journal (op `vector`) without opening the derived indexes, and the process that owns the
    index applies them. Only chunks without a vector for their current text are embedded, so a
    batch run twice does nothing the second time; unknown ids are skipped. Returns how many were
    embedded. `progress` gets the fraction of the chunks to embed that is done."""
    def into_store(store: Store, docs: list[Document]) -> None:
        claim_encoder(store, encoder, f"the index {target}")
        vectors, passages, _ = embed(encoder, docs, progress)
        store.set_vectors([d.id for d in docs], vectors, encoder.name, texts=[d.dense_text for d in docs],
                          only_missing=True, passages=passages)

    def through_engine(engine: Engine, docs: list[Document]) -> None:
        claim_encoder(engine, encoder, f"the index {target}")
        embed_ids(engine, encoder, docs, progress)

    return _derive_at(target, ids, index, "vectors", through_engine, into_store)


def _derive_at(target: str, ids: Sequence[str], index: str | None, what: str,
               through_engine: Callable[[Engine, list[Document]], object],
               into_store: Callable[[Store, list[Document]], object]) -> int:
    """Store what is derived (`what`: "vectors" or "codes") from the chunks `ids` of `target` that
    exist and still lack it, through the engine for a URL or into the journal of a directory;
    returns how many. The target must be an existing hybridsearch index (IndexNotFoundError)."""
    with open_target(target, index) as holder:
        found = holder.missing_vectors(ids=ids) if what == "vectors" else holder.missing_codes(ids=ids)
        docs = [d for _, d in found]
        if docs:
            if isinstance(holder, Store):
                into_store(holder, docs)
            else:
                through_engine(holder, docs)
    return len(docs)


@contextmanager
def open_target(target: str, index: str | None) -> Iterator[Engine | Store]:
    """What a worker writes to: the engine of a URL (`index` names the logical index), or the store
    of an index directory, opened without its derived indexes (the owning process applies what
    is journaled). The target must be an existing hybridsearch index (IndexNotFoundError)."""
    if is_url(target):
        engine = open_engine(target, **({"index": index} if index else {}))
        try:
            engine.stats()  # the index exists and hybridsearch made it
            yield engine
        finally:
            engine.close()
        return
    path = Path(target) / "store.sqlite"
    if not path.is_file():
        raise IndexNotFoundError(f"no index at {target}")
    store = Store(path, create=False)  # a worker never makes a store: an empty one is damaged
    try:
        yield store
    finally:
        store.close()


def graph_at(target: str, index: str | None = None, *, force: bool = False) -> tuple[GraphSummary, bool]:
    """Build the citation graph of an index and store it with the index, unless the stored one
    was built from the same input: what the `graph` worker runs (`indexer.graph.update_graph`)."""
    with open_target(target, index) as holder:
        if not isinstance(holder, GraphStore | Store):
            raise UnsupportedCapabilityError("this engine does not store a citation graph")
        return update_graph(holder, force=force)


def encode_hdc_missing(engine: Engine, *, progress: bool = True) -> int:
    """HDC-encode every stored chunk that has no codes yet (resumable)."""
    missing = engine.missing_codes()
    enc = _binary(engine).hdc_encoder()
    for i in tqdm(range(0, len(missing), BATCH), desc="hdc", unit="batch",
                  disable=not progress or len(missing) < BATCH, leave=False):
        chunk = missing[i:i + BATCH]
        engine.set_codes([d.id for _, d in chunk], enc.encode_documents([d for _, d in chunk]))
    return len(missing)


def encode_hdc_ids(target: str, ids: Sequence[str], *, index: str | None = None) -> int:
    """HDC-encode chunks by id: the offline encoding a worker runs, stored like `embed_ids_at`
    stores vectors (through the engine for a URL, into the journal for a directory)."""
    def through_engine(engine: Engine, docs: list[Document]) -> None:
        enc = _binary(engine).hdc_encoder()
        engine.set_codes([d.id for d in docs], enc.encode_documents(docs))

    def into_store(store: Store, docs: list[Document]) -> None:
        analyzer = default_analyzer()  # as the engine would: refused when the index has another lexicon
        check_lexicon(store.get_meta("lexicon"), analyzer, target)
        enc = HdcEncoder(analyzer, **store.hdc_options())
        store.set_codes([d.id for d in docs], enc.encode_documents(docs), only_missing=True)

    return _derive_at(target, ids, index, "codes", through_engine, into_store)


def missing_vector_ids(engine: Engine) -> list[str]:
    return [i for i, _ in engine.missing_vectors()]
