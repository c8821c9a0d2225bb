"""What the HTTP API and MCP ask of an indexer: search, status, documents, a pass, an
evaluation. Answered in the API's models (`schema`), from the index the passes keep and
the models the configuration names; damage a search meets is a 503, and the passes are
told to rebuild the index. The answers see the passes through `Answered`, what they read
of them, never the pass loop itself."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from metis_indexer import notes
from metis_indexer.changes import chunking_change, peers
from metis_indexer.changes.chunking_change import ChunkingChange
from metis_indexer.changes.model_change import ModelChange
from metis_indexer.changes.vectors import Vectors
from metis_indexer.config import IndexerConfig, SourceConfig
from metis_indexer.configured import Configured
from metis_indexer.errors import BadRequest, Refusal, Unavailable
from metis_indexer.index import folders, store
from metis_indexer.index.memory import Index
from metis_indexer.ingest import artifacts
from metis_indexer.ingest.runner import now
from metis_indexer.metrics import Metrics
from metis_indexer.models.clients import ModelUnavailable
from metis_indexer.schema import (
    DocumentsPage,
    NoteAnswer,
    NoteCitation,
    NoteRequest,
    NotesPage,
    NotesQuery,
    SearchAnswer,
    SearchRequest,
    StatusAnswer,
    VectorsAnswer,
    VectorsRequest,
)
from metis_indexer.search import evaluation, hybrid
from metis_indexer.search_health import Fallback, RecentSearches, outcome
from metis_indexer.service.notebook import Notebook
from metis_indexer.service.progress import Progress
from metis_indexer.service.restoring import Restorer

log = logging.getLogger("metis.indexer")

DOCUMENT_STATES = ("indexed", "failed")
BROKE = "the indexer failed on a search; see its log"
"""What a search that broke the indexer (a 500) is counted with."""


class Answered(Protocol):
    """What the answers read of the passes (`passes.Passes`): the index that answers,
    whether it is loaded and has had a whole pass, what a status says of it (damage, notes,
    the changes made beside it, where its vectors came from), the notes, the folders of
    the artifacts read, and where a pass is asked for and damage met is told."""

    @property
    def loaded(self) -> bool: ...

    @property
    def passed(self) -> bool: ...

    @property
    def index(self) -> Index: ...

    @property
    def chunks_of(self) -> tuple[int, int] | None: ...

    @property
    def damage(self) -> str | None: ...

    @property
    def notes(self) -> list[str]: ...

    @property
    def notebook(self) -> Notebook: ...

    @property
    def vectors(self) -> Vectors: ...

    @property
    def model_change(self) -> ModelChange: ...

    @property
    def chunking_change(self) -> ChunkingChange: ...

    @property
    def artifacts(self) -> artifacts.Fetched: ...

    def request(self, full: bool = False) -> None: ...

    def damaged(self, error: sqlite3.DatabaseError, found_by: str, index: Index) -> None: ...


class Answers:
    """One indexer as its API sees it."""

    def __init__(
        self,
        configured: Configured,
        progress: Progress,
        passes: Answered,
        metrics: Metrics,
        restorer: Restorer | None = None,
    ) -> None:
        """`restorer`: the restore from a backup at start, which the status shows."""
        self._configured = configured
        self._restorer = restorer
        self._progress = progress
        self._passes = passes
        self.metrics = metrics
        """Where the API counts its requests and searches."""
        metrics.drive_used.set_function(lambda: (self.drive() or {}).get("used_bytes", 0))
        metrics.drive_size.set_function(lambda: (self.drive() or {}).get("size_bytes", 0))
        self.recent = RecentSearches()
        """How the searches of the last minute were answered (an evaluation's are not
        counted: they ask every way, the ones a base lacks a model for included)."""

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

    def not_ready(self) -> str | None:
        """Why a loaded index is not ready (`peers.not_ready`); None when it is."""
        return peers.not_ready(self._configured.config.peers, self._passes.passed)

    async def vectors(self, req: VectorsRequest) -> VectorsAnswer:
        """`POST /v1/vectors`: the vectors of the asked passages this index holds, of the
        asked model only; none, saying why, where its vectors are not that model's."""
        index = self._passes.index
        with index.serve():
            return await self._vectors(index, req)

    async def _vectors(self, index: Index, req: VectorsRequest) -> VectorsAnswer:
        embedder = self._configured.embedder
        configured = None if embedder is None else embedder.model
        settings = await asyncio.to_thread(index.settings) if self.loaded else None
        held = None if settings is None else settings.model
        changing = self._passes.model_change.answering_now() is not None
        why = peers.serving_problem(req.model, self.loaded, configured, held, changing)
        if why is not None or embedder is None or settings is None:
            return VectorsAnswer(model=None, dimensions=0, found=[], vectors="", reason=why)
        found, rows = await asyncio.to_thread(
            self._passes.vectors.held.find,
            index.store,
            embedder.document_prefix,
            req.hashes,
            settings.dimensions,
        )
        return VectorsAnswer(
            model=held, dimensions=settings.dimensions, found=found, vectors=peers.encode_rows(rows)
        )

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
        answering = self._passes.model_change.answering_now()
        embedding: dict[str, object] | None = None
        if answering is not None:
            embedding = {
                "answering": answering.model,
                "next": answering.next_model,
                "done": answering.done,
                "total": answering.total,
            }
        elif embedder is not None and embedder.model is not None:
            embedding = {"answering": embedder.model, "next": None, "done": 0, "total": 0}
        chunking: dict[str, object] | None = None
        if (building := self._passes.chunking_change.building) is not None:
            done, total = self._passes.chunking_change.progress()
            chunking = {
                "answering": _chunks(chunking_change.chunking(building.old)),
                "next": _chunks(chunking_change.chunking(building.new)),
                "done": done,
                "total": total,
            }
        elif (chunks_of := self._passes.chunks_of) is not None:
            chunking = {"answering": _chunks(chunks_of), "next": None, "done": 0, "total": 0}
        return StatusAnswer.model_validate(
            {
                "name": config.name,
                "phase": s.phase,
                "reason": s.reason,
                "documents": totals.documents,
                "notes": len(self._passes.notebook.notes),
                "chunks": totals.chunks,
                "failed": totals.failed,
                "pass_total": s.total,
                "pass_done": s.done,
                "last_indexed_at": s.last_indexed_at,
                "passes": s.completed,
                "dimensions": index.dimensions or None,
                "vectors": index.vector_kind,
                "embedding_model": None if embedder is None else embedder.model,
                "embedding": embedding,
                "chunking": chunking,
                "reranker": None if reranker is None else reranker.name,
                "skipped": dict(sorted(s.skipped.items())),
                "revisions": config.all_revisions(),
                "indexed_revisions": s.indexed_revisions,
                "generation": config.generation,
                "indexed_generation": s.indexed_generation,
                "last_pass": {"read": s.read, "unchanged": s.unchanged, "dropped": s.dropped},
                "warnings": [
                    *s.problems,
                    *self._passes.notes,
                    *([damage] if damage else []),
                    *self._passes.vectors.peers.warnings(time.monotonic()),
                ],
                "searches": self.recent.account(time.monotonic()),
                "vectors_from_peers": self._passes.vectors.from_peers,
                "vectors_from_model": self._passes.vectors.from_model,
                "vectors_kept": self._passes.vectors.kept,
                "drive": self.drive(),
                "restore": None if self._restorer is None else self._restorer.status(),
            }
        )

    def drive(self) -> dict[str, int] | None:
        use = folders.drive_use(self._configured.config.index_dir)
        return None if use is None else {"used_bytes": use[0], "size_bytes": use[1]}

    def empty_warning(self) -> str:
        """What a search that finds nothing says, by how far the passes got."""
        state = self._progress.state
        if state.completed and not self._passes.index.totals().documents:
            return (
                "nothing is indexed: the sources hold no document Metis reads "
                "(Markdown, text, HTML, PDF, DOCX)"
            )
        return f"nothing is indexed yet: the index is {state.phase}"

    def _embed_query(self) -> hybrid.EmbedQuery | None:
        """What embeds a question now: the model whose vectors the index holds (while a
        new model's are made, the old one), None where the base has no embedding model."""
        answering, e = self._passes.model_change.answering_now(), self._configured.embedder
        if answering is not None:
            return answering.embed_query
        return None if e is None else e.embed_query

    async def _embedded(self, question: str) -> npt.NDArray[np.float32]:
        """A question's vector by the model that answers when it is asked: a search asked
        again after a switch (`hybrid.Switched`) goes to the new model."""
        embed = self._embed_query()
        if embed is None:
            raise ModelUnavailable("the base has no embedding model now")
        return await embed(question)

    def _models(
        self, embed: hybrid.EmbedQuery | None = None, fell_back: hybrid.FellBack | None = None
    ) -> hybrid.Models:
        r = self._configured.reranker
        config = self._configured.config
        answering = self._passes.model_change.answering_now()
        if answering is not None:
            embedding_name = answering.warning_name()
        elif config.embedding:
            embedding_name = f"embedding model {config.embedding.name}"
        else:
            embedding_name = "the embedding model"
        return hybrid.Models(
            embed=embed or (None if self._embed_query() is None else self._embedded),
            embedding_name=embedding_name,
            rerank=None if r is None else r.rerank,
            reranker_name=f"reranker {config.reranker.name}" if config.reranker else "the reranker",
            fell_back=fell_back,
        )

    async def search(self, req: SearchRequest) -> SearchAnswer:
        """A search of the API (HTTP, MCP, the Search page), counted in `recent` by how
        it was answered: as asked, without a model, or failed (a 5xx)."""
        fallbacks: list[tuple[Fallback, str]] = []
        try:
            if not self._passes.loaded:
                raise Unavailable(
                    "KNOWLEDGE_BASE_NOT_READY",
                    f"the index is not serving yet: it is {self._progress.state.phase}",
                )
            answer = await self._searched(
                req, self._models(fell_back=lambda kind, why: fallbacks.append((kind, why)))
            )
        except Refusal as e:
            if e.status >= 500:
                self.recent.record(time.monotonic(), "failed", e.message)
            raise
        except Exception:
            self.recent.record(time.monotonic(), "failed", BROKE)
            raise
        self.recent.record(time.monotonic(), *outcome(fallbacks))
        return answer

    async def _searched(self, req: SearchRequest, models: hybrid.Models) -> SearchAnswer:
        """A search of the index; damage it meets is a 503 and schedules the rebuild."""
        index = self._passes.index
        try:
            with index.serve():
                answer = await hybrid.search(index, req, models, self.empty_warning())
        except sqlite3.DatabaseError as e:
            if store.trouble(e) != "damaged":
                raise self._unreadable(e) from None
            self._passes.damaged(e, "search", index)
            raise Unavailable(
                "KNOWLEDGE_BASE_NOT_READY",
                f"the index is damaged ({e}): it is being rebuilt from the sources, and "
                "searches answer from what is read again meanwhile",
            ) from None
        except (sqlite3.Error, store.StoreUnavailable) as e:
            raise self._unreadable(e) from None
        return self._with_notes(answer)

    @staticmethod
    def _unreadable(e: Exception) -> Unavailable:
        """Whatever else a search meets in the store (a busy or full file, an index another
        has just taken the place of): a 503 that says so, never a 500."""
        log.warning("a search could not read the index: %s", e)
        return Unavailable(
            "KNOWLEDGE_BASE_NOT_READY",
            f"the index could not be read just now ({e}); ask again in a moment",
        )

    def _with_notes(self, answer: SearchAnswer) -> SearchAnswer:
        """Notes' results cited with when they were written and what replaced them, and
        those of notes that hold before those of replaced ones (`notes.holding_first`)."""
        notebook = self._passes.notebook
        replaced: list[bool | None] = []
        for result in answer.results:
            c = result.citation
            note_id = notes.of_document(c.document) if c.source == notebook.source else None
            note = None if note_id is None else notebook.notes.get(note_id)
            if note is None:
                replaced.append(None)
                continue
            by = notebook.replaced.get(note.id)
            c.note = NoteCitation(
                id=note.id,
                written_at=note.written_at,
                replaces=list(note.replaces),
                replaced_by=None if by is None else by.by,
                replaced_at=None if by is None else by.at,
            )
            replaced.append(by is not None)
        if any(replaced):
            order = notes.holding_first(replaced)
            answer.results = [answer.results[i] for i in order]
        return answer

    # -- notes -------------------------------------------------------------------------------

    def _notebook(self) -> Notebook:
        if not self._passes.loaded:
            raise Unavailable(
                "KNOWLEDGE_BASE_NOT_READY",
                f"the index is not serving yet: it is {self._progress.state.phase}",
            )
        return self._passes.notebook

    def note(self, note_id: str) -> NoteAnswer:
        return self._note_answer(self._notebook().get(notes.check_id(note_id)))

    def notes_page(self, query: NotesQuery) -> NotesPage:
        listed = self._notebook().listed()
        start = (query.page - 1) * query.page_size
        return NotesPage(
            notes=[self._note_answer(n) for n in listed[start : start + query.page_size]],
            page=query.page,
            page_size=query.page_size,
            total=len(listed),
        )

    async def write_note(self, req: NoteRequest) -> tuple[NoteAnswer, bool]:
        """The note kept and searchable, and whether it is new."""
        note, new = await self._notebook().write(req.text, req.title, req.replaces, req.id)
        return self._note_answer(note), new

    async def forget_note(self, note_id: str) -> NoteAnswer:
        return self._note_answer(await self._notebook().forget(notes.check_id(note_id)))

    def _note_answer(self, note: notes.Note) -> NoteAnswer:
        notebook = self._passes.notebook
        by = notebook.replaced.get(note.id)
        return NoteAnswer(
            id=note.id,
            source=notebook.source,
            document=note.document,
            title=note.title,
            text=note.text,
            written_at=note.written_at,
            replaces=list(note.replaces),
            replaced_by=None if by is None else by.by,
            replaced_at=None if by is None else by.at,
        )

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
        cases = await asyncio.to_thread(
            evaluation.read_cases,
            evaluation_places(self._passes.artifacts.readable(self._configured.config.sources)),
        )
        vectors: dict[tuple[str, int], npt.NDArray[np.float32]] = {}

        async def embed_once(question: str) -> npt.NDArray[np.float32]:
            key = (question, self._passes.index.vectors_epoch)  # a switch: asked again
            if key not in vectors:
                vectors[key] = await self._embedded(question)
            return vectors[key]

        has_embedder = self._embed_query() is not None
        models = self._models(embed_once if has_embedder else None)

        async def ask(question: str, way: evaluation.Way) -> SearchAnswer:
            req = SearchRequest(query=question, top_k=50, mode=way.mode, rerank=way.rerank)
            return await self._searched(req, models)

        ways = evaluation.ways(has_embedder, self._configured.reranker is not None)
        return await evaluation.evaluate(cases, k, ask, ways, now)


def evaluation_places(sources: Sequence[SourceConfig]) -> list[tuple[str, Path]]:
    """Where evaluation sets are looked for: each source drive's root, then each folder a
    source reads (a team keeps its questions beside its documents), each place once."""
    places = {s.drive: s.root for s in sources}
    for s in sources:
        if s.path:
            places.setdefault(f"{s.drive}/{s.path}", s.folder)
    return sorted(places.items())


def _chunks(chunking: tuple[int, int]) -> dict[str, int]:
    size, overlap = chunking
    return {"size": size, "overlap": overlap}
