"""The Search page over HTTP (aiohttp): what `metis serve` adds for its one base
(`add_search_page`), and the parts the cluster console (metis_operator/console/app.py)
serves its own pages with.

Pages carry a Content-Security-Policy that allows only the app's own script and
stylesheet (no inline code).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path

from aiohttp import web

from metis_indexer.console import asking, pages
from metis_indexer.console.html import Html
from metis_indexer.console.views import FormError, SearchForm, parse_search

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # A search's URL holds its question: never sent on to another site.
    "Referrer-Policy": "no-referrer",
}
STATIC = Path(str(resources.files("metis_indexer.console") / "static"))
"""The pages' script and stylesheet, served at /static."""


def page(html: Html, status: int = 200) -> web.Response:
    return web.Response(
        text=html, status=status, content_type="text/html", headers=SECURITY_HEADERS
    )


def query_of(request: web.Request) -> dict[str, list[str]]:
    """The request's query, every value of each parameter (as `parse_search` reads it)."""
    return {k: request.query.getall(k) for k in request.query}


async def found(form: SearchForm, ask: Callable[[SearchForm], asking.Askers]) -> Html | None:
    """The results (or comparison) of the form's search; None when nothing was asked."""
    if form.q is None:
        return None
    if form.compare:
        rows, by_mode = await asking.compare_modes(form, ask(form))
        return pages.compare_section(form, rows, by_mode)
    hits, outcomes = await asking.search(form, ask(form))
    return pages.results_section(form, hits, outcomes)


def add_search_page(app: web.Application, ask: asking.Ask, name: str) -> None:
    """The Search page for one base, at `/` of `app` (`metis serve`): `ask` searches
    its index; the page, its form and its links are those of the console."""
    base = name

    async def one(request: web.Request) -> web.Response:
        try:
            form = parse_search(query_of(request), base=base)
        except FormError as e:
            return page(
                pages.search_page(
                    SearchForm(q=request.query.get("q"), bases=(base,)),
                    None,
                    pages.error_box(e.body, None),
                    action="/",
                    title=f"Search {name}",
                )
            )
        shown = await found(form, lambda f: {base: ask})
        return page(pages.search_page(form, None, shown, action="/", title=f"Search {name}"))

    app.router.add_get("/", one, name="search-page")
    app.router.add_static("/static", STATIC, name="static")
