"""Domain models: documents (works and chunks), queries, filters and ranked results."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson
import pydantic
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from hybridsearch.errors import ValidationError

# Canonical scored fields and their BM25 weights (MRP-VM field weights plus khive's tag weight).
BM25_FIELD_WEIGHTS: dict[str, float] = {
    "title": 1.5,
    "text": 1.0,
    "procedure": 1.0,
    "utility_acts": 0.8,
    "utility_note": 0.6,
    "condition": 0.6,
    "role": 0.5,
    "subjects": 1.25,
}
TEXT_FIELDS: tuple[str, ...] = tuple(f for f in BM25_FIELD_WEIGHTS if f != "subjects")
# Scored fields joined from others: one field holding their tokens in order, so that BM25 counts a
# term's frequency, the length and the document frequency over them together (BEIR's "flat" index of
# title and text). `hybrid` scores `title_text` instead of title and text apart.
JOINED_FIELDS: dict[str, tuple[str, ...]] = {"title_text": ("title", "text")}
# every field both engines index for BM25
SCORED_FIELDS: tuple[str, ...] = (*BM25_FIELD_WEIGHTS, *JOINED_FIELDS)
# Document.passages: where a sentence ends, and how many passages a chunk has at most
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")
MAX_PASSAGES = 64
# limits every engine can hold: OpenSearch ids are at most 512 bytes, its integers 32-bit, a
# keyword value one Lucene term (32,766 bytes) and a JSON whole number 64-bit
MAX_ID_BYTES = 512
INT32_MAX = 2**31 - 1
MAX_KEYWORD_BYTES = 32_766
KEYWORD_FIELDS = ("work_id", "subjects", "authors", "venue", "date", "kind", "license", "source", "cites")


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every key and scalar inside a JSON-like value: `a.b[2]` for a value, the
    key's repr after its parent's path (or "a key" at the top) for a key."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield (f"{path}.{k!r}" if path else "a key"), k
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def check_finite(value: Any, path: str = "") -> None:
    """Reject NaN, infinities and whole numbers beyond 64 bits anywhere inside a JSON-like value."""
    for at, v in _leaves(value, path):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"non-finite number {v!r}" + (f" at {at}" if at else ""))
        if isinstance(v, int) and not -2**63 <= v < 2**64:
            raise ValueError("whole number outside the 64-bit range" + (f" at {at}" if at else ""))


def check_unicode(value: Any) -> None:
    """Reject text that is not valid Unicode (a lone surrogate, which JSON's \\ud800 escapes can
    make) anywhere inside a JSON-like value, keys included: no engine can store it as UTF-8."""
    try:
        orjson.dumps(value)  # a C pass that refuses surrogates (and what it cannot write: then the walk)
        return
    except (TypeError, orjson.JSONEncodeError):
        pass
    for at, v in _leaves(value):
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"invalid text: a lone surrogate {v[e.start]!r} at character {e.start}"
                                 + (f" of {at}" if at else "")) from None


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


def _alias(*names: str) -> Any:
    return Field(default="", validation_alias=AliasChoices(*names))


def _not_blank(v: str) -> str:
    """A name or text that must hold something besides whitespace."""
    if not v.strip():
        raise ValueError("must not be blank")
    return v


VECTOR_FIELDS = ("vector", "passage_vectors")


@dataclass(frozen=True)
class GivenVectors:
    """A chunk's vector (unit length) and passage vectors (one unit row per passage, or None:
    then its own vector stands for them), given on input, with where they were read."""

    vector: np.ndarray
    passages: np.ndarray | None
    source: str | None = None
    line: int | None = None

    def rows(self) -> np.ndarray:
        return self.passages if self.passages is not None else self.vector[None, :]


def given_vectors(data: Mapping[str, Any], source: str | None = None, line: int | None = None
                  ) -> GivenVectors | None:
    """`vector` (a list of numbers) and `passage_vectors` (a list of such lists) of an input record,
    checked: finite, not all zeros, all of one length; scaled to unit length. None without them;
    else a ValueError naming the field."""
    if "vector" not in data:
        if "passage_vectors" in data:
            raise ValueError("passage_vectors: given without a vector (give both, or only a vector)")
        return None
    vec = _unit_row(data["vector"], "vector")
    passages = data.get("passage_vectors")
    if passages is None:
        return GivenVectors(vec, None, source, line)
    if not isinstance(passages, list) or not passages:
        raise ValueError("passage_vectors: expected a non-empty list of vectors")
    rows = np.vstack([_unit_row(p, f"passage_vectors[{i}]", len(vec)) for i, p in enumerate(passages)])
    return GivenVectors(vec, rows, source, line)


def _unit_row(value: Any, where: str, dim: int | None = None) -> np.ndarray:
    if not isinstance(value, list) or not value or not all(type(x) in (int, float) for x in value):
        raise ValueError(f"{where}: expected a non-empty list of numbers")
    if dim is not None and len(value) != dim:
        raise ValueError(f"{where}: expected {dim} numbers (as many as vector), got {len(value)}")
    row = np.asarray(value, dtype=np.float64)
    if not np.isfinite(row).all():
        raise ValueError(f"{where}: every value must be finite")
    scale = float(np.abs(row).max())
    if scale == 0.0:
        raise ValueError(f"{where}: all zeros (a vector without a direction has no cosine)")
    row /= scale  # first to at most 1, so that the length cannot overflow
    return (row / np.linalg.norm(row)).astype(np.float32)


class Document(_Model):
    """One indexable unit: a chunk of a work. A BEIR document is a work of one chunk."""

    id: str = Field(min_length=1)
    work_id: str = ""
    chunk_no: int = Field(default=0, ge=0)
    title: str = _alias("title", "topic")
    text: str = _alias("text", "claim", "abstract")
    procedure: str = ""
    utility_acts: str = _alias("utility_acts", "utilityActs")
    utility_note: str = _alias("utility_note", "utilityNote")
    condition: str = ""
    role: str = ""
    subjects: list[str] = Field(default_factory=list, validation_alias=AliasChoices("subjects", "tags"))
    authors: list[str] = Field(default_factory=list)
    venue: str | None = None
    year: int | None = Field(default=None, ge=-9999, le=9999)
    month: int | None = Field(default=None, ge=1, le=12)
    date: str | None = None
    kind: str | None = None
    license: str | None = None
    cites: list[str] = Field(default_factory=list)
    source: str | None = Field(default=None, validation_alias=AliasChoices("source", "file"))
    page: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # vectors computed elsewhere, given on input (`vector`, `passage_vectors`): stored as they are,
    # never part of the document's own fields
    _given: GivenVectors | None = PrivateAttr(default=None)

    @property
    def given_vectors(self) -> GivenVectors | None:
        return self._given

    def with_vectors(self, given: GivenVectors | None) -> Document:
        self._given = given
        return self

    @field_validator("id")
    @classmethod
    def _id_not_blank(cls, v: str) -> str:
        return _not_blank(v)

    @field_validator("metadata")
    @classmethod
    def _metadata_finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_finite(v)
        return v

    @property
    def facts(self) -> list[Fact]:
        """The facts given explicitly under `metadata.facts` (indexer.facts extracts more); input
        is checked at ingest (`check_limits`), and a stored item of another shape is passed over."""
        value = self.metadata.get("facts")
        return [f for f in map(_fact, value) if f is not None] if isinstance(value, list) else []

    @model_validator(mode="after")
    def _has_content(self) -> Document:
        if not self.work_id:
            self.work_id = self.id
        if not any(getattr(self, f).strip() for f in TEXT_FIELDS):
            raise ValueError("title and text are both empty")
        return self

    @property
    def dense_text(self) -> str:
        """The text the dense channel embeds: title + " " + text (BEIR convention)."""
        return f"{self.title} {self.text}".strip()

    @property
    def passages(self) -> list[str]:
        """The texts embedded alone for the passage score (the reranker's semantic component): the
        title, then each sentence of the text (split after . ! or ? where the next sentence starts
        with a capital, a digit or a bracket), at most MAX_PASSAGES (the last one holds the rest).
        All derive from `dense_text`, so a chunk's passages change exactly when its vector does."""
        parts = self._sentences()
        if len(parts) > MAX_PASSAGES:
            parts[MAX_PASSAGES - 1:] = [" ".join(parts[MAX_PASSAGES - 1:])]
        return parts

    @property
    def passage_spans(self) -> list[tuple[int, int]]:
        """Where each of `passages` lies in `dense_text`: (start, end) character offsets (the last
        of MAX_PASSAGES spans the sentences it joins)."""
        dense, pos, spans = self.dense_text, 0, []
        for part in self._sentences():
            start = dense.find(part, pos)
            pos = start + len(part)
            spans.append((start, pos))
        if len(spans) > MAX_PASSAGES:
            spans[MAX_PASSAGES - 1:] = [(spans[MAX_PASSAGES - 1][0], spans[-1][1])]
        return spans

    def _sentences(self) -> list[str]:
        parts = [self.title.strip()] + [s.strip() for s in _SENTENCE_END.split(self.text)]
        return [p for p in parts if p]


@dataclass(frozen=True, slots=True)
class Fact:
    """A (subject, relation, object) statement for symbolic expansion, e.g. ("Tietze extension
    theorem", "requires", "normal space")."""

    subject: str
    relation: str
    object: str

    def __str__(self) -> str:
        return f"{self.subject} {self.relation} {self.object}"


def _fact(item: Any) -> Fact | None:
    """[subject, relation, object] (a list or tuple) or {"subject", "relation", "object"}, three
    non-empty strings, as a Fact; anything else None."""
    parts = ([item.get(k) for k in ("subject", "relation", "object")] if isinstance(item, Mapping)
             else item if isinstance(item, list | tuple) and len(item) == 3 else [])
    texts = [p.strip() for p in parts if isinstance(p, str) and p.strip()]
    return Fact(*texts) if len(texts) == 3 else None


def check_facts(value: Any) -> None:
    """`metadata.facts` on input: a list of facts, else one ValidationError naming the item."""
    if not isinstance(value, list | tuple):
        raise ValidationError("expected a list of [subject, relation, object]", field="metadata.facts")
    for i, item in enumerate(value):
        if _fact(item) is None:
            raise ValidationError("expected [subject, relation, object], three non-empty strings",
                                  field=f"metadata.facts[{i}]")


class Query(_Model):
    id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, v: str) -> str:
        return _not_blank(v)

    @field_validator("metadata")
    @classmethod
    def _metadata_finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_finite(v)
        return v

    @property
    def intent(self) -> str | None:
        value = self.metadata.get("intent")
        return value if isinstance(value, str) else None


class DateRange(_Model):
    """Inclusive range on (year, month). A bound without a month covers the whole year."""

    gte: str | int | None = None
    lte: str | int | None = None

    def bounds(self) -> tuple[int | None, int | None]:
        """The bounds as year*100+month integers, the form the engines index; a range that holds
        no date is refused (it would match nothing, silently)."""
        lo, hi = _ym(self.gte, lower=True), _ym(self.lte, lower=False)
        if lo is not None and hi is not None and lo > hi:
            raise ValidationError(f"the range is empty: {self.gte!r} is after {self.lte!r}", field="date_range")
        return lo, hi


def _ym(value: str | int | None, *, lower: bool) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    year_s, _, month_s = text.partition("-")
    if not (year_s.isascii() and year_s.isdigit()) or (month_s and not (month_s.isascii() and month_s.isdigit())):
        raise ValidationError(f"expected YYYY or YYYY-MM, got {text!r}", field="date_range")
    if int(year_s) > 9999:
        raise ValidationError(f"year out of range in {text!r} (at most 9999, as documents' years)", field="date_range")
    month = int(month_s) if month_s else (0 if lower else 12)  # 0: before January, for a whole year
    if month_s and not 1 <= month <= 12:
        raise ValidationError(f"month out of range in {text!r}", field="date_range")
    return int(year_s) * 100 + month


class Filters(_Model):
    """Filters that mean the same in every channel and on every engine."""

    date_range: DateRange | None = None
    subjects: list[str] | None = None
    sources: list[str] | None = None
    kind: list[str] | None = None
    license: list[str] | None = None

    @field_validator("subjects", "sources", "kind", "license")
    @classmethod
    def _no_blank_value(cls, v: list[str] | None, info: Any) -> list[str] | None:
        if v is not None and any(not x.strip() for x in v):
            raise ValidationError("a blank value names nothing; leave it out", field=info.field_name)
        return v

    def is_empty(self) -> bool:
        return not any(getattr(self, f) for f in type(self).model_fields)


@dataclass(frozen=True, slots=True)
class DocInfo:
    """The few fields that diversity, evidence packing and reranking need, small enough to cache
    per chunk. `authors` and `subjects` are sets, as sorted tuples (OpenSearch serves them from
    doc values, which keep no order)."""

    work_id: str
    source: str | None
    page: int | None
    authors: tuple[str, ...]
    venue: str | None
    kind: str | None
    title: str
    subjects: tuple[str, ...] = ()
    year: int | None = None

    @classmethod
    def of(cls, d: Document) -> DocInfo:
        return cls(d.work_id, d.source, d.page, tuple(sorted(set(d.authors))), d.venue, d.kind, d.title,
                   tuple(sorted(set(d.subjects))), d.year)


@dataclass(slots=True)
class ChannelScore:
    """One channel's view of a hit: raw score, normalised score and 1-based rank."""

    raw: float
    normalized: float | None
    rank: int


class RankedList(BaseModel):
    """One channel's result: ids with scores, best first. Ranks are 1-based list positions."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    channel: str
    ids: list[str] = Field(default_factory=list)
    scores: list[float] = Field(default_factory=list)

    @classmethod
    def of(cls, channel: str, ids: list[str], scores: list[float]) -> RankedList:
        """Build without validation (hot path); callers pass equal-length, sorted lists."""
        return cls.model_construct(channel=channel, ids=ids, scores=scores)

    def __len__(self) -> int:
        return len(self.ids)

    def items(self) -> Iterable[tuple[str, float]]:
        return zip(self.ids, self.scores, strict=True)


@dataclass(slots=True)
class Hit:
    """A ranked result: final score, per-channel scores, and the additive contributions that sum
    to the final score. (A dataclass: the hot path builds hundreds per query.)"""

    id: str
    score: float
    rank: int
    channels: dict[str, ChannelScore] = field(default_factory=dict)
    contributions: dict[str, float] = field(default_factory=dict)
    document: Document | None = None
    components: dict[str, float] = field(default_factory=dict)  # a reranker's features, each in [0, 1]
    via: str = ""  # the chain of facts by which symbolic expansion reached it


class SearchResult(BaseModel):
    query: str
    hits: list[Hit] = Field(default_factory=list)
    diagnostics: dict[str, Any] = Field(default_factory=dict)
    evidence: Any = None  # an evidence pack (query_service.evidence.EvidencePack) when the profile asks


Bm25Mode = Literal["most_fields", "best_fields"]


def error_message(err: Mapping[str, Any]) -> str:
    """The message of one pydantic error, as its validator wrote it (without pydantic's "Value
    error, " in front)."""
    return str(err["msg"]).removeprefix("Value error, ")


def validate_record(model: type[BaseModel], data: Any, *, source: str | None = None,
                    line: int | None = None, strict: bool = False) -> Any:
    """Validate one record, turning pydantic's error into ours (record, field, line); `strict`
    converts no value (no `true` for 1, no "3" for 3)."""
    if not isinstance(data, Mapping):
        raise ValidationError(f"expected a JSON object, got {type(data).__name__}",
                              source=source, line=line)
    record = data.get("id", data.get("_id"))
    given = None
    try:
        if model is Document and any(k in data for k in VECTOR_FIELDS):
            given = given_vectors(data, source, line)
            data = {k: v for k, v in data.items() if k not in VECTOR_FIELDS}
        check_unicode(data)
    except ValueError as e:
        raise ValidationError(str(e), source=source, line=line,
                              record=str(record) if isinstance(record, str | int) else None) from None
    try:
        obj = model.model_validate(data, strict=strict or None)  # None: the model's own setting
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        msg = error_message(err)
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise ValidationError(msg, field=field, source=source, line=line,
                              record=str(record) if record is not None else None) from None
    if isinstance(obj, Document):
        try:
            check_limits(obj)
        except ValidationError as e:
            raise e.located(source=source, line=line) from None
        if given is not None and given.passages is not None and len(given.passages) != len(obj.passages):
            raise ValidationError(f"expected {len(obj.passages)} rows, one per passage (the title, then each "
                                  f"sentence of the text), got {len(given.passages)}", field="passage_vectors",
                                  source=source, line=line, record=obj.id)
        obj.with_vectors(given)
    return obj


def _over(value: str, limit: int) -> bool:
    """Whether `value` takes more than `limit` bytes in UTF-8 (encoded only when it might: a
    character takes at most 4)."""
    return len(value) > limit // 4 and len(value.encode("utf-8")) > limit


def check_limits(doc: Document) -> None:
    """What every engine can hold, and well-formed `metadata.facts` (checked on input, not on
    reading stored documents)."""
    if _over(doc.id, MAX_ID_BYTES):
        raise ValidationError(f"longer than {MAX_ID_BYTES} bytes (UTF-8)", field="id", record=doc.id[:40])
    if not doc.work_id.strip():  # a work of its own, never one that every blank-named chunk shares
        raise ValidationError("must not be blank (leave it out: a chunk is then a work of its own)", field="work_id",
                              record=doc.id)
    for name in ("chunk_no", "page"):
        value = getattr(doc, name)
        if value is not None and value > INT32_MAX:
            raise ValidationError(f"must be at most {INT32_MAX}", field=name, record=doc.id)
    for name in KEYWORD_FIELDS:
        value = getattr(doc, name)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and _over(v, MAX_KEYWORD_BYTES):
                raise ValidationError(f"a value longer than {MAX_KEYWORD_BYTES} bytes (UTF-8)", field=name,
                                      record=doc.id)
    if "facts" in doc.metadata:
        try:
            check_facts(doc.metadata["facts"])
        except ValidationError as e:
            raise ValidationError(e.message, field=e.field, record=doc.id) from None


def check_unique_ids(docs: Iterable[Document], *, source: str | None = None) -> None:
    """A batch to write: unique ids, each document within the limits every engine holds."""
    seen: set[str] = set()
    for d in docs:
        check_limits(d)
        if d.id in seen:
            raise ValidationError("duplicate id in one batch", field="id", source=source, record=d.id)
        seen.add(d.id)
