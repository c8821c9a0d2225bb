"""Hybrid search over the in-memory index (docs/search.md, "HTTP API (port 7700)").

`rank` is the core: filters → the two legs (the index's read API) → fusion, timed.
`search` wraps it with the model calls, each bounded by its time limit; when a
model does not answer, the search answers without it and warns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent import futures

import numpy as np
import numpy.typing as npt

from metis_indexer.errors import BadRequest, Unavailable
from metis_indexer.index import texts, tokens
from metis_indexer.index.memory import Index, Reading, Where
from metis_indexer.index.vectors import Leg
from metis_indexer.schema import (
    Citation,
    Filters,
    Mode,
    Result,
    Scores,
    SearchAnswer,
    SearchRequest,
    Took,
    check_search,
)
from metis_indexer.search import fusion, snippet
from metis_indexer.search_health import Fallback

CANDIDATES = 50
"""Each leg keeps this many, or 4 × top_k when that is more."""
RERANK_MIN, RERANK_MAX = 20, 50
MODEL_TIMEOUT = 10.0
"""Seconds a search waits for a model before it answers without it."""

EmbedQuery = Callable[[str], Awaitable[npt.NDArray[np.float32]]]
RerankCall = Callable[[str, list[str]], Awaitable[list[float]]]
FellBack = Callable[[Fallback, str], None]
"""Told of a model a search answers without, with the warning that says so."""


@dataclasses.dataclass(frozen=True, slots=True)
class Models:
    """The model calls a search may make; None where the base has no such model."""

    embed: EmbedQuery | None = None
    embedding_name: str = "the embedding model"
    rerank: RerankCall | None = None
    reranker_name: str = "the reranker"
    timeout: float = MODEL_TIMEOUT
    fell_back: FellBack | None = None
    """Told of each fallback of the search (the status counts them); None: nobody is."""

    def warn(self, warnings: list[str], fallback: Fallback, warning: str) -> None:
        warnings.append(warning)
        if self.fell_back is not None:
            self.fell_back(fallback, warning)


@dataclasses.dataclass(slots=True)
class Ranked:
    """Fused candidates with each leg's score and rank, best first, and the index as
    they were ranked in (`read`): their texts and citations are read from it after the
    index's lock is let go, while a compaction may move rows."""

    rows: list[int]
    fused: dict[int, float]
    dense: dict[int, tuple[float, int]]
    keyword: dict[int, tuple[float, int]]
    took: Took
    read: Reading
    words: list[str]
    """The question's telling words (`Reading.telling`)."""


def leg_size(top_k: int) -> int:
    return max(CANDIDATES, 4 * top_k)


def rerank_size(top_k: int) -> int:
    return min(RERANK_MAX, max(RERANK_MIN, 3 * top_k))


def where(filters: Filters | None) -> Where | None:
    """The files a search may return, as the index reads it; None: every file."""
    if filters is None or (
        filters.path_prefix is None and filters.kinds is None and filters.sources is None
    ):
        return None
    return Where(
        kinds=None if filters.kinds is None else frozenset(k.value for k in filters.kinds),
        sources=None if filters.sources is None else frozenset(filters.sources),
        path_prefix=filters.path_prefix,
    )


class Switched(Exception):
    """The index's vectors were switched to another model's since the question was
    embedded: its vector is not ranked against them."""


def rank(
    index: Index,
    req: SearchRequest,
    query_vector: npt.NDArray[np.float32] | None,
    epoch: int | None = None,
) -> Ranked:
    """Both legs and their fusion; a leg is skipped when the mode or the models say so.

    Fusion meets the keyword leg first, so equal fused scores (a chunk only one leg found,
    at the same rank in either) put the one found by words first: a keyword candidate shares
    words with the question, where the dense leg returns its 50 whether or not any is close.
    On SciFact's train split this gave hybrid nDCG@10 +0.005 over the dense leg's first
    (docs/quality.md, "Quality: BEIR SciFact"); scores and ranks are the same either way.
    `epoch`: the index's `vectors_epoch` when the question was embedded (Switched where
    it is no longer)."""
    took = Took()
    dense: dict[int, tuple[float, int]] = {}
    keyword: dict[int, tuple[float, int]] = {}
    k = leg_size(req.top_k)
    files = where(req.filters)
    with index.reading() as read:  # both legs see the same rows
        if query_vector is not None and epoch is not None and epoch != index.vectors_epoch:
            raise Switched
        allowed = read.allowed(files)
        question = tokens.words(req.query)
        words = read.telling(question)
        by_vector: Callable[[], Leg] | None = None
        by_words: Callable[[], Leg] | None = None
        if query_vector is not None:
            by_vector = functools.partial(read.dense, query_vector, allowed, k)
        if req.mode != "dense":
            by_words = functools.partial(
                read.by_words, question, None if files is None else allowed, k
            )
        if by_vector is not None and by_words is not None:
            beside = _beside().submit(_timed, by_words)
            try:
                dense, took.dense = _timed(by_vector)
            finally:
                futures.wait([beside])  # it reads under this block's lock: it ends first
            keyword, took.keyword = beside.result()
        elif by_vector is not None:
            dense, took.dense = _timed(by_vector)
        elif by_words is not None:
            keyword, took.keyword = _timed(by_words)
    t = time.perf_counter()
    fused = fusion.reciprocal_rank([list(leg) for leg in (keyword, dense) if leg])
    took.fuse = _ms(t)
    return Ranked([r for r, _ in fused], dict(fused), dense, keyword, took, read, words)


def _timed(leg: Callable[[], Leg]) -> tuple[dict[int, tuple[float, int]], float]:
    """A leg's rows with their scores and ranks, and its milliseconds."""
    t = time.perf_counter()
    rows = {r: (v, i) for i, (r, v) in enumerate(leg(), start=1)}
    return rows, _ms(t)


@functools.cache
def _beside() -> futures.ThreadPoolExecutor:
    """The thread a search's keyword leg runs on while its dense leg runs on the caller's:
    the int8 scan lets go of the interpreter lock, and the keyword leg fits in the time
    the scan's threads wait on memory. One is enough: only the holder of the index's read
    lock gives it work, and waits for it."""
    return futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="keyword-leg")


async def search(
    index: Index, req: SearchRequest, models: Models, empty_warning: str
) -> SearchAnswer:
    """One search, as the API answers it.

    `empty_warning` is what to say when nothing is indexed (why depends on the pass).
    """
    check_search(req)
    start = time.perf_counter()
    mode: Mode = req.mode
    if index.chunk_count == 0:
        return SearchAnswer(
            results=[],
            mode=mode,
            reranked=False,
            warnings=[empty_warning],
            took=Took(total=_ms(start)),
            words=[],
        )
    for again in (False, True):  # again: the vectors were switched while the question was embedded
        warnings: list[str] = []
        epoch, dimensions = index.vectors_epoch, index.dimensions  # a switch sets the epoch last
        query_vector, embed_ms = await _embed(index, req, models, warnings, dimensions)
        mode = "keyword" if req.mode == "hybrid" and query_vector is None else req.mode
        try:
            ranked = await asyncio.to_thread(
                rank, index, req.model_copy(update={"mode": mode}), query_vector, epoch
            )
            break
        except Switched:
            if again:
                raise Unavailable(
                    "EMBEDDING_MODEL_UNAVAILABLE",
                    "the index's embedding model changed twice during one search: ask again",
                ) from None
    ranked.took.embed = embed_ms
    rows = ranked.rows
    rerank_scores: dict[int, float] = {}
    use_reranker = models.rerank is not None and req.rerank is not False and rows
    if use_reranker:
        rows, rerank_scores = await _rerank(ranked.read, req, models, rows, ranked.took, warnings)
    results = _results(req, rows, ranked, rerank_scores)
    ranked.took.total = _ms(start)
    return SearchAnswer(
        results=results,
        mode=mode,
        reranked=bool(rerank_scores),
        warnings=warnings,
        took=ranked.took.model_copy(update={k: round(v, 3) for k, v in ranked.took}),
        words=ranked.words,
    )


async def _embed(
    index: Index, req: SearchRequest, models: Models, warnings: list[str], dimensions: int
) -> tuple[npt.NDArray[np.float32] | None, float]:
    """The question's vector (of `dimensions`: the index's when it was asked), or None (and
    why) when the dense leg cannot run."""
    if req.mode == "keyword":
        return None, 0.0
    if models.embed is None:
        if req.mode == "dense":
            raise BadRequest("NO_EMBEDDING_MODEL", "mode dense needs an embedding model")
        return None, 0.0
    any_vector, missing = index.vector_coverage()
    if not any_vector:
        models.warn(
            warnings,
            "by_words_only",
            "no chunk has a vector yet (indexed while the embedding model did not answer): "
            "results by keywords",
        )
        return None, 0.0
    if missing:
        warnings.append(
            f"{missing} chunks have no vector yet (indexed while the embedding model did not "
            "answer): they are found by keywords only"
        )
    t = time.perf_counter()
    try:
        vector = _unit(await asyncio.wait_for(models.embed(req.query), models.timeout), dimensions)
    except Exception as e:  # any failure of the model is the same degraded answer
        why = _why(e, models.timeout)
        if req.mode == "dense":
            raise Unavailable(
                "EMBEDDING_MODEL_UNAVAILABLE",
                f"{models.embedding_name} did not answer ({why}); mode dense needs it",
            ) from None
        models.warn(
            warnings,
            "by_words_only",
            f"{models.embedding_name} did not answer ({why}): results by keywords only",
        )
        return None, _ms(t)
    return vector, _ms(t)


async def _rerank(
    read: Reading,
    req: SearchRequest,
    models: Models,
    rows: list[int],
    took: Took,
    warnings: list[str],
) -> tuple[list[int], dict[int, float]]:
    assert models.rerank is not None
    text_of = read.texts(rows[: rerank_size(req.top_k)])
    candidates = [r for r in rows[: rerank_size(req.top_k)] if r in text_of]  # still there
    passages = [
        texts.reranked(c.record.title, c.headings, text_of[r])
        for r, c in zip(candidates, read.cited(candidates), strict=True)
    ]
    t = time.perf_counter()
    try:
        scores = await asyncio.wait_for(models.rerank(req.query, passages), models.timeout)
        if len(scores) != len(candidates):
            raise ValueError(f"{len(scores)} scores for {len(candidates)} passages")
    except Exception as e:  # any failure of the reranker is the same degraded answer
        took.rerank = _ms(t)
        models.warn(
            warnings,
            "without_reranker",
            f"{models.reranker_name} did not answer ({_why(e, models.timeout)}): "
            "results in the fused order",
        )
        return rows, {}
    took.rerank = _ms(t)
    by_row = dict(zip(candidates, (float(s) for s in scores), strict=True))
    order = sorted(candidates, key=lambda r: -by_row[r])
    return order, by_row


def _results(
    req: SearchRequest,
    rows: Sequence[int],
    ranked: Ranked,
    rerank_scores: dict[int, float],
) -> list[Result]:
    """The best `top_k` rows whose chunks are still there (a document replaced since it
    was ranked is left out rather than answered without its text)."""
    by_row: dict[int, str] = {}
    kept: list[int] = []
    looked = 0
    while len(kept) < req.top_k and looked < len(rows):  # once, unless rows went meanwhile
        more = rows[looked : looked + req.top_k - len(kept)]
        looked += len(more)
        by_row.update(ranked.read.texts(more))
        kept += [r for r in more if r in by_row]
    rows = kept
    words = tokens.words(req.query)
    results = []
    for r, cited in zip(rows, ranked.read.cited(rows), strict=True):
        entry = cited.record
        dense = ranked.dense.get(r)
        kw = ranked.keyword.get(r)
        scores = Scores(
            dense=None if dense is None else round(dense[0], 6),
            dense_rank=None if dense is None else dense[1],
            keyword=None if kw is None else round(kw[0], 6),
            keyword_rank=None if kw is None else kw[1],
            fused=round(ranked.fused[r], 6),
            rerank=None if r not in rerank_scores else round(rerank_scores[r], 6),
        )
        text = by_row[r]
        results.append(
            Result(
                score=scores.rerank if scores.rerank is not None else scores.fused or 0.0,
                text=text,
                citation=Citation(
                    source=entry.source,
                    document=entry.path,
                    title=entry.title,
                    kind=entry.kind,  # type: ignore[arg-type]
                    page=cited.page,
                    line=cited.line,
                    headings=list(cited.headings),
                    snippet=snippet.snippet(text, words),
                ),
                scores=scores,
            )
        )
    return results


def _unit(vector: npt.NDArray[np.float32], dimensions: int) -> npt.NDArray[np.float32]:
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    if dimensions and len(v) != dimensions:
        raise Unavailable(
            "EMBEDDING_MODEL_UNAVAILABLE",
            f"the question's vector has {len(v)} dimensions; the index has {dimensions}",
        )
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def _why(e: BaseException, timeout: float) -> str:
    if isinstance(e, TimeoutError):
        return f"no answer within {timeout:g} s"
    return str(e) or type(e).__name__


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0
