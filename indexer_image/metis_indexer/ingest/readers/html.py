"""HTML (.html, .htm, .xhtml): `<title>`, sections under `<h1>`–`<h6>`, no page chrome.

The title is `<title>`, else the first `<h1>` (as Markdown's first `#`).

Scripts, styles, navigation and hidden elements are dropped; so are headers,
footers and asides that sit outside the main content (a site's banner, its
footer links, a sidebar), while an article's own `<header>` is kept.

The charset: a byte-order mark wins (then UTF-16/32 known by its zero bytes);
pure ASCII bytes are read as declared (ISO-2022-JP is 7-bit); bytes that are
valid UTF-8 are UTF-8 whatever the page declares (a declaration that contradicts
valid UTF-8 is the usual mistake, "declared-charset-mismatch"); otherwise the
declared charset (`<meta charset>`, `http-equiv` content type, or an XML
declaration; labels read the way browsers do, so "iso-8859-1" is windows-1252)
is tried, and a declaration that is bogus or does not fit the bytes falls back
to Latin-1, the rule for text that is not UTF-8 (`encoding`).
"""

from __future__ import annotations

import codecs
import re

from selectolax.lexbor import LexborHTMLParser, LexborNode

from metis_indexer.documents import Kind, ParsedDocument, Section
from metis_indexer.ingest.readers import encoding
from metis_indexer.ingest.readers.outline import Outline

_DECLARED = re.compile(
    rb"""<meta[^>]*?charset\s*=\s*["']?\s*([-\w.:]+)|<\?xml[^>]*?encoding\s*=\s*["']([-\w.:]+)""",
    re.IGNORECASE,
)
_PRESCAN = 4096
"""Bytes searched for a declared charset (browsers look at the first 1024)."""

_WIDER = {
    # a declared label's codec -> the codec browsers use for it (WHATWG Encoding);
    # "latin-1" stands for `encoding.latin1`, which is windows-1252
    "ascii": "latin-1",
    "iso8859-1": "latin-1",
    "cp1252": "latin-1",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "big5": "big5hkscs",
    "tis-620": "cp874",
    "iso8859-11": "cp874",
    "iso8859-9": "cp1254",
}
_LABELS = {
    "windows-874": "cp874",
    "x-sjis": "cp932",
    "x-mac-cyrillic": "mac-cyrillic",
    "iso-8859-8-i": "iso8859-8",
}
_WRONG_SHARE = 0.01
"""Share of undecodable characters above which a declared charset is taken as wrong."""

_DROPPED = (
    "script, style, noscript, template, nav, iframe, object, embed, svg, canvas, select, button,"
    " [hidden], [aria-hidden=true], [role=navigation]"
)
_CHROME = "header, footer, aside, [role=banner], [role=contentinfo], [role=complementary]"
_MAIN = {"main", "article"}
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_PARAGRAPHS = frozenset(
    {
        *("p", "div", "section", "article", "main", "blockquote", "pre", "table", "ul", "ol"),
        *("dl", "form", "fieldset", "figure", "figcaption", "details", "summary", "address"),
        *("hr", "header", "footer", "aside", "body"),
    }
)
_LINES = frozenset({"li", "tr", "dt", "dd", "br", "caption", "legend", "option"})
_CELLS = frozenset({"td", "th"})
_SPACES = re.compile(r"\s+")
_LINE = 1
_PARAGRAPH = 2


def read(data: bytes) -> ParsedDocument:
    tree = LexborHTMLParser(decode(data))
    title = _title(tree)
    for node in tree.css(_DROPPED):
        node.decompose()
    for node in tree.css(_CHROME):
        if not _in_main(node):
            node.decompose()
    root = tree.body or tree.root
    sections = _Sections()
    if root is not None:
        sections.walk(root)
    title = title or sections.outline.first_h1
    return ParsedDocument(title=title, kind=Kind.HTML, sections=tuple(sections.done))


def decode(data: bytes) -> str:
    """The page's text, by the charset rule in the module docstring."""
    marked = encoding.bom(data)
    if marked is not None:
        name, skip = marked
        return encoding.clean(data[skip:].decode(name, errors="replace"))
    if b"\x00" in data[:_PRESCAN]:
        wide = encoding.wide_without_bom(data)
        if wide is not None:
            return encoding.clean(wide)
    declared = _declared(data)
    if data.isascii() and declared is not None:
        return encoding.clean(data.decode(declared, errors="replace"))
    try:
        return encoding.clean(data.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    if declared is not None and declared not in ("utf-8", "latin-1"):
        text = data.decode(declared, errors="replace")
        if text.count("\ufffd") <= _WRONG_SHARE * len(text):
            return encoding.clean(text)
    return encoding.clean(encoding.latin1(data))


def _declared(data: bytes) -> str | None:
    """The codec of the page's declared charset; None when none, or unknown."""
    m = _DECLARED.search(data[:_PRESCAN])
    if m is None:
        return None
    label = (m[1] or m[2]).decode("ascii").strip().lower()
    try:
        name = codecs.lookup(_LABELS.get(label, label)).name
    except LookupError:
        return None
    if name.startswith(("utf-16", "utf-32", "utf-8")):
        return "utf-8"  # a page whose declaration we could read is not UTF-16 (WHATWG)
    try:
        b"".decode(name)
    except LookupError:  # base64, zlib… are codecs but not text encodings
        return None
    return _WIDER.get(name, name)


def _title(tree: LexborHTMLParser) -> str | None:
    head = tree.head
    node = head.css_first("title") if head is not None else None
    text = _SPACES.sub(" ", node.text(deep=True)).strip() if node is not None else ""
    return text or None


def _in_main(node: LexborNode) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.tag in _MAIN or parent.attributes.get("role") == "main":
            return True
        parent = parent.parent
    return False


class _Sections:
    """Walks the DOM in document order, cutting a section at each heading.

    Text nodes have their whitespace collapsed as a browser would; line breaks
    come from the structure only (blocks, list items, rows, `<br>`), except in
    `<pre>`, which is kept as written.
    """

    def __init__(self) -> None:
        self.done: list[Section] = []
        self.outline = Outline()
        self._flow: list[str | int] = []  # text, or a break: _LINE or _PARAGRAPH
        self._blocks: list[str] = []

    def walk(self, root: LexborNode) -> None:
        # An explicit stack, not recursion: real pages nest deeper than Python's limit.
        stack: list[tuple[LexborNode, bool]] = [(root, False)]
        while stack:
            node, leaving = stack.pop()
            tag = node.tag
            if leaving:
                self._flow.append(_PARAGRAPH if tag in _PARAGRAPHS else _LINE)
                continue
            if tag == "-text":
                self._flow.append(_SPACES.sub(" ", node.text_content or ""))
                continue
            if tag in _HEADINGS:
                self._heading(_HEADINGS[tag], node)
                continue
            if tag == "pre":
                self._end_flow()
                pre = "\n".join(line.rstrip() for line in node.text(deep=True).split("\n"))
                self._blocks.append(pre.strip("\n"))
                continue
            if tag in _PARAGRAPHS or tag in _LINES:
                self._flow.append(_PARAGRAPH if tag in _PARAGRAPHS else _LINE)
                stack.append((node, True))
            elif tag in _CELLS:
                self._flow.append(" ")
            children = []
            child = node.child
            while child is not None:
                children.append(child)
                child = child.next
            stack.extend((c, False) for c in reversed(children))
        self._flush()

    def _heading(self, level: int, node: LexborNode) -> None:
        name = " ".join(node.text(deep=True).split())
        if not name:
            return
        self._flush()
        self.outline.enter(level, name)

    def _end_flow(self) -> None:
        """Closes the running text: a run of breaks is one, the strongest of them."""
        out: list[str] = []
        brk = 0
        for part in self._flow:
            if isinstance(part, int):
                brk = max(brk, part)
                continue
            if brk and part.strip():
                out.append("\n" * brk)
                brk = 0
            out.append(part)
        self._flow = []
        lines = "".join(out).split("\n")
        self._blocks.append("\n".join(" ".join(line.split()) for line in lines))

    def _flush(self) -> None:
        self._end_flow()
        text = "\n\n".join(b.strip("\n") for b in self._blocks if b.strip())
        self._blocks = []
        if text:
            self.done.append(Section(headings=self.outline.headings, text=text))
