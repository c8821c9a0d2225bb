"""A new chunking's index built beside the one that answers.

Chunks of another size are other passages: they cannot be switched chunk by chunk as a new
model's vectors are (`model_change`). So the whole index is built again in a folder of its own
(`index.folders`), by a pass over the sources, while searches go on answering from the
index as it was, by meaning; once it is complete it answers instead, at once. A passage the
old index already holds keeps its vector (a short document, a section shorter than either
size, is cut the same), so the model is sent only what is new. A kill mid-build resumes
it: the files already built are not read again. `ChunkingChange` is the pass's part that
does it: it takes the pass's read of the sources, and its vectors (`vectors.Vectors`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import sqlite3
import time
from pathlib import Path

from metis_indexer.changes.model_change import LOG_MEGABYTES, endpoint_meta
from metis_indexer.changes.passing import Read, Shown
from metis_indexer.changes.vectors import Vectors
from metis_indexer.configured import Configured
from metis_indexer.index import folders, store
from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.ingest.runner import now

log = logging.getLogger("metis.indexer")

ROUNDS = 3
"""Passes over the sources a build makes at most before it answers: the first reads every
document; each next one what changed meanwhile, until one finds nothing to read."""


@dataclasses.dataclass(slots=True)
class Building:
    """An index of a new chunking being built beside the one that answers."""

    old: IndexSettings
    new: IndexSettings
    index: Index
    """The new index (in its own folder): searches do not see it until it answers."""


class NoRoom(Exception):
    """The new chunking's index does not fit on the index drive beside the one that
    answers: the change waits for room, and the old index goes on answering."""


class BuildDamaged(Exception):
    """The index being built beside was damaged: it is removed and built again, while the
    one that answers goes on answering (it is not rebuilt: the damage is not its)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(
            f"the index being built beside the one that answers was damaged ({error}): it "
            "is built again"
        )


def needs_building(current: IndexSettings | None, wanted: IndexSettings, chunks: int) -> bool:
    """Whether a change is built beside the index that answers: the chunking changed, the
    model did not (a new model's vectors are made first, `model_change`), and the index holds
    chunks to answer with meanwhile."""
    return (
        current is not None
        and chunks > 0
        and current.same_model(wanted)
        and chunking(current) != chunking(wanted)
    )


def chunking(settings: IndexSettings) -> tuple[int, int]:
    return settings.chunk_size, settings.chunk_overlap


def megabytes(
    answering_bytes: int, built_bytes: int, old: IndexSettings, new: IndexSettings
) -> int:
    """What the rest of a build costs on the index drive, in MB (rounded up): the answering
    index's size scaled by how many more chunks (a vector and a row each) or how much more
    text (the overlaps, stored again in each chunk) the new chunking makes, less what is
    built already."""
    old_step = old.chunk_size - old.chunk_overlap
    new_step = new.chunk_size - new.chunk_overlap
    more_chunks = old_step / new_step
    more_text = (new.chunk_size / new_step) / (old.chunk_size / old_step)
    estimate = answering_bytes * max(1.0, more_chunks, more_text)
    return math.ceil(max(0.0, estimate - built_bytes) / 1_000_000)


def no_room(needed_mb: int, free_mb: int, old: IndexSettings, new: IndexSettings) -> str | None:
    """Why a build cannot go on (the reason its `waiting` shows), or None when it fits with
    the log's room to spare."""
    if needed_mb + LOG_MEGABYTES <= free_mb:
        return None
    return (
        f"the index of {described(new)} needs about {needed_mb} MB more beside the one that "
        f"answers and {free_mb} MB are free on the index drive: the index of {described(old)} "
        "goes on answering until there is room"
    )


def described(settings: IndexSettings) -> str:
    """Chunks as the status and the log name them."""
    return f"chunks of {settings.chunk_size} characters (overlap {settings.chunk_overlap})"


def reason(old: IndexSettings, new: IndexSettings) -> str:
    """What the phase says while the new index is built."""
    return (
        f"building the index of {described(new)} beside the one of {described(old)}, which "
        "answers searches until it is complete"
    )


def remove_left_over(index_dir: Path, answering: Path, building: Path | None = None) -> None:
    """What a kill or a switch left on the index drive besides the index that answers
    (and the one being built): the writer's to do, before a pass."""
    for folder in folders.left_over(index_dir, answering, building):
        log.info("removing %s: an index no longer answering or built", folder)
        folders.remove(index_dir, folder)


class ChunkingChange:
    """The pass's part that builds a new chunking's index beside the one that answers;
    `vectors`: where the build's vectors come from (those the answering index holds first)."""

    def __init__(self, configured: Configured, progress: Shown, vectors: Vectors) -> None:
        self._configured = configured
        self._progress = progress
        self._vectors = vectors
        self.building: Building | None = None
        """A new chunking's index being built beside the one that answers."""

    def progress(self) -> tuple[int, int]:
        """Documents the new chunking's index holds, and of how many it is built (those it
        holds and those the pass has still to read)."""
        building, state = self.building, self._progress.state
        if building is None:
            return 0, 0
        held = len(building.index.files)
        return held, held + max(0, state.total - state.done)

    async def build(
        self, answering: Index, current: IndexSettings, settings: IndexSettings, read: Read
    ) -> Index | None:
        """The new chunking's index built in a folder of its own (resumed where a stop left
        it) while `answering` goes on answering, then published to answer in its place (the
        caller takes it, and retires `answering`): the answering index is brought up to
        date first, and the new one read again until a round finds nothing changed, up to
        `ROUNDS` times. None where the configuration changed meanwhile (nothing switched;
        what is built is kept)."""
        index_dir = self._configured.config.index_dir
        folder = await asyncio.to_thread(folders.beside, index_dir, answering.folder)
        await asyncio.to_thread(remove_left_over, index_dir, answering.folder, folder)
        new = await self._opened_beside(folder, settings)
        self.building = Building(current, settings, new)
        self._progress.changing = reason(current, settings)
        vectors = self._vectors
        started, kept, asked = time.monotonic(), vectors.kept, vectors.from_model
        log.info(
            "%s now; the index holds %s: building it beside the one that answers, in %s "
            "(%d documents built)",
            described(settings),
            described(current),
            folder,
            len(new.files),
        )
        switched, read_in, dropped = False, 0, 0
        state = self._progress.state
        try:
            await read(current, vectors.embed)
            embed = vectors.reusing(answering.store)
            for _ in range(ROUNDS):
                await self._check_room(answering, self.building)
                try:
                    planned = await read(settings, embed, new)
                except sqlite3.DatabaseError as e:
                    if store.trouble(e) != "damaged":
                        raise
                    await self._give_up(new)  # the index that answers is not the damaged one
                    raise BuildDamaged(e) from None
                read_in, dropped = read_in + state.read, dropped + state.dropped
                configured = self._configured.config.chunking
                if (configured.size, configured.overlap) != chunking(settings):
                    return None
                if not planned.to_read and not planned.to_drop:
                    break
            await asyncio.to_thread(new.settle)
            await asyncio.to_thread(new.store.set_meta, self._answering_meta())
            await asyncio.to_thread(folders.publish, index_dir, folder)
            switched = True
            state.read, state.dropped = read_in, dropped
        finally:
            self.building = None
            self._progress.changing = ""
            if not switched:
                await self._let_go(new)
        log.info(
            "switched to the index of %s: %d documents in %.1f s; %d passages kept their "
            "vectors, %d were sent to the model",
            described(settings),
            len(new.files),
            time.monotonic() - started,
            vectors.kept - kept,
            vectors.from_model - asked,
        )
        return new

    @staticmethod
    async def _let_go(new: Index) -> None:
        """A build's index closed, once a write cancelled mid-way (still running in its
        thread) has ended."""
        await asyncio.to_thread(new.writes_done)
        await asyncio.to_thread(new.store.close)

    async def _give_up(self, new: Index) -> None:
        """A build that cannot go on: its folder removed, the next pass starts it anew."""
        await self._let_go(new)
        await asyncio.to_thread(folders.remove, self._configured.config.index_dir, new.folder)

    async def _opened_beside(self, folder: Path, settings: IndexSettings) -> Index:
        """The index a build resumes in `folder` (one a stop left, if built with these
        settings and not damaged; else an empty one)."""
        new = Index(folder, self._configured.config.vectors)
        try:
            await asyncio.to_thread(new.store.check)
            await asyncio.to_thread(new.load)
            built = await asyncio.to_thread(new.settings)
        except sqlite3.DatabaseError as e:
            if store.trouble(e) != "damaged":
                raise
            log.warning("the index being built in %s is damaged (%s): building it anew", folder, e)
            await self._give_up(new)
            return await self._opened_beside(folder, settings)
        if built is not None and built != settings:
            log.info("%s holds an index of other settings (%s): building anew", folder, built)
            await self._give_up(new)
            return await self._opened_beside(folder, settings)
        if built is None:
            await asyncio.to_thread(new.adopt, settings)
        return new

    def _answering_meta(self) -> dict[str, str]:
        """What an index built beside records once it answers: it has had a whole pass, and
        the endpoint its vectors are of."""
        endpoint = self._configured.config.embedding
        meta = {store.PASSED: now()}
        if endpoint is not None:
            meta.update(endpoint_meta(endpoint))
        return meta

    async def _check_room(self, answering: Index, building: Building) -> None:
        """NoRoom (the pass waits, and is tried again) where the rest of the new index does
        not fit on the index drive beside `answering`."""
        index_dir = self._configured.config.index_dir
        answering_bytes, built = await asyncio.gather(
            asyncio.to_thread(folders.size, index_dir, answering.folder),
            asyncio.to_thread(folders.size, index_dir, building.index.folder),
        )
        needed = megabytes(answering_bytes, built, building.old, building.new)
        free = store.free_megabytes(index_dir)
        why = no_room(needed, free, building.old, building.new)
        if why is not None:
            raise NoRoom(why)
