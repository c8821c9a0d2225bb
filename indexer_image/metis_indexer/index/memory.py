"""The index held in memory for search, kept in step with the store on disk.

Rows are chunks: their unit vectors (`vectors.py`: float32 in memory, or int8 codes
with float32 on disk; grown by doubling, viewed as `[:n_rows]`), BM25 postings, and
per-row citation fields as small arrays. Text stays on disk and is read only for the
few chunks a search returns or reranks.
A replaced or dropped document's rows are marked dead and reclaimed by
`compact` once they are a share of the rows (`compaction_capacity`), in the write path
and again once a pass has stopped: a base read again and again holds what a fresh
load of it would, within a few percent (`tests/indexer/index/test_compaction.py`).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import gc
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from metis_indexer.documents import Chunk
from metis_indexer.index import keyword, snapshot, texts, vectors
from metis_indexer.index.store import ChunkBatch, FileRecord, Store, Stored, Terms, Written
from metis_indexer.index.vectors import Leg, Vectors

log = logging.getLogger(__name__)

MIN_ROWS = 1024
"""Rows the row arrays have room for at least."""
WRITE_SHARE = 4
"""While a pass writes, dead rows are reclaimed once they are a quarter of the rows (and
at least `MIN_ROWS`): each compaction then reclaims as many rows as a quarter of what it
copies, so a pass's compactions cost a few copies of the index, and the dense scan
passes over the dead rows in pieces meanwhile (`vectors.allowed_spans`)."""
COMMON_SHARE = 0.25
"""A word held by more than this share of a base's chunks is too common to mark in a
snippet (`Reading.telling`)."""
IDLE_SHARE = 16
"""Once a pass has stopped, dead rows are reclaimed once they are a sixteenth of the
rows, or the arrays hold room for a sixteenth more than they need: what the next pass
edits is a small share, and what memory holds is then within about 6 % of a fresh
load's."""


def compaction_capacity(n_rows: int, dead: int, capacity: int, idle: bool) -> int | None:
    """The capacity to compact the rows to now, or None to leave them as they are.

    While writing (`idle` False): room for a half more than the live rows, so that the rest
    of a full reindex fills it without growing before the next compaction (at a quarter
    dead, the rows are a third more than the live ones). Once idle: room for a thirty-
    second more, so that the edits of a few files fit without growing (a fresh load has
    room for its rows alone). Arrays of `MIN_ROWS` or fewer rows are left with their dead
    rows: they would be as large without them, and scanning them costs microseconds."""
    live = n_rows - dead
    if not idle:
        if dead >= MIN_ROWS and dead * WRITE_SHARE >= n_rows:
            return max(MIN_ROWS, live + live // 2)
        return None
    fit = max(MIN_ROWS, live + live // 32)
    spare = capacity * IDLE_SHARE > fit * (IDLE_SHARE + 1)
    if spare or (n_rows > MIN_ROWS and dead * IDLE_SHARE >= n_rows):
        return fit
    return None


def grown(capacity: int, needed: int, dead: int) -> int:
    """The capacity rows grow to when `needed` rows are more than it holds. With no dead
    row the index grows: doubling keeps appends cheap. With dead rows a pass replaces
    documents, and a compaction reclaims the dead before the live rows are a half more
    (`compaction_capacity`): room for that, and an eighth more than is needed now."""
    if dead == 0:
        return max(needed, 2 * capacity, MIN_ROWS)
    live = needed - dead
    return max(needed + needed // 8, live + live // 2, MIN_ROWS)


@dataclasses.dataclass(slots=True)
class FileEntry:
    """A file as search sees it: its citation fields (its rows say `row_file`)."""

    id: int
    record: FileRecord


@dataclasses.dataclass(frozen=True, slots=True)
class IndexSettings:
    """What an index was built with. A change of model or chunking means every document
    is read again (`key`); a change of words only that they are counted again from the
    stored texts (`Index.adopt`)."""

    model: str
    dimensions: int
    chunk_size: int
    chunk_overlap: int
    words: str = texts.WORDS_VERSION
    """How chunks' words were counted (`texts.WORDS_VERSION`); "" for an index written
    before the index recorded it."""

    @property
    def key(self) -> str:
        """What a file's chunks record they were made with."""
        return f"{self.model}|{self.dimensions}|{self.chunk_size}|{self.chunk_overlap}"

    def same_model(self, other: IndexSettings) -> bool:
        """Whether `other` embeds with this model, of these dimensions: its vectors would be
        this index's."""
        return (self.model, self.dimensions) == (other.model, other.dimensions)

    def as_meta(self) -> dict[str, str]:
        return {
            "model": self.model,
            "dimensions": str(self.dimensions),
            "chunk_size": str(self.chunk_size),
            "chunk_overlap": str(self.chunk_overlap),
            "words": self.words,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, str]) -> IndexSettings | None:
        try:
            return cls(
                meta["model"],
                int(meta["dimensions"]),
                int(meta["chunk_size"]),
                int(meta["chunk_overlap"]),
                meta.get("words", ""),
            )
        except (KeyError, ValueError):
            return None


@dataclasses.dataclass(frozen=True, slots=True)
class Where:
    """Which files' rows a search may see; a None field lets any through."""

    kinds: frozenset[str] | None = None
    sources: frozenset[str] | None = None
    path_prefix: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CitedRow:
    """What a result's citation needs of its row."""

    record: FileRecord
    page: int | None
    line: int | None
    headings: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Replacement:
    """What a pass hands the index for one file: its record, and the chunks that replace the
    ones it held (none for a file that failed)."""

    record: FileRecord
    chunks: Sequence[Chunk] = ()
    vectors: npt.NDArray[np.float32] | None = None
    """A row a chunk; None: the embedding model did not answer."""
    terms: Terms | None = None
    """The chunks' words already counted (`count_words`); None: the index counts them."""


@dataclasses.dataclass(frozen=True, slots=True)
class Totals:
    """What the index holds, as a status counts it."""

    documents: int
    """Files indexed (those that failed are not documents)."""
    chunks: int
    failed: int


class Index:
    """Chunks in memory and on disk. Thread-safe: passes write while searches read."""

    ROW_FIELDS = (
        ("alive", np.bool_),
        ("has_vector", np.bool_),
        ("row_file", np.int32),
        ("row_chunk", np.int64),
        ("row_page", np.int32),
        ("row_line", np.int32),
        ("row_headings", np.int32),
    )
    SAVED_FIELDS = tuple(name for name, _ in ROW_FIELDS if name != "alive")
    """The row fields a snapshot keeps: every row a load reads is alive."""

    def __init__(self, folder: Path, vector_kind: vectors.Kind = "float32") -> None:
        self.store = Store(folder)
        self.folder = folder
        self.vector_kind: vectors.Kind = vector_kind
        self.lock = threading.RLock()
        """Held by searches (`reading`) and by the writes that change what they read."""
        self._writes = threading.RLock()
        """Held by whatever changes the rows, around `lock` (never inside it): a compaction
        builds its arrays holding this alone, while searches go on reading."""
        self.dimensions = 0
        self.vectors_epoch = 0
        """Counts the times the vectors became another model's (a switch, a load, `adopt`),
        under the lock: a question embedded before is not ranked against them."""
        self._vectors_of: tuple[str, int] | None = None
        """The model and dimensions the vectors held are of."""
        self.serving = 0
        """Searches (and peers' questions) answering from it now, on the event loop: an
        index another takes the place of is closed once none is (`serve`)."""
        self._clear_memory()

    def _clear_memory(self) -> None:
        self.keyword = keyword.KeywordIndex()
        self.vectors = vectors.make(self.vector_kind, self.dimensions, self.folder)
        self.n_rows = 0
        self.alive = np.zeros(0, dtype=bool)
        self.has_vector = np.zeros(0, dtype=bool)
        self.row_file = np.zeros(0, dtype=np.int32)
        self.row_chunk = np.zeros(0, dtype=np.int64)
        self.row_page = np.zeros(0, dtype=np.int32)
        self.row_line = np.zeros(0, dtype=np.int32)
        self.row_headings = np.zeros(0, dtype=np.int32)
        self.headings: list[tuple[str, ...]] = []
        self._headings_ids: dict[str, int] = {}
        self.files: dict[int, FileEntry] = {}
        self.by_key: dict[tuple[str, str], int] = {}
        self.dead = 0
        self.failed_files = 0
        """Files recorded as failed: kept as files come and go, as status reads it often."""

    @contextlib.contextmanager
    def serve(self) -> Iterator[None]:
        """Around whatever answers from it, on the event loop (`serving`)."""
        self.serving += 1
        try:
            yield
        finally:
            self.serving -= 1

    # -- loading ---------------------------------------------------------------------------

    def settings(self) -> IndexSettings | None:
        return IndexSettings.from_meta(self.store.meta())

    def load(self) -> None:
        """Read the whole index into memory, sized exactly: from the snapshot the last load
        saved when no chunk changed since (`snapshot.py`), else from the store, saving a
        snapshot for the next load and then reading its rows back from it."""
        with self._writes, self.lock:
            meta_settings = self.settings()
            self.dimensions = meta_settings.dimensions if meta_settings else 0
            self._vectors_are(meta_settings)
            with self.store.reading() as tag:
                files = self.store.files()
                saved = snapshot.read(self.folder, tag)
                from_store = saved is None or not self._from_snapshot(files, *saved)
                if from_store:
                    self._from_store(files)
            if from_store:
                try:
                    self._save_snapshot(tag)
                except OSError as e:
                    log.warning("cannot save the index's snapshot (%s): loads read the store", e)
                else:
                    saved = snapshot.read(self.folder, tag)
                    if saved is not None:
                        self._from_snapshot(files, *saved)
        _release_freed_memory()

    def _from_store(self, files: Sequence[tuple[int, FileRecord]]) -> None:
        self._clear_memory()
        for file_id, record in files:
            self._add_file(file_id, record)
        self._ensure_capacity(self.store.chunk_count())
        words: list[tuple[npt.NDArray[np.int32], ...]] = []
        for batch in self.store.load_chunks(self.dimensions):
            words.append((batch.term_ids, batch.counts, batch.sizes))
            self._add_batch(batch, words=False)
        if words:  # one segment for them all: one sort, where a segment a batch merged is two
            term_ids, counts, sizes = (np.concatenate(c) for c in zip(*words, strict=True))
            words.clear()
            self.keyword.add(np.arange(self.n_rows), term_ids, counts, sizes)
            del term_ids, counts, sizes

    def _save_snapshot(self, tag: snapshot.Tag) -> None:
        """What a load from the store built, for the next load (every row is live)."""
        n = self.n_rows
        arrays: dict[str, npt.ArrayLike] = {
            name: getattr(self, name)[:n] for name in self.SAVED_FIELDS
        }
        arrays.update(self.keyword.snapshot_parts(n))
        if self.dimensions:
            arrays.update(self.vectors.snapshot_parts(n))
        headings = sorted(self._headings_ids, key=self._headings_ids.__getitem__)
        extra = {"dimensions": self.dimensions, "headings": headings}
        snapshot.write(self.folder, tag, n, arrays, extra)

    def _from_snapshot(
        self,
        files: Sequence[tuple[int, FileRecord]],
        manifest: dict[str, Any],
        arrays: dict[str, npt.NDArray[Any]],
    ) -> bool:
        """Take a snapshot's rows; False (memory left empty) when it does not fit this
        index: other dimensions, a part missing or cut short, vectors held the other way,
        or its files replaced by another indexer's load meanwhile."""
        n = int(manifest["rows"])
        if manifest.get("dimensions") != self.dimensions or any(
            name not in arrays or len(arrays[name]) != n for name in self.SAVED_FIELDS
        ):
            return False
        self._clear_memory()
        try:
            self._ensure_capacity(n)
            if self.dimensions and not self.vectors.from_snapshot(arrays, n):
                raise KeyError("vectors")
            for name in self.SAVED_FIELDS:
                getattr(self, name)[:n] = arrays[name]
            for stored in manifest["headings"]:
                self._heading_id(stored)
            self.keyword.from_snapshot(arrays, n)
        except (OSError, KeyError, TypeError, ValueError) as e:
            log.info("the index's snapshot does not fit (%r): loading from the store", e)
            self._clear_memory()
            return False
        for file_id, record in files:
            self._add_file(file_id, record)
        self.alive[:n] = True
        self.n_rows = n
        return True

    def _vectors_are(self, settings: IndexSettings | None) -> None:
        """The vectors held are of `settings`' model from now on (under the lock)."""
        of = None if settings is None else (settings.model, settings.dimensions)
        if of != self._vectors_of:
            self._vectors_of = of
            self.vectors_epoch += 1

    def writes_done(self) -> None:
        """Return once no write runs: a task cancelled while its write ran in a thread
        leaves that thread writing, and the writer lock must not be let go before it ends."""
        with self._writes:
            return

    def hold_vectors(self, kind: vectors.Kind) -> None:
        """Hold vectors the other way (float32 or int8): the index is loaded again."""
        with self._writes:
            if kind == self.vector_kind:
                return
            self.vector_kind = kind
            self.load()

    def adopt(self, settings: IndexSettings) -> None:
        """Take new settings and keep what is indexed: its files are read again one by one
        (their records say what they were built with), and until then their chunks are
        found by words, and by meaning too where the embedding model did not change.
        Words of another version are counted again from the stored texts first."""
        before = self.settings()
        if before is not None and before.words != settings.words:
            self._count_words_again()
        with self._writes, self.lock:
            self.store.set_meta(settings.as_meta())
            if before is not None and (before.model, before.dimensions) == (
                settings.model,
                settings.dimensions,
            ):
                return
            self.store.drop_vectors()
            self.dimensions = settings.dimensions
            self.has_vector[:] = False
            self.vectors = vectors.make(self.vector_kind, self.dimensions, self.folder)
            self.vectors.ensure_capacity(len(self.alive), 0)
            self._vectors_are(settings)

    def put_staged(
        self, ids: Sequence[int], vectors: Sequence[npt.NDArray[np.float32] | None]
    ) -> None:
        """Another model's vectors of chunks (by id), beside the ones that answer: scaled to
        unit length as a document's are (`put_documents`), so that a switched index holds
        what a fresh one would. None: the model refused the chunk."""
        self.store.put_staged(ids, [None if v is None else _units(v[None])[0] for v in vectors])

    def switch(self, settings: IndexSettings, meta: dict[str, str], forget: Sequence[str]) -> bool:
        """The staged vectors take the place of the ones that answer: on disk in one
        transaction with the settings of their model (and `meta`, `forget`), then in memory
        at once, under the lock, so a search sees the old vectors or the new, never a mix.
        The new rows are built from the store meanwhile, while searches go on with the old.
        False, and nothing changed, where a live chunk still lacks a staged vector."""
        with self._writes:
            before = self.settings()
            old_key = before.key if before is not None else ""
            rebuilt = self.store.switch_vectors(
                {**meta, **settings.as_meta()}, forget, (old_key, settings.key)
            )
            if rebuilt is None:
                return False
            held, has_vector = self._stored_vectors(settings.dimensions)
            with self.lock:
                self.vectors, self.has_vector = held, has_vector
                self.dimensions = settings.dimensions
                self._vectors_are(settings)
                for file_id in rebuilt:
                    entry = self.files[file_id]
                    entry.record = dataclasses.replace(entry.record, built_with=settings.key)
        _release_freed_memory()
        return True

    def _stored_vectors(self, dimensions: int) -> tuple[Vectors, npt.NDArray[np.bool_]]:
        """The store's vectors for the rows held now (`_writes` held: no row changes), in
        new arrays of their capacity. Live rows are in id order (a write adds its chunks
        after the last row, with ids past every id on disk; loads and compactions keep the
        order), so the stored vectors, read in id order, are put after the last row."""
        capacity = len(self.alive)
        held = vectors.make(self.vector_kind, dimensions, self.folder)
        held.ensure_capacity(capacity, 0)
        has_vector = np.zeros(capacity, dtype=bool)
        rows = np.flatnonzero(self.alive[: self.n_rows])
        ids = self.row_chunk[rows]
        for batch_ids, matrix, present in self.store.chunk_vectors(dimensions):
            at = np.minimum(np.searchsorted(ids, batch_ids), max(len(ids) - 1, 0))
            found = (ids[at] == batch_ids) if len(ids) else np.zeros(len(batch_ids), bool)
            where = rows[at[found]]
            if len(where) == 0:
                continue
            block = np.zeros((int(where[-1] - where[0]) + 1, dimensions), dtype=np.float32)
            block[where - where[0]] = matrix[found]
            held.put(int(where[0]), block)
            has_vector[where] = present[found]
        return held, has_vector

    def _count_words_again(self) -> None:
        """Count every chunk's words from its stored title, headings and text as this
        version counts them, then load the index with them. Only the indexer writing the
        index adopts settings, so no chunk changes meanwhile; searches go on with the old
        words until the load."""
        for batch in self.store.chunk_texts():
            self.store.put_words([(i, texts.counted(*parts)) for i, *parts in batch])
        self.load()

    # -- writing ---------------------------------------------------------------------------

    def put_document(
        self,
        record: FileRecord,
        chunks: Sequence[Chunk],
        vectors: npt.NDArray[np.float32] | None,
    ) -> None:
        """Replace one file's chunks, on disk (one transaction) and then in memory."""
        [error] = self.put_documents([Replacement(record, chunks, vectors)])
        if error is not None:
            raise error

    def put_documents(self, documents: Sequence[Replacement]) -> list[Exception | None]:
        """Replace several files' chunks, on disk (one transaction, each document whole or
        not at all) and then in memory; each document's error, or None where it was
        written. An error of the index itself (a full drive, a damaged file) is raised.
        A document's words are counted here unless it comes with them (`terms`). The
        keyword segments are merged and dead rows reclaimed after, while searches read
        (`compact`)."""
        errors: list[Exception | None] = []
        todo: list[tuple[int, Stored]] = []
        for i, d in enumerate(documents):
            chunks = d.chunks
            if d.vectors is not None and len(d.vectors) != len(chunks):
                errors.append(ValueError(f"{len(chunks)} chunks but {len(d.vectors)} vectors"))
                continue
            errors.append(None)
            terms = d.terms if d.terms is not None else count_words(chunks)
            units = None if d.vectors is None else _units(d.vectors)
            todo.append((i, Stored(d.record, chunks, _headings(chunks), terms, units)))
        if not todo:
            return errors
        results = self.store.put_documents([stored for _, stored in todo])
        batches = []
        with self._writes:
            with self.lock:
                for (i, stored), written in zip(todo, results, strict=True):
                    if isinstance(written, Exception):
                        errors[i] = written
                        continue
                    record = stored.record
                    self._drop_file((record.source, record.path))
                    self._add_file(written.file_id, record)
                    batches.append(_batch(written, stored, self.dimensions))
                if batches:
                    self._add_batch(_concatenated(batches))
            self.keyword.compact(self.alive, self.lock)
            self.compact()
        return errors

    def touch_file(self, record: FileRecord) -> None:
        """A file whose size or mtime changed but whose content did not."""
        self.store.touch_file(record.source, record.path, record.size, record.mtime_ns)
        with self.lock:
            file_id = self.by_key.get((record.source, record.path))
            if file_id is not None:
                self.files[file_id].record = record

    def drop_files(self, keys: Sequence[tuple[str, str]]) -> None:
        """Forget files that are gone from their source."""
        if not keys:
            return
        with self._writes:
            with self.lock:
                self.store.delete_files(keys)
                for key in keys:
                    self._drop_file(key)
            self.compact()

    def settle(self) -> None:
        """Renew BM25's cached weights once a pass has stopped changing rows, so idle searches
        sum cached weights again. The weighing runs outside the lock: searches go on
        meanwhile, and the result is dropped if a document came or went. The store's
        writer lets go of its word ids too, and dead rows and spare room are reclaimed
        first, as the pass has stopped (`compaction_capacity`)."""
        self.store.forget_written_words()
        self.compact(idle=True)
        with self.lock:
            if self.keyword.weighed:
                return
            snap = self.keyword.snapshot(self.alive)
        weights = snap.weigh(self.keyword)
        with self.lock:
            self.keyword.install(snap, weights)

    def compact(self, idle: bool = False) -> None:
        """Reclaim dead rows and spare room when `compaction_capacity` says so (`idle`: a
        pass has stopped). The new arrays are built while searches go on reading the old
        ones (only writes wait) and take their place at once; a search's rows stay
        those of the arrays it read (`Reading`). A compaction that fails (a full drive,
        for int8's files) leaves the index as it was, to be tried again later."""
        with self._writes:
            capacity = compaction_capacity(self.n_rows, self.dead, len(self.alive), idle)
            if capacity is None:
                return
            try:
                rows = self._compacted(capacity)
            except OSError as e:
                log.warning("cannot compact the index's rows (%s): tried again later", e)
                return
            with self.lock:
                for field in dataclasses.fields(rows):
                    setattr(self, field.name, getattr(rows, field.name))
                self.dead = 0
            del rows
        _trim_heap()

    def _compacted(self, capacity: int) -> Rows:
        """The live rows in new arrays of room for `capacity` rows, renumbered in order;
        headings no live row has are forgotten. Reads the current arrays and changes
        none (`_writes` held: nothing else changes them meanwhile)."""
        n = self.n_rows
        keep = self.alive[:n].copy()
        new_row = np.cumsum(keep) - 1
        live = int(np.count_nonzero(keep))
        fields: dict[str, npt.NDArray[Any]] = {}
        for name, dtype in self.ROW_FIELDS:
            fields[name] = np.zeros(capacity, dtype=dtype)
            fields[name][:live] = getattr(self, name)[:n][keep]
        used, fields["row_headings"][:live] = np.unique(
            fields["row_headings"][:live], return_inverse=True
        )
        stored = list(self._headings_ids)  # in the order of their ids
        keyword_index = copy.copy(self.keyword)
        keyword_index.remap(new_row, keep, capacity)
        kept = copy.copy(self.vectors)
        kept.keep(keep, n, capacity)
        return Rows(
            **fields,
            n_rows=live,
            keyword=keyword_index,
            vectors=kept,
            headings=[self.headings[h] for h in used.tolist()],
            _headings_ids={stored[h]: i for i, h in enumerate(used.tolist())},
        )

    def _add_file(self, file_id: int, record: FileRecord) -> None:
        self.files[file_id] = FileEntry(file_id, record)
        self.by_key[(record.source, record.path)] = file_id
        self.failed_files += record.state == "failed"

    def _drop_file(self, key: tuple[str, str]) -> None:
        file_id = self.by_key.pop(key, None)
        if file_id is None:
            return
        self.failed_files -= self.files.pop(file_id).record.state == "failed"
        rows = np.flatnonzero(self.alive[: self.n_rows] & (self.row_file[: self.n_rows] == file_id))
        self.alive[rows] = False
        self.keyword.drop(rows)
        self.dead += len(rows)

    def _add_batch(self, batch: ChunkBatch, words: bool = True) -> None:
        """Rows after the last; `words`: their postings too (a load adds them all at once)."""
        n = len(batch.ids)
        if n == 0:
            return
        start, end = self.n_rows, self.n_rows + n
        self._ensure_capacity(end)
        self.row_chunk[start:end] = batch.ids
        self.row_file[start:end] = batch.file_ids
        self.row_page[start:end] = batch.pages
        self.row_line[start:end] = batch.lines
        self.row_headings[start:end] = [self._heading_id(h) for h in batch.headings]
        self.has_vector[start:end] = batch.has_vector
        if self.dimensions:
            self.vectors.put(start, batch.vectors)
        self.alive[start:end] = True
        self.n_rows = end
        if words:
            self.keyword.add(np.arange(start, end), batch.term_ids, batch.counts, batch.sizes)

    def _heading_id(self, stored: str) -> int:
        hid = self._headings_ids.get(stored)
        if hid is None:
            hid = self._headings_ids[stored] = len(self.headings)
            self.headings.append(tuple(json.loads(stored)))
        return hid

    def _ensure_capacity(self, rows: int) -> None:
        capacity = len(self.alive)
        if rows <= capacity:
            return
        new = grown(capacity, rows, self.dead)
        for name, dtype in self.ROW_FIELDS:
            larger = np.zeros(new, dtype=dtype)
            larger[: self.n_rows] = getattr(self, name)[: self.n_rows]
            setattr(self, name, larger)
        self.vectors.ensure_capacity(new, self.n_rows)
        self.keyword.ensure_capacity(new)

    # -- reading ---------------------------------------------------------------------------

    @property
    def chunk_count(self) -> int:
        return self.n_rows - self.dead

    def totals(self) -> Totals:
        failed = self.failed_files
        return Totals(documents=len(self.files) - failed, chunks=self.chunk_count, failed=failed)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Reading]:
        """Hold it across reads whose row numbers must agree (a pass's write or a
        compaction moves rows). What it yields reads without taking the lock again, so
        other threads may read for the holder (a search's two legs at once) until the
        block ends; its rows' citations and texts it answers after the block too."""
        with self.lock:
            yield self._reading()

    def _reading(self) -> Reading:
        """What `reading` yields; under the lock."""
        return Reading(
            self,
            self.row_chunk,
            self.row_file,
            self.row_page,
            self.row_line,
            self.row_headings,
            self.headings,
        )

    def vector_coverage(self) -> tuple[bool, int]:
        """Whether any row has a vector, and how many live chunks have none yet (indexed
        while the embedding model did not answer)."""
        with self.lock:
            n = self.n_rows
            has = self.has_vector[:n]
            return bool(has.any()), int(np.count_nonzero(self.alive[:n] & ~has))

    def allowed(self, where: Where | None) -> npt.NDArray[np.bool_]:
        """Live rows of the files `where` lets through (`Reading.allowed`)."""
        with self.reading() as read:
            return read.allowed(where)

    def dense(self, vector: npt.NDArray[np.float32], allowed: npt.NDArray[np.bool_], k: int) -> Leg:
        """The k allowed rows nearest a unit vector (`Reading.dense`)."""
        with self.reading() as read:
            return read.dense(vector, allowed, k)

    def by_words(self, words: Sequence[str], allowed: npt.NDArray[np.bool_] | None, k: int) -> Leg:
        """The k rows of best BM25 score above 0 for `words` (`Reading.by_words`)."""
        with self.reading() as read:
            return read.by_words(words, allowed, k)

    def cited(self, rows: Sequence[int]) -> list[CitedRow]:
        """Each row's file record, page, line and headings (`Reading.cited`)."""
        with self.reading() as read:
            return read.cited(rows)

    def texts(self, rows: Sequence[int]) -> dict[int, str]:
        """Each row's text, read from disk (`Reading.texts`)."""
        with self.lock:
            read = self._reading()
        return read.texts(rows)


@dataclasses.dataclass(slots=True)
class Rows:
    """What a compaction replaces, as `Index` names it."""

    alive: npt.NDArray[np.bool_]
    has_vector: npt.NDArray[np.bool_]
    row_file: npt.NDArray[np.int32]
    row_chunk: npt.NDArray[np.int64]
    row_page: npt.NDArray[np.int32]
    row_line: npt.NDArray[np.int32]
    row_headings: npt.NDArray[np.int32]
    n_rows: int
    keyword: keyword.KeywordIndex
    vectors: Vectors
    headings: list[tuple[str, ...]]
    _headings_ids: dict[str, int]


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    """The index's search reads while `Index.reading` holds its lock: they take no lock
    themselves, so any thread may make them for the holder, until its block ends.

    Its rows' citations and texts (`cited`, `texts`) stay right after the block, while a
    search reranks and builds its answer: they read the row arrays as they were, whose
    rows writes never change (rows are added after the last; growing, a compaction or a
    load makes new arrays). A row whose document was replaced since has no text."""

    index: Index
    row_chunk: npt.NDArray[np.int64]
    row_file: npt.NDArray[np.int32]
    row_page: npt.NDArray[np.int32]
    row_line: npt.NDArray[np.int32]
    row_headings: npt.NDArray[np.int32]
    headings: list[tuple[str, ...]]

    def telling(self, words: Sequence[str]) -> list[str]:
        """The question's words that tell passages apart here: held by at least one chunk
        and by at most `COMMON_SHARE` of them (3 at least). A word's rarity in this base
        decides, not a list of stop words: "the" is common in any English base, "vpn" may
        be common in an IT handbook and telling in a wiki."""
        ix = self.index
        most = max(COMMON_SHARE * ix.keyword.live_rows, 3)
        ix.store.word_ids(words)  # one lookup for the words not cached: each below is cached
        telling = []
        for word in dict.fromkeys(words):
            ids = ix.store.word_ids([word])
            if len(ids) and 0 < int(ix.keyword.postings(ids)[0]) <= most:
                telling.append(word)
        return telling

    def cited(self, rows: Sequence[int]) -> list[CitedRow]:
        """Each row's file record, page, line and headings."""
        files = self.index.files
        return [
            CitedRow(
                files[int(self.row_file[r])].record,
                int(self.row_page[r]) or None,
                int(self.row_line[r]) or None,
                self.headings[int(self.row_headings[r])],
            )
            for r in rows
        ]

    def texts(self, rows: Sequence[int]) -> dict[int, str]:
        """Each row's text, read from disk (text is not held in memory)."""
        ids = {int(self.row_chunk[r]): r for r in rows}
        by_id = self.index.store.texts(list(ids))
        return {ids[cid]: text for cid, text in by_id.items()}

    def allowed(self, where: Where | None) -> npt.NDArray[np.bool_]:
        """Live rows of the files `where` lets through: filters apply before anything is
        ranked."""
        ix = self.index
        n = ix.n_rows
        mask = ix.alive[:n].copy()
        if where is None:
            return mask
        ok_ids = [
            fid
            for fid, f in ix.files.items()
            if (where.kinds is None or f.record.kind in where.kinds)
            and (where.sources is None or f.record.source in where.sources)
            and (where.path_prefix is None or f.record.path.startswith(where.path_prefix))
        ]
        if not ok_ids:
            return np.zeros(n, dtype=bool)
        file_ok = np.zeros(max(ix.files) + 1, dtype=bool)
        file_ok[ok_ids] = True
        return mask & file_ok[ix.row_file[:n]]

    def dense(self, vector: npt.NDArray[np.float32], allowed: npt.NDArray[np.bool_], k: int) -> Leg:
        """The k allowed rows nearest a unit vector (cosine), best first; exact float32
        scores either way the vectors are held."""
        ix = self.index
        return ix.vectors.nearest(vector, allowed & ix.has_vector[: ix.n_rows], k)

    def by_words(self, words: Sequence[str], allowed: npt.NDArray[np.bool_] | None, k: int) -> Leg:
        """The k rows of best BM25 score above 0 for `words`, best first; `allowed`:
        only those rows (None: every live row)."""
        ix = self.index
        scores = ix.keyword.scores(ix.store.word_ids(words), ix.alive, ix.dead == 0)
        if scores is None:
            return []
        scores = scores[: ix.n_rows]
        if allowed is not None:  # without filters, `scores` is 0 for dead rows
            scores[~allowed] = 0
        rows = top_positive(scores, k)
        return list(zip(rows, scores[rows].tolist(), strict=True)) if rows else []


def top_positive(scores: npt.NDArray[np.float32], k: int) -> list[int]:
    """Rows of the k best scores above 0, best first (ties: lower row first, at the cut
    too: texts repeated across files score alike)."""
    rows = _reaching(scores, k)
    rows, _ = vectors.best(rows, scores[rows], k)
    return rows[np.lexsort((rows, -scores[rows]))].tolist()


SAMPLE = 64
"""`_reaching` samples every 64th score."""


def _reaching(scores: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.int64]:
    """Rows above 0 among which the k best are, ascending: those reaching a floor that
    about 4k rows reach by a sample's count, when at least k do; else every row above 0.
    At a large index most rows hold some word of a question (65% at a million chunks),
    and ranking them all took 4.4 ms a question there, ranking these 1.4 ms."""
    wanted = -(-4 * k // SAMPLE)
    sample = scores[::SAMPLE]
    if len(sample) > wanted:
        floor = np.partition(sample, len(sample) - wanted)[len(sample) - wanted]
        if floor > 0:
            rows = np.flatnonzero(scores >= floor)
            if len(rows) >= k:
                return rows
    return np.flatnonzero(scores > 0)


def count_words(chunks: Sequence[Chunk]) -> Terms:
    """A document's words as the keyword index stores them (the reader workers count them
    for a pass, so that this work is off the indexer's own process)."""
    return Terms.of(texts.counted(c.title, c.headings, c.text) for c in chunks)


def _headings(chunks: Sequence[Chunk]) -> list[str]:
    """Each chunk's headings as stored (JSON); a section's chunks share theirs."""
    said: dict[tuple[str, ...], str] = {}
    out = []
    for c in chunks:
        h = said.get(c.headings)
        if h is None:
            h = said[c.headings] = json.dumps(c.headings, ensure_ascii=False)
        out.append(h)
    return out


def _batch(written: Written, stored: Stored, dimensions: int) -> ChunkBatch:
    """One document's chunks in the columns `load` reads."""
    n = len(stored.chunks)
    units = stored.vectors
    if units is None or units.shape[1:] != (dimensions,):
        units, has_vector = np.zeros((n, dimensions), np.float32), np.zeros(n, dtype=bool)
    else:
        has_vector = np.ones(n, dtype=bool)
    return ChunkBatch(
        ids=np.arange(written.first_id, written.first_id + n, dtype=np.int64),
        file_ids=np.full(n, written.file_id, dtype=np.int64),
        headings=stored.headings,
        pages=np.array([c.page or 0 for c in stored.chunks], dtype=np.int32),
        lines=np.array([c.line or 0 for c in stored.chunks], dtype=np.int32),
        term_ids=written.term_ids,
        counts=stored.terms.counts,
        sizes=stored.terms.sizes,
        vectors=units,
        has_vector=has_vector,
    )


def _concatenated(batches: Sequence[ChunkBatch]) -> ChunkBatch:
    """Several documents' columns as one batch: one keyword segment for them all."""
    if len(batches) == 1:
        return batches[0]
    return ChunkBatch(
        ids=np.concatenate([b.ids for b in batches]),
        file_ids=np.concatenate([b.file_ids for b in batches]),
        headings=[h for b in batches for h in b.headings],
        pages=np.concatenate([b.pages for b in batches]),
        lines=np.concatenate([b.lines for b in batches]),
        term_ids=np.concatenate([b.term_ids for b in batches]),
        counts=np.concatenate([b.counts for b in batches]),
        sizes=np.concatenate([b.sizes for b in batches]),
        vectors=np.concatenate([b.vectors for b in batches]),
        has_vector=np.concatenate([b.has_vector for b in batches]),
    )


def _units(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Each row scaled to unit length (a zero row stays zero). Each row's norm is taken
        alone (`np.linalg.norm` of a row is the square root of its dot with itself, which is
    what is taken, without that function's checks per row), as a row was before rows were
    scaled together: the vectors are the same bits."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.sqrt(np.array([row.dot(row) for row in v], dtype=np.float32).reshape(len(v)))
    return np.divide(v, norms[:, None], out=np.zeros_like(v), where=norms[:, None] > 0)


def _release_freed_memory() -> None:
    """Hand the load's temporaries back to the system: glibc keeps freed heap otherwise,
    and a base's memory is what its placement asks for."""
    gc.collect()
    _trim_heap()


def _trim_heap() -> None:
    """Give freed heap pages back to the system. Arrays a compaction replaced were mapped
    on their own, and unmapped when freed; but glibc then serves blocks up to their size
    from its heap (its mmap threshold rises to the largest freed, up to 32 MiB), which
    it keeps when they are freed: the next compaction's arrays of a small index, say."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
