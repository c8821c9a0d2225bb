"""The indexer over the Model Context Protocol: `/mcp` on the indexer's own app, so an AI
agent finds a base's search the way it finds any tool (issue 14).

The official SDK (`mcp`) serves it: its MCPServer describes the tools, its Streamable
HTTP session manager speaks the protocol, and aiohttp-asgi's resource hands `/mcp`
requests to that ASGI callable. Stateless, with JSON answers: each call stands alone (the
tools only read), so there is no session to keep across pods. The tools are read-only —
search, status, documents — and answer what the HTTP API answers, from the same models;
the API's refusals (an empty question, top_k out of range, an index still loading) come
back as tool errors with the API's code.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from aiohttp import web
from aiohttp_asgi import ASGIResource
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import ValidationError

from metis_indexer import schema
from metis_indexer.errors import Refusal
from metis_indexer.service import Indexer

PATH = "/mcp"
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)  # fmt: skip

Observe = Callable[[Indexer, schema.SearchRequest, schema.SearchAnswer], None]
"""What the HTTP search does with an answer (its metrics); MCP searches count the same."""


def server(indexer: Indexer, observe: Observe) -> MCPServer:
    """The tools of one indexer."""
    name = f"metis-{indexer.config.name}"
    mcp = MCPServer(
        name=name,
        title=f"Metis knowledge base {indexer.config.name}",
        instructions=(
            "A knowledge base of a team's documents (Markdown, text, HTML, PDF, Word). Use "
            "`search` to find passages that answer a question, each cited (document, "
            "headings, page or line) and scored; `status` to see whether the index is "
            "ready and how many documents it holds; `documents` to see which documents "
            "could not be read and why. Nothing here changes the base."
        ),
    )

    @mcp.tool(annotations=READ_ONLY)
    async def search(
        query: str,
        top_k: int = 5,
        mode: schema.Mode = "hybrid",
        rerank: bool | None = None,
        path_prefix: str | None = None,
        kinds: list[Literal["md", "txt", "html", "pdf", "docx"]] | None = None,
        sources: list[str] | None = None,
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
        filters = {k: v for k, v in (("path_prefix", path_prefix), ("kinds", kinds),
                                     ("sources", sources)) if v is not None}  # fmt: skip
        body: dict[str, Any] = {"query": query, "top_k": top_k, "mode": mode}
        if rerank is not None:
            body["rerank"] = rerank
        if filters:
            body["filters"] = filters
        try:
            req = schema.check_search(schema.parse_body(schema.SearchRequest,
                                                        json.dumps(body).encode()))  # fmt: skip
            result = await indexer.search(req)
        except Refusal as e:
            indexer.metrics.searches.labels(mode=mode, outcome="error").inc()
            raise ToolError(f"{e.code}: {e.message}") from None
        observe(indexer, req, result)
        return dict(result.model_dump(mode="json", exclude_none=True))

    @mcp.tool(annotations=READ_ONLY)
    def status() -> dict[str, Any]:
        """The knowledge base's index: its phase (`ready` answers searches; `loading`,
        `scanning`, `indexing`, `waiting` for the embedding model, `standby`) and why,
        how many documents and chunks it holds, how many failed, the progress of the
        current pass, when it last finished indexing, and warnings."""
        answer = schema.StatusAnswer.model_validate(indexer.status())
        return dict(answer.model_dump(mode="json"))

    @mcp.tool(annotations=READ_ONLY)
    def documents(
        state: Literal["failed", "indexed"] | None = "failed", page: int = 1,
        page_size: int = 100,
    ) -> dict[str, Any]:  # fmt: skip
        """The knowledge base's documents, by default those that could not be read, each
        with why (`scanned PDF without a text layer (no OCR)`, `password-protected`,
        `larger than 64 MB`, ...) and the parser's detail. `state` `indexed` lists the
        searchable ones, null all; `page` from 1, `page_size` 1-1000."""
        try:
            query = schema.DocumentsQuery(page=page, page_size=page_size, state=state)
            page_ = indexer.documents(query.page, query.page_size, query.state)
        except ValidationError as e:
            raise ToolError(schema.invalid(e).message) from None
        except Refusal as e:
            raise ToolError(f"{e.code}: {e.message}") from None
        return dict(schema.DocumentsPage.model_validate(page_).model_dump(mode="json"))

    return mcp


class _Resource(ASGIResource):
    """aiohttp-asgi's resource for `/mcp` alone: its prefix match would also take `/mcpx`
    from the API's own 404."""

    def raw_match(self, path: str) -> bool:
        return path == PATH


def mount(app: web.Application, indexer: Indexer, observe: Observe) -> None:
    """Serve `server(indexer)` at /mcp of `app`, its session manager running with the app.
    On loopback the SDK's DNS-rebinding protection admits only loopback Host headers."""
    mcp = server(indexer, observe)
    mcp.streamable_http_app(json_response=True, stateless_http=True, host=indexer.config.host)
    manager = mcp.session_manager
    app.router.register_resource(_Resource(manager.handle_request, root_path=PATH))

    async def running(_: web.Application) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app.cleanup_ctx.append(running)
