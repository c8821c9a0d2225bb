"""The console's aiohttp app (`metis console`), and the Search page `metis serve` adds.

Thin handlers: read the request, call views/asking, render pages. One middleware turns
what goes wrong into a page with a message. Pages carry a Content-Security-Policy
that allows only the app's own script and stylesheet (no inline code), and live
updates reach the pages as Server-Sent Events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path

import httpx
from aiohttp import web

from metis_indexer.console import asking, pages
from metis_indexer.console.cluster import Cluster, Watches, api_client
from metis_indexer.console.html import Html
from metis_indexer.console.views import FormError, SearchForm, indexer_url, parse_search
from metis_indexer.schema import ErrorBody

log = logging.getLogger("metis.console")

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    # A search's URL holds its question: never sent on to another site.
    "Referrer-Policy": "no-referrer",
}
KEEPALIVE_SECONDS = 15.0
STATIC = Path(str(resources.files("metis_indexer.console") / "static"))


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the console reaches the cluster and the bases."""

    kubeconfig: str | None = None
    """None: the pod's service account (in-cluster)."""
    namespace: str | None = None
    """Only this namespace's bases; None: every namespace."""
    url_template: str | None = None
    """How to reach a base's Service (`http://127.0.0.1:{port}` out of a cluster);
    None: its `observed.address`."""


settings_key = web.AppKey("settings", Settings)
cluster_key = web.AppKey("cluster", Cluster)
http_key = web.AppKey("http", httpx.AsyncClient)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def page(html: Html, status: int = 200) -> web.Response:
    return web.Response(text=html, status=status, content_type="text/html",
                        headers=SECURITY_HEADERS)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as a page that says what went wrong."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return page(pages.message_page("Not found", ErrorBody(
            code="NOT_FOUND", message=f"nothing at {request.path}")), 404)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("error handling %s %s", request.method, request.path)
        return page(pages.message_page("Error", ErrorBody(
            code="INTERNAL", message="the console failed on this request; see its log")), 500)


def _base_key(request: web.Request) -> str:
    return f"{request.match_info['namespace']}/{request.match_info['name']}"


def _url(request: web.Request, address: str) -> str:
    return indexer_url(address, request.app[settings_key].url_template)


async def bases(request: web.Request) -> web.Response:
    cluster = request.app[cluster_key]
    return page(pages.bases_page(cluster.views(), cluster.trouble()))


async def base(request: web.Request) -> web.Response:
    cluster = request.app[cluster_key]
    view = cluster.view(_base_key(request))
    if view is None:
        raise web.HTTPNotFound()
    failed = None
    if view.address:
        failed = await asking.failed_documents(request.app[http_key],
                                               _url(request, view.address))
    return page(pages.base_page(view, cluster.recent_events(view.key), failed))


def askers(request: web.Request, form: SearchForm) -> asking.Askers:
    """How to ask each base of the form, or why it cannot be asked (spec 001's codes)."""
    cluster = request.app[cluster_key]
    out: dict[str, asking.Ask | ErrorBody] = {}
    for key in form.bases:
        view = cluster.view(key)
        if view is None:
            out[key] = ErrorBody(code="KNOWLEDGE_BASE_NOT_FOUND",
                                 message=f"no knowledge base {key} that the console may see")
        elif not view.address:
            out[key] = ErrorBody(code="KNOWLEDGE_BASE_NOT_READY",
                                 message=f"{key} is {view.state}: {view.reason}")
        else:
            out[key] = asking.http_asker(request.app[http_key], _url(request, view.address))
    return out


async def found(form: SearchForm, ask: Callable[[SearchForm], asking.Askers]) -> Html | None:
    """The results (or comparison) of the form's search; None when nothing was asked."""
    if form.q is None:
        return None
    if form.compare:
        rows, by_mode = await asking.compare_modes(form, ask(form))
        return pages.compare_section(form, rows, by_mode)
    hits, outcomes = await asking.search(form, ask(form))
    return pages.results_section(form, hits, outcomes)


async def search_page(request: web.Request) -> web.Response:
    views = request.app[cluster_key].views()
    try:
        form = parse_search(_query(request))
    except FormError as e:
        return page(pages.search_page(SearchForm(q=request.query.get("q")), views,
                                      pages.error_box(e.body, None)))
    return page(pages.search_page(form, views, await found(form, lambda f: askers(request, f))))


def _query(request: web.Request) -> dict[str, list[str]]:
    return {k: request.query.getall(k) for k in request.query}


def _sse(name: str, html: Html) -> bytes:
    data = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
    return f"event: {name}\n{data}\n".encode()


async def _stream(request: web.Request, render: Callable[[], Html | None]) -> web.StreamResponse:
    """Push `render()` each time the cluster changes (a comment keeps the line open)."""
    cluster = request.app[cluster_key]
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache", **SECURITY_HEADERS})
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
    return await _stream(request, lambda: pages.bases_fragment(cluster.views(),
                                                               cluster.trouble()))


async def base_events(request: web.Request) -> web.StreamResponse:
    cluster = request.app[cluster_key]
    key = _base_key(request)

    def render() -> Html | None:
        view = cluster.view(key)
        return None if view is None else pages.base_fragment(view, cluster.recent_events(key))

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


def create_app(settings: Settings) -> web.Application:
    """The console; the watches and the indexers' client start and stop with it."""
    app = web.Application(middlewares=[errors])
    app[settings_key] = settings

    async def watching(app: web.Application) -> AsyncIterator[None]:
        cluster = Cluster()
        app[cluster_key] = cluster
        api = await asyncio.to_thread(api_client, settings.kubeconfig)
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


def add_search_page(app: web.Application, ask: asking.Ask, name: str) -> None:
    """The Search page for one base, at `/` of `app` (`metis serve`): `ask` searches
    its index; the page, its form and its links are those of the console."""
    base = name

    async def one(request: web.Request) -> web.Response:
        try:
            form = parse_search(_query(request), base=base)
        except FormError as e:
            return page(pages.search_page(SearchForm(q=request.query.get("q"), bases=(base,)),
                                          None, pages.error_box(e.body, None),
                                          action="/", title=f"Search {name}"))
        shown = await found(form, lambda f: {base: ask})
        return page(pages.search_page(form, None, shown, action="/", title=f"Search {name}"))

    app.router.add_get("/", one, name="search-page")
    app.router.add_static("/static", STATIC, name="static")
