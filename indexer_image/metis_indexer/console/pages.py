"""The Search page as HTML, from plain data (views.py) through the escaping builder,
and the layout, state badge and error box the cluster console's own pages are built
with (metis_operator/console/pages.py).

Pure: each function takes what the page shows and returns `Html`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from metis_indexer.answer_text import score_line
from metis_indexer.console.html import Html, el, join
from metis_indexer.console.views import (
    COMPARED,
    CompareRow,
    Hit,
    SearchForm,
    marked,
    telling_words,
    took_line,
)
from metis_indexer.schema import FILTERS, ErrorBody, Filter, Mode, Result, SearchAnswer


class Choice(Protocol):
    """A base the form offers to search (the cluster console's): its key, its state."""

    @property
    def key(self) -> str: ...

    @property
    def state(self) -> str: ...


MODE_LABELS: Mapping[Mode, str] = {
    "hybrid": "hybrid (both)",
    "dense": "by meaning only",
    "keyword": "by words only",
}
COLUMN: Mapping[Mode, str] = {"hybrid": "Both", "dense": "Meaning", "keyword": "Words"}


def layout(title: str, main: Html, *, console: bool = True) -> Html:
    """A whole page: one stylesheet, one script (deferred), no inline code."""
    nav = [el("a", "Bases", href="/"), " ", el("a", "Search", href="/search")] if console else []
    return Html(
        "<!doctype html>"
        + el(
            "html",
            el(
                "head",
                el("meta", charset="utf-8"),
                el("meta", name="viewport", content="width=device-width, initial-scale=1"),
                el("title", f"{title} · Metis"),
                el("link", rel="stylesheet", href="/static/console.css"),
                el("script", src="/static/console.js", defer=True),
            ),
            el(
                "body",
                el("a", "Skip to content", href="#main", class_="skip"),
                el("header", el("nav", el("strong", "Metis"), " ", nav, aria_label="Console")),
                el("main", el("h1", title), main, id="main", tabindex="-1"),
            ),
            lang="en",
        )
    )


def state_badge(state: str) -> Html:
    return el("span", state, class_=f"state state-{state.lower()}")


def error_box(error: ErrorBody, base: str | None) -> Html:
    return el(
        "div",
        el("strong", error.code),
        " ",
        el("span", f"{base}: " if base else "", class_="base"),
        error.message,
        class_="error",
        role="alert",
    )


def search_form(form: SearchForm, bases: Sequence[Choice] | None, action: str) -> Html:
    """The form; `bases` None: the page serves one base (`metis serve`)."""
    chosen = set(form.bases)
    pick = None
    if bases is not None:
        pick = el(
            "fieldset",
            el("legend", "Bases"),
            [
                el(
                    "label",
                    el("input", type="checkbox", name="base", value=b.key, checked=b.key in chosen),
                    " ",
                    b.key,
                    " ",
                    state_badge(b.state),
                )
                for b in bases
            ]
            or el("span", "No knowledge base to show yet.", class_="muted"),
            class_="bases-pick",
        )
    modes = el(
        "fieldset",
        el("legend", "Mode"),
        [
            el(
                "label",
                el("input", type="radio", name="mode", value=m, checked=form.mode == m),
                " ",
                label,
            )
            for m, label in MODE_LABELS.items()
        ],
    )
    filters = el(
        "details",
        el("summary", "Filters"),
        [filter_field(f, form.filter(f)) for f in FILTERS],
        el(
            "label",
            "Results ",
            el("input", name="top_k", type="number", min=1, max=50, value=form.top_k),
        ),
        class_="filters",
        open=any(form.filter(f) for f in FILTERS),
    )
    return el(
        "form",
        el("label", "Question", for_="q"),
        el(
            "div",
            el(
                "input",
                id="q",
                name="q",
                type="search",
                value=form.q or "",
                autofocus=form.q is None,
                autocomplete="off",
            ),
            el("button", "Search", type="submit"),
            class_="ask",
        ),
        pick,
        modes,
        el(
            "div",
            el("input", type="hidden", name="rerank", value="0"),
            el(
                "label",
                el("input", type="checkbox", name="rerank", value="1", checked=form.rerank),
                " rerank",
            ),
            " ",
            el(
                "label",
                el("input", type="checkbox", name="compare", value="1", checked=form.compare),
                " compare by meaning, by words, both",
            ),
            class_="switches",
        ),
        filters,
        method="get",
        action=action,
        role="search",
        class_="search",
    )


def filter_field(f: Filter, given: Collection[str]) -> Html:
    """A search filter's field: a box for each of its choices, or a line of text (a list's
    values comma-separated)."""
    name, label = f.asked.name, f.asked.label
    if f.choices is not None:
        kind = "checkbox" if f.many else "radio"
        return el(
            "fieldset",
            el("legend", label),
            [
                el("label", el("input", type=kind, name=name, value=c, checked=c in given), " ", c)
                for c in f.choices
            ],
        )
    example = f.asked.example or None
    line = el("input", name=name, value=", ".join(given), placeholder=example)
    return el("label", f"{label} ", line)


def note_line(hit: Hit) -> Html:
    """Under a note's result: when it was written, and what replaced it."""
    n = hit.result.citation.note
    if n is None:
        return Html("")
    said = [f"note written {n.written_at}"]
    if n.replaced_by:
        said.append(f"replaced by {n.replaced_by} on {n.replaced_at}")
    return el("div", "; ".join(said), class_="note replaced" if n.replaced_by else "note")


def citation(hit: Hit, several: bool) -> Html:
    c = hit.result.citation
    where = f"page {c.page}" if c.page else f"line {c.line}" if c.line else None
    headings = list(c.headings)
    if headings and headings[0] == c.title:
        headings = headings[1:]
    place = " › ".join(p for p in [c.title, *headings] if p)
    return join(
        [
            el(
                "div",
                el("span", hit.base, class_="label") if several else None,
                el("span", f"{c.source}/{c.document}", class_="doc"),
                el("span", f", {where}") if where else None,
                el("span", c.kind, class_="kind"),
                class_="cite",
            ),
            el("div", place, class_="place") if place else None,
            note_line(hit),
        ]
    )


def snippet(result: Result, words: Collection[str]) -> Html:
    """The result's snippet with its base's telling words of the question marked."""
    return el(
        "p",
        [el("mark", run) if hit else run for run, hit in marked(result.citation.snippet, words)],
        class_="snippet",
    )


def outcome_notes(answers: Mapping[str, SearchAnswer | ErrorBody], several: bool) -> Html:
    """Errors, warnings and step timings, each labelled with its base when several."""
    notes = []
    for base, a in answers.items():
        label = base if several else None
        if isinstance(a, ErrorBody):
            notes.append(error_box(a, label))
            continue
        notes += [
            el(
                "div",
                el("strong", "warning"),
                " ",
                f"{label}: " if label else "",
                w,
                class_="warning",
                role="status",
            )
            for w in a.warnings
        ]
    return join(notes)


def timings(answers: Mapping[str, SearchAnswer | ErrorBody], several: bool) -> Html:
    lines = [
        el(
            "li",
            f"{base}: " if several else "",
            f"{a.mode}{', reranked' if a.reranked else ''}: ",
            took_line(a.took.model_dump()),
        )
        for base, a in answers.items()
        if isinstance(a, SearchAnswer)
    ]
    return el("ul", lines, class_="took", aria_label="Step timings") if lines else Html("")


def results_section(
    form: SearchForm, hits: Sequence[Hit], answers: Mapping[str, SearchAnswer | ErrorBody]
) -> Html:
    several = len(form.bases) > 1
    told = telling_words(form.q or "", answers.items())
    items = [
        el(
            "li",
            citation(h, several),
            snippet(h.result, told.get(h.base, ())),
            el("p", score_line(h.result.scores), class_="scores"),
            class_="result",
        )
        for h in hits
    ]
    ok = [a for a in answers.values() if isinstance(a, SearchAnswer)]
    return el(
        "section",
        el("h2", "Results"),
        outcome_notes(answers, several),
        el("ol", items, class_="results")
        if items
        else el("p", "No passage found.", class_="muted")
        if ok
        else None,
        el("p", "merged across bases by reciprocal rank (k = 60)", class_="muted")
        if several and items
        else None,
        timings(answers, several),
        id="results",
        aria_label="Results",
    )


def compare_section(
    form: SearchForm,
    rows: Sequence[CompareRow],
    answers: Mapping[Mode, Mapping[str, SearchAnswer | ErrorBody]],
) -> Html:
    several = len(form.bases) > 1
    told = telling_words(form.q or "", (a for by in answers.values() for a in by.items()))
    notes = [
        join(
            [
                el("h3", MODE_LABELS[m]),
                outcome_notes(answers[m], several),
                timings(answers[m], several),
            ]
        )
        for m in COMPARED
        if m in answers
    ]
    body = [
        el(
            "tr",
            [
                el("td", r.ranks[m] or "—", data_label=COLUMN[m], class_="num rank")
                for m in COMPARED
            ],
            el(
                "td",
                citation(r.hit, several),
                snippet(r.hit.result, told.get(r.hit.base, ())),
                data_label="Passage",
            ),
            el("td", r.why, data_label="Why it came up", class_="why"),
        )
        for r in rows
    ]
    head = el(
        "tr",
        [el("th", COLUMN[m], scope="col") for m in COMPARED],
        el("th", "Passage", scope="col"),
        el("th", "Why it came up", scope="col"),
    )
    return el(
        "section",
        el("h2", "Compare: both, by meaning, by words"),
        el("table", el("thead", head), el("tbody", body), class_="compare stack")
        if rows
        else el("p", "No passage found.", class_="muted"),
        el("details", el("summary", "Each way's warnings and timings"), notes),
        id="results",
        aria_label="Compare",
    )


def search_page(
    form: SearchForm,
    bases: Sequence[Choice] | None,
    found: Html | None,
    *,
    action: str = "/search",
    title: str = "Search",
) -> Html:
    return layout(title, join([search_form(form, bases, action), found]), console=bases is not None)


def message_page(title: str, error: ErrorBody, *, console: bool = True) -> Html:
    return layout(title, error_box(error, None), console=console)
