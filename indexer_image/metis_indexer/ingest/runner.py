"""A pass's reading, embedding and writing of the files its plan names.

Many documents are in flight at once: their passages share full embedding
requests, and they are committed a few to a transaction, each document whole or
not at all. What fails of one document alone (it cannot be read, embedded or
stored) is recorded as its failure and the pass goes on; the index's own trouble
(a full drive, a damaged file) is raised for the service to handle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import hashlib
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from metis_indexer.documents import FailReason, ReadFailed
from metis_indexer.index import store, texts
from metis_indexer.index.memory import Index, IndexSettings, Replacement
from metis_indexer.index.store import FileRecord
from metis_indexer.ingest import readers, sources
from metis_indexer.ingest.plan import Key, ToRead
from metis_indexer.ingest.readers.failures import detail
from metis_indexer.ingest.readers.pool import CountedChunks, ReaderPool
from metis_indexer.ingest.writer import GroupWriter
from metis_indexer.models.clients import ModelRefused, Unencodable

log = logging.getLogger("metis.indexer")

IN_FLIGHT_DOCUMENTS = 32
"""Documents hashed, read, embedded and written at once: enough that the reader workers
always have the next file, the model full requests (a document is 18 passages on
average), and the writer a group to commit while the next embed."""

Embed = Callable[[list[str]], Awaitable[npt.NDArray[np.float32] | None]]
"""Passages → their vectors (None: no embedding model); waits while the model is away."""


def now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def file_hash(path: Path, root: Path | None = None) -> str:
    """The content hash of a regular file still inside its drive (ReadFailed if not), of
    its first 64 MB and a byte at most: a longer file fails when read anyway, and hashing
    all of it would read gigabytes, past any deadline, for nothing."""
    digest = hashlib.blake2b(digest_size=20)
    left = readers.MAX_BYTES + 1
    with os.fdopen(readers.open_inside(path, root), "rb") as f:
        while left and (block := f.read(min(1 << 20, left))):
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def failed(record: FileRecord, why: ReadFailed) -> FileRecord:
    return dataclasses.replace(
        record, state="failed", reason=why.reason.value, detail=why.detail or None, chunks=0
    )


@dataclasses.dataclass
class PassState:
    """What a status shows of the passes."""

    phase: str = "loading"
    reason: str = ""
    total: int = 0
    done: int = 0
    last_indexed_at: str | None = None
    completed: int = 0
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    indexed_revisions: dict[str, str] = dataclasses.field(default_factory=dict)
    indexed_generation: int | None = None
    read: int = 0
    unchanged: int = 0
    dropped: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Runner:
    """Brings the planned files up to date, counting in `state` and calling `progress`
    after each."""

    index: Index
    pool: ReaderPool
    embed: Embed
    state: PassState
    progress: Callable[[], None]

    async def run(
        self,
        to_read: Sequence[ToRead],
        known: Mapping[Key, FileRecord],
        full: bool,
        settings: IndexSettings,
    ) -> None:
        queue: asyncio.Queue[ToRead] = asyncio.Queue()
        for entry in to_read:
            queue.put_nowait(entry)
        writer = GroupWriter(self.index)
        writing = asyncio.create_task(writer.run(), name="metis-writer")
        workers = [
            asyncio.create_task(self._work(queue, writer, known, full, settings))
            for _ in range(min(IN_FLIGHT_DOCUMENTS, len(to_read)))
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            writing.cancel()

    async def _work(
        self,
        queue: asyncio.Queue[ToRead],
        writer: GroupWriter,
        known: Mapping[Key, FileRecord],
        full: bool,
        settings: IndexSettings,
    ) -> None:
        while not queue.empty():
            entry = queue.get_nowait()
            drive, path = entry.key
            await self._one(writer, drive, path, entry.found, known.get(entry.key), full, settings)
            self.state.done += 1
            self.progress()

    async def _one(
        self,
        writer: GroupWriter,
        drive: str,
        path: str,
        item: sources.Found,
        before: FileRecord | None,
        full: bool,
        settings: IndexSettings,
    ) -> None:
        """Bring one file up to date; commits it whole or not at all. Whatever fails of
        this document alone is recorded as its failure, and the pass goes on. Its file
        work runs on the reader pool's own threads, under a deadline: never on the threads
        searches rank on."""
        try:
            digest = await self.pool.files.within(item.root, file_hash, item.absolute, item.root)
        except (OSError, ReadFailed) as e:
            digest = ""
            result: CountedChunks | ReadFailed = (
                e if isinstance(e, ReadFailed) else ReadFailed(FailReason.UNREADABLE, detail(e))
            )
        else:
            if (
                before is not None
                and before.hash == digest
                and before.built_with == settings.key
                and not full
            ):
                await self.pool.files.call(
                    self.index.touch_file,
                    dataclasses.replace(before, size=item.size, mtime_ns=item.mtime_ns),
                )
                self.state.unchanged += 1
                return
            result = await self.pool.read_counted(
                item.absolute, item.kind, settings.chunk_size, settings.chunk_overlap, item.root
            )
        self.state.read += 1
        record = FileRecord(
            source=drive,
            path=path,
            kind=item.kind.value,
            size=item.size,
            mtime_ns=item.mtime_ns,
            hash=digest,
            state="indexed",
            indexed_at=now(),
            built_with=settings.key,
        )
        if isinstance(result, ReadFailed):
            await writer.put(Replacement(failed(record, result)))
            return
        chunks = result.chunks
        try:
            vectors = await self.embed([texts.embedded(c) for c in chunks])
        except Unencodable as e:
            await writer.put(Replacement(failed(record, ReadFailed(FailReason.MALFORMED, str(e)))))
            return
        except ModelRefused as e:
            why = ReadFailed(FailReason.EMBEDDING_REFUSED, str(e))
            await writer.put(Replacement(failed(record, why)))
            return
        record = dataclasses.replace(
            record, title=chunks[0].title if chunks else None, chunks=len(chunks)
        )
        try:
            await writer.put(Replacement(record, chunks, vectors, result.terms))
        except (sqlite3.Error, ValueError) as e:
            if store.trouble(e) is not None:
                raise  # the index's trouble, not this document's
            log.warning("%s: %s could not be stored: %s", drive, path, e)
            why = ReadFailed(FailReason.NOT_STORED, detail(e))
            await writer.put(Replacement(failed(record, why)))
