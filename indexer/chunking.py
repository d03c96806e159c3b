"""Split a long work into chunks: by page (form feeds), then into word windows with overlap.

A chunk keeps the work's fields and metadata; it gets `id = <work id>#<n>`, `work_id`, `chunk_no`
(0-based) and, when split by page, `page` (1-based). A text that fits one window stays one chunk
with the work's own id.
"""

from __future__ import annotations

from hybridsearch.models import Document

WINDOW_WORDS = 300
OVERLAP_WORDS = 50


def chunk_document(doc: Document, *, window: int = WINDOW_WORDS, overlap: int = OVERLAP_WORDS) -> list[Document]:
    if not 0 <= overlap < window:
        raise ValueError(f"overlap must be in [0, window), got overlap={overlap}, window={window}")
    pages = doc.text.split("\f") if "\f" in doc.text else [doc.text]
    pieces: list[tuple[str, int | None]] = []
    for page_no, page in enumerate(pages, 1):
        words = page.split()
        if not words:
            continue
        page_ref = page_no if len(pages) > 1 else doc.page
        step = window - overlap
        for start in range(0, max(len(words) - overlap, 1), step):
            pieces.append((" ".join(words[start:start + window]), page_ref))
    if len(pieces) <= 1:
        return [doc]
    return [doc.model_copy(update={"id": f"{doc.id}#{n}", "work_id": doc.id, "chunk_no": n,
                                   "text": text, "page": page})
            for n, (text, page) in enumerate(pieces)]
