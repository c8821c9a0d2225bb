"""The passes: the index loaded, then a pass whenever one is asked for or the rescan is due.

A pass is `ingest.plan` (what to read, what to drop) and `ingest.runner` (reading,
embedding, writing). When the embedding model does not answer, the pass waits
(`model_watch`) and resumes where it stopped; a full index drive makes it wait for space; a
damaged index is moved aside and rebuilt from the sources (it is derived data), whether the
damage was met by a pass, a search or the integrity check. A new embedding model's vectors
are made from the stored chunks beside the ones that answer, and switched to at once
(`changes.model_change`); a new chunking's index is built beside the one that answers, and
answers in its place once complete (`changes.chunking_change`); a passage's vector comes
from the index that answers, the peers or the model (`changes.vectors`). A source whose
listing does not finish (a hung drive) stops the pass, which waits and is tried again, its
files kept, with one listing of it in flight at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import time

from metis_indexer import notes
from metis_indexer.changes import chunking_change, model_change
from metis_indexer.changes.chunking_change import ChunkingChange
from metis_indexer.changes.model_change import ModelChange
from metis_indexer.changes.passing import Read
from metis_indexer.changes.vectors import Vectors
from metis_indexer.config import SourceConfig
from metis_indexer.configured import Configured
from metis_indexer.errors import Conflict
from metis_indexer.index import folders, store
from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.ingest import artifacts, plan
from metis_indexer.ingest.readers.pool import FileThreads, ReaderPool
from metis_indexer.ingest.runner import Embed, Runner, now
from metis_indexer.metrics import Metrics
from metis_indexer.models.clients import ModelUnavailable
from metis_indexer.service.model_watch import WAIT_FIRST, WAIT_MAX, ModelWatch
from metis_indexer.service.notebook import Notebook
from metis_indexer.service.progress import Progress

log = logging.getLogger("metis.indexer")

RETIRE_SECONDS = 60.0
"""How long an index another took the place of stays open for the searches still answering
from it (a search waits for its models a few seconds at most); then it is closed anyway."""
RETIRE_LOOK = 0.05
"""Seconds between looks at whether those searches have ended."""
LISTING_SECONDS = 900.0
"""How long a pass waits for the listing of its sources before it stops and is tried
again. Listing the 19,546 files of a documentation corpus takes 0.75 s here: a quarter of
an hour is over a thousand times that, a drive that much larger or slower (a network
drive of millions of files) still listed; past it the drive is hung (a stale NFS mount, a
FUSE filesystem that stopped answering)."""


class Passes:
    """One index and the passes that keep it: only the indexer holding the index's writer
    lock runs `loop` or `rebuild` (`service.Indexer`). A pass composes the changes made
    beside the index that answers (`model_change`, `chunking_change`) and where its vectors
    come from (`vectors`)."""

    def __init__(
        self,
        configured: Configured,
        progress: Progress,
        watch: ModelWatch,
        metrics: Metrics,
        token: str | None = None,
    ) -> None:
        self._configured = configured
        self._progress = progress
        self._watch = watch
        self._metrics = metrics
        config = configured.config
        self.index = Index(folders.live(config.index_dir), config.vectors)
        """The index searches read; a rebuild, or a new chunking's built beside, replaces it."""
        self.chunks_of: tuple[int, int] | None = None
        """The chunk size and overlap the answering index was built with (None: not yet)."""
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
        self._listings: dict[plan.Key, asyncio.Future[plan.Scan]] = {}
        """The sources' listings that have not returned, on the pass's file threads: one
        a source at most, however often the pass is tried again."""
        self.passed = False
        """Whether the index has had one whole pass (recorded in it: a restart keeps it)."""
        self.vectors = Vectors(configured, metrics, watch.wait_for, token)
        """Where a pass's vectors come from (kept, the peers, the model), and the vectors
        this index gives its peers."""
        self.model_change = ModelChange(
            configured, progress, metrics, lambda: self.index, self.vectors.embed
        )
        """A new embedding model's vectors made beside the ones that answer."""
        self.chunking_change = ChunkingChange(configured, progress, self.vectors)
        """A new chunking's index built beside the one that answers."""
        self.notebook = Notebook(configured, self, progress)
        """The base's own notes, kept in a folder of the index drive."""
        self.artifacts = artifacts.Fetched()
        """The revision folder each artifact source reads."""

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
                await self.model_change.follow_recorded()
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
        self._loaded()

    def _loaded(self) -> None:
        self.notebook.load()
        self.index.load()
        self.index.settle()
        meta = self.index.store.meta()
        settings = IndexSettings.from_meta(meta)
        self.chunks_of = None if settings is None else chunking_change.chunking(settings)
        # An index made before `PASSED` was kept has had its passes where it holds chunks:
        # a base going from one replica to two must not take its only answering pod out
        # of its Service until a pass ends.
        made_before = store.PASSES_TRACKED not in meta and self.index.chunk_count > 0
        self.passed = store.PASSED in meta or made_before

    async def rebuild(self, error: Exception) -> None:
        """Start an empty index in a folder of its own, answering at once, and move the
        damaged one aside once the searches still reading it have ended (as a switch
        does); the next pass reads every document again. The caller holds the index's
        writer lock."""
        log.error("the index is damaged (%s): moving it aside and rebuilding it", error)
        config = self._configured.config
        damaged = self.index
        folder = await asyncio.to_thread(folders.beside, config.index_dir, damaged.folder)
        await asyncio.to_thread(folders.remove, config.index_dir, folder)  # a build's, if any
        rebuilt = Index(folder, config.vectors)
        await asyncio.to_thread(rebuilt.load)
        await asyncio.to_thread(folders.publish, config.index_dir, folder)
        self.model_change.drop_answering()
        self.index = rebuilt
        self.passed = False
        self.chunks_of = None
        self.damage = self._damage_error = None
        await self._retire(damaged, remove=False)
        aside = await asyncio.to_thread(damaged.store.move_aside, config.index_dir)
        self._metrics.index_rebuilds.inc()
        self._progress.rebuilding = (
            f"rebuilding the index from the sources: it was damaged ({error}); "
            f"the damaged file was moved aside as {aside.name}"
        )
        self.notes.append(
            f"the index was damaged ({error}) and rebuilt from the sources at {now()}; "
            f"the damaged file is kept as {aside.name}"
        )
        self._progress.set_phase("loading", "")

    async def reopen(self) -> None:
        """The index that answers loaded again, from the folder the pointer names now: the
        indexer that wrote it while this one stood by may have built another since."""
        folder = await asyncio.to_thread(folders.live, self._configured.config.index_dir)
        if folder == self.index.folder:
            await asyncio.to_thread(self._loaded)
            return
        old = self.index
        self.index = Index(folder, self._configured.config.vectors)
        await asyncio.to_thread(self._loaded)
        await self._retire(old, remove=False)  # its files are the writer's to remove

    async def _retire(self, old: Index, remove: bool) -> None:
        """Close an index another took the place of, once no search answers from it (at
        most `RETIRE_SECONDS`); `remove`: its files too (the writer's to do)."""
        deadline = time.monotonic() + RETIRE_SECONDS
        while old.serving and time.monotonic() < deadline:
            await asyncio.sleep(RETIRE_LOOK)
        await asyncio.to_thread(old.writes_done)
        await asyncio.to_thread(old.store.retire)
        if remove:
            await asyncio.to_thread(folders.remove, self._configured.config.index_dir, old.folder)

    def damaged(self, error: sqlite3.DatabaseError, found_by: str, index: Index) -> None:
        """Damage met outside the pass loop in `index`: counted each time, said in the
        status, and the pass loop woken to rebuild the index (at once when idle, else when
        its pass ends: a pass's own writes meet the damage too, or finish first). Damage a
        search meets in an index another has taken the place of since is counted only."""
        self._metrics.index_damage.labels(found_by=found_by).inc()
        if self._damage_error is not None or index is not self.index:
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
            checked = self.index
            try:
                await asyncio.to_thread(checked.store.sweep)
            except (sqlite3.Error, store.StoreUnavailable) as e:
                if not isinstance(e, sqlite3.DatabaseError) or store.trouble(e) != "damaged":
                    continue  # not damage, or an index another took the place of
                self.damaged(e, "check", checked)

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
                await self._back_off(delay)
                delay = min(WAIT_MAX, delay * 2)
                continue
            finally:
                watch.cancel()
            delay = WAIT_FIRST
            wait = self._configured.config.rescan_seconds or None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _back_off(self, delay: float) -> None:
        """The wait before a pass that broke is tried again, cut short when a listing it
        waited for returns: the drive answers again."""
        listings = list(self._listings.values())
        if listings:
            await asyncio.wait(listings, timeout=delay)
        else:
            await asyncio.sleep(delay)

    def _stopped_because(self, e: Exception) -> str:
        """The reason a pass that broke shows; it is tried again after a while."""
        changes = (model_change.NoRoom, chunking_change.NoRoom, chunking_change.BuildDamaged)
        if isinstance(e, (*changes, plan.ListingHung, artifacts.ArtifactError)):
            log.warning("%s", e)
            return str(e)
        if store.trouble(e) == "full":
            free = store.free_megabytes(self._configured.config.index_dir)
            log.warning("the index drive is full (%d MB free): waiting for space", free)
            return f"the index drive is full ({free} MB free); indexing resumes when there is room"
        log.exception("pass failed")
        return f"the last pass stopped on an error: {e}"

    async def _pass(self, full: bool, pool: ReaderPool) -> None:
        started = time.monotonic()
        config = self._configured.config
        generation = config.generation
        state = self._progress.state
        self._progress.set_phase("scanning", "")
        revisions = {**config.revisions, **await self.artifacts.fetch(config.sources)}
        settings = await self._settings()
        current = self.index.settings()
        read = self._changes_read(pool)
        staged = model_change.needs_staging(current, settings, self.index.chunk_count)
        if staged:
            assert current is not None
            if not await self.model_change.make(current, settings, read):
                return  # the configuration changed meanwhile: the pass it asked for runs next
            current = self.index.settings()
        built_beside = chunking_change.needs_building(current, settings, self.index.chunk_count)
        if built_beside:
            assert current is not None
            answering = self.index
            built = await self.chunking_change.build(answering, current, settings, read)
            if built is None:
                return  # the configuration changed meanwhile: the pass it asked for runs next
            self.index, self.chunks_of = built, chunking_change.chunking(settings)
            await self._retire(answering, remove=True)
            current = self.index.settings()
        else:
            index_dir = self._configured.config.index_dir
            await asyncio.to_thread(chunking_change.remove_left_over, index_dir, self.index.folder)
        if current != settings:
            if current is not None and self.index.chunk_count:
                again = (
                    "reading everything again"
                    if current.key != settings.key
                    else "counting words again from the stored texts"
                )
                log.info("index built with %s; now %s: %s", current, settings, again)
            await asyncio.to_thread(self.index.adopt, settings)
        self.chunks_of = chunking_change.chunking(settings)
        await self.model_change.answered_by_configured()
        changed = staged or built_beside or current != settings or not self.passed
        if not built_beside:  # else its last round was this pass's reading
            # A full reindex asks the model alone: it is how a base is made whole again,
            # vectors a peer gave in the past included.
            embed = self.vectors.embed
            if full:
                embed = functools.partial(self.vectors.embed, ask_peers=False)
            planned = await self._read(settings, full, pool, embed)
            changed = changed or bool(planned.to_read or planned.to_drop)
        await asyncio.to_thread(self.index.settle)
        finished = now()
        if changed or state.last_indexed_at is None:
            # A rescan that found nothing to read leaves the time, and so the base's status.
            state.last_indexed_at = finished
        if not self.passed:
            await asyncio.to_thread(self.index.store.set_meta, {store.PASSED: finished})
            self.passed = True
        embedder = self._configured.embedder
        if config.peers and embedder is not None and embedder.model is not None:
            held = self.vectors.held
            await asyncio.to_thread(held.refresh, self.index.store, embedder.document_prefix)
        await self.artifacts.settle(config.sources)
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
            state.dropped,
        )

    async def _read(
        self,
        settings: IndexSettings,
        full: bool,
        pool: ReaderPool,
        embed: Embed,
        index: Index | None = None,
    ) -> plan.Plan:
        """What changed in the sources read into `index` (the one that answers unless
        said: the files built otherwise than `settings` say too; `full`: every file), its
        chunks embedded by `embed`, and what is gone dropped."""
        index = index or self.index
        state = self._progress.state
        # What the index holds is taken before the listing: a note written meanwhile is
        # then read again rather than dropped as not listed.
        known = {(f.record.source, f.record.path): f.record for f in list(index.files.values())}
        listing = await self._scan(pool.files)
        state.skipped = dict(listing.skipped)
        state.problems = [*self.artifacts.problems, *listing.problems]
        planned = plan.plan(listing, known, settings, full)
        await asyncio.to_thread(index.drop_files, planned.to_drop)
        state.total, state.done = len(planned.to_read), 0
        state.read = state.unchanged = 0
        state.dropped = len(planned.to_drop)
        self._progress.set_phase("indexing" if planned.to_read else "scanning", "")
        runner = Runner(index, pool, embed, state, self._progress.publish)
        await runner.run(planned.to_read, known, full, settings)
        return planned

    def _changes_read(self, pool: ReaderPool) -> Read:
        """The read a change beside the index makes (`changes.passing.Read`): what changed,
        on this pass's readers."""

        async def read(
            settings: IndexSettings, embed: Embed, index: Index | None = None
        ) -> plan.Plan:
            return await self._read(settings, False, pool, embed, index)

        return read

    async def _scan(self, files: FileThreads) -> plan.Scan:
        """The sources listed on the pass's file threads, never on the threads searches
        rank on, all at once; `plan.ListingHung` naming those not listed within
        `LISTING_SECONDS`, and at once while an earlier listing of one has not returned
        (`plan.still_listing`). A listing that did not finish is not used: the pass stops
        before it drops anything."""
        configured = self.sources()
        stuck = plan.still_listing(configured, self._listings)
        if stuck:
            raise plan.ListingHung(stuck, LISTING_SECONDS)
        listings = [
            asyncio.ensure_future(files.call(plan.scan_source, source)) for source in configured
        ]
        for source, listing in zip(configured, listings, strict=True):
            key = plan.source_key(source)
            self._listings[key] = listing
            listing.add_done_callback(functools.partial(self._listed, key))
        if listings:
            await asyncio.wait(listings, timeout=LISTING_SECONDS)
        late = [s for s, listing in zip(configured, listings, strict=True) if not listing.done()]
        if late:
            raise plan.ListingHung(late, LISTING_SECONDS)
        return plan.merged(listing.result() for listing in listings)

    def sources(self) -> list[SourceConfig]:
        """What a pass reads: the configured sources (an artifact source at the folder of
        the revision it reads), and the base's own notes."""
        config = self._configured.config
        own = SourceConfig(drive=notes.source(config.name), root=notes.folder(config.index_dir))
        return [*(self.artifacts.resolved(s) for s in config.sources), own]

    def _listed(self, key: plan.Key, listing: asyncio.Future[plan.Scan]) -> None:
        """A listing returned: its source may be listed again. One that returned late is
        not used, and its error (if any) is not the pass's any more."""
        if self._listings.get(key) is listing:
            del self._listings[key]
        if not listing.cancelled():
            listing.exception()

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

    async def close(self) -> None:
        """Let go of the client of the model that answers while a new one's are made (and
        of those let go of before: at once), and of the peers' and the artifacts' clients."""
        await self.model_change.close()
        await self.vectors.close()
        await self.artifacts.close()
