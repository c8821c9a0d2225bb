"""The indexer's HTTP API (DESIGN.md, port 7700): thin handlers over `service.Indexer`.

Bodies are parsed into pydantic models; every domain error becomes
`{"error": {"code", "message"}}` in one middleware.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from metis_indexer.errors import ApiError, BadRequest
from metis_indexer.schema import (
    EvaluateRequest,
    ReindexRequest,
    SearchAnswer,
    SearchRequest,
    parse_body,
)
from metis_indexer.service import Indexer

log = logging.getLogger("metis.api")

MAX_BODY = 64 * 1024
"""Bytes a request body may have: a 4,000-character question fits many times over."""

indexer_key = web.AppKey("indexer", Indexer)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return error(e.status, e.code, e.message)
    except web.HTTPRequestEntityTooLarge:
        return error(413, "INVALID_BODY", f"the body is larger than {MAX_BODY} bytes")
    except web.HTTPException as e:
        if e.status == 404:
            return error(404, "NOT_FOUND", f"no route {request.method} {request.path}")
        if e.status == 405:
            return error(405, "METHOD_NOT_ALLOWED", f"{request.method} is not allowed here")
        raise
    except Exception:
        log.exception("error handling %s %s", request.method, request.path)
        return error(500, "INTERNAL", "the indexer failed on this request; see its log")


async def search(request: web.Request) -> web.Response:
    indexer = request.app[indexer_key]
    try:
        req = parse_body(SearchRequest, await request.read())
    except BadRequest:
        indexer.metrics.searches.labels(mode="unknown", outcome="error").inc()
        raise
    try:
        answer = await indexer.search(req)
    except ApiError:
        indexer.metrics.searches.labels(mode=req.mode, outcome="error").inc()
        raise
    _observe(indexer, req, answer)
    return web.json_response(text=answer.model_dump_json(exclude_none=True))


def _observe(indexer: Indexer, req: SearchRequest, answer: SearchAnswer) -> None:
    m = indexer.metrics
    outcome = "degraded" if answer.warnings and answer.results else "ok"
    m.searches.labels(mode=req.mode, outcome=outcome).inc()
    for step, ms in answer.took:
        m.search_seconds.labels(step=step, mode=answer.mode).observe(ms / 1000.0)


async def status(request: web.Request) -> web.Response:
    return web.json_response(request.app[indexer_key].status())


async def documents(request: web.Request) -> web.Response:
    q = request.query
    try:
        page = int(q.get("page", "1"))
        page_size = int(q.get("page_size", "100"))
    except ValueError:
        raise BadRequest("INVALID_BODY", "page and page_size must be whole numbers") from None
    return web.json_response(request.app[indexer_key].documents(page, page_size, q.get("state")))


async def reindex(request: web.Request) -> web.Response:
    req = parse_body(ReindexRequest, await request.read())
    request.app[indexer_key].request_pass(full=req.full)
    return web.json_response({"accepted": True, "full": req.full}, status=202)


async def evaluate(request: web.Request) -> web.Response:
    req = parse_body(EvaluateRequest, await request.read())
    result = await request.app[indexer_key].evaluate(req.k)
    return web.json_response(text=result.model_dump_json())


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[indexer_key].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    indexer = request.app[indexer_key]
    if not indexer.loaded:
        return error(503, "KNOWLEDGE_BASE_NOT_READY", f"the index is {indexer.state.phase}")
    return web.json_response({"ok": True, "phase": indexer.state.phase})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 of the routes, with the bodies' JSON Schemas from their models."""
    from metis_indexer.evaluation import Evaluation

    def ref(name: str) -> dict[str, str]:
        return {"$ref": f"#/components/schemas/{name}"}

    def body(name: str) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {"schema": ref(name)}}}

    def answer(name: str | None, what: str) -> dict[str, Any]:
        content = {"application/json": {"schema": ref(name)}} if name else {
            "application/json": {"schema": {"type": "object"}}}
        return {"description": what, "content": content}

    err = {"description": "An error", "content": {"application/json": {"schema": ref("Error")}}}
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object",
            "properties": {"error": {"type": "object", "properties": {
                "code": {"type": "string"}, "message": {"type": "string"}}}},
        }
    }
    for model in (SearchRequest, SearchAnswer, ReindexRequest, EvaluateRequest, Evaluation):
        s = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(s.pop("$defs", {}))
        schemas[model.__name__] = s
    return {
        "openapi": "3.1.0",
        "info": {"title": "Metis indexer", "version": "1"},
        "paths": {
            "/v1/search": {"post": {"summary": "Hybrid search with citations",
                                    "requestBody": body("SearchRequest"),
                                    "responses": {"200": answer("SearchAnswer", "The results"),
                                                  "400": err, "503": err}}},
            "/v1/status": {"get": {"summary": "Phase, totals and pass progress",
                                   "responses": {"200": answer(None, "The status")}}},
            "/v1/documents": {"get": {
                "summary": "Documents with their state and why one failed",
                "parameters": [
                    {"name": "page", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    {"name": "page_size", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    {"name": "state", "in": "query",
                     "schema": {"type": "string", "enum": ["indexed", "failed"]}},
                ],
                "responses": {"200": answer(None, "A page of documents"), "400": err}}},
            "/v1/reindex": {"post": {"summary": "Start a pass (full: read everything again)",
                                     "requestBody": body("ReindexRequest"),
                                     "responses": {"202": answer(None, "Accepted"),
                                                   "409": err}}},
            "/v1/evaluate": {"post": {"summary": "Evaluate .metis/evals.jsonl",
                                      "requestBody": body("EvaluateRequest"),
                                      "responses": {"200": answer("Evaluation", "The figures"),
                                                    "400": err}}},
            "/metrics": {"get": {"summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "Text exposition"}}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": answer(None, "Up")}}},
            "/readyz": {"get": {"summary": "Readiness: the index is loaded",
                                "responses": {"200": answer(None, "Ready"), "503": err}}},
        },
        "components": {"schemas": schemas},
    }


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/v1/search", search, name="search")
    app.router.add_get("/v1/status", status, name="status")
    app.router.add_get("/v1/documents", documents, name="documents")
    app.router.add_post("/v1/reindex", reindex, name="reindex")
    app.router.add_post("/v1/evaluate", evaluate, name="evaluate")
    app.router.add_get("/metrics", metrics, name="metrics")
    app.router.add_get("/healthz", healthz, name="healthz")
    app.router.add_get("/readyz", readyz, name="readyz")
    app.router.add_get("/openapi.json", openapi, name="openapi")


def create_app(indexer: Indexer) -> web.Application:
    """The app; the indexer's passes start and stop with it."""
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY)
    app[indexer_key] = indexer

    async def passes(_: web.Application) -> AsyncIterator[None]:
        started = time.monotonic()
        await indexer.start()
        log.info("indexer started in %.2f s", time.monotonic() - started)
        yield
        await indexer.stop()

    app.cleanup_ctx.append(passes)
    setup_routes(app)
    return app
