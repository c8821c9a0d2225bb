"""What an indexer runs with now: its configuration and the model clients made from it.
A changed configuration replaces both (`following`); every part reads them here each time,
so none keeps an old client or an old configuration."""

from __future__ import annotations

import asyncio

from metis_indexer.config import EmbeddingConfig, IndexerConfig
from metis_indexer.models.clients import EmbeddingClient, RerankClient
from metis_indexer.search import hybrid

RETIRING = "metis-retiring-client"
"""The name of a task that closes a client let go of."""


class Configured:
    """The configuration run now, and its embedding and reranker clients (None where the
    configuration names no such model)."""

    def __init__(self, config: IndexerConfig) -> None:
        self.config = config
        self.embedder = _embedder(config)
        self.reranker = _reranker(config)
        self._retiring: set[asyncio.Task[None]] = set()
        """Clients let go of, closing once the searches that took them are over."""

    def take(self, config: IndexerConfig) -> None:
        """Run `config` from now on; each client is made again only when its own model
        (or the embedding batch) changed, and the one it replaces is retired, not closed:
        a search in flight keeps the client it took (one closed under its request was
        answered by words only, a clean-clone CI run saw it)."""
        old, self.config = self.config, config
        if (config.embedding, config.embedding_batch) != (old.embedding, old.embedding_batch):
            self._retire(self.embedder)
            self.embedder = _embedder(config)
        if config.reranker != old.reranker:
            self._retire(self.reranker)
            self.reranker = _reranker(config)

    def _retire(self, client: EmbeddingClient | RerankClient | None) -> None:
        """Close `client` once every search that took it has had its model's time."""
        if client is not None:
            task = asyncio.create_task(_close_after(client, hybrid.MODEL_TIMEOUT), name=RETIRING)
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        """Close every client, those retired too (at once)."""
        for task in self._retiring:
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for client in (self.embedder, self.reranker):
            if client is not None:
                await client.close()

    @property
    def embedding_name(self) -> str:
        """The embedding model as a log line or a reason names it."""
        e = self.config.embedding
        return e.name if e is not None else "the embedding model"


async def _close_after(client: EmbeddingClient | RerankClient, seconds: float) -> None:
    """Close `client` after `seconds`, or at once when cancelled."""
    try:
        await asyncio.sleep(seconds)
    finally:
        await client.close()


def _embedder(config: IndexerConfig) -> EmbeddingClient | None:
    e = config.embedding
    return None if e is None else embedding_client(e, config.embedding_batch)


def embedding_client(e: EmbeddingConfig, batch: int) -> EmbeddingClient:
    """A client of an embedding endpoint: the configured one, or the one whose vectors
    answer while a new model's are made."""
    return EmbeddingClient(
        e.url, query_prefix=e.query_prefix, document_prefix=e.document_prefix, batch=batch
    )


def _reranker(config: IndexerConfig) -> RerankClient | None:
    r = config.reranker
    return None if r is None else RerankClient(r.url, query_prefix=r.query_prefix, name=r.name)
