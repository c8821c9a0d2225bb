"""Asking indexers over their HTTP API (`/v1/search`, `/v1/documents`), and running a
search of the Search page: one or several bases, one mode or the three of Compare.

A base's answer is a `SearchAnswer` or the `ErrorBody` it gave (or one saying it could
not be reached), so one base that fails does not hide the others' results.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

import httpx
from pydantic import ValidationError

from metis_indexer.console.views import COMPARED, CompareRow, Hit, SearchForm, compare, merge
from metis_indexer.schema import (
    DocumentsPage,
    ErrorAnswer,
    ErrorBody,
    Mode,
    SearchAnswer,
    SearchRequest,
)

Ask = Callable[[SearchRequest], Awaitable[SearchAnswer | ErrorBody]]
"""One base's search: its answer, or the error it gave."""
Outcome = SearchAnswer | ErrorBody
SEARCH_TIMEOUT = 60.0
"""Seconds to wait for an indexer's answer: it waits 10 s for each model itself."""


def refused(response: httpx.Response) -> ErrorBody:
    """An indexer's error answer, or what stands for one when the body is not."""
    try:
        return ErrorAnswer.model_validate_json(response.content).error
    except ValidationError:
        return ErrorBody(
            code=f"HTTP_{response.status_code}",
            message=response.text[:300] or response.reason_phrase,
        )


def unreachable(url: str, e: httpx.HTTPError) -> ErrorBody:
    return ErrorBody(
        code="KNOWLEDGE_BASE_NOT_READY",
        message=f"its indexer at {url} does not answer: {e or type(e).__name__}",
    )


def http_asker(http: httpx.AsyncClient, url: str) -> Ask:
    """Searches through the indexer at `url`."""

    async def ask(req: SearchRequest) -> Outcome:
        try:
            response = await http.post(
                f"{url}/v1/search",
                content=req.model_dump_json(exclude_none=True),
                headers={"Content-Type": "application/json"},
                timeout=SEARCH_TIMEOUT,
            )
        except httpx.HTTPError as e:
            return unreachable(url, e)
        if response.status_code >= 400:
            return refused(response)
        return SearchAnswer.model_validate_json(response.content)

    return ask


async def failed_documents(http: httpx.AsyncClient, url: str) -> DocumentsPage | ErrorBody:
    """The first page of the indexer's failed documents, with why each failed."""
    try:
        response = await http.get(
            f"{url}/v1/documents", params={"state": "failed", "page_size": 100}, timeout=15.0
        )
    except httpx.HTTPError as e:
        return unreachable(url, e)
    if response.status_code >= 400:
        return refused(response)
    return DocumentsPage.model_validate_json(response.content)


Askers = Mapping[str, Ask | ErrorBody]
"""Per base key, how to ask it, or why it cannot be asked."""


async def each(form: SearchForm, mode: Mode, askers: Askers) -> dict[str, Outcome]:
    """Every base's outcome for one mode, asked at once."""
    req = form.request(mode)

    async def one(base: str) -> Outcome:
        ask = askers[base]
        return ask if isinstance(ask, ErrorBody) else await ask(req)

    outcomes = await asyncio.gather(*(one(b) for b in form.bases))
    return dict(zip(form.bases, outcomes, strict=True))


def _hits(form: SearchForm, outcomes: Mapping[str, Outcome]) -> list[Hit]:
    return merge(
        {b: a.results for b, a in outcomes.items() if isinstance(a, SearchAnswer)}, form.top_k
    )


async def search(form: SearchForm, askers: Askers) -> tuple[list[Hit], dict[str, Outcome]]:
    """The form's search of its bases, merged by reciprocal rank when several."""
    outcomes = await each(form, form.mode, askers)
    return _hits(form, outcomes), outcomes


async def compare_modes(
    form: SearchForm, askers: Askers
) -> tuple[list[CompareRow], dict[Mode, dict[str, Outcome]]]:
    """The form's question asked three ways (both, by meaning, by words) of its bases."""
    asked = await asyncio.gather(*(each(form, m, askers) for m in COMPARED))
    by_mode = dict(zip(COMPARED, asked, strict=True))
    return compare({m: _hits(form, o) for m, o in by_mode.items()}), by_mode
