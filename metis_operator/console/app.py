"""The cluster console's aiohttp app (`metis-console`): the Bases page, a page per
base, and the Search page over every base it sees.

Thin handlers: read the request, call views/asking, render pages (the Bases page and a
base's page from pages.py; the Search page from metis_indexer.console, the page
`metis serve` shows too). One middleware turns what
goes wrong into a page with a message. Live updates reach the pages as Server-Sent
Events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from aiohttp import web

from metis_indexer.console import asking, pages
from metis_indexer.console.app import SECURITY_HEADERS, STATIC, found, page, query_of
from metis_indexer.console.html import Html
from metis_indexer.console.views import FormError, SearchForm, parse_search
from metis_indexer.schema import ErrorBody
from metis_operator import kube
from metis_operator.console.cluster import Cluster, Watches
from metis_operator.console.pages import base_fragment, base_page, bases_fragment, bases_page
from metis_operator.console.views import indexer_url

log = logging.getLogger("metis.console")

KEEPALIVE_SECONDS = 15.0


@dataclasses.dataclass(frozen=True)
class Credentials:
    """One place to read the API server's credentials from, named as an error names it."""

    origin: str
    """Where it comes from: `--kubeconfig`, `$KUBECONFIG`, `in-cluster`, `~/.kube/config`."""
    kubeconfig: str | None = None
    """The kubeconfig file (or kubectl's colon-separated list, merged as kubectl merges
    it); None: the pod's service account."""

    def __str__(self) -> str:
        where = self.kubeconfig or "the pod's service account"
        return f"{self.origin} ({where})"


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the console reaches the cluster and the bases."""

    credentials: tuple[Credentials, ...] = (Credentials("in-cluster"),)
    """Tried in order; the first that loads is used (main.credentials chooses them)."""
    namespace: str | None = None
    """Only this namespace's bases; None: every namespace."""
    url_template: str | None = None
    """How to reach a base's Service (`http://127.0.0.1:{port}` out of a cluster);
    None: its `observed.address`."""


settings_key = web.AppKey("settings", Settings)
cluster_key = web.AppKey("cluster", Cluster)
http_key = web.AppKey("http", httpx.AsyncClient)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as a page that says what went wrong."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        not_found = ErrorBody(code="NOT_FOUND", message=f"nothing at {request.path}")
        return page(pages.message_page("Not found", not_found), 404)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("error handling %s %s", request.method, request.path)
        failed = ErrorBody(
            code="INTERNAL", message="the console failed on this request; see its log"
        )
        return page(pages.message_page("Error", failed), 500)


def _base_key(request: web.Request) -> str:
    return f"{request.match_info['namespace']}/{request.match_info['name']}"


def _url(request: web.Request, address: str) -> str:
    return indexer_url(address, request.app[settings_key].url_template)


async def bases(request: web.Request) -> web.Response:
    cluster = request.app[cluster_key]
    return page(bases_page(cluster.views(), cluster.trouble()))


async def base(request: web.Request) -> web.Response:
    cluster = request.app[cluster_key]
    view = cluster.view(_base_key(request))
    if view is None:
        raise web.HTTPNotFound()
    failed = None
    if view.address:
        failed = await asking.failed_documents(request.app[http_key], _url(request, view.address))
    return page(base_page(view, cluster.recent_events(view.key), failed))


def askers(request: web.Request, form: SearchForm) -> asking.Askers:
    """How to ask each base of the form, or why it cannot be asked (the error codes
    of the indexer's API: KNOWLEDGE_BASE_NOT_FOUND, KNOWLEDGE_BASE_NOT_READY)."""
    cluster = request.app[cluster_key]
    out: dict[str, asking.Ask | ErrorBody] = {}
    for key in form.bases:
        view = cluster.view(key)
        if view is None:
            out[key] = ErrorBody(
                code="KNOWLEDGE_BASE_NOT_FOUND",
                message=f"no knowledge base {key} that the console may see",
            )
        elif not view.address or not view.served:
            # Its indexer never answered: what answers at its address now is not its own.
            out[key] = ErrorBody(
                code="KNOWLEDGE_BASE_NOT_READY",
                message=f"{key} answers no searches yet: it is {view.state}: {view.reason}",
            )
        else:
            out[key] = asking.http_asker(request.app[http_key], _url(request, view.address))
    return out


async def search_page(request: web.Request) -> web.Response:
    views = request.app[cluster_key].views()
    try:
        form = parse_search(query_of(request))
    except FormError as e:
        empty = SearchForm(q=request.query.get("q"))
        return page(pages.search_page(empty, views, pages.error_box(e.body, None)))
    return page(pages.search_page(form, views, await found(form, lambda f: askers(request, f))))


def _sse(name: str, html: Html) -> bytes:
    data = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
    return f"event: {name}\n{data}\n".encode()


async def _stream(request: web.Request, render: Callable[[], Html | None]) -> web.StreamResponse:
    """Push `render()` each time the cluster changes (a comment keeps the line open)."""
    cluster = request.app[cluster_key]
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **SECURITY_HEADERS,
        }
    )
    await response.prepare(request)
    seen = -1
    try:
        while not cluster.closing:
            if cluster.version != seen:
                seen = cluster.version
                html = render()
                if html is None:
                    break
                await response.write(_sse("update", html))
            else:
                await response.write(b": keep-alive\n\n")
            await cluster.wait(seen, KEEPALIVE_SECONDS)
    except ConnectionResetError:
        pass  # the page was closed
    return response


async def bases_events(request: web.Request) -> web.StreamResponse:
    cluster = request.app[cluster_key]
    return await _stream(request, lambda: bases_fragment(cluster.views(), cluster.trouble()))


async def base_events(request: web.Request) -> web.StreamResponse:
    cluster = request.app[cluster_key]
    key = _base_key(request)

    def render() -> Html | None:
        view = cluster.view(key)
        return None if view is None else base_fragment(view, cluster.recent_events(key))

    return await _stream(request, render)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def setup_routes(app: web.Application) -> None:
    app.router.add_get("/", bases, name="bases")
    app.router.add_get("/bases/{namespace}/{name}", base, name="base")
    app.router.add_get("/search", search_page, name="search")
    app.router.add_get("/events/bases", bases_events, name="bases-events")
    app.router.add_get("/events/bases/{namespace}/{name}", base_events, name="base-events")
    app.router.add_get("/healthz", healthz, name="healthz")
    app.router.add_static("/static", STATIC, name="static")


def connect(settings: Settings) -> kube.Cluster:
    """The first of `settings.credentials` that loads; where none does, the error names
    each one tried and why it failed."""
    tried = []
    for source in settings.credentials:
        try:
            if source.kubeconfig is None:
                api = kube.in_cluster()
            else:
                api = kube.from_kubeconfig(source.kubeconfig)
        except kube.ConfigError as e:
            tried.append(f"{source}: {e}")
            continue
        return kube.Cluster(api, manager="metis-console")
    raise kube.ConfigError("tried " + "; ".join(tried))


def create_app(settings: Settings) -> web.Application:
    """The console; the watches and the indexers' client start and stop with it."""
    app = web.Application(middlewares=[errors])
    app[settings_key] = settings

    async def watching(app: web.Application) -> AsyncIterator[None]:
        cluster = Cluster()
        app[cluster_key] = cluster
        api = await asyncio.to_thread(connect, settings)
        watches = Watches(api, cluster, settings.namespace, asyncio.get_running_loop())
        watches.start()
        yield
        watches.stop()

    async def http(app: web.Application) -> AsyncIterator[None]:
        async with httpx.AsyncClient() as client:
            app[http_key] = client
            yield

    async def close_streams(app: web.Application) -> None:
        app[cluster_key].close()

    app.cleanup_ctx.append(watching)
    app.cleanup_ctx.append(http)
    app.on_shutdown.append(close_streams)
    setup_routes(app)
    return app
