"""Word (.docx): sections under headings found by Word style, in any language.

A heading is known by what Word itself keys on, never by the display name a
localized Word shows: the style's `w:name` "heading N" (German Word stores
"heading 1" under the style id `berschrift1`), or an outline level
(`w:outlineLvl`, on the style, a style it is based on, or the paragraph). The
title is the core properties' title, else the first paragraph in the Title style.

python-docx opens the package (relationships, content types, core properties);
the body is walked here with lxml, because python-docx's paragraph list skips
text in content controls, text boxes and tracked insertions. Main parts of
templates and macro-enabled documents are read too (a renamed .docm is still
the user's text), and Strict Open XML by its own namespace.

Before any of that, the zip's central directory is checked: an encrypted
document (an OLE container), a legacy .doc, or a package that would inflate past
`MAX_UNCOMPRESSED` is refused without being unpacked.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator

import docx  # noqa: F401  (registers python-docx's part classes with its package reader)
from docx.opc.constants import RELATIONSHIP_TYPE as RT
from docx.opc.exceptions import PackageNotFoundError
from docx.opc.package import OpcPackage
from docx.opc.part import Part, XmlPart
from docx.oxml.parser import parse_xml
from lxml import etree

from metis_indexer.documents import FailReason, Kind, ParsedDocument, ReadFailed, Section
from metis_indexer.ingest.readers import encoding
from metis_indexer.ingest.readers.failures import detail
from metis_indexer.ingest.readers.outline import Outline

MAX_UNCOMPRESSED = 256 * 1024 * 1024
"""Bytes a package may inflate to, all parts together (python-docx holds them all)."""

_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_ENCRYPTED = "EncryptedPackage".encode("utf-16-le")
_MAIN_TYPES = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.template.main+xml",
    "application/vnd.ms-word.document.macroEnabled.main+xml",
    "application/vnd.ms-word.template.macroEnabledTemplate.main+xml",
}
_STRICT_RELS = "http://purl.oclc.org/ooxml/officeDocument/relationships/"
_MAIN_DOCUMENT = (RT.OFFICE_DOCUMENT, _STRICT_RELS + "officeDocument")
_STYLES = (RT.STYLES, _STRICT_RELS + "styles")
_MC = "{http://schemas.openxmlformats.org/markup-compatibility/2006}"
_HEADING_NAME = re.compile(r"heading\s*([1-9])", re.IGNORECASE)


def read(data: bytes) -> ParsedDocument:
    _check_container(data)
    try:
        package = OpcPackage.open(io.BytesIO(data))
    except PackageNotFoundError as e:
        raise ReadFailed(FailReason.NOT_A_DOCUMENT, detail(e)) from e
    except (zipfile.BadZipFile, etree.XMLSyntaxError, KeyError, ValueError, EOFError) as e:
        raise ReadFailed(FailReason.MALFORMED, detail(e)) from e
    main = _related(package, _MAIN_DOCUMENT)
    if main is None:
        raise ReadFailed(FailReason.NOT_A_DOCUMENT, "the package has no main document part")
    if main.content_type not in _MAIN_TYPES:
        raise ReadFailed(FailReason.NOT_A_DOCUMENT, f"its main part is {main.content_type}")
    try:
        body_root = _element(main)
        styles_part = _related(main, _STYLES)
        styles = _element(styles_part) if styles_part is not None else None
    except etree.XMLSyntaxError as e:
        raise ReadFailed(FailReason.MALFORMED, detail(e)) from e
    w = _namespace(body_root)
    headings = _HeadingStyles(styles, w)
    sections, title_style_text = _sections(body_root, w, headings)
    title = _core_title(package) or title_style_text
    return ParsedDocument(title=title, kind=Kind.DOCX, sections=tuple(sections))


def _check_container(data: bytes) -> None:
    if data.startswith(_OLE):
        if _ENCRYPTED in data:
            raise ReadFailed(FailReason.PASSWORD, "an encrypted Office document")
        raise ReadFailed(FailReason.NOT_A_DOCUMENT, "a legacy Word (.doc) or other OLE file")
    if not data.startswith(b"PK"):
        raise ReadFailed(FailReason.NOT_A_DOCUMENT, "not a zip package")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            total = sum(info.file_size for info in z.infolist())
    except (zipfile.BadZipFile, ValueError, EOFError) as e:
        raise ReadFailed(FailReason.MALFORMED, detail(e)) from e
    if total > MAX_UNCOMPRESSED:
        raise ReadFailed(
            FailReason.TOO_BIG_UNCOMPRESSED,
            f"{total:,} bytes unpacked, over the limit of {MAX_UNCOMPRESSED:,}",
        )


def _related(source: OpcPackage | Part, reltypes: tuple[str, str]) -> Part | None:
    """The part related by a relationship type, transitional or Strict."""
    for reltype in reltypes:
        try:
            return source.part_related_by(reltype)
        except KeyError:
            continue
        except ValueError as e:  # two relationships of one type
            raise ReadFailed(FailReason.MALFORMED, detail(e)) from e
    return None


def _element(part: Part) -> etree._Element:
    return part.element if isinstance(part, XmlPart) else parse_xml(part.blob)


def _namespace(root: etree._Element) -> str:
    """`{ns}` of the WordprocessingML namespace: transitional or Strict."""
    tag = root.tag if isinstance(root.tag, str) else ""
    return tag[: tag.index("}") + 1] if tag.startswith("{") else ""


def _core_title(package: OpcPackage) -> str | None:
    """The core properties' title; None when there are none (python-docx would invent one)."""
    try:
        part = package.part_related_by(RT.CORE_PROPERTIES)
        title = part.core_properties.title
    except (KeyError, ValueError, AttributeError, etree.XMLSyntaxError):
        return None
    if not isinstance(title, str):
        return None
    return " ".join(encoding.clean(title).split()) or None


class _HeadingStyles:
    """Heading level (1-9) and title-ness of each paragraph style, through `w:basedOn`."""

    def __init__(self, styles: etree._Element | None, w: str) -> None:
        self._raw: dict[str, tuple[str, str | None, int | None]] = {}
        self.default: str | None = None
        self._levels: dict[str, int | None] = {}
        self._titles: dict[str, bool] = {}
        if styles is None:
            return
        for style in styles.iter(f"{w}style"):
            if style.get(f"{w}type", "paragraph") != "paragraph":
                continue
            sid = style.get(f"{w}styleId")
            if sid is None:
                continue
            name = style.find(f"{w}name")
            based = style.find(f"{w}basedOn")
            self._raw[sid] = (
                (name.get(f"{w}val") or "") if name is not None else "",
                based.get(f"{w}val") if based is not None else None,
                _outline_level(style.find(f"{w}pPr"), w),
            )
            if style.get(f"{w}default") in ("1", "true", "on") and self.default is None:
                self.default = sid

    def level(self, sid: str) -> int | None:
        if sid not in self._levels:
            self._levels[sid] = self._resolve(sid)
        return self._levels[sid]

    def is_title(self, sid: str) -> bool:
        if sid not in self._titles:
            self._titles[sid] = any(name.strip().lower() == "title" for name in self._names(sid))
        return self._titles[sid]

    def _chain(self, sid: str) -> Iterator[tuple[str, str | None, int | None]]:
        seen: set[str] = set()
        current: str | None = sid
        while current is not None and current in self._raw and current not in seen:
            seen.add(current)
            yield self._raw[current]
            current = self._raw[current][1]

    def _names(self, sid: str) -> Iterator[str]:
        return (name for name, _, _ in self._chain(sid))

    def _resolve(self, sid: str) -> int | None:
        for name, _, outline in self._chain(sid):
            m = _HEADING_NAME.fullmatch(name.strip())
            if m:
                return int(m[1])
            if outline is not None:
                return outline
        return None


def _outline_level(ppr: etree._Element | None, w: str) -> int | None:
    """A `w:outlineLvl` as a heading level: 0-8 are levels 1-9, 9 is body text."""
    if ppr is None:
        return None
    node = ppr.find(f"{w}outlineLvl")
    value = node.get(f"{w}val") if node is not None else None
    if value is None or not value.isdigit():
        return None
    return int(value) + 1 if int(value) < 9 else None


def _sections(
    root: etree._Element, w: str, styles: _HeadingStyles
) -> tuple[list[Section], str | None]:
    """Sections in reading order, and the text of the first Title-style paragraph."""
    body = root.find(f"{w}body")
    if body is None:
        return [], None
    for fallback in list(body.iter(f"{_MC}Fallback")):  # the same content as its mc:Choice
        fallback.getparent().remove(fallback)
    boxed = _paragraphs_holding_boxes(body, w)
    sections: list[Section] = []
    outline = Outline()
    lines: list[str] = []
    title: str | None = None

    def flush() -> None:
        text = "\n".join(lines).strip()
        if text:
            sections.append(Section(headings=outline.headings, text=text))
        lines.clear()

    for p in body.iter(f"{w}p"):
        text = encoding.clean(_paragraph_text(p, w, p in boxed))
        ppr = p.find(f"{w}pPr")
        style_node = ppr.find(f"{w}pStyle") if ppr is not None else None
        sid = style_node.get(f"{w}val") if style_node is not None else styles.default
        level = _outline_level(ppr, w) or (styles.level(sid) if sid else None)
        name = " ".join(text.split())
        if level is not None and name:
            flush()
            outline.enter(level, name)
            continue
        if title is None and name and sid and styles.is_title(sid):
            title = name
        lines.append(text)
    flush()
    return sections, title


def _paragraphs_holding_boxes(body: etree._Element, w: str) -> set[etree._Element]:
    """Paragraphs with a text box inside: their own text must skip the box's paragraphs."""
    holders: set[etree._Element] = set()
    for box in body.iter(f"{w}txbxContent"):
        parent = box.getparent()
        while parent is not None and parent is not body:
            if parent.tag == f"{w}p":
                holders.add(parent)
            parent = parent.getparent()
    return holders


def _paragraph_text(p: etree._Element, w: str, has_boxes: bool) -> str:
    """The paragraph's own text: runs, tracked insertions, tabs and breaks; no deletions."""
    t, tab, ptab, br, cr, hyphen = (
        f"{w}t",
        f"{w}tab",
        f"{w}ptab",
        f"{w}br",
        f"{w}cr",
        f"{w}noBreakHyphen",
    )
    tab_stops = f"{w}tabs"
    parts: list[str] = []
    for node in p.iter(t, tab, ptab, br, cr, hyphen):
        if has_boxes and _nearest_paragraph(node, w) is not p:
            continue
        tag = node.tag
        if tag == t:
            parts.append(node.text or "")
        elif tag in (tab, ptab):
            if node.getparent().tag != tab_stops:  # a tab stop's definition, not a tab
                parts.append("\t")
        elif tag == hyphen:
            parts.append("-")
        else:
            parts.append("\n")
    return "".join(parts)


def _nearest_paragraph(node: etree._Element, w: str) -> etree._Element | None:
    parent = node.getparent()
    while parent is not None and parent.tag != f"{w}p":
        parent = parent.getparent()
    return parent
