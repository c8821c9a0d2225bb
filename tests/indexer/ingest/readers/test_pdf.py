"""PDF on real files: pages, empty-password encryption, and each way a PDF fails."""

from __future__ import annotations

import logging

import pytest

from metis_indexer.documents import FailReason, Kind, ReadFailed
from metis_indexer.ingest import readers

from .paths import TIKA_PDF, TORTURE

OCRMYPDF = TORTURE / "ocrmypdf-test-resources/tests/resources"


def read(path):
    return readers.read_document(path, Kind.PDF)


def test_one_section_per_page_numbered_from_1():
    doc = read(TORTURE / "py-pdf-sample-files/004-pdflatex-4-pages/pdflatex-4-pages.pdf")
    assert doc.kind is Kind.PDF
    assert doc.title is None
    assert [s.page for s in doc.sections] == [1, 2, 3, 4]
    assert doc.sections[0].text.startswith(
        "Hello, here is some text without a meaning. This text should show what a printed text\n"
    )
    assert doc.sections[3].text.startswith("in of the original language.")
    assert all(s.line is None and s.headings == () for s in doc.sections)


def test_pages_without_text_are_left_out_and_the_others_keep_their_number():
    doc = read(OCRMYPDF / "multipage.pdf")  # 6 pages; only page 4 has an OCR text layer
    assert [s.page for s in doc.sections] == [4]


def test_a_page_that_cannot_be_extracted_is_skipped_not_the_file(caplog):
    with caplog.at_level(logging.DEBUG):
        doc = read(TIKA_PDF / "testPDF_bad_page_303226.pdf")  # pages 2, 12, 13 are damaged
    assert [s.page for s in doc.sections] == [1, *range(3, 12), *range(14, 20)]
    assert not [r for r in caplog.records if r.name.startswith("pypdf")]  # no noise in the log


def test_encrypted_with_an_empty_user_password_is_read():
    doc = read(TIKA_PDF / "testPDF_protected.pdf")
    assert doc.title == (
        "Rethinking the Financial Network, Speech by Andrew G Haldane, Executive Director, "
        "Financial Stability delivered at the Financial Student Association, Amsterdam on "
        "28 April 2009"
    )
    assert len(doc.sections) == 41
    assert doc.sections[0].text.startswith("RETHINKING THE FINANCIAL NETWORK\n\nSpeech by\n")


def test_non_latin_text():
    doc = read(TORTURE / "py-pdf-sample-files/015-arabic/habibi.pdf")
    assert doc.title == "habibi"
    assert doc.sections[0].text.startswith("حَبيبي habibi حَبيبي")


@pytest.mark.parametrize(
    ("path", "reason", "detail"),
    [
        (
            TORTURE / "camelot-test-files/tests/files/health_protected.pdf",
            FailReason.PASSWORD,
            "the empty password does not open it",
        ),
        (OCRMYPDF / "3small.pdf", FailReason.SCANNED_PDF, "no text on any of its 3 pages"),
        (OCRMYPDF / "invalid.pdf", FailReason.MALFORMED, "PdfReadError: startxref not found"),
        (TORTURE / "pdfplumber-test-pdfs/tests/pdfs/empty.pdf", FailReason.MALFORMED, "empty file"),
        (
            TORTURE / "pdfjs-test-pdfs/test/pdfs/poppler-90-0-fuzzed.pdf",
            FailReason.MALFORMED,
            "no text; 14 of its 16 pages could not be read: page 1: PdfStreamError: Invalid "
            "hexadecimal character in ASCIIHexDecode stream",
        ),
    ],
    ids=["password-required", "image-only-scan", "no-xref", "0-bytes", "no-page-readable"],
)
def test_failures_name_the_reason_and_the_parser_detail(path, reason, detail):
    with pytest.raises(ReadFailed) as failed:
        read(path)
    assert failed.value.reason is reason
    assert failed.value.detail.startswith(detail)
