"""A route of the HTTP API as one declaration: its method, path and handler, what it takes
(a body, a query, path parameters), what it answers (each success, each error status with
the codes it carries), and whether it takes the operator's token. `api.ROUTES` is the one
list of them: the router registers it (`register`, the token's check included), the OpenAPI
document is made from it (openapi.py), and the codes every route may answer come from it
(`codes`), as aiohttp-demos' `setup_routes` is the one list of its routes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True)
class Answer:
    """A success a route answers: its status, what it means, and its body: a model's
    (JSON), or another media type with its JSON Schema."""

    status: int
    description: str
    model: type[BaseModel] | None = None
    media_type: str = "application/json"
    schema: Mapping[str, Any] | None = None
    """The body's schema where no model is (`model` None)."""


@dataclasses.dataclass(frozen=True)
class Failure:
    """An error status a route answers, what it means, and the codes its
    `{"error": {"code", "message"}}` carries; `headers`: those the answer always has."""

    status: int
    description: str
    codes: tuple[str, ...]
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Route:
    """One route: `name` labels its requests in `metis_requests_total`."""

    name: str
    method: str
    path: str
    handler: Handler
    summary: str
    answers: tuple[Answer, ...]
    fails: tuple[Failure, ...] = ()
    """Its error statuses, besides 401 (`token`) and those any route answers."""
    description: str | None = None
    query: type[BaseModel] | None = None
    """The model of its query string."""
    path_parameters: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """The JSON Schema of each `{name}` of its path."""
    body: type[BaseModel] | None = None
    body_required: bool = True
    token: bool = False
    """It takes the operator's token, where one is set: without it, 401."""


def register(
    app: web.Application, routes: Iterable[Route], authorize: Callable[[web.Request], Any]
) -> None:
    """Each route on `app`'s router, in order; a route that takes the token checks it with
    `authorize` (which refuses, raising) before its handler runs."""
    for route in routes:
        handler = _guarded(route.handler, authorize) if route.token else route.handler
        app.router.add_route(route.method, route.path, handler, name=route.name)


def _guarded(handler: Handler, authorize: Callable[[web.Request], Any]) -> Handler:
    @functools.wraps(handler)
    async def guarded(request: web.Request) -> web.StreamResponse:
        authorize(request)
        return await handler(request)

    return guarded


def failures(route: Route, token: Failure | None) -> list[Failure]:
    """The error statuses `route` answers, by status: its own, and `token` (the answer
    without the operator's token) where it takes one and `token` is given."""
    given = [token] if route.token and token is not None else []
    return sorted([*route.fails, *given], key=lambda f: f.status)


def codes(routes: Iterable[Route], token: Failure, *anywhere: str) -> tuple[str, ...]:
    """Every code the routes answer, each once, in the order they first appear: each
    route's (`token`'s where it takes the token), then `anywhere`'s."""
    found = [c for route in routes for f in failures(route, token) for c in f.codes]
    return tuple(dict.fromkeys([*found, *anywhere]))
