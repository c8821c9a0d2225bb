"""The embedding model watched while a pass asks it: a model that falls silent shows as
`waiting` and its next answer shows the pass going on; a model whose request failed is
waited for (phase `waiting`) until it answers again, and the pass resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import logging

from metis_indexer.configured import Configured
from metis_indexer.models.clients import ModelUnavailable
from metis_indexer.service.progress import Progress

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


class ModelWatch:
    """What the passes show of the embedding model: silent, waited for, answering again."""

    def __init__(self, configured: Configured, progress: Progress) -> None:
        self._configured = configured
        self._progress = progress
        self._lock = asyncio.Lock()
        """Held by the one waiter that looks at a model which does not answer."""
        self._silenced_from: str | None = None
        """The phase a pass was in when its model fell silent (it shows `waiting`)."""

    async def watch(self) -> None:
        """During a pass: a model that answers nothing for MODEL_SILENCE seconds shows as
        `waiting` at once, and its next answer shows the pass going on (requests to a
        busy model are not given up for being slow)."""
        state = self._progress.state
        while True:
            await asyncio.sleep(1.0)
            embedder = self._configured.embedder
            if embedder is None or self._lock.locked():
                continue  # no model, or `wait_for` already says what happens
            silent = embedder.silent_for() >= MODEL_SILENCE
            if silent and self._silenced_from is None and state.phase != "waiting":
                self._silenced_from = state.phase
                name = self._configured.embedding_name
                log.warning("embedding model %s has answered nothing for %g s", name, MODEL_SILENCE)
                self._progress.set_phase(
                    "waiting",
                    f"waiting for embedding model {name}: no answer for {MODEL_SILENCE:g} s",
                )
            elif not silent and self._silenced_from is not None:
                log.info("embedding model %s answers again", self._configured.embedding_name)
                self._progress.set_phase(self._silenced_from, "")
                self._silenced_from = None

    async def wait_for(self, error: ModelUnavailable) -> None:
        """Phase `waiting` until the embedding model answers again; one waiter looks. A
        quick look first, so a passing failure does not show as waiting."""
        embedder = self._configured.embedder
        assert embedder is not None
        async with self._lock:
            if await embedder.answers(PROBE_SECONDS):
                return
            before = self._silenced_from or self._progress.state.phase
            self._silenced_from = None
            name = self._configured.embedding_name
            self._progress.set_phase("waiting", f"waiting for embedding model {name}: {error}")
            log.warning("embedding model %s does not answer (%s): the pass waits", name, error)
            delay = WAIT_FIRST
            while not await embedder.answers(PROBE_SECONDS):
                await asyncio.sleep(delay)
                delay = min(WAIT_MAX, delay * 2)
            log.info("embedding model %s answers again: the pass resumes", name)
            self._progress.set_phase(before if before != "waiting" else "indexing", "")
