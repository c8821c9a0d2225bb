"""What the console decides, as pure functions over plain data (no I/O).

- `parse_search`: a search's URL (`/search?q=…&base=NS/NAME&mode=…&compare=1`) into a
  `SearchForm`, or the indexer's error code and message; `search_query` writes it back.
- `merge`: several bases' results into one list by reciprocal rank (k = 60).
- `compare`: the three modes' lists into rows with each passage's rank in each.
- `why`: a result's "Why it came up" sentence (the score line under it: answer_text).
- `marked`: a snippet cut into runs, the question's words marked.

The cluster console's own views of a KnowledgeBase and an Event are in
metis_operator/console/views.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, get_args
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict

from metis_indexer.schema import (
    FILTERS,
    QUERY_MAX,
    TOP_K_MAX,
    ErrorBody,
    Filter,
    Mode,
    Result,
    SearchAnswer,
    SearchRequest,
)

RRF_K = 60
"""The search's fusion constant (search/fusion.py), used again to merge several bases' lists."""
MODES: tuple[Mode, ...] = get_args(Mode)
COMPARED: tuple[Mode, ...] = ("hybrid", "dense", "keyword")
"""Compare asks these, shown as Both, Meaning, Words."""
_WORD = re.compile(r"[^\W_]+")
_ON = {"1", "on", "true", "yes"}


class SearchForm(BaseModel):
    """A search as its URL says it; `q` None: nothing asked yet (the empty form)."""

    model_config = ConfigDict(frozen=True)

    q: str | None = None
    bases: tuple[str, ...] = ()
    mode: Mode = "hybrid"
    rerank: bool = True
    compare: bool = False
    top_k: int = 5
    # A field per search filter (schema.FILTERS), named as in the body's `filters`: a
    # list's values as a tuple, "" and () when not asked.
    path_prefix: str = ""
    kinds: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def filter(self, f: Filter) -> tuple[str, ...]:
        """The values the form asks of filter `f`: none, one, or a list's."""
        value = getattr(self, f.field)
        return tuple(value) if f.many else (value,) if value else ()

    def request(self, mode: Mode | None = None) -> SearchRequest:
        """The indexer's search body for one mode (by default the form's)."""
        filters = {
            f.field: list(given) if f.many else given[0]
            for f in FILTERS
            if (given := self.filter(f))
        }
        body = {
            "query": self.q or "",
            "top_k": self.top_k,
            "mode": mode or self.mode,
            "rerank": None if self.rerank else False,
            "filters": filters or None,
        }
        # As JSON: the request models are strict, and a kind is a string there.
        return SearchRequest.model_validate_json(json.dumps(body))


class FormError(Exception):
    """A search the console refuses before asking any base, with the indexer's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.body = ErrorBody(code=code, message=message)


def parse_search(query: Mapping[str, Sequence[str]], *, base: str | None = None) -> SearchForm:
    """The search a URL's query asks (each key with all its values, in order).

    `base`: the one base of a page that serves a single index (`metis serve`).
    A checkbox that is cleared is not sent, so the form sends `rerank=0` before the
    box's `rerank=1` and the last value wins; a `source` may list several, comma-separated.
    Raises FormError with QUERY_EMPTY, QUERY_TOO_LONG, TOP_K_OUT_OF_RANGE or INVALID_BODY,
    as the indexer would.
    """

    def last(key: str, default: str = "") -> str:
        values = query.get(key) or [default]
        return values[-1]

    q = query["q"][-1] if query.get("q") else None
    mode = last("mode", "hybrid")
    if mode not in MODES:
        raise FormError("INVALID_BODY", f"mode is {mode!r}; it must be hybrid, dense or keyword")
    filters: dict[str, Any] = {f.field: asked(f, query.get(f.asked.name, [])) for f in FILTERS}
    try:
        top_k = int(last("top_k", "5"))
    except ValueError:
        raise FormError(
            "INVALID_BODY",
            f"top_k is {last('top_k')!r}; it must be a whole number from 1 to {TOP_K_MAX}",
        ) from None
    form = SearchForm(
        q=q,
        bases=(base,) if base else tuple(dict.fromkeys(b for b in query.get("base", []) if b)),
        mode=mode,  # checked against MODES above
        rerank=last("rerank", "1").lower() in _ON,
        compare=last("compare", "0").lower() in _ON,
        top_k=top_k,
        **filters,
    )
    if form.q is not None:
        check_form(form)
    return form


def asked(f: Filter, values: Sequence[str]) -> str | tuple[str, ...]:
    """Filter `f` as the URL's values of its parameter ask it: a list's each once (a value
    of free words may list several, comma-separated), one's the last; INVALID_BODY for a
    value not among its choices."""
    if f.many and f.choices is None:
        values = [s for v in values for s in re.split(r"[,\s]+", v) if s]
    given = tuple(dict.fromkeys(values)) if f.many else tuple(values[-1:])
    if f.choices is not None and (bad := [v for v in given if v not in f.choices]):
        choices = ", ".join(f.choices)
        raise FormError("INVALID_BODY", f"{f.asked.name} {bad[0]!r} is not one of {choices}")
    return given if f.many else given[0] if given else ""


def check_form(form: SearchForm) -> None:
    """The question's limits, as the indexer checks them, with its codes and messages."""
    q = form.q or ""
    if not q.strip():
        raise FormError("QUERY_EMPTY", "the question is empty")
    if len(q) > QUERY_MAX:
        raise FormError(
            "QUERY_TOO_LONG",
            f"the question has {len(q)} characters; at most {QUERY_MAX} are allowed",
        )
    if not 1 <= form.top_k <= TOP_K_MAX:
        raise FormError(
            "TOP_K_OUT_OF_RANGE", f"top_k is {form.top_k}; it must be between 1 and {TOP_K_MAX}"
        )
    if not form.bases:
        raise FormError("INVALID_BODY", "no base is chosen: tick one or more")


def search_query(form: SearchForm) -> str:
    """The URL query that asks `form` again: `parse_search` of it gives `form` back."""
    pairs: list[tuple[str, str]] = [("q", form.q or "")]
    pairs += [("base", b) for b in form.bases]
    pairs.append(("mode", form.mode))
    if not form.rerank:
        pairs.append(("rerank", "0"))
    if form.compare:
        pairs.append(("compare", "1"))
    if form.top_k != 5:
        pairs.append(("top_k", str(form.top_k)))
    pairs += [(f.asked.name, v) for f in FILTERS for v in form.filter(f)]
    return urlencode(pairs)


@dataclasses.dataclass(frozen=True)
class Hit:
    """One result of one base, and where it stands once the bases are merged."""

    base: str
    rank: int
    """Its rank in its own base's answer, from 1."""
    result: Result
    merged: float
    """The sum of 1 / (60 + rank) over the bases' lists (one: it is in one base)."""

    @property
    def key(self) -> tuple[Any, ...]:
        c = self.result.citation
        return (self.base, c.source, c.document, c.page, c.line, self.result.text)


def merge(answers: Mapping[str, Sequence[Result]], top_k: int, k: int = RRF_K) -> list[Hit]:
    """Several bases' results as one list by reciprocal rank, at most `top_k`.

    Each base's list is already in its own best order; scores of two bases (two
    models, two rerankers) cannot be compared, ranks can. Equal ranks keep the order
    of the bases as asked.
    """
    hits = [
        Hit(base, rank, result, 1.0 / (k + rank))
        for base, results in answers.items()
        for rank, result in enumerate(results, start=1)
    ]
    order = sorted(range(len(hits)), key=lambda i: (-hits[i].merged, i))
    return [hits[i] for i in order[:top_k]]


def why(meaning: int | None, words: int | None, rerank: float | None) -> str:
    """A Compare row's "Why it came up" in spec 002's sentences, with the ranks its Meaning
    and Words columns show (the by-meaning and by-words searches' own, not the hybrid
    search's legs'), so the sentence and the table say one rank per thing."""
    if meaning is not None and words is not None:
        said = f"close in meaning (#{meaning}) and shares words (#{words}) — both agree"
    elif words is not None:
        said = (
            f"shares words (#{words}); not among the closest in meaning — "
            "it names a term of the question exactly"
        )
    elif meaning is not None:
        said = (
            f"close in meaning (#{meaning}); its words do not match — "
            "it says the same thing in other words"
        )
    else:
        said = "not among the closest in meaning nor the best by words"
    if rerank is not None:
        said += f"; the reranker scored it {rerank:.3f}"
    return said


@dataclasses.dataclass(frozen=True)
class CompareRow:
    """A passage any mode found: its rank in each mode's list, and why it came up."""

    hit: Hit
    ranks: Mapping[Mode, int | None]
    why: str


def compare(lists: Mapping[Mode, Sequence[Hit]]) -> list[CompareRow]:
    """Every passage of the three lists, ordered by its rank in Both, then by its best
    rank elsewhere, each said why it came up by its ranks in the Meaning and Words
    lists and the reranker's score from whichever answer carries one."""
    found: dict[tuple[Any, ...], dict[Mode, Hit]] = {}
    for mode in COMPARED:
        for position, hit in enumerate(lists.get(mode, ()), start=1):
            found.setdefault(hit.key, {})[mode] = dataclasses.replace(hit, rank=position)
    rows = []
    for by in found.values():
        ranks = {m: by[m].rank if m in by else None for m in COMPARED}
        rerank = next(
            (r for m in COMPARED if m in by if (r := by[m].result.scores.rerank) is not None), None
        )
        reason = why(ranks["dense"], ranks["keyword"], rerank)
        rows.append(CompareRow(next(iter(by.values())), ranks, reason))
    big = TOP_K_MAX * 100
    return sorted(
        rows,
        key=lambda r: (r.ranks["hybrid"] or big, min(v for v in r.ranks.values() if v is not None)),
    )


def fold(text: str) -> str:
    """Lower case, accents dropped: how search compares words."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def question_words(question: str) -> set[str]:
    """The question's words as search compares them: one letter alone is left out,
    one digit kept."""
    return {w for w in _WORD.findall(fold(question)) if len(w) > 1 or w.isdigit()}


def telling_words(
    question: str, answers: Iterable[tuple[str, SearchAnswer | ErrorBody]]
) -> dict[str, set[str]]:
    """Each base's words worth marking in its snippets: the question's words its index
    says tell passages apart (an answer's `words`), so "the" or "off" is not lit up in
    every line; every word of the question where an older indexer does not say."""
    told: dict[str, set[str]] = {}
    for base, answer in answers:
        if isinstance(answer, SearchAnswer):
            words = question_words(question) if answer.words is None else set(answer.words)
            told.setdefault(base, set()).update(words)
    return told


def marked(snippet: str, wanted: Collection[str]) -> list[tuple[str, bool]]:
    """The snippet in runs of text, True for a word of `wanted` (folded words)."""
    runs: list[tuple[str, bool]] = []
    at = 0
    for m in _WORD.finditer(snippet):
        if fold(m.group()) in wanted:
            if m.start() > at:
                runs.append((snippet[at : m.start()], False))
            runs.append((m.group(), True))
            at = m.end()
    if at < len(snippet):
        runs.append((snippet[at:], False))
    return runs


def took_line(took: Mapping[str, float]) -> str:
    """The search's step timings: `embed 12.0 ms · meaning 1.1 ms · … · total 214.0 ms`."""
    names = (
        ("embed", "embed"),
        ("dense", "meaning"),
        ("keyword", "words"),
        ("fuse", "fuse"),
        ("rerank", "rerank"),
        ("total", "total"),
    )
    return " · ".join(f"{label} {took[key]:.1f} ms" for key, label in names if key in took)
