"""Readers: one module per kind of document, each turning bytes into a `ParsedDocument`.

`read_document` is the one entry point: it opens the file (checking that the
file opened, not the name listed, is inside its drive), checks the size limit
before reading a byte, hands the bytes to the kind's reader, and makes the text
storable. Whatever goes wrong comes out as `ReadFailed` with a reason from the
fixed vocabulary; no other exception escapes. Only a regular file is opened: a pipe, a
socket or a device in its place fails at once rather than waiting for a writer or reading
forever. It has no time limit of its own: run it through
`metis_indexer.ingest.readers.pool`, which can stop a parse (or a hung drive's read) that
runs too long.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from types import ModuleType

from metis_indexer.documents import FailReason, Kind, ParsedDocument, ReadFailed
from metis_indexer.ingest.readers import docx, html, markdown, pdf, text
from metis_indexer.ingest.readers.failures import detail

MAX_BYTES = 64 * 1024 * 1024
"""A file larger than this (64 MB) is not read."""
MAX_TEXT = MAX_BYTES
"""Characters of text a document may yield: a small compressed file (a DOCX of 600 KB)
can hold hundreds of MB of XML, and every character becomes index and model work."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""NULs and lone surrogates (pypdf yields them for some fonts): SQLite and JSON
encoders refuse them, so one such character would fail a whole document."""

KINDS: Mapping[str, Kind] = {
    **dict.fromkeys((".md", ".markdown", ".mdx"), Kind.MD),
    **dict.fromkeys((".txt", ".text", ".rst", ".adoc", ".org", ".csv", ".tsv"), Kind.TXT),
    **dict.fromkeys((".json", ".jsonl", ".log", ".tex"), Kind.TXT),
    **dict.fromkeys((".html", ".htm", ".xhtml"), Kind.HTML),
    ".pdf": Kind.PDF,
    ".docx": Kind.DOCX,
}
"""Extension (lower case) to kind: the table of docs/reference/indexing.md."""

_READERS: Mapping[Kind, ModuleType] = {
    Kind.MD: markdown,
    Kind.TXT: text,
    Kind.HTML: html,
    Kind.PDF: pdf,
    Kind.DOCX: docx,
}
"""Each kind's module; its `read(data: bytes) -> ParsedDocument` raises only `ReadFailed`."""


def kind_of(path: str | PurePath) -> Kind | None:
    """The kind a file is read as, by its extension in any case; None: not read."""
    return KINDS.get(PurePath(path).suffix.lower())


_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
"""O_NONBLOCK: the open of a named pipe returns at once instead of waiting for a writer;
O_NOCTTY: a terminal opened is never made the process's own."""

_SPECIAL: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def not_regular(mode: int) -> str | None:
    """Why a file of this `st_mode` is not read, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    what = next((name for test, name in _SPECIAL if test(mode)), "something else")
    return f"it is {what}, not a regular file"


def open_inside(path: Path, root: Path | None) -> int:
    """A descriptor of the regular file at `path`, refused unless the file opened is inside
    `root`: a name listed as a file may have become a link out of the drive, a pipe or a
    device since. What the name leads to is checked before it is opened (opening a device
    can do something: a tape rewinds) and what was opened after (the name may have changed
    in between)."""
    try:
        refused = not_regular(os.stat(path).st_mode)
        if refused is not None:
            raise ReadFailed(FailReason.UNREADABLE, refused)
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise ReadFailed(FailReason.UNREADABLE, detail(e)) from e
    try:
        try:
            if root is not None:
                real = _opened(fd, path)
                top = os.path.realpath(root)
                inside = real == top or real.startswith(top.rstrip(os.sep) + os.sep)
                relative = os.path.relpath(real, top)
                if not inside or any(p.startswith(".") for p in relative.split(os.sep)):
                    raise ReadFailed(
                        FailReason.UNREADABLE, "it became a link that leads out of its drive"
                    )
            refused = not_regular(os.fstat(fd).st_mode)
            if refused is not None:
                raise ReadFailed(FailReason.UNREADABLE, refused)
            # A regular file reads the same without the flag, and a file system that hands
            # open flags to a server (FUSE) must not take it as "do not wait for the data".
            os.set_blocking(fd, True)
        except OSError as e:
            raise ReadFailed(FailReason.UNREADABLE, detail(e)) from e
    except BaseException:
        os.close(fd)
        raise
    return fd


def _opened(fd: int, path: Path) -> str:
    """The real path of an open file (Linux names it under /proc), else of its name."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def storable(text: str) -> str:
    return _UNSTORABLE.sub("\ufffd", text)


def _storable(document: ParsedDocument) -> ParsedDocument:
    """The document with unstorable characters replaced, refused past `MAX_TEXT`."""
    total = sum(len(s.text) for s in document.sections)
    if total > MAX_TEXT:
        raise ReadFailed(
            FailReason.TOO_BIG_UNCOMPRESSED,
            f"{total:,} characters of text; at most {MAX_TEXT:,} are indexed",
        )
    title = None if document.title is None else storable(document.title)
    sections = tuple(
        dataclasses.replace(
            s, text=storable(s.text), headings=tuple(storable(h) for h in s.headings)
        )
        for s in document.sections
    )
    return dataclasses.replace(document, title=title, sections=sections)


def read_document(path: Path, kind: Kind, root: Path | None = None) -> ParsedDocument:
    """The file as a document, or `ReadFailed` saying why not. With `root`, a file
    that is not inside it when opened is not read."""
    fd = open_inside(path, root)
    try:
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise ReadFailed(FailReason.TOO_LARGE, f"{size:,} bytes")
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ReadFailed(FailReason.UNREADABLE, detail(e)) from e
    if len(data) > MAX_BYTES:  # it grew since we looked
        raise ReadFailed(FailReason.TOO_LARGE, f"more than {MAX_BYTES:,} bytes")
    try:
        document: ParsedDocument = _READERS[kind].read(data)
    except ReadFailed:
        raise
    except MemoryError as e:
        raise ReadFailed(FailReason.TOO_BIG_UNCOMPRESSED, "ran out of memory reading it") from e
    except Exception as e:  # a parser's own bug must not stop a pass
        raise ReadFailed(FailReason.MALFORMED, detail(e)) from e
    return _storable(document)
