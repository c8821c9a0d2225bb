"""What the HTTP API and MCP ask of an indexer: search, status, documents, a pass, an
evaluation. Answered in the API's models (`schema`), from the index the passes keep and
the models the configuration names; damage a search meets is a 503, and the passes are
told to rebuild the index."""

from __future__ import annotations

import asyncio
import sqlite3

import numpy as np
import numpy.typing as npt

from metis_indexer.config import IndexerConfig
from metis_indexer.configured import Configured
from metis_indexer.errors import BadRequest, Unavailable
from metis_indexer.index import store
from metis_indexer.ingest.runner import now
from metis_indexer.metrics import Metrics
from metis_indexer.passes import Passes
from metis_indexer.progress import Progress
from metis_indexer.schema import DocumentsPage, SearchAnswer, SearchRequest, StatusAnswer
from metis_indexer.search import evaluation, hybrid

DOCUMENT_STATES = ("indexed", "failed")


class Answers:
    """One indexer as its API sees it."""

    def __init__(
        self, configured: Configured, progress: Progress, passes: Passes, metrics: Metrics
    ) -> None:
        self._configured = configured
        self._progress = progress
        self._passes = passes
        self.metrics = metrics
        """Where the API counts its requests and searches."""

    @property
    def config(self) -> IndexerConfig:
        return self._configured.config

    @property
    def loaded(self) -> bool:
        """Whether searches are answered: the index is loaded."""
        return self._passes.loaded

    @property
    def phase(self) -> str:
        return self._progress.state.phase

    def request_pass(self, full: bool = False) -> None:
        """`POST /v1/reindex`; refused (409 STANDBY) while a replacement takes over."""
        self._passes.request(full)

    def status(self) -> StatusAnswer:
        s = self._progress.state
        config = self._configured.config
        index = self._passes.index
        totals = index.totals()
        embedder, reranker = self._configured.embedder, self._configured.reranker
        damage = self._passes.damage
        return StatusAnswer.model_validate(
            {
                "name": config.name,
                "phase": s.phase,
                "reason": s.reason,
                "documents": totals.documents,
                "chunks": totals.chunks,
                "failed": totals.failed,
                "pass_total": s.total,
                "pass_done": s.done,
                "last_indexed_at": s.last_indexed_at,
                "passes": s.completed,
                "dimensions": index.dimensions or None,
                "vectors": index.vector_kind,
                "embedding_model": None if embedder is None else embedder.model,
                "reranker": None if reranker is None else reranker.name,
                "skipped": dict(sorted(s.skipped.items())),
                "revisions": dict(config.revisions),
                "indexed_revisions": s.indexed_revisions,
                "generation": config.generation,
                "indexed_generation": s.indexed_generation,
                "last_pass": {"read": s.read, "unchanged": s.unchanged, "dropped": s.dropped},
                "warnings": [*s.problems, *self._passes.notes, *([damage] if damage else [])],
            }
        )

    def empty_warning(self) -> str:
        """What a search that finds nothing says, by how far the passes got."""
        state = self._progress.state
        if state.completed and not self._passes.index.totals().documents:
            return (
                "nothing is indexed: the sources hold no document Metis reads "
                "(Markdown, text, HTML, PDF, DOCX)"
            )
        return f"nothing is indexed yet: the index is {state.phase}"

    def _models(self, embed: hybrid.EmbedQuery | None = None) -> hybrid.Models:
        e, r = self._configured.embedder, self._configured.reranker
        config = self._configured.config
        return hybrid.Models(
            embed=embed or (None if e is None else e.embed_query),
            embedding_name=f"embedding model {config.embedding.name}"
            if config.embedding
            else "the embedding model",
            rerank=None if r is None else r.rerank,
            reranker_name=f"reranker {config.reranker.name}" if config.reranker else "the reranker",
        )

    async def search(self, req: SearchRequest) -> SearchAnswer:
        if not self._passes.loaded:
            raise Unavailable(
                "KNOWLEDGE_BASE_NOT_READY",
                f"the index is not serving yet: it is {self._progress.state.phase}",
            )
        return await self._searched(req, self._models())

    async def _searched(self, req: SearchRequest, models: hybrid.Models) -> SearchAnswer:
        """A search of the index; damage it meets is a 503 and schedules the rebuild."""
        try:
            return await hybrid.search(self._passes.index, req, models, self.empty_warning())
        except sqlite3.DatabaseError as e:
            if store.trouble(e) != "damaged":
                raise
            self._passes.damaged(e, "search")
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
            f.record
            for f in list(self._passes.index.files.values())
            if state is None or f.record.state == state
        ]
        rows.sort(key=lambda r: (r.source, r.path))
        start = (page - 1) * page_size
        return DocumentsPage.model_validate(
            {
                "documents": [
                    {
                        "source": r.source,
                        "document": r.path,
                        "kind": r.kind,
                        "title": r.title,
                        "state": r.state,
                        "chunks": r.chunks,
                        "size": r.size,
                        "reason": r.reason,
                        "detail": r.detail,
                        "indexed_at": r.indexed_at,
                    }
                    for r in rows[start : start + page_size]
                ],
                "page": page,
                "page_size": page_size,
                "total": len(rows),
            }
        )

    async def evaluate(self, k: int) -> evaluation.Evaluation:
        drives = {s.drive: s.root for s in self._configured.config.sources}
        cases = await asyncio.to_thread(evaluation.read_cases, sorted(drives.items()))
        vectors: dict[str, npt.NDArray[np.float32]] = {}

        async def embed_once(question: str) -> npt.NDArray[np.float32]:
            if question not in vectors:
                embedder = self._configured.embedder
                assert embedder is not None
                vectors[question] = await embedder.embed_query(question)
            return vectors[question]

        has_embedder = self._configured.embedder is not None
        models = self._models(embed_once if has_embedder else None)

        async def ask(question: str, way: evaluation.Way) -> SearchAnswer:
            req = SearchRequest(query=question, top_k=50, mode=way.mode, rerank=way.rerank)
            return await self._searched(req, models)

        ways = evaluation.ways(has_embedder, self._configured.reranker is not None)
        return await evaluation.evaluate(cases, k, ask, ways, now)
