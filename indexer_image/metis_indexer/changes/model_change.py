"""A new embedding model's vectors made beside the ones that answer.

When the model (or its dimensions) changes, the index keeps its vectors and questions are
embedded by the model that made them (`Answering`), while every stored chunk is embedded
by the new model into a staged set (`store.Store.put_staged`); once every live chunk has
one, the staged vectors take the old ones' place at once (`memory.Index.switch`). The
index's meta records which endpoint answers (`ANSWERING`) and which model is being
staged (`STAGING`), so a restart mid-change still answers by meaning, and resumes the
staging where it stopped. `ModelChange` is the pass's part that does it: it takes the
pass's read of the sources and its embed, and the index that answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from metis_indexer import limits
from metis_indexer.changes.passing import Read, Shown
from metis_indexer.config import EmbeddingConfig
from metis_indexer.configured import Configured, embedding_client
from metis_indexer.index import store, texts
from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.ingest.runner import Embed
from metis_indexer.metrics import Metrics
from metis_indexer.models.clients import EmbeddingClient, ModelRefused, ModelUnavailable
from metis_indexer.search import hybrid

log = logging.getLogger("metis.indexer")

ANSWERING = "answering"
"""Meta key: the endpoint (as configured: url, name, prefixes) of the model whose vectors
the index holds."""
STAGING = "staging"
"""Meta key: the model (and dimensions) whose vectors are being staged."""
STAGE_CHUNKS = 128
"""Chunks embedded and committed together while staging: requests of the pass's usual
size go out two at a time, and a kill loses at most this many chunks' vectors."""
STAGE_ROUNDS = 3
"""Times a change reads what changed in the sources (with the old model) and stages it,
before switching: what changed during the staging is staged too."""
STAGED_ROW_BYTES = 48
"""What SQLite spends on a staged row besides its vector: its key, record header and its
share of the table's B-tree pages."""
LOG_MEGABYTES = store.CHECKPOINT_BYTES // 1_000_000
"""Room left free besides the estimate: the write-ahead log grows this much before it is
copied into the database."""


class NoRoom(Exception):
    """The new model's vectors do not fit on the index drive: the change waits for room,
    and the old model goes on answering."""


def recorded_endpoint(meta: dict[str, str]) -> EmbeddingConfig | None:
    """The endpoint the index records as answering; None where it records none (an index
    written before it did)."""
    raw = meta.get(ANSWERING)
    if raw is None:
        return None
    try:
        return EmbeddingConfig.model_validate_json(raw)
    except ValidationError:
        return None


def endpoint_meta(endpoint: EmbeddingConfig) -> dict[str, str]:
    return {ANSWERING: endpoint.model_dump_json()}


def staging_meta(settings: IndexSettings) -> dict[str, str]:
    return {STAGING: f"{settings.model}|{settings.dimensions}"}


def staged_model(meta: dict[str, str]) -> str | None:
    """The model (`model|dimensions`) whose vectors are being staged, if any."""
    return meta.get(STAGING)


def needs_staging(current: IndexSettings | None, wanted: IndexSettings, chunks: int) -> bool:
    """Whether a change of model is made beside the answering vectors: the model or its
    dimensions changed, to a model, and the index holds chunks with the vectors of one.
    Otherwise there is nothing to keep: the settings are adopted as they are."""
    return (
        current is not None
        and bool(current.model)
        and bool(wanted.model)
        and chunks > 0
        and not current.same_model(wanted)
    )


def staging_megabytes(
    lacking: int, chunks: int, dimensions: int, kind: limits.VectorKind, database_bytes: int
) -> int:
    """What the rest of a change costs on the index drive, in MB (rounded up): the staged
    vectors still to make (float32, with their rows' overhead); the switch's log, which
    writes every chunk's row again (at most the database's size); and for int8, the
    float32 vectors and codes it keeps in files beside the store."""
    staged = lacking * (4 * dimensions + STAGED_ROW_BYTES)
    beside = chunks * dimensions * (4 + 1) if kind == "int8" else 0
    return math.ceil((staged + database_bytes + beside) / 1_000_000)


def no_room(needed_mb: int, free_mb: int, model: str) -> str | None:
    """Why a change cannot start (the reason its `waiting` shows), or None when it fits
    with the log's room to spare."""
    if needed_mb + LOG_MEGABYTES <= free_mb:
        return None
    return (
        f"the vectors of embedding model {model} need {needed_mb} MB and {free_mb} MB are "
        "free on the index drive: the index goes on answering with the model it has until "
        "there is room"
    )


class Answering:
    """The model whose vectors answer while another's are made: questions are embedded by
    it, and so are documents read meanwhile (they are staged for the new model too)."""

    def __init__(
        self,
        settings: IndexSettings,
        endpoint: EmbeddingConfig | None,
        client: EmbeddingClient | None,
        next_model: str | None,
        epoch: int,
    ) -> None:
        self.model = settings.model
        """The model id the index's vectors are of."""
        self.endpoint = endpoint
        """Where it was served; None where the index records no other endpoint than the one
        that now serves the new model: the old model is gone."""
        self.client = client
        self.next_model = next_model
        """The model whose vectors are being made; None until the pass has asked it."""
        self.epoch = epoch
        """The index's `vectors_epoch` while its vectors are this model's: questions go to
        the new model from the moment of the switch, before this is let go."""
        self.done = 0
        self.total = 0
        self._documents_gone = False

    @property
    def name(self) -> str:
        """The answering model as a warning names it."""
        shown = self.endpoint.name if self.endpoint is not None else self.model
        return f"embedding model {shown}"

    def warning_name(self) -> str:
        """How a search that cannot ask it names it: the old model, and what is made."""
        being = (
            f"those of embedding model {self.next_model} are made ({self.done} of "
            f"{self.total} chunks)"
            if self.next_model
            else "the new model's are made"
        )
        return f"the old {self.name} (its vectors answer until {being})"

    def reason(self) -> str:
        """What the phase says while the new model's vectors are made."""
        return (
            f"making the vectors of embedding model {self.next_model}: {self.done} of "
            f"{self.total} chunks; embedding model {self.model} answers until then"
        )

    async def _asked(self) -> EmbeddingClient:
        """The client, once it says it serves the model the vectors are of."""
        if self.client is None:
            raise ModelUnavailable("it is no longer served at the configured address")
        if self.client.model is None:
            await self.client.connect()
        if self.client.model != self.model:
            raise ModelUnavailable(f"its address serves {self.client.model} now")
        return self.client

    async def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        return await (await self._asked()).embed_query(text)

    async def embed_documents(self, passages: list[str]) -> npt.NDArray[np.float32] | None:
        """A document read meanwhile, embedded for the vectors that answer; None where the
        old model does not answer or refuses it: its chunks are found by words until the
        switch, which gives them the new model's vectors."""
        if self._documents_gone:
            return None
        try:
            return await (await self._asked()).embed_documents(passages)
        except ModelRefused:
            return None
        except ModelUnavailable as e:
            log.warning(
                "%s does not answer (%s): documents read meanwhile wait for the switch",
                self.name,
                e,
            )
            self._documents_gone = True
            return None

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def retire(self, after: float) -> None:
        """Close the client once the searches that took it before the switch are over
        (each waits `after` seconds at most for its model), or at once when cancelled:
        closed under a search's request, that search was answered by words only."""
        try:
            await asyncio.sleep(after)
        finally:
            await self.close()


class ModelChange:
    """The pass's part that makes a new embedding model's vectors beside the ones that
    answer, then switches to them: the model that answers meanwhile (`Answering`), the
    staging, and the room it needs on the index drive."""

    def __init__(
        self,
        configured: Configured,
        progress: Shown,
        metrics: Metrics,
        index: Callable[[], Index],
        embed: Embed,
    ) -> None:
        """`index`: the index that answers now (a rebuild or a new chunking's takes its
        place); `embed`: the pass's, which the new model's vectors are asked of."""
        self._configured = configured
        self._progress = progress
        self._metrics = metrics
        self._index = index
        self._embed = embed
        self.answering: Answering | None = None
        """The model whose vectors answer while a new one's are made (questions are embedded
        by it); None while the configured model's do."""
        self._retiring: set[asyncio.Task[None]] = set()
        """Models let go of whose clients close once the searches still asking them end."""

    def answering_now(self) -> Answering | None:
        """The model whose vectors answer while a new one's are made; None from the moment
        the index's vectors are the configured model's (at the switch, under the lock)."""
        answering = self.answering
        if answering is None or answering.epoch != self._index().vectors_epoch:
            return None
        return answering

    async def follow_recorded(self) -> None:
        """Questions go to the model whose vectors the index holds: the configured one,
        unless the index records another endpoint for them (the configuration names
        another since, and its vectors are not made yet). A pass finds out whether the
        configured endpoint serves the same model (`answered_by_configured`) or another
        (`make`)."""
        meta = await asyncio.to_thread(self._index().store.meta)
        held = IndexSettings.from_meta(meta)
        recorded = recorded_endpoint(meta)
        endpoint = self._configured.config.embedding
        if (
            held is None
            or not held.model
            or not self._index().chunk_count
            or endpoint is None
            or recorded is None
            or recorded == endpoint
        ):
            return
        staged = staged_model(meta)
        await self._answer_by(held, recorded, staged.split("|")[0] if staged else None)

    async def _answer_by(
        self, held: IndexSettings, endpoint: EmbeddingConfig | None, next_model: str | None
    ) -> Answering:
        """Questions embedded by `endpoint`'s model, whose vectors the index holds (None: it
        is served nowhere now), while `next_model`'s are made."""
        index = self._index()
        answering = self.answering
        if (
            answering is None
            or answering.endpoint != endpoint
            or answering.model != held.model
            or answering.epoch != index.vectors_epoch
        ):
            self.drop_answering()
            client: EmbeddingClient | None = None
            if endpoint is not None:
                client = embedding_client(endpoint, self._configured.config.embedding_batch)
            answering = self.answering = Answering(
                held, endpoint, client, next_model, index.vectors_epoch
            )
        answering.next_model = next_model
        answering.done, answering.total = await asyncio.to_thread(index.store.staged_counts)
        return answering

    async def close(self) -> None:
        """Let go of the client of the model that answers while a new one's are made (and
        of those let go of before: at once)."""
        if (answering := self._release_answering()) is not None:
            await answering.close()  # not by a task: one cancelled before it starts never runs
        for task in self._retiring:
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)

    def _release_answering(self) -> Answering | None:
        """Questions go to the configured model from now on."""
        answering, self.answering = self.answering, None
        self._progress.changing = ""
        return answering

    def drop_answering(self) -> None:
        """Questions go to the configured model from now on; a search that asked the old
        model a moment ago still waits for its answer, so its client closes later."""
        if (answering := self._release_answering()) is not None:
            task = asyncio.create_task(answering.retire(hybrid.MODEL_TIMEOUT))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def answered_by_configured(self) -> None:
        """The configured model's vectors are the index's: it answers, the index records
        its endpoint, and vectors staged for another model are forgotten."""
        self.drop_answering()
        meta = await asyncio.to_thread(self._index().store.meta)
        if staged_model(meta) is not None:
            await asyncio.to_thread(self._index().store.end_staging, STAGING)
        endpoint = self._configured.config.embedding
        if endpoint is not None and recorded_endpoint(meta) != endpoint:
            await asyncio.to_thread(self._index().store.set_meta, endpoint_meta(endpoint))

    async def make(self, current: IndexSettings, settings: IndexSettings, read: Read) -> bool:
        """The new model's vectors made beside the ones that answer, then switched to: what
        changed in the sources is read first (`read`, with the old model, and staged too),
        and read again after each staging (what changed meanwhile is staged next), up to
        `STAGE_ROUNDS` times. False where the configuration changed meanwhile (nothing
        switched)."""
        embedder = self._configured.embedder
        endpoint = self._configured.config.embedding
        assert embedder is not None and endpoint is not None
        started = time.monotonic()
        meta = await asyncio.to_thread(self._index().store.meta)
        target = staging_meta(settings)
        if staged_model(meta) != target[STAGING]:
            await asyncio.to_thread(self._index().store.begin_staging, target)
        recorded = recorded_endpoint(meta)
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
        await read(current, answering.embed_documents)
        for _ in range(STAGE_ROUNDS):
            await self._check_room(answering, settings)
            self._progress.set_phase("indexing", "")
            made = await self._stage(answering, embedder)
            if made is None:
                return False
            calls += made
            planned = await read(current, answering.embed_documents)
            if not planned.to_read and not planned.to_drop:
                break
        switched = dataclasses.replace(
            current, model=settings.model, dimensions=settings.dimensions
        )
        while not await asyncio.to_thread(
            self._index().switch, switched, endpoint_meta(endpoint), [STAGING]
        ):
            made = await self._stage(answering, embedder)
            if made is None:
                return False
            calls += made
        self.drop_answering()
        log.info(
            "switched to the vectors of embedding model %s: %d chunks embedded in %.1f s",
            settings.model,
            calls,
            time.monotonic() - started,
        )
        return True

    async def _check_room(self, answering: Answering, settings: IndexSettings) -> None:
        """NoRoom (the pass waits, and is tried again) where the rest of the change does not
        fit on the index drive."""
        folder = self._configured.config.index_dir
        answering.done, answering.total = await asyncio.to_thread(self._index().store.staged_counts)
        self._progress.changing = answering.reason()
        size = await asyncio.to_thread(self._index().store.database_bytes)
        needed = staging_megabytes(
            answering.total - answering.done,
            answering.total,
            settings.dimensions,
            self._index().vector_kind,
            size,
        )
        why = no_room(needed, store.free_megabytes(folder), settings.model)
        if why is not None:
            raise NoRoom(why)

    async def _stage(self, answering: Answering, embedder: EmbeddingClient) -> int | None:
        """Every live chunk that lacks a staged vector given one by `embedder`, a batch a
        transaction; the chunks embedded, or None where the configuration changed meanwhile
        (another client embeds now: what it would give is not this model's)."""
        state = self._progress.state
        after, made = 0, 0
        while self._configured.embedder is embedder:
            batch = await asyncio.to_thread(self._index().store.lacking_staged, after, STAGE_CHUNKS)
            if not batch:
                return made
            passages = [texts.passage(title, h, text) for _, title, h, text in batch]
            vectors = await self._staged_vectors(passages)
            if self._configured.embedder is not embedder:
                break
            ids = [chunk_id for chunk_id, *_ in batch]
            await asyncio.to_thread(self._index().put_staged, ids, vectors)
            after, made = ids[-1], made + len(ids)
            answering.done, answering.total = await asyncio.to_thread(
                self._index().store.staged_counts
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
