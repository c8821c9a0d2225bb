"""The index held in memory for search, kept in step with the store on disk.

Rows are chunks: a float32 matrix of unit vectors (grown by doubling, viewed as
`[:n_rows]`), BM25 postings, and per-row citation fields as small arrays. Text
stays on disk and is read only for the few chunks a search returns or reranks.
A replaced or dropped document's rows are marked dead and reclaimed by
`compact` once they are many.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from metis_indexer import keyword, tokens
from metis_indexer.documents import Chunk
from metis_indexer.store import FileRecord, Store, StoredChunk


@dataclasses.dataclass(slots=True)
class FileEntry:
    """A file as search sees it: its citation fields and its rows."""

    id: int
    record: FileRecord
    rows: list[int]


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """What an index was built with; a change means every document is read again."""

    model: str
    dimensions: int
    chunk_size: int
    chunk_overlap: int

    def as_meta(self) -> dict[str, str]:
        return {
            "format": "1",
            "model": self.model,
            "dimensions": str(self.dimensions),
            "chunk_size": str(self.chunk_size),
            "chunk_overlap": str(self.chunk_overlap),
        }

    @classmethod
    def from_meta(cls, meta: dict[str, str]) -> Settings | None:
        try:
            return cls(
                meta["model"],
                int(meta["dimensions"]),
                int(meta["chunk_size"]),
                int(meta["chunk_overlap"]),
            )
        except (KeyError, ValueError):
            return None


def keyword_text(title: str | None, headings: Sequence[str], text: str) -> str:
    """What BM25 indexes of a chunk: its title, headings and text."""
    return "\n".join(p for p in (title, *headings, text) if p)


class Index:
    """Chunks in memory and on disk. Thread-safe: passes write while searches read."""

    def __init__(self, folder: Path) -> None:
        self.store = Store(folder)
        self.lock = threading.RLock()
        self.dimensions = 0
        self._clear_memory()

    def _clear_memory(self) -> None:
        self.vocabulary = keyword.Vocabulary()
        self.keyword = keyword.KeywordIndex()
        self.vectors = np.zeros((0, self.dimensions), dtype=np.float32)
        self.n_rows = 0
        self.alive = np.zeros(0, dtype=bool)
        self.has_vector = np.zeros(0, dtype=bool)
        self.row_file = np.zeros(0, dtype=np.int32)
        self.row_chunk = np.zeros(0, dtype=np.int64)
        self.row_page = np.zeros(0, dtype=np.int32)
        self.row_line = np.zeros(0, dtype=np.int32)
        self.row_headings = np.zeros(0, dtype=np.int32)
        self.headings: list[tuple[str, ...]] = []
        self._headings_ids: dict[tuple[str, ...], int] = {}
        self.files: dict[int, FileEntry] = {}
        self.by_key: dict[tuple[str, str], int] = {}
        self.dead = 0

    # -- loading ---------------------------------------------------------------------------

    def settings(self) -> Settings | None:
        return Settings.from_meta(self.store.meta())

    def load(self) -> None:
        """Read the whole index from disk into memory."""
        with self.lock:
            meta_settings = self.settings()
            self.dimensions = meta_settings.dimensions if meta_settings else 0
            self._clear_memory()
            self.vocabulary = keyword.Vocabulary(self.store.words())
            for file_id, record in self.store.files():
                self._add_file(file_id, record)
            batch: list[tuple[int, int, StoredChunk]] = []
            for c in self.store.load_chunks():
                batch.append(
                    (
                        c.id,
                        c.file_id,
                        StoredChunk(
                            c.headings, c.page, c.line, "", c.term_ids, c.counts, c.vector
                        ),
                    )
                )
                if len(batch) >= 8192:
                    self._add_rows(batch)
                    batch = []
            self._add_rows(batch)
            self.keyword.merge(self.alive)

    def reset(self, settings: Settings) -> None:
        """Drop everything and start an index for new settings."""
        with self.lock:
            self.store.clear()
            self.store.set_meta(settings.as_meta())
            self.dimensions = settings.dimensions
            self._clear_memory()

    def set_settings(self, settings: Settings) -> None:
        with self.lock:
            self.store.set_meta(settings.as_meta())
            self.dimensions = settings.dimensions

    # -- writing ---------------------------------------------------------------------------

    def put_document(
        self,
        record: FileRecord,
        chunks: Sequence[Chunk],
        vectors: npt.NDArray[np.float32] | None,
    ) -> None:
        """Replace one file's chunks, on disk (one transaction) and then in memory."""
        if vectors is not None and len(vectors) != len(chunks):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        with self.lock:
            known = len(self.vocabulary)
            stored = []
            for i, c in enumerate(chunks):
                counts = Counter(tokens.words(keyword_text(c.title, c.headings, c.text)))
                ids = np.array(self.vocabulary.add(counts.keys()), dtype=np.int32)
                vec = None if vectors is None else _unit(vectors[i])
                stored.append(
                    StoredChunk(
                        c.headings,
                        c.page,
                        c.line,
                        c.text,
                        ids,
                        np.fromiter(counts.values(), dtype=np.int32, count=len(counts)),
                        vec,
                    )
                )
            new_words = self.vocabulary.words[known:]
            try:
                file_id, chunk_ids = self.store.put_document(record, stored, new_words)
            except BaseException:
                for w in new_words:
                    del self.vocabulary.ids[w]
                del self.vocabulary.words[known:]
                raise
            self._drop_file((record.source, record.path))
            self._add_file(file_id, record)
            self._add_rows(list(zip(chunk_ids, [file_id] * len(stored), stored, strict=True)))
            self.keyword.compact(self.alive)

    def drop_files(self, keys: Sequence[tuple[str, str]]) -> None:
        """Forget files that are gone from their source."""
        if not keys:
            return
        with self.lock:
            self.store.delete_files(keys)
            for key in keys:
                self._drop_file(key)
            self.compact()

    def compact(self) -> None:
        """Reclaim dead rows once they are a third of the matrix."""
        with self.lock:
            if self.dead < 1024 or self.dead * 3 < self.n_rows:
                return
            keep = self.alive[: self.n_rows].copy()
            new_row = np.cumsum(keep) - 1
            n = int(keep.sum())
            self.keyword.remap(new_row, keep)
            for name in ("alive", "has_vector", "row_file", "row_chunk", "row_page",
                         "row_line", "row_headings"):
                arr = getattr(self, name)[: self.n_rows][keep]
                grown = np.zeros(max(n, 1024), dtype=arr.dtype)
                grown[:n] = arr
                setattr(self, name, grown)
            self.vectors = np.ascontiguousarray(self.vectors[: self.n_rows][keep])
            self.n_rows = n
            self.dead = 0
            for entry in self.files.values():
                entry.rows = [int(new_row[r]) for r in entry.rows]

    def _add_file(self, file_id: int, record: FileRecord) -> None:
        self.files[file_id] = FileEntry(file_id, record, [])
        self.by_key[(record.source, record.path)] = file_id

    def _drop_file(self, key: tuple[str, str]) -> None:
        file_id = self.by_key.pop(key, None)
        if file_id is None:
            return
        entry = self.files.pop(file_id)
        self.alive[entry.rows] = False
        self.dead += len(entry.rows)

    def _add_rows(self, chunks: Sequence[tuple[int, int, StoredChunk]]) -> None:
        if not chunks:
            return
        start = self.n_rows
        end = start + len(chunks)
        self._ensure_capacity(end)
        rows = list(range(start, end))
        for row, (chunk_id, file_id, c) in zip(rows, chunks, strict=True):
            self.row_chunk[row] = chunk_id
            self.row_file[row] = file_id
            self.row_page[row] = c.page or 0
            self.row_line[row] = c.line or 0
            self.row_headings[row] = self._heading_id(c.headings)
            if c.vector is not None and self.dimensions == len(c.vector):
                self.vectors[row] = c.vector
                self.has_vector[row] = True
            self.files[file_id].rows.append(row)
        self.alive[start:end] = True
        self.n_rows = end
        self.keyword.add(rows, [c.term_ids for _, _, c in chunks], [c.counts for _, _, c in chunks])

    def _heading_id(self, headings: tuple[str, ...]) -> int:
        hid = self._headings_ids.get(headings)
        if hid is None:
            hid = self._headings_ids[headings] = len(self.headings)
            self.headings.append(headings)
        return hid

    def _ensure_capacity(self, rows: int) -> None:
        capacity = len(self.alive)
        if rows <= capacity and self.vectors.shape[1] == self.dimensions:
            return
        new = max(rows, 2 * capacity, 1024)
        for name in ("alive", "has_vector", "row_file", "row_chunk", "row_page", "row_line",
                     "row_headings"):
            arr = getattr(self, name)
            grown = np.zeros(new, dtype=arr.dtype)
            grown[: len(arr)] = arr
            setattr(self, name, grown)
        vectors = np.zeros((new, self.dimensions), dtype=np.float32)
        if self.vectors.shape[1] == self.dimensions:
            vectors[: self.n_rows] = self.vectors[: self.n_rows]
        self.vectors = vectors
        self.keyword.ensure_capacity(new)

    # -- reading ---------------------------------------------------------------------------

    @property
    def chunk_count(self) -> int:
        return self.n_rows - self.dead


def _unit(v: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    v = np.asarray(v, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v
