"""What an indexer runs with now: its configuration and the model clients made from it.
A changed configuration replaces both (`following`); every part reads them here each time,
so none keeps an old client or an old configuration."""

from __future__ import annotations

from metis_indexer.config import EmbeddingConfig, IndexerConfig
from metis_indexer.models.clients import EmbeddingClient, RerankClient


class Configured:
    """The configuration run now, and its embedding and reranker clients (None where the
    configuration names no such model)."""

    def __init__(self, config: IndexerConfig) -> None:
        self.config = config
        self.embedder = _embedder(config)
        self.reranker = _reranker(config)

    async def take(self, config: IndexerConfig) -> None:
        """Run `config` from now on; each client is made again only when its own model
        (or the embedding batch) changed: a search in flight keeps a client that did not
        change (a reranker closed under it answered in the fused order)."""
        old, self.config = self.config, config
        if (config.embedding, config.embedding_batch) != (old.embedding, old.embedding_batch):
            if self.embedder is not None:
                await self.embedder.close()
            self.embedder = _embedder(config)
        if config.reranker != old.reranker:
            if self.reranker is not None:
                await self.reranker.close()
            self.reranker = _reranker(config)

    async def close(self) -> None:
        for client in (self.embedder, self.reranker):
            if client is not None:
                await client.close()

    @property
    def embedding_name(self) -> str:
        """The embedding model as a log line or a reason names it."""
        e = self.config.embedding
        return e.name if e is not None else "the embedding model"


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
