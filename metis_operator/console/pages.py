"""The cluster console's Bases page and a base's page as HTML, from the views of
views.py, in the layout of the Search page (metis_indexer.console.pages).

Pure: each function takes what the page shows and returns `Html`. The fragments that
live updates replace (`bases_fragment`, `base_fragment`) are the same functions the
first render uses, so a pushed update and a reload show the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from metis_indexer.console.html import Html, el, join
from metis_indexer.console.pages import error_box, layout, state_badge
from metis_indexer.console.views import SearchForm, search_query
from metis_indexer.schema import DocumentsPage, ErrorBody
from metis_operator.console.views import BaseView, EventView, when

BASES_COLUMNS = (
    "Base",
    "State",
    "Documents",
    "Chunks",
    "Failed",
    "Progress",
    "Last indexed",
    "Evaluation",
    "Warnings",
)


def table(headers: Sequence[str], rows: Sequence[Html], class_: str) -> Html:
    """A table with a header row; `stack` ones read as labelled lines on a narrow screen
    (each cell's data-label)."""
    head = el("tr", [el("th", h, scope="col") for h in headers])
    return el("table", el("thead", head), el("tbody", rows), class_=class_)


def base_href(key: str) -> str:
    return "/bases/" + quote(key)


def number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def progress(view: BaseView) -> Html:
    p = view.progress
    if p is None:
        return el("span", "—", class_="muted")
    done, total = p
    return el(
        "span",
        el(
            "progress",
            f"{done}/{total}",
            value=done,
            max=total,
            aria_label=f"{view.key}: {done} of {total} documents read",
        ),
        " ",
        el("span", f"{done}/{total}", class_="count"),
        class_="pass",
    )


def evaluation(view: BaseView) -> Html:
    e = view.evaluation
    if e is None or e.recall_at_k is None:
        return el("span", "—", class_="muted")
    return join(
        [
            el(
                "span", f"recall@{e.k} {e.recall_at_k:.2f} · MRR {e.mrr or 0:.2f}", class_="figures"
            ),
            el("small", f"{e.cases} questions, {when(e.at)}") if e.cases else None,
        ]
    )


def bases_fragment(views: Sequence[BaseView], problem: str | None) -> Html:
    """The Bases table (the part a live update replaces)."""
    rows = [
        el(
            "tr",
            el("td", el("a", v.key, href=base_href(v.key)), data_label="Base"),
            el(
                "td", state_badge(v.state), el("div", v.reason, class_="reason"), data_label="State"
            ),
            el("td", number(v.index.documents), data_label="Documents", class_="num"),
            el("td", number(v.index.chunks), data_label="Chunks", class_="num"),
            el("td", number(v.index.failed), data_label="Failed", class_="num"),
            el("td", progress(v), data_label="Progress"),
            el("td", when(v.index.last_indexed_at), data_label="Last indexed"),
            el("td", evaluation(v), data_label="Evaluation"),
            el(
                "td",
                el("ul", [el("li", w) for w in v.warnings], class_="warnings")
                if v.warnings
                else "—",
                data_label="Warnings",
            ),
            data_base=v.key,
            data_state=v.state,
        )
        for v in views
    ]
    return join(
        [
            el("p", problem, class_="error", role="alert") if problem else None,
            table(BASES_COLUMNS, rows, "bases stack")
            if views
            else el("p", "No knowledge base to show yet.", class_="muted"),
        ]
    )


def bases_page(views: Sequence[BaseView], problem: str | None) -> Html:
    return layout(
        "Bases",
        el(
            "div",
            bases_fragment(views, problem),
            id="bases",
            data_stream="/events/bases",
            aria_live="polite",
        ),
    )


def base_fragment(view: BaseView, events: Sequence[EventView]) -> Html:
    """A base's state, totals, conditions and recent Events (replaced live)."""
    ix = view.index
    facts = [
        ("State", join([state_badge(view.state), " ", view.reason])),
        ("Sources", ", ".join(view.sources) or "—"),
        ("Index", ix.phase or "—"),
        (
            "Documents / chunks / failed",
            f"{number(ix.documents)} / {number(ix.chunks)} / {number(ix.failed)}",
        ),
        ("Notes", number(ix.notes)),
        ("Progress", progress(view)),
        ("Last indexed", when(ix.last_indexed_at)),
        ("Evaluation", evaluation(view)),
        ("Address", view.address or "—"),
        ("Machine", view.machine or "—"),
    ]
    conditions = (
        table(
            ("Condition", "Status", "Reason", "Message", "Since"),
            [
                el(
                    "tr",
                    el("td", c.type, data_label="Condition"),
                    el("td", c.status, data_label="Status"),
                    el("td", c.reason, data_label="Reason"),
                    el("td", c.message, data_label="Message"),
                    el("td", when(c.last_transition_time), data_label="Since"),
                )
                for c in view.conditions
            ],
            "stack",
        )
        if view.conditions
        else el("p", "No conditions yet.", class_="muted")
    )
    recent = (
        table(
            ("Last seen", "Type", "Reason", "Message", "Count"),
            [
                el(
                    "tr",
                    el("td", when(e.last), data_label="Last seen"),
                    el("td", e.type, data_label="Type", class_=f"event-{e.type.lower()}"),
                    el("td", e.reason, data_label="Reason"),
                    el("td", e.message, data_label="Message"),
                    el("td", e.count, data_label="Count", class_="num"),
                )
                for e in events
            ],
            "stack events",
        )
        if events
        else el("p", "No recent Events.", class_="muted")
    )
    backups = (
        table(
            ("Backup", "Phase", "Finished", "Chunks", "Notes", "Size", "Message"),
            [
                el(
                    "tr",
                    el("td", b.name, data_label="Backup"),
                    el("td", b.phase, data_label="Phase", class_=f"backup-{b.phase.lower()}"),
                    el("td", when(b.finished), data_label="Finished"),
                    el("td", number(b.chunks), data_label="Chunks", class_="num"),
                    el("td", number(b.notes), data_label="Notes", class_="num"),
                    el("td", b.size or "—", data_label="Size", class_="num"),
                    el("td", b.message or "—", data_label="Message"),
                )
                for b in view.backups
            ],
            "stack backups",
        )
        if view.backups
        else el("p", "No backups.", class_="muted")
    )
    return join(
        [
            el("dl", [[el("dt", k), el("dd", v)] for k, v in facts], class_="facts"),
            el("h2", "Warnings") if view.warnings else None,
            el("ul", [el("li", w) for w in view.warnings], class_="warnings")
            if view.warnings
            else None,
            el("h2", "Conditions"),
            conditions,
            el("h2", "Backups"),
            backups,
            el("h2", "Recent Events"),
            recent,
        ]
    )


def failed_documents(page: DocumentsPage | ErrorBody | None) -> Html:
    """The base's failed documents and why, from its indexer (read once per page view)."""
    if page is None:
        return el("p", "The indexer has no address yet.", class_="muted")
    if isinstance(page, ErrorBody):
        return error_box(page, None)
    if not page.documents:
        return el("p", "No document failed.", class_="muted")
    rows = [
        el(
            "tr",
            el("td", f"{d.source}/{d.document}", data_label="Document"),
            el("td", d.kind, data_label="Kind"),
            el("td", d.reason or "", data_label="Why"),
            el("td", d.detail or "", data_label="Detail"),
        )
        for d in page.documents
    ]
    more = page.total - len(page.documents)
    return join(
        [
            el(
                "table",
                el(
                    "thead",
                    el(
                        "tr",
                        [el("th", h, scope="col") for h in ("Document", "Kind", "Why", "Detail")],
                    ),
                ),
                el("tbody", rows),
                class_="stack",
            ),
            el("p", f"and {more} more", class_="muted") if more > 0 else None,
        ]
    )


def base_page(
    view: BaseView, events: Sequence[EventView], failed: DocumentsPage | ErrorBody | None
) -> Html:
    ask = "/search?" + search_query(SearchForm(bases=(view.key,)))
    return layout(
        view.key,
        join(
            [
                el("p", el("a", "Search this base", href=ask)),
                el(
                    "div",
                    base_fragment(view, events),
                    id="base",
                    data_stream=f"/events{base_href(view.key)}",
                    aria_live="polite",
                ),
                el("h2", "Failed documents"),
                failed_documents(failed),
            ]
        ),
    )
