"""The shapes every reader produces and the chunker consumes.

Readers turn a file into a `ParsedDocument` (or raise `ReadFailed`); the chunker turns
a `ParsedDocument` into `Chunk`s. Both are plain frozen dataclasses: they are created by
the thousand per pass, and they never cross a process or HTTP boundary unchecked.
"""

from __future__ import annotations

import dataclasses
import enum


class Kind(enum.StrEnum):
    """The kinds of document Metis reads."""

    MD = "md"
    TXT = "txt"
    HTML = "html"
    PDF = "pdf"
    DOCX = "docx"


class FailReason(enum.StrEnum):
    """Why a document could not be read: a short fixed vocabulary.

    The reason is what `GET /v1/documents` lists and what metrics count by; the
    free-text `detail` of `ReadFailed` says more (the parser's own message).
    """

    TOO_LARGE = "larger than 64 MB"
    SCANNED_PDF = "scanned PDF without a text layer (no OCR)"
    PASSWORD = "password-protected"
    MALFORMED = "malformed document"
    TIMEOUT = "took longer than its time limit"
    TOO_BIG_UNCOMPRESSED = "decompresses to more than the size limit"
    NOT_A_DOCUMENT = "not a document of its kind"
    UNREADABLE = "could not be read from its drive"
    EMBEDDING_REFUSED = "refused by the embedding model"
    NOT_STORED = "could not be stored in the index"


class ReadFailed(Exception):
    """A document that cannot be read; the pass records it and moves on."""

    def __init__(self, reason: FailReason, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)

    @property
    def message(self) -> str:
        return str(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Section:
    """A run of text under one heading path.

    `line` is the source line (from 1) of the first character of `text`, and
    `text` keeps the source's line breaks from there, so any offset in `text`
    maps back to its line. `page` is a PDF's page (from 1). Kinds without lines
    or pages leave them None.
    """

    headings: tuple[str, ...]
    text: str
    page: int | None = None
    line: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ParsedDocument:
    """A file as its reader parsed it: its title, and its text in sections."""

    title: str | None
    kind: Kind
    sections: tuple[Section, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """A passage of one section, with everything its citation needs."""

    title: str | None
    headings: tuple[str, ...]
    text: str
    page: int | None
    line: int | None
    section: int
    start: int
