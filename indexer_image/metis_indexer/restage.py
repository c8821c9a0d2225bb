"""A new embedding model's vectors made beside the ones that answer.

When the model (or its dimensions) changes, the index keeps its vectors and questions are
embedded by the model that made them (`Answering`), while every stored chunk is embedded
by the new model into a staged set (`store.Store.put_staged`); once every live chunk has
one, the staged vectors take the old ones' place at once (`memory.Index.switch`). The
index's meta records which endpoint answers (`ANSWERING`) and which model is being
staged (`STAGING`), so a restart mid-change still answers by meaning, and resumes the
staging where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import math

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from metis_indexer import limits
from metis_indexer.config import EmbeddingConfig
from metis_indexer.index.memory import IndexSettings
from metis_indexer.index.store import CHECKPOINT_BYTES
from metis_indexer.models.clients import EmbeddingClient, ModelRefused, ModelUnavailable

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
LOG_MEGABYTES = CHECKPOINT_BYTES // 1_000_000
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
