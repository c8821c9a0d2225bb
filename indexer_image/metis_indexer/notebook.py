"""A base's notes on its own drive, and in its index the moment they are written.

Each note is two files in `notes/` of the index drive: its record (`.records/<id>.json`:
when it was written, what it replaces) and its Markdown (`<id>.md`), which the passes
read like any source's file, as the source `metis-<name>`: a full reindex, a model
change and a new chunking's index built beside keep every note, re-embedded. The record
is written first and removed last, each file whole (written aside, synced, renamed), so
a kill leaves a note whole or absent: a record without its Markdown is dropped on load.

A write also puts the note in the index at once, so it is found as soon as the write
returns: by words always, by meaning when the embedding model answers within
`EMBED_SECONDS` (else it is recorded as not embedded, and the pass it asks for embeds it
when the model is back).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from metis_indexer import notes
from metis_indexer.configured import Configured
from metis_indexer.documents import Chunk, Kind
from metis_indexer.errors import Conflict, NotFound
from metis_indexer.index import texts
from metis_indexer.index.memory import Index, IndexSettings, Replacement
from metis_indexer.index.store import FileRecord
from metis_indexer.ingest import chunking, readers
from metis_indexer.ingest.runner import file_hash
from metis_indexer.models.clients import ModelRefused, ModelUnavailable
from metis_indexer.progress import Progress
from metis_indexer.restage import Answering

log = logging.getLogger("metis.notes")

RECORDS = ".records"
"""Hidden: a pass's walk skips it."""
EMBED_SECONDS = 5.0
"""How long a write waits for the embedding model before the note is kept by words only
(the pass it asks for embeds it)."""


class Indexing(Protocol):
    """What a note is written to (`passes.Passes`): the index that answers, the model whose
    vectors answer while a new one's are made, and a pass asked for."""

    index: Index

    def answering_now(self) -> Answering | None: ...

    def request(self, full: bool = False) -> None: ...


class Notebook:
    """The notes of one base: read from the drive, written to it and to the index."""

    def __init__(self, configured: Configured, passes: Indexing, progress: Progress) -> None:
        """`passes`: whose index a note is written to, and asked for a pass."""
        self._configured = configured
        self._passes = passes
        self._progress = progress
        config = configured.config
        self.folder = notes.folder(config.index_dir)
        self.source = notes.source(config.name)
        self.notes: dict[str, notes.Note] = {}
        self.replaced: dict[str, notes.Replaced] = {}
        self._writing = asyncio.Lock()

    # -- the drive -------------------------------------------------------------------------

    def load(self) -> None:
        """The notes as the drive holds them; what a kill left half written is removed."""
        records = self.folder / RECORDS
        try:
            records.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a full or read-only drive: the index still loads and answers
            log.warning("the notes' folder %s cannot be made (%s): no notes are read", records, e)
            return
        found: dict[str, notes.Note] = {}
        for path in records.glob("*.json"):
            note_id = path.stem
            if not (self.folder / (note_id + notes.SUFFIX)).exists():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # a write or a forget a kill cut short
                continue
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                notes.moment(raw["written_at"])
                found[note_id] = notes.Note(
                    note_id,
                    raw["text"],
                    raw["written_at"],
                    raw.get("title"),
                    tuple(raw.get("replaces", ())),
                )
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("note %s: its record cannot be read (%s): it is left out", note_id, e)
        self.notes = found
        self.replaced = notes.replaced(found.values())

    def _keep(self, note: notes.Note) -> Path:
        record = {
            "text": note.text,
            "written_at": note.written_at,
            "title": note.title,
            "replaces": list(note.replaces),
        }
        _write_whole(self.folder / RECORDS / f"{note.id}.json", json.dumps(record))
        path = self.folder / note.document
        _write_whole(path, notes.markdown(note))
        return path

    def _remove(self, note_id: str) -> None:
        markdown, record = self.folder / (note_id + notes.SUFFIX), self.folder / RECORDS
        for path in (markdown, record / f"{note_id}.json"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        _sync(self.folder)

    # -- the API ---------------------------------------------------------------------------

    def get(self, note_id: str) -> notes.Note:
        found = self.notes.get(note_id)
        if found is None:
            raise NotFound("NOTE_NOT_FOUND", f"the base holds no note {note_id[:80]!r}")
        return found

    def listed(self) -> list[notes.Note]:
        """Newest first."""
        return sorted(
            self.notes.values(), key=lambda n: (notes.moment(n.written_at), n.id), reverse=True
        )

    async def write(
        self, text: str, title: str | None, replaces: Sequence[str], note_id: str | None
    ) -> tuple[notes.Note, bool]:
        """The note kept and indexed, and whether it is new (an id already held is written
        over)."""
        self._check_writable()
        async with self._writing:
            chosen = notes.new_id() if note_id is None else note_id
            text, title, kept = notes.check_write(text, title, replaces, chosen, self.notes)
            written = notes.written_now(n.written_at for n in self.notes.values())
            note = notes.Note(chosen, text, written, title, kept)
            path = await asyncio.to_thread(self._keep, note)
            new = chosen not in self.notes
            self.notes = {**self.notes, chosen: note}
            self.replaced = notes.replaced(self.notes.values())
            await self._index(path, note)
        return note, new

    async def forget(self, note_id: str) -> notes.Note:
        self._check_writable()
        async with self._writing:
            note = self.get(note_id)
            await asyncio.to_thread(self._remove, note_id)
            self.notes = {k: v for k, v in self.notes.items() if k != note_id}
            self.replaced = notes.replaced(self.notes.values())
            index = self._passes.index
            await asyncio.to_thread(index.drop_files, [(self.source, note.document)])
            self._passes.request()  # a pass that listed it before reads no missing file as failed
        return note

    def _check_writable(self) -> None:
        config = self._configured.config
        if config.peers:
            raise Conflict(
                "NOTES_REPLICATED",
                "this base runs several replicas, each with an index drive of its own: a "
                "note written to one would be missing from the others, so notes are written "
                "only to a base of one replica",
            )
        if self._progress.state.phase == "standby":
            raise Conflict("STANDBY", "a replacement is taking over; ask again in a moment")

    # -- the index -------------------------------------------------------------------------

    async def _index(self, path: Path, note: notes.Note) -> None:
        index = self._passes.index
        settings = await asyncio.to_thread(index.settings)
        if settings is None:  # no pass has recorded how the index is built yet
            self._passes.request()
            return
        chunks = await asyncio.to_thread(
            _cut, path, self.folder, settings.chunk_size, settings.chunk_overlap
        )
        vectors, built_with = await self._vectors(chunks, settings)
        info = path.stat()
        record = FileRecord(
            source=self.source,
            path=note.document,
            kind=Kind.MD.value,
            size=info.st_size,
            mtime_ns=info.st_mtime_ns,
            hash=await asyncio.to_thread(file_hash, path, self.folder),
            state="indexed",
            indexed_at=note.written_at,
            title=note.title or (chunks[0].title if chunks else None),
            chunks=len(chunks),
            built_with=built_with,
        )
        [error] = await asyncio.to_thread(
            index.put_documents, [Replacement(record, chunks, vectors)]
        )
        if error is not None:
            raise error
        if built_with != settings.key or self._passes.index is not index:
            self._passes.request()  # embedded, or read into the index that answers now, by a pass

    async def _vectors(
        self, chunks: list[Chunk], settings: IndexSettings
    ) -> tuple[npt.NDArray[np.float32] | None, str]:
        """The chunks' vectors and what they are built with; None and "" (the pass reads
        the note again) while the model does not answer, or while a new model's vectors
        are made."""
        embedder = self._configured.embedder
        if embedder is None:
            return None, settings.key
        if (
            self._passes.answering_now() is not None
            or embedder.model != settings.model
            or embedder.dimensions != settings.dimensions
        ):
            return None, ""
        try:
            vectors = await asyncio.wait_for(
                embedder.embed_documents([texts.embedded(c) for c in chunks]), EMBED_SECONDS
            )
        except (ModelUnavailable, ModelRefused, TimeoutError) as e:
            log.info("a note is kept by its words until the embedding model answers: %s", e)
            return None, ""
        return vectors, settings.key


def _cut(path: Path, root: Path, size: int, overlap: int) -> list[Chunk]:
    document = readers.read_document(path, Kind.MD, root)
    return chunking.chunk_document(document, size, overlap)


def _write_whole(path: Path, content: str) -> None:
    staged = path.with_name(f".{path.name}.new")
    with open(staged, "w", encoding="utf-8") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, path)
    _sync(path.parent)


def _sync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
