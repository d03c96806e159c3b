"""Loaders (plugins, group `hybridsearch.loaders`): JSONL, BEIR, Atlas markdown, text directories.

A loader yields valid Documents. A bad record is reported with its file and line and skipped,
so the rest of the file still loads; with `strict=True` the first bad record raises instead.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from hybridsearch.errors import ValidationError
from hybridsearch.models import VECTOR_FIELDS, Document, Query, check_finite, check_limits, validate_record
from indexer.chunking import chunk_document

MONTHS = {m: i for i, m in enumerate(["january", "february", "march", "april", "may", "june", "july",
                                      "august", "september", "october", "november", "december"], 1)}
_MODEL_FIELDS = set(Document.model_fields) | {"topic", "claim", "abstract", "tags", "file",
                                              "utilityActs", "utilityNote"}


@dataclass
class LoadReport:
    """What a load saw: accepted documents and rejected records with their reasons."""

    loaded: int = 0
    rejected: list[ValidationError] = field(default_factory=list)

    def reject(self, err: ValidationError, strict: bool) -> None:
        if strict:
            raise err
        self.rejected.append(err)


@runtime_checkable
class Loader(Protocol):
    name: ClassVar[str]

    def load(self, path: Path, report: LoadReport, *, strict: bool = False) -> Iterator[Document]: ...


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, without a UTF-8 byte order mark at its start: for files small by nature
    (a markdown or text document); line-oriented files are streamed (`_read_lines`)."""
    try:
        return path.read_bytes().removeprefix(codecs.BOM_UTF8)
    except OSError as e:
        raise ValidationError(f"cannot read: {e.strerror}", source=str(path)) from e


def _read_text(path: Path) -> str:
    """The file's text (a UTF-8 byte order mark at its start is dropped)."""
    try:
        return _read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError(f"not UTF-8 ({e.reason} at byte {e.start})", source=str(path)) from e


def _read_lines(path: Path, bad: Callable[[ValidationError], None] | None = None) -> Iterator[tuple[int, str]]:
    """Non-blank lines with 1-based numbers, read as they are asked for (a corpus file is never held
    whole). Splits on LF only (CRLF tolerated), so that U+2028 or a form feed inside a JSON string
    never splits a record; a UTF-8 byte order mark at the file's start is dropped. Each line is
    decoded alone: one that is not UTF-8 goes to `bad` (skipped and reported, as a malformed record
    is), or raises without it."""
    try:
        with path.open("rb") as f:  # binary lines end at LF only
            for lineno, raw in enumerate(f, 1):
                raw = raw.removesuffix(b"\n")
                if lineno == 1:
                    raw = raw.removeprefix(codecs.BOM_UTF8)
                try:
                    line = raw.decode("utf-8").rstrip("\r")
                except UnicodeDecodeError as e:
                    err = ValidationError(f"not UTF-8 ({e.reason} at byte {e.start + 1} of the line)",
                                          source=str(path), line=lineno)
                    if bad is None:
                        raise err from e
                    bad(err)
                    continue
                if line.strip():
                    yield lineno, line
    except OSError as e:
        raise ValidationError(f"cannot read: {e.strerror}", source=str(path)) from e


def _json_records(path: Path, report: LoadReport, strict: bool) -> Iterator[tuple[int, Any]]:
    for lineno, line in _read_lines(path, lambda e: report.reject(e, strict)):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            report.reject(ValidationError(f"invalid JSON: {e.msg} (column {e.colno})",
                                          source=str(path), line=lineno), strict)
            continue
        except RecursionError:
            report.reject(ValidationError("invalid JSON: nested too deeply", source=str(path), line=lineno), strict)
            continue
        yield lineno, obj


Record = tuple[str, int | None, str, list[Document]]  # (source, line, record id, its chunks)


def _unique(records: Iterator[Record], report: LoadReport, strict: bool) -> Iterator[Document]:
    """Each record's chunks, unless one of their ids was taken by an earlier record's chunk: then the whole record
    is rejected, naming its file, line and the id, and where the id was first seen."""
    owner: dict[str, tuple[str, str, int | None]] = {}  # chunk id -> (record, source, line) it came from
    for source, lineno, rid, chunks in records:
        taken = next((c.id for c in chunks if c.id in owner), None)
        if taken is not None:
            first, where, at = owner[taken]
            seen = f"{where}:{at}" if at is not None else where
            what = (f"duplicate id (first in {seen})" if first == taken == rid else
                    f"chunk id {taken!r} is taken by an earlier record ({first!r}, {seen})")
            report.reject(ValidationError(what, field="id", record=rid, source=source, line=lineno), strict)
            continue
        owner.update((c.id, (rid, source, lineno)) for c in chunks)
        report.loaded += 1
        yield from chunks


class JsonlLoader:
    """One work per line in our own schema (canonical names or their aliases). A long text is
    split into chunks (pages, then word windows with overlap); a line that is already a chunk
    (it names a `work_id` other than its id) is kept as it is."""

    name: ClassVar[str] = "jsonl"

    def load(self, path: Path, report: LoadReport, *, strict: bool = False) -> Iterator[Document]:
        return self.records(_json_records(path, report, strict), str(path), report, strict)

    def records(self, items: Iterable[tuple[int, Any]], where: str, report: LoadReport, strict: bool = False
                ) -> Iterator[Document]:
        """Documents of numbered records (JSON-like mappings, or Document instances) read from
        `where`, as `load` makes them of a file's lines."""
        def parsed() -> Iterator[Record]:
            for lineno, obj in items:
                try:
                    doc = (validate_record(Document, obj, source=where, line=lineno) if not isinstance(obj, Document)
                           else _checked_document(obj, where, lineno))
                    chunks = chunk_document(doc) if doc.work_id == doc.id else [doc]
                    if doc.given_vectors is not None:
                        if len(chunks) > 1:
                            raise ValidationError(
                                f"a record with a vector is one chunk, but its text splits into {len(chunks)} "
                                "(give each chunk as a record of its own, with work_id and chunk_no)",
                                field="vector", source=where, line=lineno, record=doc.id)
                        chunks[0].with_vectors(doc.given_vectors)
                except ValidationError as e:
                    report.reject(e, strict)
                    continue
                yield where, lineno, doc.id, chunks

        yield from _unique(parsed(), report, strict)


def _checked_document(doc: Document, where: str, lineno: int) -> Document:
    """A Document made in Python, checked as a record of a file is (its limits)."""
    try:
        check_limits(doc)
    except ValidationError as e:
        raise e.located(source=where, line=lineno) from None
    return doc


def parse_date(text: str) -> tuple[int | None, int | None]:
    """Year and month from free text: "CACM December, 1958" -> (1958, 12); "2021-03-05" -> (2021, 3)."""
    m = re.search(r"\b(\d{4})-(\d{1,2})(?:-\d{1,2})?\b", text)
    if m and 1 <= int(m.group(2)) <= 12:
        return int(m.group(1)), int(m.group(2))
    year_m = re.search(r"\b(1[5-9]\d\d|20\d\d)\b", text)
    month = next((MONTHS[w] for w in re.findall(r"[a-z]+", text.lower()) if w in MONTHS), None)
    if month is None:
        month = next((i for w in re.findall(r"[a-z]{3,}", text.lower())
                      for name, i in MONTHS.items() if name.startswith(w) and len(w) >= 3), None)
    return (int(year_m.group(1)) if year_m else None), (month if year_m else None)


def _as_list(value: Any, fieldname: str) -> list[str]:
    if isinstance(value, str):
        return [p.strip() for p in re.split(r"[;,]", value) if p.strip()]
    if isinstance(value, list) and all(isinstance(v, str | int) for v in value):
        return [str(v) for v in value]
    raise ValueError(f"metadata.{fieldname}: expected a string or a list of strings")


def beir_record(obj: Any) -> dict[str, Any]:
    """Map a BEIR corpus line onto our schema: recognised metadata keys become fields."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    meta = obj.get("metadata") or {}
    if not isinstance(meta, dict):
        raise ValueError("metadata: expected an object")
    check_finite(meta)
    out: dict[str, Any] = {k: v for k, v in obj.items()
                           if (k in _MODEL_FIELDS or k in VECTOR_FIELDS) and k != "metadata"}
    if "_id" in obj:
        out["id"] = obj["_id"] if not isinstance(obj["_id"], int) else str(obj["_id"])
    rest: dict[str, Any] = {}
    subjects: list[str] = list(out.get("subjects", []))
    for key, value in meta.items():
        k = key.lower()
        if k in ("subjects", "tags", "keywords", "categories"):
            subjects.extend(_as_list(value, key))
        elif k in ("authors", "cites"):
            out[k] = _as_list(value, key)
        elif k == "year":
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            out["year"] = value
        elif k == "date":
            if not isinstance(value, str):
                raise ValueError("metadata.date: expected a string")
            out["date"] = value
            year, month = parse_date(value)
            if year is not None:
                out.setdefault("year", year)
                out.setdefault("month", month)
        elif k in ("venue", "kind", "license"):
            out[k] = value
        else:
            rest[key] = value
    if subjects:
        out["subjects"] = list(dict.fromkeys(subjects))
    out["metadata"] = rest
    return out


class BeirLoader:
    """A BEIR dataset directory (corpus.jsonl) or a corpus file. Reads links.tsv as citations."""

    name: ClassVar[str] = "beir"

    def load(self, path: Path, report: LoadReport, *, strict: bool = False) -> Iterator[Document]:
        corpus = path / "corpus.jsonl" if path.is_dir() else path
        links = load_links(corpus.parent / "links.tsv")
        npy = corpus.with_suffix(".npy")
        rows = _vector_file(npy) if npy.is_file() else None

        def parsed() -> Iterator[Record]:
            for lineno, obj in _json_records(corpus, report, strict):
                try:
                    rec = beir_record(obj)
                    cited = links.get(str(rec.get("id")))
                    if cited:
                        rec["cites"] = list(dict.fromkeys([*rec.get("cites", []), *cited]))
                    if rows is not None:
                        if lineno > len(rows):
                            raise ValidationError(f"{npy.name} has {len(rows)} rows, none for this line",
                                                  field="vector", source=str(corpus), line=lineno)
                        rec["vector"] = rows[lineno - 1].tolist()
                    doc = validate_record(Document, rec, source=str(corpus), line=lineno)
                    yield str(corpus), lineno, doc.id, [doc]
                except ValueError as e:
                    report.reject(ValidationError(str(e), source=str(corpus), line=lineno,
                                                  record=str(obj.get("_id")) if isinstance(obj, dict) else None),
                                  strict)
                except ValidationError as e:
                    report.reject(e, strict)

        yield from _unique(parsed(), report, strict)


def _vector_file(path: Path) -> np.ndarray:
    """`corpus.npy` beside a BEIR corpus: one vector per line of corpus.jsonl, in order (a 2-d
    array of numbers), mapped rather than read whole."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValidationError(f"not a readable .npy array: {e}", source=str(path)) from None
    if arr.ndim != 2 or arr.dtype.kind not in "fiu":
        raise ValidationError(f"expected a 2-d array of numbers (one row per line of corpus.jsonl), got shape "
                              f"{arr.shape} of {arr.dtype}", source=str(path))
    return arr


def load_links(path: Path) -> dict[str, list[str]]:
    """Undirected citation pairs `a<TAB>b`; both documents list each other in `cites` (the
    citation graph orients a pair by the documents' dates: indexer/graph.py)."""
    if not path.exists():
        return {}
    out: dict[str, list[str]] = {}
    for lineno, line in _read_lines(path):
        parts = line.split("\t")
        # a header line (`doc-id-a<TAB>doc-id-b`) is read as a pair too: it names no document, so
        # it links nothing, where guessing it from its words could drop a real first pair
        if len(parts) != 2:
            raise ValidationError("expected two tab-separated ids", source=str(path), line=lineno)
        a, b = parts[0].strip(), parts[1].strip()
        if not a or not b:
            raise ValidationError("an empty id: expected two tab-separated ids", source=str(path), line=lineno)
        out.setdefault(a, []).append(b)
        out.setdefault(b, []).append(a)
    return out


def load_queries(path: Path) -> list[Query]:
    """BEIR queries.jsonl; metadata (such as `intent`) is kept."""
    qfile = path / "queries.jsonl" if path.is_dir() else path
    out = []
    for lineno, obj in _json_records(qfile, LoadReport(), strict=True):  # the first bad line raises
        if isinstance(obj, dict):
            obj = {("id" if k == "_id" else k): (str(v) if k == "_id" else v) for k, v in obj.items()
                   if k in ("_id", "id", "text", "metadata")}
        out.append(validate_record(Query, obj, source=str(qfile), line=lineno))
    return out


def load_qrels(path: Path, split: str = "test") -> dict[str, dict[str, int]]:
    """BEIR qrels/<split>.tsv (header optional, CRLF tolerated), or TREC qrels (`qid 0 docid grade`,
    tabs or spaces) -> {query: {doc: grade}}."""
    if not path.exists():
        raise ValidationError("no such file or directory", source=str(path))
    qfile = path / "qrels" / f"{split}.tsv" if path.is_dir() else path
    if not qfile.exists():
        raise ValidationError(f"no qrels for split {split!r}", source=str(qfile))
    out: dict[str, dict[str, int]] = {}
    for lineno, line in _read_lines(qfile):
        parts = line.strip().split("\t")
        if len(parts) == 1:  # TREC qrels are separated by spaces
            parts = line.split()
        if lineno == 1 and parts[0] == "query-id":
            continue
        if len(parts) == 4:  # TREC format: qid 0 docid grade
            parts = [parts[0], parts[2], parts[3]]
        if len(parts) != 3 or not re.fullmatch(r"-?[0-9]+", parts[2]):
            raise ValidationError("expected query-id<TAB>corpus-id<TAB>score (a whole number)", source=str(qfile),
                                  line=lineno)
        out.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return out


_SECTION_ALIASES: dict[str, tuple[str, ...]] = {
    "definition": ("definition", "definitions", "def", "defn"),
    "theorem": ("theorem", "theorems", "statement", "main result", "result", "proposition"),
    "lemma": ("lemma", "lemmas"),
    "proof": ("proof", "proof sketch", "sketch", "argument"),
    "example": ("example", "examples", "illustration"),
    "procedure": ("procedure", "algorithm", "method", "steps", "how to", "recipe"),
    "condition": ("condition", "conditions", "hypotheses", "assumptions", "prerequisites", "when it applies"),
    "summary": ("summary", "overview", "abstract", "tl;dr", "synopsis"),
    "reference": ("references", "reference", "see also", "further reading", "bibliography"),
    "history": ("history", "background", "context", "origins"),
    "usage": ("usage", "uses", "applications", "when to use", "utility"),
}


def section_type(heading: str) -> str:
    """Map a `## Heading` to a section type through loose aliases; unmatched headings are `other`."""
    h = re.sub(r"[^a-z; ]+", " ", heading.lower()).strip()
    h = re.sub(r"\s+", " ", h)
    for kind, aliases in _SECTION_ALIASES.items():
        if h in aliases or any(h.startswith(a + " ") or h.endswith(" " + a) for a in aliases):
            return kind
    return "other"


def parse_atlas(text: str) -> tuple[str | None, str, str, list[tuple[str, str, str]]]:
    """Atlas markdown -> (atlas_id, title, body before the first `##`, [(heading, type, content)])."""
    lines = text.splitlines()
    atlas_id = None
    for i, line in enumerate(lines[:32]):
        m = re.match(r"^\s*atlas_id\s*:\s*(\S+)\s*$", line)
        if m:
            atlas_id = m.group(1).strip("\"'")
            del lines[i]
            break
    title, body, sections = "", [], []  # type: ignore[var-annotated]
    current: list[str] | None = None
    for line in lines:
        if line.strip() == "---":
            continue
        if line.startswith("# ") and not title:
            title = line[2:].strip()
        elif line.startswith("## "):
            heading = line[3:].strip()
            current = []
            sections.append((heading, section_type(heading), current))
        elif current is not None:
            current.append(line)
        else:
            body.append(line)
    return atlas_id, title, "\n".join(body).strip(), [(h, t, "\n".join(c).strip()) for h, t, c in sections]


class AtlasLoader:
    """Atlas markdown files (a file or a directory of `.md`). Strategy `section` (default): one
    atom document plus one per section; `atom`: one document with the full content."""

    name: ClassVar[str] = "atlas"

    def __init__(self, strategy: str = "section") -> None:
        if strategy not in ("section", "atom"):
            raise ValidationError(f"chunk strategy must be one of section, atom; got {strategy!r}",
                                  field="strategy")
        self.strategy = strategy

    def load(self, path: Path, report: LoadReport, *, strict: bool = False) -> Iterator[Document]:
        def parsed() -> Iterator[Record]:
            for f in sorted(path.rglob("*.md")) if path.is_dir() else [path]:
                try:
                    docs = self._file(f, path if path.is_dir() else f.parent)
                    yield str(f), None, docs[0].id, docs
                except ValidationError as e:
                    report.reject(e, strict)

        yield from _unique(parsed(), report, strict)

    def _file(self, f: Path, root: Path) -> list[Document]:
        text = _read_text(f)
        atlas_id, title, body, sections = parse_atlas(text)
        if not title:
            raise ValidationError("missing '# Title' line", source=str(f), field="title")
        work_id = atlas_id or f.relative_to(root).with_suffix("").as_posix()
        meta: dict[str, Any] = {"atlas_id": atlas_id, "source_uri": f"atlas:{atlas_id}"} if atlas_id else {}
        common = {"work_id": work_id, "source": f.name, "metadata": meta}
        if self.strategy == "atom":
            full = "\n\n".join([body] + [f"{h}\n{c}" for h, _, c in sections]).strip()
            return [self._doc(f, {"id": work_id, "title": title, "text": full or title, **common})]
        docs = [self._doc(f, {"id": work_id, "title": title, "text": body or title, **common})]
        for n, (heading, kind, content) in enumerate(sections, 1):
            if not content:
                continue
            rec: dict[str, Any] = {"id": f"{work_id}#{n}", "chunk_no": n, "title": f"{title}: {heading}",
                                   "text": content, "kind": kind, **common,
                                   "metadata": {**meta, "section": heading, "section_type": kind}}
            if kind in ("procedure", "condition"):
                rec[kind] = content
            docs.append(self._doc(f, rec))
        return docs

    @staticmethod
    def _doc(f: Path, rec: dict[str, Any]) -> Document:
        result: Document = validate_record(Document, rec, source=str(f))
        return result


class TextDirLoader:
    """A directory of `.md` / `.txt` files: one work each, the first line its title; long files
    are split into chunks (form feeds mark pages)."""

    name: ClassVar[str] = "textdir"

    def load(self, path: Path, report: LoadReport, *, strict: bool = False) -> Iterator[Document]:
        files = sorted(p for p in (path.rglob("*") if path.is_dir() else [path])
                       if p.suffix in (".md", ".txt") and p.is_file())
        root = path if path.is_dir() else path.parent
        for f in files:
            try:
                first, _, rest = _read_text(f).strip().partition("\n")
                title = first.lstrip("#").strip()
                if not title:
                    raise ValidationError("empty file", source=str(f), field="text")
                text = rest.strip() or title
                rel = f.relative_to(root).as_posix()
                doc = validate_record(Document, {"id": rel, "title": title, "text": text,
                                                 "source": rel}, source=str(f))
            except ValidationError as e:
                report.reject(e, strict)
                continue
            report.loaded += 1
            yield from chunk_document(doc)


def detect_loader(path: Path) -> str:
    """Guess the loader for a path: BEIR directory, JSONL file, Atlas markdown or text directory."""
    if path.is_dir():
        if (path / "corpus.jsonl").exists():
            return "beir"
        mds = list(path.rglob("*.md"))[:20]
        if mds and all(_looks_atlas(p) for p in mds) and not any(path.rglob("*.txt")):  # atlas reads .md only
            return "atlas"
        return "textdir"
    if path.name == "corpus.jsonl":
        return "beir"
    if path.suffix == ".jsonl":
        return "jsonl"
    if path.suffix == ".md" and _looks_atlas(path):
        return "atlas"
    return "textdir"


def _looks_atlas(p: Path) -> bool:
    try:
        head = p.read_text(encoding="utf-8", errors="replace")[:4000]
    except OSError:
        return False
    return bool(re.search(r"^# \S", head, re.M)) and bool(re.search(r"^## \S", head, re.M))
