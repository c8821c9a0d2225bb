"""The passes: the index loaded, then a pass whenever one is asked for or the rescan is due.

A pass is `ingest.plan` (what to read, what to drop) and `ingest.runner` (reading,
embedding, writing). When the embedding model does not answer, the pass waits
(`model_watch`) and resumes where it stopped; a full index drive makes it wait for space; a
damaged index is moved aside and rebuilt from the sources (it is derived data), whether the
damage was met by a pass, a search or the integrity check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time

import numpy as np
import numpy.typing as npt

from metis_indexer.configured import Configured
from metis_indexer.errors import Conflict
from metis_indexer.index import store
from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.ingest import plan
from metis_indexer.ingest.readers.pool import ReaderPool
from metis_indexer.ingest.runner import Runner, now
from metis_indexer.metrics import Metrics
from metis_indexer.model_watch import WAIT_FIRST, WAIT_MAX, ModelWatch
from metis_indexer.models.clients import ModelRefused, ModelUnavailable
from metis_indexer.progress import Progress

log = logging.getLogger("metis.indexer")


class Passes:
    """One index and the passes that keep it: only the indexer holding the index's writer
    lock runs `loop` or `rebuild` (`service.Indexer`)."""

    def __init__(
        self, configured: Configured, progress: Progress, watch: ModelWatch, metrics: Metrics
    ) -> None:
        self._configured = configured
        self._progress = progress
        self._watch = watch
        self._metrics = metrics
        config = configured.config
        self.index = Index(config.index_dir, config.vectors)
        """The index searches read; a rebuild replaces it."""
        self.loaded = False
        """Whether the index is loaded: searches are answered from then on."""
        self.notes: list[str] = []
        """What a person should know until the indexer restarts (an index rebuilt)."""
        self.damage: str | None = None
        """Damage met outside the pass loop (a search, the integrity check), said in the
        status until the pass loop has rebuilt the index."""
        self._damage_error: Exception | None = None
        self._wake = asyncio.Event()
        self._full = False

    def request(self, full: bool = False) -> None:
        """Ask for a pass (`full`: every document read again) as soon as the one running
        ends."""
        if self._progress.state.phase == "standby":
            raise Conflict("STANDBY", "a replacement is taking over; ask again in a moment")
        self._full = self._full or full
        self._wake.set()

    # -- the index -------------------------------------------------------------------------

    async def open(self) -> sqlite3.DatabaseError | None:
        """Load the index, waiting (and saying why) while its folder cannot hold it; the
        damage that keeps it from loading, for a rebuild."""
        delay = WAIT_FIRST
        while True:
            try:
                await asyncio.to_thread(self._check_and_load)
                return None
            except store.StoreUnavailable as e:
                log.error("%s", e)
                self._progress.set_phase("waiting", str(e))
            except sqlite3.DatabaseError as e:
                if store.trouble(e) != "damaged":
                    raise
                self._metrics.index_damage.labels(found_by="start").inc()
                return e
            await asyncio.sleep(delay)
            delay = min(WAIT_MAX, delay * 2)

    def _check_and_load(self) -> None:
        self.index.store.check()
        self.index.load()
        self.index.settle()

    async def rebuild(self, error: Exception) -> None:
        """Move a damaged index aside and start an empty one; the next pass reads every
        document again. The caller holds the index's writer lock."""
        log.error("the index is damaged (%s): moving it aside and rebuilding it", error)
        aside = await asyncio.to_thread(self.index.store.move_aside)
        config = self._configured.config
        self.index = Index(config.index_dir, config.vectors)
        await asyncio.to_thread(self.index.load)
        self._metrics.index_rebuilds.inc()
        self._progress.rebuilding = (
            f"rebuilding the index from the sources: it was damaged ({error}); "
            f"the damaged file was moved aside as {aside.name}"
        )
        self.notes.append(
            f"the index was damaged ({error}) and rebuilt from the sources at {now()}; "
            f"the damaged file is kept as {aside.name}"
        )
        self.damage = self._damage_error = None
        self._progress.set_phase("loading", "")

    def damaged(self, error: sqlite3.DatabaseError, found_by: str) -> None:
        """Damage met outside the pass loop: counted each time, said in the status, and the
        pass loop woken to rebuild the index (at once when idle, else when its pass ends:
        a pass's own writes meet the damage too, or finish first)."""
        self._metrics.index_damage.labels(found_by=found_by).inc()
        if self._damage_error is not None:
            return
        by = "a search" if found_by == "search" else "the integrity check"
        log.error("the index is damaged (%s), met by %s: rebuilding it from the sources", error, by)
        self._damage_error = error
        self.damage = (
            f"the index is damaged ({error}; met by {by} at {now()}): it is being rebuilt "
            "from the sources"
        )
        self._wake.set()

    async def check_pages(self) -> None:
        """The integrity check: every `check_seconds`, a few pages more of the index file
        are read (`Store.sweep`), so damage on a page that no search reads is found too,
        without reading a large index whole (what SQLite's quick check at start does)."""
        while True:
            await asyncio.sleep(self._configured.config.check_seconds)
            if not self.loaded or self._damage_error is not None:
                continue
            checked = self.index.store
            try:
                await asyncio.to_thread(checked.sweep)
            except sqlite3.DatabaseError as e:
                if store.trouble(e) != "damaged" or checked is not self.index.store:
                    continue  # not damage, or the index was rebuilt meanwhile
                self.damaged(e, "check")

    # -- the passes ------------------------------------------------------------------------

    async def loop(self, pool: ReaderPool) -> None:
        """A pass, then another when asked or when the rescan is due; a pass that breaks is
        tried again after a while, and a damaged index rebuilt first."""
        delay = WAIT_FIRST
        while True:
            if self._damage_error is not None:
                await self.rebuild(self._damage_error)
            full, self._full = self._full, False
            self._wake.clear()
            watch = asyncio.create_task(self._watch.watch(), name="metis-model-watch")
            try:
                await self._pass(full, pool)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a pass that breaks must not end the service
                if store.trouble(e) == "damaged":
                    self._metrics.index_damage.labels(found_by="pass").inc()
                    await self.rebuild(e)
                    continue
                self._progress.set_phase("waiting", self._stopped_because(e))
                await asyncio.sleep(delay)
                delay = min(WAIT_MAX, delay * 2)
                continue
            finally:
                watch.cancel()
            delay = WAIT_FIRST
            wait = self._configured.config.rescan_seconds or None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _stopped_because(self, e: Exception) -> str:
        """The reason a pass that broke shows; it is tried again after a while."""
        if store.trouble(e) == "full":
            free = store.free_megabytes(self._configured.config.index_dir)
            log.warning("the index drive is full (%d MB free): waiting for space", free)
            return f"the index drive is full ({free} MB free); indexing resumes when there is room"
        log.exception("pass failed")
        return f"the last pass stopped on an error: {e}"

    async def _pass(self, full: bool, pool: ReaderPool) -> None:
        started = time.monotonic()
        config = self._configured.config
        revisions = dict(config.revisions)
        generation = config.generation
        state = self._progress.state
        self._progress.set_phase("scanning", "")
        settings = await self._settings()
        current = self.index.settings()
        if current != settings:
            if current is not None and self.index.chunk_count:
                again = (
                    "reading everything again"
                    if current.key != settings.key
                    else "counting words again from the stored texts"
                )
                log.info("index built with %s; now %s: %s", current, settings, again)
            await asyncio.to_thread(self.index.adopt, settings)
        listing = await asyncio.to_thread(plan.scan, self._configured.config.sources)
        state.skipped = dict(listing.skipped)
        state.problems = list(listing.problems)
        known = {(f.record.source, f.record.path): f.record for f in self.index.files.values()}
        planned = plan.plan(listing, known, settings, full)
        await asyncio.to_thread(self.index.drop_files, planned.to_drop)
        state.total, state.done = len(planned.to_read), 0
        state.read = state.unchanged = 0
        state.dropped = len(planned.to_drop)
        self._progress.set_phase("indexing" if planned.to_read else "scanning", "")
        runner = Runner(self.index, pool, self._embed, state, self._progress.publish)
        await runner.run(planned.to_read, known, full, settings)
        await asyncio.to_thread(self.index.settle)
        state.last_indexed_at = now()
        state.completed += 1
        state.indexed_revisions = revisions
        state.indexed_generation = generation
        self._progress.rebuilding = ""
        self._metrics.pass_seconds.observe(time.monotonic() - started)
        self._progress.set_phase("ready", "")
        log.info(
            "pass done in %.1f s: %d read, %d unchanged, %d dropped",
            time.monotonic() - started,
            state.read,
            state.unchanged,
            len(planned.to_drop),
        )

    async def _settings(self) -> IndexSettings:
        """What the index must be built with now: waits for the embedding model."""
        chunking = self._configured.config.chunking
        size, overlap = chunking.size, chunking.overlap
        embedder = self._configured.embedder
        if embedder is None:
            return IndexSettings("", 0, size, overlap)
        while True:
            try:
                if embedder.model is None or embedder.dimensions is None:
                    await embedder.connect()
                    await embedder.embed_documents(["dimensions"])
                assert embedder.model is not None and embedder.dimensions is not None
                return IndexSettings(embedder.model, embedder.dimensions, size, overlap)
            except ModelUnavailable as e:
                await self._watch.wait_for(e)

    async def _embed(self, passages: list[str]) -> npt.NDArray[np.float32] | None:
        """Vectors of a document's passages; waits (phase `waiting`) while the model is
        away."""
        if self._configured.embedder is None:
            return None
        while True:
            embedder = self._configured.embedder  # a changed configuration makes another
            assert embedder is not None
            started = time.monotonic()
            try:
                vectors = await embedder.embed_documents(passages)
                self._metrics.embed_seconds.observe(time.monotonic() - started)
                return vectors
            except ModelRefused:
                raise
            except ModelUnavailable as e:
                self._metrics.embed_failures.inc()
                await self._watch.wait_for(e)
