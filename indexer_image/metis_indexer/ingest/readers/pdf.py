"""PDF: the text layer, page by page (pypdf).

No OCR: a PDF where no page has any text is reported as a scan. A PDF that opens
with the empty password (owner-password-only files, common for "no copying"
PDFs) is read; one that needs a password is reported as such. pypdf is lenient
(`strict=False`) so damaged files are repaired where it can; a page whose text
cannot be extracted is skipped, not the whole file. There is no time limit here:
a slow parse is stopped by the reader pool, which runs this where it can be killed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator

from pypdf import PasswordType, PdfReader
from pypdf.errors import EmptyFileError

from metis_indexer.documents import FailReason, Kind, ParsedDocument, ReadFailed, Section
from metis_indexer.ingest.readers import encoding
from metis_indexer.ingest.readers.failures import detail

_BLANK_RUNS = re.compile(r"\n{3,}")


def read(data: bytes) -> ParsedDocument:
    with _quiet():
        reader = _open(data)
        count = _page_count(reader)
        sections: list[Section] = []
        errors: list[str] = []
        for number in range(1, count + 1):
            try:
                text = _tidy(reader.pages[number - 1].extract_text())
            except Exception as e:  # pypdf raises anything on a damaged page
                errors.append(detail(e, f"page {number}"))
                continue
            if text:
                sections.append(Section(headings=(), text=text, page=number))
        if not sections:
            if errors:
                raise ReadFailed(
                    FailReason.MALFORMED,
                    f"no text; {len(errors)} of its {count} pages could not be read: {errors[0]}",
                )
            raise ReadFailed(FailReason.SCANNED_PDF, f"no text on any of its {count} pages")
        return ParsedDocument(title=_title(reader), kind=Kind.PDF, sections=tuple(sections))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silences pypdf's warnings about damaged files: a reason is reported instead."""
    log = logging.getLogger("pypdf")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def _tidy(text: str) -> str:
    """Page text without the blank runs PDF layouts leave: lines right-trimmed,
    at most one empty line in a row."""
    lines = [line.rstrip() for line in encoding.clean(text).split("\n")]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n")


def _open(data: bytes) -> PdfReader:
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
    except EmptyFileError as e:
        raise ReadFailed(FailReason.MALFORMED, "empty file") from e
    except NotImplementedError as e:  # pypdf knows only the Standard security handler
        raise ReadFailed(FailReason.PASSWORD, f"unsupported encryption: {e}") from e
    except Exception as e:
        raise ReadFailed(FailReason.MALFORMED, detail(e)) from e
    try:
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            raise ReadFailed(FailReason.PASSWORD, "the empty password does not open it")
    except ReadFailed:
        raise
    except Exception as e:
        raise ReadFailed(FailReason.MALFORMED, detail(e, "decrypting")) from e
    return reader


def _page_count(reader: PdfReader) -> int:
    try:
        count = len(reader.pages)
    except Exception as e:
        raise ReadFailed(FailReason.MALFORMED, detail(e, "page tree")) from e
    if count == 0:
        raise ReadFailed(FailReason.MALFORMED, "it has no pages")
    return count


def _title(reader: PdfReader) -> str | None:
    try:
        title = reader.metadata.title if reader.metadata is not None else None
    except Exception:  # a damaged info dictionary costs the title, not the document
        return None
    if not isinstance(title, str):
        return None
    return " ".join(encoding.clean(title).split()) or None
