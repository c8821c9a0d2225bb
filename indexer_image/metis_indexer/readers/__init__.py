"""Readers: one module per kind of document, each turning bytes into a `Document`.

`read_document` is the one entry point: it checks the size limit before reading
a byte, reads the file, and hands the bytes to the kind's reader. Whatever goes
wrong comes out as `ReadFailed` with a reason from the fixed vocabulary; no
other exception escapes. It has no time limit of its own: run it through
`metis_indexer.readers.pool`, which can stop a parse that runs too long.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePath
from types import ModuleType

from metis_indexer.documents import Document, FailReason, Kind, ReadFailed
from metis_indexer.readers import docx, html, markdown, pdf, text
from metis_indexer.readers.failures import detail

MAX_BYTES = 64 * 1024 * 1024
"""A file larger than this is not read (spec 001: "at most 64 MB")."""

KINDS: Mapping[str, Kind] = {
    **dict.fromkeys((".md", ".markdown", ".mdx"), Kind.MD),
    **dict.fromkeys((".txt", ".text", ".rst", ".adoc", ".org", ".csv", ".tsv"), Kind.TXT),
    **dict.fromkeys((".json", ".jsonl", ".log", ".tex"), Kind.TXT),
    **dict.fromkeys((".html", ".htm", ".xhtml"), Kind.HTML),
    ".pdf": Kind.PDF,
    ".docx": Kind.DOCX,
}
"""Extension (lower case) to kind: the table of spec 001, "Files read"."""

_READERS: Mapping[Kind, ModuleType] = {
    Kind.MD: markdown,
    Kind.TXT: text,
    Kind.HTML: html,
    Kind.PDF: pdf,
    Kind.DOCX: docx,
}
"""Each kind's module; its `read(data: bytes) -> Document` raises only `ReadFailed`."""


def kind_of(path: str | PurePath) -> Kind | None:
    """The kind a file is read as, by its extension in any case; None: not read."""
    return KINDS.get(PurePath(path).suffix.lower())


def read_document(path: Path, kind: Kind) -> Document:
    """The file as a document, or `ReadFailed` saying why not."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise ReadFailed(FailReason.TOO_LARGE, f"{size:,} bytes")
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ReadFailed(FailReason.UNREADABLE, detail(e)) from e
    if len(data) > MAX_BYTES:  # it grew since we looked
        raise ReadFailed(FailReason.TOO_LARGE, f"more than {MAX_BYTES:,} bytes")
    try:
        document: Document = _READERS[kind].read(data)
    except ReadFailed:
        raise
    except MemoryError as e:
        raise ReadFailed(FailReason.TOO_BIG_UNCOMPRESSED, "ran out of memory reading it") from e
    except Exception as e:  # a parser's own bug must not stop a pass
        raise ReadFailed(FailReason.MALFORMED, detail(e)) from e
    return document
