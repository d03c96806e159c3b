from __future__ import annotations

import pytest

from hybridsearch.errors import ValidationError
from hybridsearch.models import Document, check_unique_ids, validate_record


def test_aliases_map_to_canonical_fields() -> None:
    d = validate_record(Document, {"id": "u1", "topic": "Compactness", "claim": "Closed and bounded.",
                                   "tags": ["topology"], "file": "notes.pdf", "utilityActs": "prove"})
    assert (d.title, d.text, d.subjects, d.source, d.utility_acts) == (
        "Compactness", "Closed and bounded.", ["topology"], "notes.pdf", "prove")
    assert d.work_id == "u1" and d.chunk_no == 0
    assert d.dense_text == "Compactness Closed and bounded."


@pytest.mark.parametrize(("record", "field", "message"), [
    ({"id": "", "title": "x"}, "id", "at least 1"),
    ({"id": "   ", "title": "x"}, "id", "blank"),
    ({"id": "a", "title": "", "text": ""}, None, "both empty"),
    ({"id": "a", "title": 5}, "title", "string"),
    ({"id": "a", "title": "x", "year": "1958"}, "year", "integer"),
    ({"id": "a", "title": "x", "metadata": {"score": float("nan")}}, "metadata", "non-finite"),
    ({"id": "a", "title": "x", "metadata": {"w": [1.0, float("inf")]}}, "metadata", "non-finite"),
    ({"id": "a", "title": "x", "metadata": {"n": {"big": 2**64}}}, "metadata", "outside the 64-bit range at n.big"),
    ({"id": "a", "title": "x", "colour": "red"}, "colour", "unknown field"),
    # a blank work id made every such chunk one work: updating one dropped the others
    ({"id": "a", "title": "x", "work_id": "  "}, "work_id", "blank"),
])
def test_invalid_records_name_record_and_field(record, field, message) -> None:
    with pytest.raises(ValidationError) as err:
        validate_record(Document, record, source="corpus.jsonl", line=7)
    e = err.value
    assert e.source == "corpus.jsonl" and e.line == 7
    assert message in str(e)
    if field is not None:
        assert e.field == field
        assert f"field {field!r}" in str(e)
    assert "corpus.jsonl:7" in str(e)


def test_duplicate_id_in_one_batch_is_rejected() -> None:
    docs = [Document(id="a", title="x"), Document(id="b", title="y"), Document(id="a", title="z")]
    with pytest.raises(ValidationError, match="duplicate id") as err:
        check_unique_ids(docs)
    assert err.value.record == "a"


def test_limits_every_engine_can_hold() -> None:
    with pytest.raises(ValidationError, match="id.*longer than 512 bytes"):
        validate_record(Document, {"id": "é" * 257, "title": "t"})
    with pytest.raises(ValidationError, match="chunk_no"):
        validate_record(Document, {"id": "a", "title": "t", "chunk_no": 2**31})
    with pytest.raises(ValidationError, match="page"):
        validate_record(Document, {"id": "a", "title": "t", "page": 2**40})
    assert validate_record(Document, {"id": "é" * 256, "title": "t", "chunk_no": 2**31 - 1}).chunk_no == 2**31 - 1


def test_a_blank_query_and_month_zero_are_refused() -> None:
    from hybridsearch.models import DateRange, Query

    with pytest.raises(ValidationError, match="field 'text': must not be blank"):
        validate_record(Query, {"id": "q2", "text": "   "}, source="queries.jsonl", line=2)
    with pytest.raises(ValidationError, match="month out of range in '1900-00'"):
        DateRange(gte="1900-00").bounds()
    assert DateRange(gte="1900", lte="1900-01").bounds() == (190000, 190001)


def test_a_blank_filter_value_is_refused() -> None:
    """It would match differently in different channels of the embedded engine (SQLite and tantivy)."""
    from hybridsearch.models import Filters

    with pytest.raises(ValidationError, match="field 'kind': a blank value names nothing"):
        Filters(kind=["theorem", ""])
    assert Filters(kind=["theorem"]).kind == ["theorem"]
