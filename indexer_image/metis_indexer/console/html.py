"""A small HTML builder that escapes every text it is given.

`el("td", text, class_="x")` escapes `text` and every attribute value; only an `Html`
(what `el` returns) is put in as it is. No page is assembled from strings anywhere
else, so a document holding `<script>` is shown as text, never run.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape


class Html(str):
    """Markup that is already safe: built by `el` or `join`."""


def text(value: object) -> Html:
    """Any value as escaped text."""
    return value if isinstance(value, Html) else Html(escape(str(value), quote=True))


def join(children: Iterable[object]) -> Html:
    """Children in order: Html as it is, None and False left out, lists flattened,
    anything else escaped."""
    out: list[str] = []
    for child in children:
        if child is None or child is False:
            continue
        if isinstance(child, str | int | float):
            out.append(text(child))
        else:
            out.append(join(child))  # type: ignore[arg-type]  # an iterable of children
    return Html("".join(out))


_VOID = frozenset({"meta", "link", "input", "br", "hr", "img"})


def el(tag: str, *children: object, **attrs: object) -> Html:
    """`<tag attrs>children</tag>`. `class_` is `class`, `data_x` is `data-x`,
    `aria_x` is `aria-x`; True gives a bare attribute, None and False none."""
    parts = [tag]
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        attr = name.rstrip("_").replace("_", "-")
        parts.append(attr if value is True else f'{attr}="{text(value)}"')
    opening = f"<{' '.join(parts)}>"
    if tag in _VOID:
        return Html(opening)
    return Html(f"{opening}{join(children)}</{tag}>")
