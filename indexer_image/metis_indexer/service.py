"""The indexer as a running service: its lifecycle (the writer lock, standby, a changed
configuration, the passes one after another) and the operations the HTTP API exposes
(search, status, documents, reindex, evaluate).

A pass (spec 000, "Incremental indexing") is `ingest.plan` (what to read, what to
drop) and `ingest.runner` (reading, embedding, writing). When the embedding model
does not answer, the pass waits (phase `waiting`) and resumes where it stopped; a
full index drive makes it wait for space; a damaged index is moved aside and rebuilt
from the sources (it is derived data).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from metis_indexer.config import IndexerConfig
from metis_indexer.errors import BadRequest, Conflict, Unavailable
from metis_indexer.index import store
from metis_indexer.index.memory import Index, Settings
from metis_indexer.ingest import plan
from metis_indexer.ingest.readers.pool import ReaderPool
from metis_indexer.ingest.runner import PassState, Runner, now
from metis_indexer.metrics import Metrics
from metis_indexer.models.clients import (
    EmbeddingClient,
    ModelRefused,
    ModelUnavailable,
    RerankClient,
)
from metis_indexer.schema import DocumentsPage, SearchAnswer, SearchRequest, StatusAnswer
from metis_indexer.search import evaluation
from metis_indexer.search import hybrid as search

log = logging.getLogger("metis.indexer")

WAIT_FIRST, WAIT_MAX = 1.0, 30.0
"""Seconds between looks at a model (or a drive) that does not answer: doubling up to
the max."""
MODEL_SILENCE = 30.0
"""Seconds a model may answer nothing at all, while asked, before the pass shows
`waiting` (a busy model answers something every few seconds)."""
PROBE_SECONDS = 30.0
"""A model whose request failed is asked for one word: an answer within this long
means the failure was passing, and the pass goes on without saying it waits."""
DOCUMENT_STATES = ("indexed", "failed")
LOCK_FILE = "writer.lock"
STANDBY_LOOK = 1.0
"""Seconds between looks, in standby, at whether the writing indexer has stopped."""


class Indexer:
    """One knowledge base's indexer."""

    def __init__(self, config: IndexerConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics.create()
        self.index = Index(config.index_dir, config.vectors)
        self.state = PassState()
        self.loaded = False
        self.embedder: EmbeddingClient | None = None
        self.reranker: RerankClient | None = None
        self._clients_for(config)
        self._wake = asyncio.Event()
        self._full = False
        self._task: asyncio.Task[None] | None = None
        self._model_lock = asyncio.Lock()
        self._pool: ReaderPool | None = None
        self.on_progress: Callable[[PassState], None] | None = None
        self._lock_fd: int | None = None
        self._rebuilding = ""
        """Why every document is being read again, until that pass is done."""
        self._silenced_from: str | None = None
        """The phase a pass was in when its model fell silent (it shows `waiting`)."""
        self._notes: list[str] = []
        """What a person should know until the indexer restarts (an index rebuilt)."""
        self._damage: str | None = None
        """Damage met outside the pass loop (a search, the integrity check), said in the
        status until the pass loop has rebuilt the index."""
        self._damage_error: Exception | None = None
        self._checking: asyncio.Task[None] | None = None
        self.metrics.set_phase("loading")

    def _clients_for(self, config: IndexerConfig) -> None:
        e, r = config.embedding, config.reranker
        self.embedder = None if e is None else EmbeddingClient(
            e.url, query_prefix=e.query_prefix, document_prefix=e.document_prefix,
            batch=config.embedding_batch,
        )
        self.reranker = None if r is None else RerankClient(
            r.url, query_prefix=r.query_prefix, name=r.name
        )

    # -- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._pool = ReaderPool(self.config.workers)
        self._task = asyncio.create_task(self._run(), name="metis-passes")
        self._checking = asyncio.create_task(self._check_pages(), name="metis-integrity")

    async def stop(self) -> None:
        for task in (self._checking, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)
        for client in (self.embedder, self.reranker):
            if client is not None:
                await client.close()
        self.index.store.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

    async def _run(self) -> None:
        await self._open()
        self.loaded = True
        self._publish()
        if not self._take_index():
            await self._stand_by()
        delay = WAIT_FIRST
        while True:
            if self._damage_error is not None:
                await self._rebuild(self._damage_error)
            full, self._full = self._full, False
            self._wake.clear()
            watch = asyncio.create_task(self._watch_model(), name="metis-model-watch")
            try:
                await self._pass(full)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a pass that breaks must not end the service
                if store.trouble(e) == "damaged":
                    self.metrics.index_damage.labels(found_by="pass").inc()
                    await self._rebuild(e)
                    continue
                self._set_phase("waiting", self._stopped_because(e))
                await asyncio.sleep(delay)
                delay = min(WAIT_MAX, delay * 2)
                continue
            finally:
                watch.cancel()
            delay = WAIT_FIRST
            wait = self.config.rescan_seconds or None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _stopped_because(self, e: Exception) -> str:
        """The reason a pass that broke shows; it is tried again after a while."""
        if store.trouble(e) == "full":
            free = store.free_megabytes(self.config.index_dir)
            log.warning("the index drive is full (%d MB free): waiting for space", free)
            return f"the index drive is full ({free} MB free); indexing resumes when there is room"
        log.exception("pass failed")
        return f"the last pass stopped on an error: {e}"

    async def _open(self) -> None:
        """Load the index, waiting (and saying why) while its folder cannot hold it; a
        damaged one is rebuilt."""
        delay = WAIT_FIRST
        while True:
            try:
                await asyncio.to_thread(self._check_and_load)
                return
            except store.StoreUnavailable as e:
                log.error("%s", e)
                self._set_phase("waiting", str(e))
            except sqlite3.DatabaseError as e:
                if store.trouble(e) != "damaged":
                    raise
                self.metrics.index_damage.labels(found_by="start").inc()
                await self._rebuild(e)
                return
            await asyncio.sleep(delay)
            delay = min(WAIT_MAX, delay * 2)

    def _check_and_load(self) -> None:
        self.index.store.check()
        self.index.load()
        self.index.settle()

    async def _rebuild(self, error: Exception) -> None:
        """Move a damaged index aside and start an empty one; the next pass reads every
        document again. Only the indexer that writes the index may do it."""
        while not self._take_index():
            self._set_phase(
                "standby", "the index is damaged; the indexer writing it will rebuild it"
            )
            await asyncio.sleep(STANDBY_LOOK)
        log.error("the index is damaged (%s): moving it aside and rebuilding it", error)
        aside = await asyncio.to_thread(self.index.store.move_aside)
        self.index = Index(self.config.index_dir, self.config.vectors)
        await asyncio.to_thread(self.index.load)
        self.metrics.index_rebuilds.inc()
        self._rebuilding = (
            f"rebuilding the index from the sources: it was damaged ({error}); "
            f"the damaged file was moved aside as {aside.name}"
        )
        self._notes.append(
            f"the index was damaged ({error}) and rebuilt from the sources at {now()}; "
            f"the damaged file is kept as {aside.name}"
        )
        self._damage = self._damage_error = None
        self._set_phase("loading", "")

    def _damaged(self, error: sqlite3.DatabaseError, found_by: str) -> None:
        """Damage met outside the pass loop: counted each time, said in the status, and the
        pass loop woken to rebuild the index (at once when idle, else when its pass ends:
        a pass's own writes meet the damage too, or finish first)."""
        self.metrics.index_damage.labels(found_by=found_by).inc()
        if self._damage_error is not None:
            return
        by = "a search" if found_by == "search" else "the integrity check"
        log.error("the index is damaged (%s), met by %s: rebuilding it from the sources",
                  error, by)
        self._damage_error = error
        self._damage = (
            f"the index is damaged ({error}; met by {by} at {now()}): it is being rebuilt "
            "from the sources"
        )
        self._wake.set()

    async def _check_pages(self) -> None:
        """The integrity check: every `check_seconds`, a few pages more of the index file
        are read (`Store.sweep`), so damage on a page that no search reads is found too,
        without reading a large index whole (what SQLite's quick check at start does)."""
        while True:
            await asyncio.sleep(self.config.check_seconds)
            if not self.loaded or self._damage_error is not None:
                continue
            checked = self.index.store
            try:
                await asyncio.to_thread(checked.sweep)
            except sqlite3.DatabaseError as e:
                if store.trouble(e) != "damaged" or checked is not self.index.store:
                    continue  # not damage, or the index was rebuilt meanwhile
                self._damaged(e, "check")

    def _take_index(self) -> bool:
        """Become the one indexer writing this index folder (a lock the system drops when
        the process ends, however it ends)."""
        if self._lock_fd is not None:
            return True
        fd = os.open(self.config.index_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    async def _stand_by(self) -> None:
        """Another indexer writes this index (the one a replacement takes over from):
        answer searches from the index as loaded until it stops, then take over."""
        self._set_phase(
            "standby", "another indexer is writing this index; searches are answered from it "
            "until that one stops"
        )
        while not self._take_index():
            await asyncio.sleep(STANDBY_LOOK)
        log.info("the other indexer stopped: taking over the index")
        await asyncio.to_thread(self.index.load)
        self._set_phase("loading", "")

    def request_pass(self, full: bool = False) -> None:
        if self.state.phase == "standby":
            raise Conflict("STANDBY", "a replacement is taking over; ask again in a moment")
        self._full = self._full or full
        self._wake.set()

    async def apply_config(self, config: IndexerConfig) -> None:
        """Take a changed configuration; a pass follows (it re-reads what must be)."""
        if config == self.config:
            return
        old = self.config
        self.config = config
        if (config.embedding, config.reranker, config.embedding_batch) != (
            old.embedding, old.reranker, old.embedding_batch
        ):
            for client in (self.embedder, self.reranker):
                if client is not None:
                    await client.close()
            self._clients_for(config)
        if config.vectors != old.vectors and self.loaded:
            await asyncio.to_thread(self.index.hold_vectors, config.vectors)
        self.request_pass()

    # -- a pass ----------------------------------------------------------------------------

    async def _pass(self, full: bool) -> None:
        started = time.monotonic()
        revisions = dict(self.config.revisions)
        generation = self.config.generation
        self._set_phase("scanning", "")
        settings = await self._settings()
        current = self.index.settings()
        if current != settings:
            if current is not None and self.index.chunk_count:
                again = ("reading everything again" if current.key != settings.key
                         else "counting words again from the stored texts")
                log.info("index built with %s; now %s: %s", current, settings, again)
            await asyncio.to_thread(self.index.adopt, settings)
        listing = await asyncio.to_thread(plan.scan, self.config.sources)
        self.state.skipped = dict(listing.skipped)
        self.state.problems = list(listing.problems)
        known = {(f.record.source, f.record.path): f.record for f in self.index.files.values()}
        todo, gone = plan.plan(listing, known, settings, full)
        await asyncio.to_thread(self.index.drop_files, gone)
        self.state.total, self.state.done = len(todo), 0
        self.state.read = self.state.unchanged = 0
        self.state.dropped = len(gone)
        self._set_phase("indexing" if todo else "scanning", "")
        assert self._pool is not None
        runner = Runner(self.index, self._pool, self._embed, self.state, self._publish)
        await runner.run(todo, known, full, settings)
        await asyncio.to_thread(self.index.settle)
        self.state.last_indexed_at = now()
        self.state.completed += 1
        self.state.indexed_revisions = revisions
        self.state.indexed_generation = generation
        self._rebuilding = ""
        self.metrics.pass_seconds.observe(time.monotonic() - started)
        self._set_phase("ready", "")
        log.info(
            "pass done in %.1f s: %d read, %d unchanged, %d dropped",
            time.monotonic() - started, self.state.read, self.state.unchanged, len(gone),
        )

    async def _settings(self) -> Settings:
        """What the index must be built with now: waits for the embedding model."""
        size, overlap = self.config.chunking.size, self.config.chunking.overlap
        if self.embedder is None:
            return Settings("", 0, size, overlap)
        embedder = self.embedder
        while True:
            try:
                if embedder.model is None or embedder.dimensions is None:
                    await embedder.connect()
                    await embedder.embed_documents(["dimensions"])
                assert embedder.model is not None and embedder.dimensions is not None
                return Settings(embedder.model, embedder.dimensions, size, overlap)
            except ModelUnavailable as e:
                await self._wait_for_model(e)

    async def _embed(self, passages: list[str]) -> npt.NDArray[np.float32] | None:
        """Vectors of a document's passages; waits (phase `waiting`) while the model is
        away."""
        if self.embedder is None:
            return None
        while True:
            started = time.monotonic()
            try:
                vectors = await self.embedder.embed_documents(passages)
                self.metrics.embed_seconds.observe(time.monotonic() - started)
                return vectors
            except ModelRefused:
                raise
            except ModelUnavailable as e:
                self.metrics.embed_failures.inc()
                await self._wait_for_model(e)

    def _embedding_name(self) -> str:
        return self.config.embedding.name if self.config.embedding else "the embedding model"

    async def _watch_model(self) -> None:
        """During a pass: a model that answers nothing for MODEL_SILENCE seconds shows as
        `waiting` at once, and its next answer shows the pass going on (requests to a
        busy model are not given up for being slow)."""
        while True:
            await asyncio.sleep(1.0)
            if self.embedder is None or self._model_lock.locked():
                continue  # no model, or `_wait_for_model` already says what happens
            silent = self.embedder.silent_for() >= MODEL_SILENCE
            if silent and self._silenced_from is None and self.state.phase != "waiting":
                self._silenced_from = self.state.phase
                name = self._embedding_name()
                log.warning("embedding model %s has answered nothing for %g s", name,
                            MODEL_SILENCE)
                self._set_phase("waiting", f"waiting for embedding model {name}: "
                                f"no answer for {MODEL_SILENCE:g} s")
            elif not silent and self._silenced_from is not None:
                log.info("embedding model %s answers again", self._embedding_name())
                self._set_phase(self._silenced_from, "")
                self._silenced_from = None

    async def _wait_for_model(self, error: ModelUnavailable) -> None:
        """Phase `waiting` until the embedding model answers again; one waiter looks. A
        quick look first, so a passing failure does not show as waiting."""
        embedder = self.embedder
        assert embedder is not None
        async with self._model_lock:
            if await embedder.answers(PROBE_SECONDS):
                return
            before = self._silenced_from or self.state.phase
            self._silenced_from = None
            name = self._embedding_name()
            self._set_phase("waiting", f"waiting for embedding model {name}: {error}")
            log.warning("embedding model %s does not answer (%s): the pass waits", name, error)
            delay = WAIT_FIRST
            while not await embedder.answers(PROBE_SECONDS):
                await asyncio.sleep(delay)
                delay = min(WAIT_MAX, delay * 2)
            log.info("embedding model %s answers again: the pass resumes", name)
            self._set_phase(before if before != "waiting" else "indexing", "")

    def _set_phase(self, phase: str, reason: str) -> None:
        if not reason and phase in ("loading", "scanning", "indexing"):
            reason = self._rebuilding
        self.state.phase, self.state.reason = phase, reason
        self.metrics.set_phase(phase)
        self._publish()

    def _publish(self) -> None:
        m, s = self.metrics, self.state
        m.pass_total.set(s.total)
        m.pass_done.set(s.done)
        counts = self.counts()
        m.documents.set(counts["documents"])
        m.chunks.set(counts["chunks"])
        m.failed.set(counts["failed"])
        if self.on_progress is not None:
            self.on_progress(s)

    # -- what the API asks -----------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        failed = self.index.failed_files
        return {
            "documents": len(self.index.files) - failed,
            "chunks": self.index.chunk_count,
            "failed": failed,
        }

    def status(self) -> StatusAnswer:
        s = self.state
        return StatusAnswer.model_validate({
            "name": self.config.name,
            "phase": s.phase,
            "reason": s.reason,
            **self.counts(),
            "pass_total": s.total,
            "pass_done": s.done,
            "last_indexed_at": s.last_indexed_at,
            "passes": s.completed,
            "dimensions": self.index.dimensions or None,
            "vectors": self.index.vector_kind,
            "embedding_model": None if self.embedder is None else self.embedder.model,
            "reranker": None if self.reranker is None else self.reranker.name,
            "skipped": dict(sorted(s.skipped.items())),
            "revisions": dict(self.config.revisions),
            "indexed_revisions": s.indexed_revisions,
            "generation": self.config.generation,
            "indexed_generation": s.indexed_generation,
            "last_pass": {"read": s.read, "unchanged": s.unchanged, "dropped": s.dropped},
            "warnings": [*s.problems, *self._notes, *([self._damage] if self._damage else [])],
        })  # fmt: skip

    def empty_warning(self) -> str:
        if self.state.completed and not self.counts()["documents"]:
            return (
                "nothing is indexed: the sources hold no document Metis reads "
                "(Markdown, text, HTML, PDF, DOCX)"
            )
        return f"nothing is indexed yet: the index is {self.state.phase}"

    def _models(self, embed: search.EmbedQuery | None = None) -> search.Models:
        e, r = self.embedder, self.reranker
        return search.Models(
            embed=embed or (None if e is None else e.embed_query),
            embedding_name=f"embedding model {self.config.embedding.name}"
            if self.config.embedding else "the embedding model",
            rerank=None if r is None else r.rerank,
            reranker_name=f"reranker {self.config.reranker.name}"
            if self.config.reranker else "the reranker",
        )

    async def search(self, req: SearchRequest) -> SearchAnswer:
        if not self.loaded:
            raise Unavailable(
                "KNOWLEDGE_BASE_NOT_READY",
                f"the index is not serving yet: it is {self.state.phase}",
            )
        return await self._searched(req, self._models())

    async def _searched(self, req: SearchRequest, models: search.Models) -> SearchAnswer:
        """A search of the index; damage it meets is a 503 and schedules the rebuild."""
        try:
            return await search.search(self.index, req, models, self.empty_warning())
        except sqlite3.DatabaseError as e:
            if store.trouble(e) != "damaged":
                raise
            self._damaged(e, "search")
            raise Unavailable(
                "KNOWLEDGE_BASE_NOT_READY",
                f"the index is damaged ({e}): it is being rebuilt from the sources, and "
                "searches answer from what is read again meanwhile",
            ) from None

    def documents(self, page: int, page_size: int, state: str | None) -> DocumentsPage:
        if page < 1:
            raise BadRequest("INVALID_BODY", f"page is {page}; pages count from 1")
        if not 1 <= page_size <= 1000:
            raise BadRequest("INVALID_BODY", f"page_size is {page_size}; it must be 1 to 1000")
        if state is not None and state not in DOCUMENT_STATES:
            allowed = ", ".join(DOCUMENT_STATES)
            raise BadRequest("INVALID_BODY", f"state is {state!r}; it must be one of {allowed}")
        rows = [
            f.record for f in list(self.index.files.values())
            if state is None or f.record.state == state
        ]
        rows.sort(key=lambda r: (r.source, r.path))
        start = (page - 1) * page_size
        return DocumentsPage.model_validate({
            "documents": [
                {
                    "source": r.source, "document": r.path, "kind": r.kind, "title": r.title,
                    "state": r.state, "chunks": r.chunks, "size": r.size,
                    "reason": r.reason, "detail": r.detail, "indexed_at": r.indexed_at,
                }
                for r in rows[start : start + page_size]
            ],
            "page": page,
            "page_size": page_size,
            "total": len(rows),
        })  # fmt: skip

    async def evaluate(self, k: int) -> evaluation.Evaluation:
        drives = {s.drive: s.root for s in self.config.sources}
        cases = await asyncio.to_thread(evaluation.read_cases, sorted(drives.items()))
        vectors: dict[str, npt.NDArray[np.float32]] = {}

        async def embed_once(question: str) -> npt.NDArray[np.float32]:
            if question not in vectors:
                assert self.embedder is not None
                vectors[question] = await self.embedder.embed_query(question)
            return vectors[question]

        models = self._models(embed_once if self.embedder is not None else None)

        async def ask(question: str, way: evaluation.Way) -> SearchAnswer:
            req = SearchRequest(query=question, top_k=50, mode=way.mode, rerank=way.rerank)
            return await self._searched(req, models)

        ways = evaluation.ways(self.embedder is not None, self.reranker is not None)
        return await evaluation.evaluate(cases, k, ask, ways, now)
