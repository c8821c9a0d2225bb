"""Small builders for index tests: real chunk shapes, vectors chosen by the test."""

from __future__ import annotations

import numpy as np

from metis_indexer.documents import Chunk
from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.index.store import FileRecord
from metis_indexer.limits import VectorKind

DIM = 8


def record(
    path: str, source: str = "docs", kind: str = "md", title: str | None = None, chunks: int = 1
) -> FileRecord:
    return FileRecord(
        source=source,
        path=path,
        kind=kind,
        size=10,
        mtime_ns=1,
        hash="h" + path,
        state="indexed",
        indexed_at="2026-11-30T00:00:00Z",
        title=title,
        chunks=chunks,
    )


def chunk(
    text: str,
    headings: tuple[str, ...] = (),
    line: int | None = 1,
    title: str | None = None,
    page: int | None = None,
) -> Chunk:
    return Chunk(
        title=title, headings=headings, text=text, page=page, line=line, section=0, start=0
    )


def axis(i: int, dim: int = DIM) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i] = 1.0
    return v


def new_index(folder, dim: int = DIM, vectors: VectorKind = "float32") -> Index:
    index = Index(folder, vectors)
    index.adopt(IndexSettings("test-model", dim, 1200, 200))
    return index
