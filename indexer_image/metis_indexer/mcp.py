"""The indexer over the Model Context Protocol: `/mcp` on the indexer's own app, so an AI
agent finds a base's search the way it finds any tool.

The official SDK (`mcp`) serves it: its MCPServer describes the tools, its Streamable
HTTP session manager speaks the protocol, and aiohttp-asgi's resource hands `/mcp`
requests to that ASGI callable. Stateless, with JSON answers: each call stands alone (the
tools keep nothing of a session), so there is no session to keep across pods. The tools
search, status and documents read; remember and forget write the base's own notes, and
need the base's token as the HTTP API's write routes do. They answer what the HTTP API
answers, from the same models;
the API's refusals (an empty question, top_k out of range, an index still loading) come
back as tool errors with the API's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal, get_args

from aiohttp import web
from aiohttp_asgi.resource import ASGIContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import ValidationError, WithJsonSchema

from metis_indexer import notes, schema
from metis_indexer.errors import Refusal
from metis_indexer.service.answers import Answers

PATH = "/mcp"
READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)


def _raw(described: dict[str, Any]) -> Any:
    """A tool parameter the SDK hands over as sent, described by this JSON Schema: the
    API's own strict parser then judges it (`"5"` and `true` are not a top_k) and refuses
    it with the API's code and words, not the SDK's lax coercion."""
    return Annotated[Any, WithJsonSchema(described)]


Query = _raw({"type": "string"})
TopK = _raw({"type": "integer", "minimum": 1, "maximum": schema.TOP_K_MAX})
ModeArg = _raw({"type": "string", "enum": list(get_args(schema.Mode))})
Rerank = _raw({"type": ["boolean", "null"]})


def filtering(tool: Callable[..., Any]) -> Callable[..., Any]:
    """`tool`, its `**filters` declared as one parameter per search filter (`schema.FILTERS`:
    its name in the body's `filters`, its JSON Schema, null when absent), so that the tool's
    input schema lists them as the API's model does."""
    signature = inspect.signature(tool, eval_str=True)
    *asked, _ = signature.parameters.values()
    filters = [
        inspect.Parameter(
            f.field, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=_raw(dict(f.schema))
        )
        for f in schema.FILTERS
    ]
    # A function's __signature__ is what inspect (and so the SDK) reads; typeshed has none.
    tool.__signature__ = signature.replace(parameters=[*asked, *filters])  # type: ignore[attr-defined]
    return tool


NoteText = _raw({"type": "string", "minLength": 1, "maxLength": notes.TEXT_MAX})
NoteTitle = _raw({"type": ["string", "null"], "maxLength": notes.TITLE_MAX})
NoteIds = _raw(
    {
        "type": ["array", "null"],
        "items": {"type": "string", "pattern": notes.ID_PATTERN},
        "maxItems": notes.REPLACES_MAX,
    }
)
NoteId = _raw({"type": ["string", "null"], "pattern": notes.ID_PATTERN})

WRITES = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
FORGETS = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)

_write_refusal: contextvars.ContextVar[Refusal | None] = contextvars.ContextVar(
    "metis_mcp_write_refusal", default=None
)
"""Why the MCP request being answered may not write (no token, or a wrong one, where the
base has one; a stopping indexer); None: it may. Set per request, before the SDK runs the
tool in a task of its own (which copies the context)."""


def _may_write() -> None:
    refusal = _write_refusal.get()
    if refusal is not None:
        raise ToolError(f"{refusal.code}: {refusal.message}")


Ask = Callable[[bytes], Awaitable[schema.SearchAnswer]]
"""The HTTP API's search from a body: parsed, checked and counted as the API does."""


def server(answers: Answers, ask: Ask) -> MCPServer:
    """The tools of one indexer."""
    name = f"metis-{answers.config.name}"
    mcp = MCPServer(
        name=name,
        title=f"Metis knowledge base {answers.config.name}",
        instructions=(
            "A knowledge base of a team's documents (Markdown, text, HTML, PDF, Word). Use "
            "`search` to find passages that answer a question, each cited (document, "
            "headings, page or line) and scored; `status` to see whether the index is "
            "ready and how many documents it holds; `documents` to see which documents "
            "could not be read and why. `remember` keeps a note in the base (a fact, a "
            "decision), found by `search` at once; `replaces` names the notes it makes "
            "untrue, which are then found after it; `forget` removes one."
        ),
    )

    @mcp.tool(annotations=READ_ONLY)
    @filtering
    async def search(
        query: Query,
        top_k: TopK = 5,
        mode: ModeArg = "hybrid",
        rerank: Rerank = None,
        **filters: Any,
    ) -> dict[str, Any]:
        """Search the knowledge base's documents for passages that answer `query` (a
        question or keywords, up to 4,000 characters). Returns up to `top_k` (1-50)
        results, best first, each with its text, a citation (source drive, document path,
        title, headings, page or line, a snippet) and the scores of each step; `mode`
        `hybrid` (words and meaning, the default), `keyword` (exact words: codes, names,
        error numbers) or `dense` (meaning only); `warnings` say when a model did not
        answer and the search fell back. Narrow with `path_prefix` (a folder), `kinds`
        (file types) or `sources` (drive names). Cite the citation's document when you
        use a passage."""
        body: dict[str, Any] = {"query": query, "top_k": top_k, "mode": mode}
        if rerank is not None:
            body["rerank"] = rerank
        if given := {k: v for k, v in filters.items() if v is not None}:
            body["filters"] = given
        try:
            result = await ask(json.dumps(body).encode())
        except Refusal as e:
            raise ToolError(f"{e.code}: {e.message}") from None
        return dict(result.model_dump(mode="json", exclude_none=True))

    @mcp.tool(annotations=WRITES)
    async def remember(
        text: NoteText, title: NoteTitle = None, replaces: NoteIds = None, id: NoteId = None
    ) -> dict[str, Any]:
        """Keep a note in the knowledge base: a fact, a decision or a summary worth finding
        again (up to 8,000 characters, an optional title). It is searchable at once with
        `search`, cited with source `metis-<base>` and the time it was written. When it
        makes older notes untrue, name them in `replaces` (their ids, from `search`'s
        citations or an earlier `remember`): they stay searchable, after the notes that
        hold, their citation saying what replaced them and when. `id`: a name of your
        own (lowercase letters, digits, dashes); the note of that id is written over.
        Returns the note with its id. Needs the base's token when it has one."""
        body: dict[str, Any] = {"text": text}
        for key, value in (("title", title), ("replaces", replaces), ("id", id)):
            if value is not None:
                body[key] = value
        _may_write()
        try:
            req = schema.NoteRequest.model_validate(body, strict=True)
            note, _ = await answers.write_note(req)
        except ValidationError as e:
            raise ToolError(schema.invalid(e).message) from None
        except Refusal as e:
            raise ToolError(f"{e.code}: {e.message}") from None
        return dict(note.model_dump(mode="json"))

    @mcp.tool(annotations=FORGETS)
    async def forget(id: NoteId) -> dict[str, Any]:
        """Forget a note of the knowledge base (by its id): it is removed from the base's
        drive and no search finds it again; the notes it replaced hold again unless
        another replaces them. Returns the note forgotten. Needs the base's token when it
        has one."""
        _may_write()
        try:
            if not isinstance(id, str):
                raise ToolError("INVALID_BODY: id must be a string")
            note = await answers.forget_note(id)
        except Refusal as e:
            raise ToolError(f"{e.code}: {e.message}") from None
        return dict(note.model_dump(mode="json"))

    @mcp.tool(annotations=READ_ONLY)
    def status() -> dict[str, Any]:
        """The knowledge base's index: its phase (`ready` answers searches; `loading`,
        `scanning`, `indexing`, `waiting` for the embedding model, `standby`) and why,
        how many documents and chunks it holds, how many failed, the progress of the
        current pass, when it last finished indexing, and warnings."""
        answer = schema.StatusAnswer.model_validate(answers.status())
        return dict(answer.model_dump(mode="json"))

    @mcp.tool(annotations=READ_ONLY)
    def documents(
        state: Literal["failed", "indexed"] | None = "failed",
        page: int = 1,
        page_size: int = 100,
    ) -> dict[str, Any]:
        """The knowledge base's documents, by default those that could not be read, each
        with why (`scanned PDF without a text layer (no OCR)`, `password-protected`,
        `larger than 64 MB`, ...) and the parser's detail. `state` `indexed` lists the
        searchable ones, null all; `page` from 1, `page_size` 1-1000."""
        try:
            query = schema.DocumentsQuery(page=page, page_size=page_size, state=state)
            page_ = answers.documents(query.page, query.page_size, query.state)
        except ValidationError as e:
            raise ToolError(schema.invalid(e).message) from None
        except Refusal as e:
            raise ToolError(f"{e.code}: {e.message}") from None
        return dict(schema.DocumentsPage.model_validate(page_).model_dump(mode="json"))

    return mcp


class _Exchange(ASGIContext):
    """One `POST /mcp` handed to the SDK's ASGI app, as an ASGI server would hand it.

    aiohttp-asgi's own receive answers `http.request` with an empty body forever once the
    body is read, and never `http.disconnect`, without ever suspending: an app that
    listens for the disconnect (sse-starlette does) then spins the event loop, and the
    whole indexer with it (`tests/indexer/http/test_hostile.py`). Here the body, read whole
    and bounded beforehand, is one message; the next receive waits until the answer is
    sent or the client has gone, then says `http.disconnect`. An error the SDK answers
    in plain text (its transport checks: Host, Origin, Content-Type, size) is answered
    in the API's error shape; its JSON-RPC errors are MCP's own and pass as they are.
    """

    def __init__(self, app: Any, request: web.Request, body: bytes) -> None:
        super().__init__(app, request, PATH)
        self._body: bytes | None = body
        self._answered = asyncio.Event()
        self._refusal: int | None = None
        """The status of a plain-text error being rewritten (its body is dropped)."""

    async def on_receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        while not self._answered.is_set() and not _gone(self.request):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), DISCONNECT_LOOK)
        return {"type": "http.disconnect"}

    async def on_send(self, payload: dict[str, Any]) -> None:
        kind = payload["type"]
        if kind == "http.response.start" and payload["status"] >= 400:
            headers = {k.lower(): v for k, v in payload.get("headers", ())}
            if not headers.get(b"content-type", b"").startswith(b"application/json"):
                self._refusal = int(payload["status"])
                return
        if self._refusal is not None and kind == "http.response.body":
            if not payload.get("more_body", False):
                await self._refuse(self._refusal)
            return
        await super().on_send(payload)
        if kind == "http.response.body" and not payload.get("more_body", False):
            self._answered.set()

    async def _refuse(self, status: int) -> None:
        """The SDK's plain-text refusal, in the API's shape (its words are kept)."""
        code, why = REFUSALS.get(status, ("INVALID_BODY", "the request is refused"))
        self.response = web.json_response(
            {"error": {"code": code, "message": f"{PATH}: {why}"}}, status=status
        )
        await self.response.prepare(self.request)
        await self.response.write_eof()
        self._answered.set()


REFUSALS: dict[int, tuple[str, str]] = {
    400: ("INVALID_BODY", "the body must be JSON (Content-Type: application/json)"),
    403: ("FORBIDDEN", "the request's Origin is not allowed (DNS-rebinding protection)"),
    413: ("INVALID_BODY", "the body is too large"),
    421: (
        "MISDIRECTED_REQUEST",
        "the request's Host is not one this indexer answers (DNS-rebinding protection)",
    ),
}
"""What each plain-text refusal of the SDK's transport checks means."""

DISCONNECT_LOOK = 1.0
"""Seconds between looks at whether the client of an unanswered MCP request has gone."""


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def mount(
    app: web.Application,
    answers: Answers,
    ask: Ask,
    read_body: Callable[[web.Request], Awaitable[bytes]],
    write_refusal: Callable[[web.Request], Refusal | None],
) -> None:
    """Serve `server(answers)` at `POST /mcp` of `app`, its session manager running with
    the app. Stateless with JSON answers, the transport needs no GET stream and no
    DELETE of a session: those are answered 405 with `Allow: POST` (the MCP transport
    spec allows it), by the router like any method a route lacks. `read_body`: the
    API's own bounded, deadlined read; `write_refusal`: why a request may not write (the
    HTTP write routes' token), or None. On loopback the SDK's DNS-rebinding protection
    admits only loopback Host headers."""
    mcp = server(answers, ask)
    mcp.streamable_http_app(json_response=True, stateless_http=True, host=answers.config.host)
    manager = mcp.session_manager

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        _write_refusal.set(write_refusal(request))
        return await _Exchange(manager.handle_request, request, body).get_response()

    app.router.add_post(PATH, handle, name="mcp")

    async def running(_: web.Application) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app.cleanup_ctx.append(running)
