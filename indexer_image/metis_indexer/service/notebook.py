"""A base's notes on its own drive, and in its index the moment they are written.

Each note is two files in `notes/` of the index drive: its record (`.records/<id>.json`:
its text, when it was written, what it replaces) and its Markdown (`<id>.md`), which the
passes read like any source's file, as the source `metis-<name>`: a full reindex, a model
change and a new chunking's index built beside keep every note, re-embedded.

The record is the note: the Markdown is made from it. A write stages both files whole
(written aside, synced) and then renames the record into place, then the Markdown; a
forget removes the Markdown, then the record. So a kill leaves the old note or the new
one: on load a record without its Markdown (a new note's write or a forget cut short) is
dropped, and a Markdown that is not its record's (an overwrite cut short) is written
again from the record, whole, which the next pass reads again. A drive too full for the
staged files refuses the write (507) with nothing left behind. A Markdown whose record
cannot be read is found by search, so it stays removable: GET says why it cannot be
shown, DELETE removes it.

A write also puts the note in the index at once, so it is found as soon as the write
returns: by words always, by meaning when the embedding model answers within
`EMBED_SECONDS` (else it is recorded as not embedded, and the pass it asks for embeds it
when the model is back). Its passages go to the model on the questions' slots, ahead of
a pass's bulk. While a new chunking's index is built beside the one that answers, the
note is written to both, so the switch to the new one cannot leave it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from metis_indexer import notes
from metis_indexer.changes.chunking_change import ChunkingChange
from metis_indexer.changes.model_change import ModelChange
from metis_indexer.configured import Configured
from metis_indexer.documents import Chunk, Kind
from metis_indexer.errors import Conflict, DriveFull, NotFound
from metis_indexer.files import sync_folder
from metis_indexer.index import store, texts
from metis_indexer.index.memory import Index, IndexSettings, Replacement
from metis_indexer.index.store import FileRecord
from metis_indexer.ingest import chunking, readers
from metis_indexer.ingest.runner import file_hash
from metis_indexer.models.clients import ModelRefused, ModelUnavailable
from metis_indexer.service.progress import Progress

log = logging.getLogger("metis.notes")

RECORDS = ".records"
"""Hidden: a pass's walk skips it."""
STAGED = ".*.new"
"""A file written aside before it is renamed into place; one a kill left is removed on
load."""
EMBED_SECONDS = 5.0
"""How long a write waits for the embedding model before the note is kept by words only
(the pass it asks for embeds it)."""
FULL = (errno.ENOSPC, errno.EDQUOT)
"""What a drive with no room for a note's files answers."""


class Indexing(Protocol):
    """What a note is written to (`passes.Passes`): the index that answers, a new
    chunking's index being built beside it (`chunking_change`), the model whose vectors
    answer while a new one's are made (`model_change`), and a pass asked for."""

    @property
    def index(self) -> Index: ...

    @property
    def model_change(self) -> ModelChange: ...

    @property
    def chunking_change(self) -> ChunkingChange: ...

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
        self.unreadable: dict[str, str] = {}
        """The notes whose Markdown is on the drive (and found by search) but whose record
        cannot be read, with why: DELETE removes them."""
        self._writing = asyncio.Lock()

    # -- the drive -------------------------------------------------------------------------

    def load(self) -> None:
        """The notes as the drive holds them; what a kill left half written is removed or
        made whole again from the record."""
        records = self.folder / RECORDS
        try:
            records.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a full or read-only drive: the index still loads and answers
            log.warning("the notes' folder %s cannot be made (%s): no notes are read", records, e)
            return
        for staged in [*self.folder.glob(STAGED), *records.glob(STAGED)]:
            with contextlib.suppress(OSError):
                staged.unlink()  # a write a kill cut short, before its renames
        found: dict[str, notes.Note] = {}
        unreadable: dict[str, str] = {}
        for path in records.glob("*.json"):
            note_id = path.stem
            markdown = self.folder / (note_id + notes.SUFFIX)
            if not markdown.exists():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # a new note's write or a forget a kill cut short
                continue
            try:
                found[note_id] = _read_record(note_id, path)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning(
                    "note %s: its record cannot be read (%s): DELETE removes it", note_id, e
                )
                unreadable[note_id] = f"its record cannot be read ({e})"
                continue
            self._made_whole(found[note_id], markdown)
        for markdown in self.folder.glob("*" + notes.SUFFIX):
            orphan = notes.of_document(markdown.name)
            if orphan is not None and orphan not in found and orphan not in unreadable:
                log.warning("note %s: its Markdown has no record: DELETE removes it", orphan)
                unreadable[orphan] = "it has no record"
        self.notes = found
        self.unreadable = unreadable
        self.replaced = notes.replaced(found.values())

    @staticmethod
    def _made_whole(note: notes.Note, markdown: Path) -> None:
        """The note's Markdown as its record says: an overwrite a kill cut between its two
        renames left the old Markdown beside the new record."""
        wanted = notes.markdown(note)
        try:
            held: str | None = markdown.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            held = None
        if held == wanted:
            return
        log.warning("note %s: its Markdown is not its record's: written again from it", note.id)
        try:
            _sync(_commit([(_stage(markdown, wanted), markdown)]))
        except OSError as e:
            log.warning("note %s: its Markdown cannot be written (%s)", note.id, e)

    def _keep(self, note: notes.Note) -> None:
        """Both files staged whole, then renamed into place: the record first (the note),
        then its Markdown. A drive too full to stage them leaves nothing behind."""
        record = {
            "text": note.text,
            "written_at": note.written_at,
            "title": note.title,
            "replaces": list(note.replaces),
        }
        places = [self.folder / RECORDS / f"{note.id}.json", self.folder / note.document]
        staged: list[Path] = []
        try:
            staged.append(_stage(places[0], json.dumps(record)))
            staged.append(_stage(places[1], notes.markdown(note)))
        except BaseException:
            for path in staged:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        for folder in _commit(list(zip(staged, places, strict=True))):
            _sync(folder)

    def _remove(self, note_id: str) -> None:
        """The Markdown first (the note's words leave the sources), then the record."""
        markdown, record = self.folder / (note_id + notes.SUFFIX), self.folder / RECORDS
        for path in (markdown, record / f"{note_id}.json"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        _sync(self.folder)

    def _undo(self, note_id: str, old: notes.Note | None) -> None:
        """A note whose index write failed: the drive back to what the index holds."""
        try:
            if old is None:
                self._remove(note_id)
            else:
                self._keep(old)
        except OSError as e:
            log.warning(
                "note %s: the drive could not be set back (%s): a pass reads it", note_id, e
            )
            self._passes.request()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """No note written or forgotten meanwhile (a backup copies the notes and the index
        under it, so the two agree); searches and passes go on."""
        async with self._writing:
            yield

    # -- the API ---------------------------------------------------------------------------

    def get(self, note_id: str) -> notes.Note:
        found = self.notes.get(note_id)
        if found is None:
            why = self.unreadable.get(note_id)
            if why is not None:
                raise Conflict(
                    "NOTE_UNREADABLE",
                    f"note {note_id} is on the drive but {why}: DELETE /v1/notes/{note_id} "
                    "removes it",
                )
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
        over). A client that goes away meanwhile does not cut it short (shielded)."""
        self._check_writable()
        return await asyncio.shield(self._write(text, title, replaces, note_id))

    async def _write(
        self, text: str, title: str | None, replaces: Sequence[str], note_id: str | None
    ) -> tuple[notes.Note, bool]:
        async with self._writing:
            chosen = notes.new_id() if note_id is None else note_id
            text, title, kept = notes.check_write(text, title, replaces, chosen, self.notes)
            written = notes.written_now(n.written_at for n in self.notes.values())
            note = notes.Note(chosen, text, written, title, kept)
            old = self.notes.get(chosen)
            try:
                await asyncio.to_thread(self._keep, note)
            except OSError as e:
                raise _full(e, note) or e from None
            try:
                await self._index(note)
            except Exception as e:
                await asyncio.to_thread(self._undo, chosen, old)
                if store.trouble(e) == "full":
                    raise _no_room(note) from None
                raise
            new = chosen not in self.notes
            self.notes = {**self.notes, chosen: note}
            self.unreadable.pop(chosen, None)
            self.replaced = notes.replaced(self.notes.values())
        return note, new

    async def forget(self, note_id: str) -> notes.Note:
        """The note removed from the drive and from the indexes; one whose record cannot be
        read too (answered with what its Markdown holds)."""
        self._check_writable()
        return await asyncio.shield(self._forget(note_id))

    async def _forget(self, note_id: str) -> notes.Note:
        async with self._writing:
            note = self.notes.get(note_id)
            if note is None and note_id in self.unreadable:
                note = await asyncio.to_thread(self._as_found, note_id)
            elif note is None:
                note = self.get(note_id)
            await asyncio.to_thread(self._remove, note_id)
            self.notes = {k: v for k, v in self.notes.items() if k != note_id}
            self.unreadable.pop(note_id, None)
            self.replaced = notes.replaced(self.notes.values())
            gone = [(self.source, note.document)]
            await self._to_each(lambda index, _: asyncio.to_thread(index.drop_files, gone))
            self._passes.request()  # a pass that listed it before reads no missing file as failed
        return note

    def _as_found(self, note_id: str) -> notes.Note:
        """A note whose record cannot be read, as its Markdown holds it: its text, and the
        Markdown's time as when it was written."""
        markdown = self.folder / (note_id + notes.SUFFIX)
        try:
            text = markdown.read_text(encoding="utf-8", errors="replace").strip()
            at = dt.datetime.fromtimestamp(markdown.stat().st_mtime, dt.UTC)
        except OSError:
            text, at = "", dt.datetime.now(dt.UTC)
        written = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return notes.Note(note_id, text, written)

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

    def _targets(self) -> list[tuple[Index, IndexSettings | None]]:
        """The index that answers (its settings read from it) and a new chunking's index
        being built beside it (with the settings it is built with)."""
        found: list[tuple[Index, IndexSettings | None]] = [(self._passes.index, None)]
        building = self._passes.chunking_change.building
        if building is not None and building.index is not self._passes.index:
            found.append((building.index, building.new))
        return found

    @contextlib.contextmanager
    def _beside(self, index: Index) -> Iterator[None]:
        """A write to an index built beside that fails is the build's (given up or
        closed meanwhile, or read again by its next round), not the note's."""
        if index is self._passes.index:
            yield
            return
        try:
            yield
        except Exception as e:
            log.info("a note could not be written to the index built beside (%s)", e)
            self._passes.request()

    async def _index(self, note: notes.Note) -> None:
        """The note put into each index it must be in (`_to_each`)."""
        path = self.folder / note.document
        vectors: dict[str, npt.NDArray[np.float32]] = {}
        await self._to_each(lambda index, settings: self._put(index, settings, path, note, vectors))

    async def _to_each(self, act: Callable[[Index, IndexSettings | None], Awaitable[None]]) -> None:
        """`act` on each index a note must be in or out of, again until none changed
        meanwhile: an index built beside that takes the answering one's place while a note
        is written (its last round may have listed the notes before this one was kept)
        holds it when the write returns. Each is served while acted on: the switch and the
        rebuild retire an index only once nothing is (a write to a retired one is refused),
        and one replaced before its turn is left to the loop, which acts on the one in its
        place."""
        done: list[Index] = []
        while todo := [t for t in self._targets() if not any(t[0] is d for d in done)]:
            for index, settings in todo:
                done.append(index)
                if not any(index is t for t, _ in self._targets()):
                    continue
                with self._beside(index), index.serve():
                    await act(index, settings)

    async def _put(
        self,
        index: Index,
        settings: IndexSettings | None,
        path: Path,
        note: notes.Note,
        known: dict[str, npt.NDArray[np.float32]],
    ) -> None:
        """The note cut and embedded as `index` is built (`settings`, else its own), and
        put into it; `known`: the vectors of passages embedded for another index."""
        if settings is None:
            settings = await asyncio.to_thread(index.settings)
        if settings is None:  # no pass has recorded how the index is built yet
            self._passes.request()
            return
        chunks = await asyncio.to_thread(
            _cut, path, self.folder, settings.chunk_size, settings.chunk_overlap
        )
        vectors, built_with = await self._vectors(chunks, settings, known)
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
        if built_with != settings.key:
            self._passes.request()  # embedded by a pass when the model answers

    async def _vectors(
        self,
        chunks: list[Chunk],
        settings: IndexSettings,
        known: dict[str, npt.NDArray[np.float32]],
    ) -> tuple[npt.NDArray[np.float32] | None, str]:
        """The chunks' vectors and what they are built with; None and "" (the pass reads
        the note again) while the model does not answer, or while a new model's vectors
        are made. Sent ahead of a pass's bulk (`embed_now`); passages already embedded
        for another index are not sent again."""
        embedder = self._configured.embedder
        if embedder is None:
            return None, settings.key
        if (
            self._passes.model_change.answering_now() is not None
            or embedder.model != settings.model
            or embedder.dimensions != settings.dimensions
        ):
            return None, ""
        passages = [texts.embedded(c) for c in chunks]
        asked = [p for p in dict.fromkeys(passages) if p not in known]
        try:
            if asked:
                got = await asyncio.wait_for(embedder.embed_now(asked), EMBED_SECONDS)
                known.update(zip(asked, got, strict=True))
        except (ModelUnavailable, ModelRefused, TimeoutError) as e:
            log.info("a note is kept by its words until the embedding model answers: %s", e)
            return None, ""
        if not passages:
            return np.zeros((0, settings.dimensions), dtype=np.float32), settings.key
        return np.stack([known[p] for p in passages]), settings.key


def _read_record(note_id: str, path: Path) -> notes.Note:
    raw = json.loads(path.read_text(encoding="utf-8"))
    notes.moment(raw["written_at"])
    text = raw["text"]
    if not isinstance(text, str):
        raise TypeError(f"its text is {type(text).__name__}, not a string")
    return notes.Note(
        note_id, text, raw["written_at"], raw.get("title"), tuple(raw.get("replaces", ()))
    )


def _full(e: OSError, note: notes.Note) -> DriveFull | None:
    """The refusal of a note the drive has no room for; None for another error."""
    return _no_room(note) if e.errno in FULL else None


def _no_room(note: notes.Note) -> DriveFull:
    return DriveFull(
        "NOTES_DRIVE_FULL",
        f"the index drive has no room for note {note.id} ({len(notes.markdown(note)):,} "
        "characters): nothing of it was kept, and the notes held are as they were; write "
        "it again once there is room",
    )


def _cut(path: Path, root: Path, size: int, overlap: int) -> list[Chunk]:
    document = readers.read_document(path, Kind.MD, root)
    return chunking.chunk_document(document, size, overlap)


def _stage(path: Path, content: str) -> Path:
    """`content` written whole and synced beside `path` (`.<name>.new`), to be renamed
    into place; nothing is left where it cannot be written."""
    staged = path.with_name(f".{path.name}.new")
    try:
        with open(staged, "w", encoding="utf-8") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            staged.unlink()
        raise
    return staged


def _commit(moves: Sequence[tuple[Path, Path]]) -> list[Path]:
    """Staged files renamed into place, in order; the folders to sync."""
    for staged, place in moves:
        os.replace(staged, place)
    return list(dict.fromkeys(place.parent for _, place in moves))


def _sync(directory: Path | Sequence[Path]) -> None:
    for d in [directory] if isinstance(directory, Path) else directory:
        sync_folder(d)
