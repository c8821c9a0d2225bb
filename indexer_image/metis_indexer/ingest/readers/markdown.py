"""Markdown (.md, .markdown, .mdx): sections under ATX and setext headings.

A line scanner rather than a full CommonMark parser: headings are all we need,
and a scanner keeps every section's first line exact. It knows enough block
structure to not see headings where CommonMark sees none: inside fenced code,
in indented code, under a list item or a block quote, or in an HTML comment.
Comments are hidden from a page's readers, so their lines are kept blank:
commented-out text is not indexed, and the lines after still count right.
"""

from __future__ import annotations

import re
import tomllib

import yaml

from metis_indexer.documents import Kind, ParsedDocument, Section
from metis_indexer.ingest.readers import encoding
from metis_indexer.ingest.readers.outline import Outline

_COMMENT = re.compile(r" {0,3}<!--")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*")
_ATX_CLOSE = re.compile(r"(?:^|[ \t]+)#+$")
_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*")
_BREAK = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*")
_CONTAINER = re.compile(r" {0,3}(?:[-+*][ \t]|\d{1,9}[.)][ \t]|>)")
_NOT_PARAGRAPH = re.compile(r"\s{4}|\s*\|")  # indented code, a table row
_FRONT_MATTER_END = {"---": ("---", "..."), "+++": ("+++",)}

_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_HEADING_ID = re.compile(r"\s*\{\s*[#.][^}]*\}\s*$")
_TAG = re.compile(r"<[^>]+>")
_MARKS = re.compile(r"\*\*|__|`")
_SPACES = re.compile(r"\s+")

try:
    _YamlLoader: type[yaml.SafeLoader] = yaml.CSafeLoader
except AttributeError:  # PyYAML built without libyaml
    _YamlLoader = yaml.SafeLoader


def read(data: bytes) -> ParsedDocument:
    lines = encoding.decode_text(data).split("\n")
    body, front_title = _front_matter(lines)
    scan = _Scanner(lines)
    scan.run(body)
    title = front_title or scan.outline.first_h1
    return ParsedDocument(title=title, kind=Kind.MD, sections=tuple(scan.done))


def _front_matter(lines: list[str]) -> tuple[int, str | None]:
    """Where the body starts (a line index), and the front matter's title."""
    ends = _FRONT_MATTER_END.get(lines[0].rstrip())
    if ends is None:
        return 0, None
    for end in range(1, len(lines)):
        if lines[end].rstrip() in ends:
            break
    else:
        return 0, None
    block = "\n".join(lines[1:end])
    try:
        meta = tomllib.loads(block) if ends == ("+++",) else yaml.load(block, Loader=_YamlLoader)
    except (yaml.YAMLError, tomllib.TOMLDecodeError, ValueError):
        return end + 1, None
    title = meta.get("title") if isinstance(meta, dict) else None
    if isinstance(title, str | int | float) and str(title).strip():
        return end + 1, _SPACES.sub(" ", str(title)).strip()
    return end + 1, None


class _Scanner:
    """Feeds on lines in order; cuts a section at each heading."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.done: list[Section] = []
        self.outline = Outline()
        self._buffer: list[str] = []
        self._first = 0  # line index of the buffer's first line
        self._fence: tuple[str, int] | None = None  # its character and length
        self._comment = False  # in an HTML comment
        self._paragraph: int | None = None  # line index where the open paragraph starts
        self._container = False  # in a list item or block quote: no setext heading there

    def run(self, start: int) -> None:
        """Scans from line index `start` (after any front matter) to the end."""
        self._first = start
        for i in range(start, len(self.lines)):
            self._line(i)
        self._flush()

    def _line(self, i: int) -> None:
        line = self.lines[i]
        if self._fence is not None:
            m = _FENCE.fullmatch(line)
            if m and m[1][0] == self._fence[0] and len(m[1]) >= self._fence[1] and not m[2].strip():
                self._fence = None
            self._buffer.append(line)
            return
        if self._comment or _COMMENT.match(line):
            opened = 0 if self._comment else line.find("<!--") + 4
            self._comment = "-->" not in line[opened:]
            self._block_ends()
            self._buffer.append("")
            return
        m = _FENCE.fullmatch(line)
        if m and not (m[1][0] == "`" and "`" in m[2]):
            self._fence = (m[1][0], len(m[1]))
            self._block_ends()
            self._buffer.append(line)
            return
        level, name, taken = self._heading(i)
        if name:
            del self._buffer[len(self._buffer) - (taken - 1) :]
            self._cut(level, name, i + 1)
            return
        if not line.strip() or _BREAK.fullmatch(line):
            self._block_ends()
        elif _CONTAINER.match(line):  # a list item or quote starts, even inside a paragraph
            self._paragraph, self._container = None, True
        elif self._paragraph is None and not self._container and not _NOT_PARAGRAPH.match(line):
            self._paragraph = i
        self._buffer.append(line)

    def _heading(self, i: int) -> tuple[int, str, int]:
        """The heading line `i` ends: its level, its words ("" if none), its line count."""
        atx = _ATX.fullmatch(self.lines[i])
        if atx:
            return len(atx[1]), _inline(_ATX_CLOSE.sub("", atx[2] or "")), 1
        start = self._paragraph
        if start is not None and (setext := _SETEXT.fullmatch(self.lines[i])):
            level = 1 if setext[1][0] == "=" else 2
            return level, _inline(" ".join(self.lines[start:i])), i - start + 1
        return 0, "", 1

    def _cut(self, level: int, name: str, body: int) -> None:
        self._flush()
        self.outline.enter(level, name)
        self._buffer, self._first = [], body
        self._block_ends()

    def _block_ends(self) -> None:
        self._paragraph, self._container = None, False

    def _flush(self) -> None:
        """The buffer as a section, its leading blank lines skipped so `line` stays exact."""
        buffer = self._buffer
        skip = 0
        while skip < len(buffer) and not buffer[skip].strip():
            skip += 1
        text = "\n".join(buffer[skip:]).rstrip()
        if text:
            headings = self.outline.headings
            self.done.append(Section(headings=headings, text=text, line=self._first + skip + 1))


def _inline(raw: str) -> str:
    """A heading's words without its markup: links, `{#id}`, tags, bold and code marks."""
    text = _HEADING_ID.sub("", raw)
    text = _LINK.sub(r"\1", text)
    text = _TAG.sub("", text)
    text = _MARKS.sub("", text)
    return _SPACES.sub(" ", text).strip()
