"""Where a pass's vectors come from: those the index that answers holds (kept while a new
chunking's index is built beside it: a passage cut the same keeps its vector), those the
base's other replicas give (`peers`), and the embedding model's of the rest, waited for
while the model is away. Also the vectors this index gives its peers, and the counts a
status shows of each."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable

import numpy as np
import numpy.typing as npt

from metis_indexer.changes import peers
from metis_indexer.configured import Configured
from metis_indexer.index import store
from metis_indexer.ingest.runner import Embed
from metis_indexer.metrics import Metrics
from metis_indexer.models.clients import EmbeddingClient, ModelRefused, ModelUnavailable

log = logging.getLogger("metis.indexer")

WaitFor = Callable[[ModelUnavailable], Awaitable[None]]
"""Waits (phase `waiting`) until the embedding model answers again (`ModelWatch.wait_for`)."""


@dataclasses.dataclass(slots=True)
class Kept:
    """The index a new chunking's replaces, and its vectors found by passage hash (a map
    built for one build, let go with it)."""

    store: store.Store
    found: peers.HeldVectors = dataclasses.field(default_factory=peers.HeldVectors)


class Vectors:
    """A pass's vectors, from where they cost the model least; `wait_for`: the pass's wait
    for a model that does not answer; `token`: the base's, sent to its peers."""

    def __init__(
        self, configured: Configured, metrics: Metrics, wait_for: WaitFor, token: str | None
    ) -> None:
        self._configured = configured
        self._metrics = metrics
        self._wait_for = wait_for
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
        self.from_peers = 0
        self.from_model = 0
        self.kept = 0

    def reusing(self, answering: store.Store) -> Embed:
        """The embed of a new chunking's build: the vectors `answering` holds first."""
        return functools.partial(self.embed, reuse=Kept(answering))

    async def embed(
        self, passages: list[str], reuse: Kept | None = None, ask_peers: bool = True
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
        self, embedder: EmbeddingClient, reuse: Kept, passages: list[str]
    ) -> dict[int, npt.NDArray[np.float32]]:
        """The vectors `reuse` holds of passages, by position (its vectors are this model's:
        a new chunking is built only once they are)."""
        model, dimensions = embedder.model, embedder.dimensions
        if model is None or dimensions is None or not passages:
            return {}
        prefix = embedder.document_prefix
        hashes = [peers.passage_hash(prefix + p) for p in passages]
        try:
            at, rows = await asyncio.to_thread(
                reuse.found.find, reuse.store, prefix, hashes, dimensions
            )
        except sqlite3.DatabaseError as e:  # the answering index's: a search or check meets it
            log.warning("cannot read the vectors the index holds (%s): the model embeds them", e)
            return {}
        self.kept += len(at)
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
        self.from_peers += len(given.by_peers)
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
                self.from_model += len(passages)
                self._metrics.vectors_from_model.inc(len(passages))
                return vectors
            except ModelRefused:
                raise
            except ModelUnavailable as e:
                self._metrics.embed_failures.inc()
                await self._wait_for(e)

    async def close(self) -> None:
        """Let go of the peers' client."""
        await self.peers.close()
