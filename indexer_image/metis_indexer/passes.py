"""The passes: the index loaded, then a pass whenever one is asked for or the rescan is due.

A pass is `ingest.plan` (what to read, what to drop) and `ingest.runner` (reading,
embedding, writing). When the embedding model does not answer, the pass waits
(`model_watch`) and resumes where it stopped; a full index drive makes it wait for space; a
damaged index is moved aside and rebuilt from the sources (it is derived data), whether the
damage was met by a pass, a search or the integrity check. A new embedding model's vectors
are made from the stored chunks beside the ones that answer, and switched to at once
(`restage`); a new chunking's index is built beside the one that answers, and answers in
its place once complete (`rechunk`). A source whose listing does not finish (a hung drive)
stops the pass, which waits and is tried again, its files kept, with one listing of it in
flight at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import sqlite3
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from metis_indexer import notes, peers, rechunk, restage
from metis_indexer.config import EmbeddingConfig, SourceConfig
from metis_indexer.configured import Configured, embedding_client
from metis_indexer.errors import Conflict
from metis_indexer.index import folders, store, texts
from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.ingest import plan
from metis_indexer.ingest.readers.pool import FileThreads, ReaderPool
from metis_indexer.ingest.runner import Embed, Runner, now
from metis_indexer.metrics import Metrics
from metis_indexer.model_watch import WAIT_FIRST, WAIT_MAX, ModelWatch
from metis_indexer.models.clients import EmbeddingClient, ModelRefused, ModelUnavailable
from metis_indexer.notebook import Notebook
from metis_indexer.progress import Progress
from metis_indexer.search import hybrid

log = logging.getLogger("metis.indexer")

PASSED = "first_pass_ended_at"
"""The index's meta key that says it has had one whole pass (when the first ended)."""

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
    lock runs `loop` or `rebuild` (`service.Indexer`)."""

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
        self.building: rechunk.Building | None = None
        """A new chunking's index being built beside the one that answers."""
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
        self.answering: restage.Answering | None = None
        """The model whose vectors answer while a new one's are made (questions are embedded
        by it); None while the configured model's do."""
        self._retiring: set[asyncio.Task[None]] = set()
        """Models let go of whose clients close once the searches still asking them end."""
        self.passed = False
        """Whether the index has had one whole pass (recorded in it: a restart keeps it)."""
        self.held = peers.HeldVectors()
        """The vectors this index gives its peers."""
        self.peers = peers.PeerVectors(
            token,
            refused=lambda kind: metrics.peer_answers_refused.labels(reason=kind).inc(),
            checked=metrics.peer_vectors_checked.inc,
        )
        """Asks the peers (with the base's token) before passages go to the model, and
        checks what they give against it."""
        for kind in peers.REFUSALS:  # every reason shown from the start, at 0
            metrics.peer_answers_refused.labels(reason=kind)
        self._kept = peers.HeldVectors()
        """The vectors of the index that answers, found by passage hash, while a new
        chunking's is built: a passage cut the same keeps its vector."""
        self.vectors_from_peers = 0
        self.vectors_from_model = 0
        self.vectors_kept = 0
        self.notebook = Notebook(configured, self, progress)
        """The base's own notes, kept in a folder of the index drive."""

    def answering_now(self) -> restage.Answering | None:
        """The model whose vectors answer while a new one's are made; None from the moment
        the index's vectors are the configured model's (at the switch, under the lock)."""
        answering = self.answering
        if answering is None or answering.epoch != self.index.vectors_epoch:
            return None
        return answering

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
                await self.follow_recorded()
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
        self.chunks_of = None if settings is None else rechunk.chunking(settings)
        # An index made before `PASSED` was kept has had its passes where it holds chunks:
        # a base going from one replica to two must not take its only answering pod out
        # of its Service until a pass ends.
        made_before = store.PASSES_TRACKED not in meta and self.index.chunk_count > 0
        self.passed = PASSED in meta or made_before

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
        self._drop_answering()
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

    def _remove_left_over(self, building: Path | None = None) -> None:
        """What a kill or a switch left on the index drive besides the index that answers
        (and the one being built): the writer's to do, before a pass."""
        index_dir = self._configured.config.index_dir
        for folder in folders.left_over(index_dir, self.index.folder, building):
            log.info("removing %s: an index no longer answering or built", folder)
            folders.remove(index_dir, folder)

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
        if isinstance(e, (restage.NoRoom, rechunk.NoRoom, rechunk.BuildDamaged, plan.ListingHung)):
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
        revisions = dict(config.revisions)
        generation = config.generation
        state = self._progress.state
        self._progress.set_phase("scanning", "")
        settings = await self._settings()
        current = self.index.settings()
        staged = restage.needs_staging(current, settings, self.index.chunk_count)
        if staged:
            assert current is not None
            if not await self._restage(current, settings, pool):
                return  # the configuration changed meanwhile: the pass it asked for runs next
            current = self.index.settings()
        built_beside = rechunk.needs_building(current, settings, self.index.chunk_count)
        if built_beside:
            assert current is not None
            if not await self._build_beside(current, settings, pool):
                return  # the configuration changed meanwhile: the pass it asked for runs next
            current = self.index.settings()
        else:
            await asyncio.to_thread(self._remove_left_over)
        if current != settings:
            if current is not None and self.index.chunk_count:
                again = (
                    "reading everything again"
                    if current.key != settings.key
                    else "counting words again from the stored texts"
                )
                log.info("index built with %s; now %s: %s", current, settings, again)
            await asyncio.to_thread(self.index.adopt, settings)
        self.chunks_of = rechunk.chunking(settings)
        await self._answered_by_configured()
        changed = staged or built_beside or current != settings or not self.passed
        if not built_beside:  # else its last round was this pass's reading
            # A full reindex asks the model alone: it is how a base is made whole again,
            # vectors a peer gave in the past included.
            embed = functools.partial(self._embed, ask_peers=False) if full else self._embed
            planned = await self._read(settings, full, pool, embed)
            changed = changed or bool(planned.to_read or planned.to_drop)
        await asyncio.to_thread(self.index.settle)
        finished = now()
        if changed or state.last_indexed_at is None:
            # A rescan that found nothing to read leaves the time, and so the base's status.
            state.last_indexed_at = finished
        if not self.passed:
            await asyncio.to_thread(self.index.store.set_meta, {PASSED: finished})
            self.passed = True
        embedder = self._configured.embedder
        if config.peers and embedder is not None and embedder.model is not None:
            await asyncio.to_thread(self.held.refresh, self.index.store, embedder.document_prefix)
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
        state.problems = list(listing.problems)
        planned = plan.plan(listing, known, settings, full)
        await asyncio.to_thread(index.drop_files, planned.to_drop)
        state.total, state.done = len(planned.to_read), 0
        state.read = state.unchanged = 0
        state.dropped = len(planned.to_drop)
        self._progress.set_phase("indexing" if planned.to_read else "scanning", "")
        runner = Runner(index, pool, embed, state, self._progress.publish)
        await runner.run(planned.to_read, known, full, settings)
        return planned

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
        """What a pass reads: the configured sources, and the base's own notes."""
        config = self._configured.config
        own = SourceConfig(drive=notes.source(config.name), root=notes.folder(config.index_dir))
        return [*config.sources, own]

    def _listed(self, key: plan.Key, listing: asyncio.Future[plan.Scan]) -> None:
        """A listing returned: its source may be listed again. One that returned late is
        not used, and its error (if any) is not the pass's any more."""
        if self._listings.get(key) is listing:
            del self._listings[key]
        if not listing.cancelled():
            listing.exception()

    # -- a new embedding model ------------------------------------------------------------

    async def follow_recorded(self) -> None:
        """Questions go to the model whose vectors the index holds: the configured one,
        unless the index records another endpoint for them (the configuration names
        another since, and its vectors are not made yet). A pass finds out whether the
        configured endpoint serves the same model (`_answered_by_configured`) or another
        (`_restage`)."""
        meta = await asyncio.to_thread(self.index.store.meta)
        held = IndexSettings.from_meta(meta)
        recorded = restage.recorded_endpoint(meta)
        endpoint = self._configured.config.embedding
        if (
            held is None
            or not held.model
            or not self.index.chunk_count
            or endpoint is None
            or recorded is None
            or recorded == endpoint
        ):
            return
        staged = restage.staged_model(meta)
        await self._answer_by(held, recorded, staged.split("|")[0] if staged else None)

    async def _answer_by(
        self, held: IndexSettings, endpoint: EmbeddingConfig | None, next_model: str | None
    ) -> restage.Answering:
        """Questions embedded by `endpoint`'s model, whose vectors the index holds (None: it
        is served nowhere now), while `next_model`'s are made."""
        answering = self.answering
        if (
            answering is None
            or answering.endpoint != endpoint
            or answering.model != held.model
            or answering.epoch != self.index.vectors_epoch
        ):
            self._drop_answering()
            client: EmbeddingClient | None = None
            if endpoint is not None:
                client = embedding_client(endpoint, self._configured.config.embedding_batch)
            answering = self.answering = restage.Answering(
                held, endpoint, client, next_model, self.index.vectors_epoch
            )
        answering.next_model = next_model
        answering.done, answering.total = await asyncio.to_thread(self.index.store.staged_counts)
        return answering

    async def close(self) -> None:
        """Let go of the client of the model that answers while a new one's are made (and
        of those let go of before: at once), and of the peers' client."""
        if (answering := self._release_answering()) is not None:
            await answering.close()  # not by a task: one cancelled before it starts never runs
        for task in self._retiring:
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await self.peers.close()

    def _release_answering(self) -> restage.Answering | None:
        """Questions go to the configured model from now on."""
        answering, self.answering = self.answering, None
        self._progress.changing = ""
        return answering

    def _drop_answering(self) -> None:
        """A search that asked the old model a moment ago still waits for its answer, so
        its client closes later."""
        if (answering := self._release_answering()) is not None:
            task = asyncio.create_task(answering.retire(hybrid.MODEL_TIMEOUT))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _answered_by_configured(self) -> None:
        """The configured model's vectors are the index's: it answers, the index records
        its endpoint, and vectors staged for another model are forgotten."""
        self._drop_answering()
        meta = await asyncio.to_thread(self.index.store.meta)
        if restage.staged_model(meta) is not None:
            await asyncio.to_thread(self.index.store.end_staging, restage.STAGING)
        endpoint = self._configured.config.embedding
        if endpoint is not None and restage.recorded_endpoint(meta) != endpoint:
            await asyncio.to_thread(self.index.store.set_meta, restage.endpoint_meta(endpoint))

    async def _restage(
        self, current: IndexSettings, settings: IndexSettings, pool: ReaderPool
    ) -> bool:
        """The new model's vectors made beside the ones that answer, then switched to: what
        changed in the sources is read first (with the old model, and staged too), and read
        again after each staging (what changed meanwhile is staged next), up to
        `STAGE_ROUNDS` times. False where the configuration changed meanwhile (nothing
        switched)."""
        embedder = self._configured.embedder
        endpoint = self._configured.config.embedding
        assert embedder is not None and endpoint is not None
        started = time.monotonic()
        meta = await asyncio.to_thread(self.index.store.meta)
        target = restage.staging_meta(settings)
        if restage.staged_model(meta) != target[restage.STAGING]:
            await asyncio.to_thread(self.index.store.begin_staging, target)
        recorded = restage.recorded_endpoint(meta)
        old = recorded if recorded != endpoint else None
        answering = await self._answer_by(current, old, settings.model)
        log.info(
            "embedding model %s now; the index holds the vectors of %s: making the new "
            "model's beside them (%d of %d chunks made)",
            settings.model,
            current.model,
            answering.done,
            answering.total,
        )
        calls = 0
        self._progress.changing = answering.reason()
        await self._read(current, False, pool, answering.embed_documents)
        for _ in range(restage.STAGE_ROUNDS):
            await self._check_room(answering, settings)
            self._progress.set_phase("indexing", "")
            made = await self._stage(answering, embedder)
            if made is None:
                return False
            calls += made
            planned = await self._read(current, False, pool, answering.embed_documents)
            if not planned.to_read and not planned.to_drop:
                break
        switched = dataclasses.replace(
            current, model=settings.model, dimensions=settings.dimensions
        )
        while not await asyncio.to_thread(
            self.index.switch, switched, restage.endpoint_meta(endpoint), [restage.STAGING]
        ):
            made = await self._stage(answering, embedder)
            if made is None:
                return False
            calls += made
        self._drop_answering()
        log.info(
            "switched to the vectors of embedding model %s: %d chunks embedded in %.1f s",
            settings.model,
            calls,
            time.monotonic() - started,
        )
        return True

    async def _check_room(self, answering: restage.Answering, settings: IndexSettings) -> None:
        """NoRoom (the pass waits, and is tried again) where the rest of the change does not
        fit on the index drive."""
        folder = self._configured.config.index_dir
        answering.done, answering.total = await asyncio.to_thread(self.index.store.staged_counts)
        self._progress.changing = answering.reason()
        size = await asyncio.to_thread(self.index.store.database_bytes)
        needed = restage.staging_megabytes(
            answering.total - answering.done,
            answering.total,
            settings.dimensions,
            self.index.vector_kind,
            size,
        )
        why = restage.no_room(needed, store.free_megabytes(folder), settings.model)
        if why is not None:
            raise restage.NoRoom(why)

    async def _stage(self, answering: restage.Answering, embedder: EmbeddingClient) -> int | None:
        """Every live chunk that lacks a staged vector given one by `embedder`, a batch a
        transaction; the chunks embedded, or None where the configuration changed meanwhile
        (another client embeds now: what it would give is not this model's)."""
        state = self._progress.state
        after, made = 0, 0
        while self._configured.embedder is embedder:
            batch = await asyncio.to_thread(
                self.index.store.lacking_staged, after, restage.STAGE_CHUNKS
            )
            if not batch:
                return made
            passages = [texts.passage(title, h, text) for _, title, h, text in batch]
            vectors = await self._staged_vectors(passages)
            if self._configured.embedder is not embedder:
                break
            ids = [chunk_id for chunk_id, *_ in batch]
            await asyncio.to_thread(self.index.put_staged, ids, vectors)
            after, made = ids[-1], made + len(ids)
            answering.done, answering.total = await asyncio.to_thread(
                self.index.store.staged_counts
            )
            self._metrics.staged_chunks.inc(len(ids))
            self._progress.changing = answering.reason()
            if state.phase == "indexing":
                self._progress.set_phase("indexing", "")
            else:
                self._progress.publish()
        return None

    async def _staged_vectors(self, passages: list[str]) -> list[npt.NDArray[np.float32] | None]:
        """The new model's vectors of passages, in the pass's usual requests; None for a
        passage it refuses (asked alone, so only that one is)."""
        try:
            vectors = await self._embed(passages)
        except ModelRefused:
            if len(passages) == 1:
                return [None]
            parts = await asyncio.gather(*(self._staged_vectors([p]) for p in passages))
            return [v for part in parts for v in part]
        return [None] * len(passages) if vectors is None else list(vectors)

    # -- a new chunking -------------------------------------------------------------------

    def building_progress(self) -> tuple[int, int]:
        """Documents the new chunking's index holds, and of how many it is built (those it
        holds and those the pass has still to read)."""
        building, state = self.building, self._progress.state
        if building is None:
            return 0, 0
        held = len(building.index.files)
        return held, held + max(0, state.total - state.done)

    async def _build_beside(
        self, current: IndexSettings, settings: IndexSettings, pool: ReaderPool
    ) -> bool:
        """The new chunking's index built in a folder of its own (resumed where a stop left
        it) while the one that answers goes on answering, then answering in its place: the
        answering index is brought up to date first, and the new one read again until a
        round finds nothing changed, up to `rechunk.ROUNDS` times. False where the
        configuration changed meanwhile (nothing switched; what is built is kept)."""
        index_dir = self._configured.config.index_dir
        answering = self.index
        folder = await asyncio.to_thread(folders.beside, index_dir, answering.folder)
        await asyncio.to_thread(self._remove_left_over, folder)
        new = await self._opened_beside(folder, settings)
        self.building = rechunk.Building(current, settings, new)
        self._progress.changing = rechunk.reason(current, settings)
        started, kept, asked = time.monotonic(), self.vectors_kept, self.vectors_from_model
        log.info(
            "%s now; the index holds %s: building it beside the one that answers, in %s "
            "(%d documents built)",
            rechunk.described(settings),
            rechunk.described(current),
            folder,
            len(new.files),
        )
        switched, read, dropped = False, 0, 0
        state = self._progress.state
        try:
            await self._read(current, False, pool, self._embed)
            embed = functools.partial(self._embed, reuse=answering.store)
            for _ in range(rechunk.ROUNDS):
                await self._check_room_beside(self.building)
                try:
                    planned = await self._read(settings, False, pool, embed, new)
                except sqlite3.DatabaseError as e:
                    if store.trouble(e) != "damaged":
                        raise
                    await self._give_up(new)  # the index that answers is not the damaged one
                    raise rechunk.BuildDamaged(e) from None
                read, dropped = read + state.read, dropped + state.dropped
                chunking = self._configured.config.chunking
                if (chunking.size, chunking.overlap) != rechunk.chunking(settings):
                    return False
                if not planned.to_read and not planned.to_drop:
                    break
            await asyncio.to_thread(new.settle)
            await asyncio.to_thread(new.store.set_meta, self._answering_meta())
            await asyncio.to_thread(folders.publish, index_dir, folder)
            self.index, switched = new, True
            state.read, state.dropped = read, dropped
        finally:
            self.building = None
            self._progress.changing = ""
            self._kept = peers.HeldVectors()
            if not switched:
                await self._let_go(new)
        self.chunks_of = rechunk.chunking(settings)
        log.info(
            "switched to the index of %s: %d documents in %.1f s; %d passages kept their "
            "vectors, %d were sent to the model",
            rechunk.described(settings),
            len(new.files),
            time.monotonic() - started,
            self.vectors_kept - kept,
            self.vectors_from_model - asked,
        )
        await self._retire(answering, remove=True)
        return True

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
        meta = {PASSED: now()}
        if endpoint is not None:
            meta.update(restage.endpoint_meta(endpoint))
        return meta

    async def _check_room_beside(self, building: rechunk.Building) -> None:
        """rechunk.NoRoom (the pass waits, and is tried again) where the rest of the new
        index does not fit on the index drive."""
        index_dir = self._configured.config.index_dir
        answering, built = await asyncio.gather(
            asyncio.to_thread(folders.size, index_dir, self.index.folder),
            asyncio.to_thread(folders.size, index_dir, building.index.folder),
        )
        needed = rechunk.megabytes(answering, built, building.old, building.new)
        free = store.free_megabytes(index_dir)
        why = rechunk.no_room(needed, free, building.old, building.new)
        if why is not None:
            raise rechunk.NoRoom(why)

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

    async def _embed(
        self, passages: list[str], reuse: store.Store | None = None, ask_peers: bool = True
    ) -> npt.NDArray[np.float32] | None:
        """Vectors of a document's passages: those the index `reuse` holds (the one a new
        chunking's replaces), then those the peers give (`ask_peers`), and the model's of the
        rest; waits (phase `waiting`) while the model is away."""
        embedder = self._configured.embedder
        if embedder is None:
            return None
        found = {} if reuse is None else await self._kept_vectors(embedder, reuse, passages)
        if ask_peers:
            rest = peers.left_to_embed(len(passages), found)
            given = await self._from_peers(embedder, [passages[i] for i in rest])
            found.update((rest[at], row) for at, row in given.items())
        if not found:
            return await self._embedded(passages)
        rest = peers.left_to_embed(len(passages), found)
        embedded = await self._embedded([passages[i] for i in rest]) if rest else None
        assert embedder.dimensions is not None
        return peers.merged(len(passages), embedder.dimensions, found, rest, embedded)

    async def _kept_vectors(
        self, embedder: EmbeddingClient, reuse: store.Store, passages: list[str]
    ) -> dict[int, npt.NDArray[np.float32]]:
        """The vectors `reuse` holds of passages, by position (its vectors are this model's:
        a new chunking is built only once they are)."""
        model, dimensions = embedder.model, embedder.dimensions
        if model is None or dimensions is None or not passages:
            return {}
        prefix = embedder.document_prefix
        hashes = [peers.passage_hash(prefix + p) for p in passages]
        try:
            at, rows = await asyncio.to_thread(self._kept.find, reuse, prefix, hashes, dimensions)
        except sqlite3.DatabaseError as e:  # the answering index's: a search or check meets it
            log.warning("cannot read the vectors the index holds (%s): the model embeds them", e)
            return {}
        self.vectors_kept += len(at)
        self._metrics.vectors_kept.inc(len(at))
        return {position: rows[i] for i, position in enumerate(at)}

    async def _from_peers(
        self, embedder: EmbeddingClient, passages: list[str]
    ) -> dict[int, npt.NDArray[np.float32]]:
        """The vectors of passages the peers give, each checked or drawn for a check against
        the model's (`peers.PeerVectors`), with the model's vectors of those it checked, by
        position; none without peers, or before the model has said what it is (its id
        chooses its prefix)."""
        asked = self._configured.config.peers
        model, dimensions = embedder.model, embedder.dimensions
        if not asked or model is None or dimensions is None or not passages:
            return {}
        prefix = embedder.document_prefix
        hashes = [peers.passage_hash(prefix + p) for p in passages]

        async def check(positions: list[int]) -> npt.NDArray[np.float32]:
            vectors = await self._embedded([passages[i] for i in positions])
            assert vectors is not None  # the pass has an embedding model: it asked the peers
            return vectors

        given = await self.peers.vectors(asked, model, dimensions, hashes, check)
        self.vectors_from_peers += len(given.by_peers)
        self._metrics.vectors_from_peers.inc(len(given.by_peers))
        return {**given.by_peers, **given.by_model}

    async def _embedded(self, passages: list[str]) -> npt.NDArray[np.float32] | None:
        """The model's vectors of passages; waits (phase `waiting`) while it is away."""
        while True:
            embedder = self._configured.embedder  # a changed configuration makes another
            assert embedder is not None
            started = time.monotonic()
            try:
                vectors = await embedder.embed_documents(passages)
                self._metrics.embed_seconds.observe(time.monotonic() - started)
                self.vectors_from_model += len(passages)
                self._metrics.vectors_from_model.inc(len(passages))
                return vectors
            except ModelRefused:
                raise
            except ModelUnavailable as e:
                self._metrics.embed_failures.inc()
                await self._watch.wait_for(e)
