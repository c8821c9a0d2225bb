"""The readers' entry point: the extension table, the size limit, the txt family, and the
promise that nothing but `ReadFailed` escapes."""

from __future__ import annotations

import os

import pytest

from metis_indexer.documents import FailReason, Kind, ParsedDocument, ReadFailed
from metis_indexer.ingest import readers
from metis_indexer.ingest.readers import markdown

from .paths import BAT, PERF, TIKA_DOCS, TORTURE


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("README.md", Kind.MD),
        ("notes.MARKDOWN", Kind.MD),
        ("page.mdx", Kind.MD),
        ("a.txt", Kind.TXT),
        ("a.text", Kind.TXT),
        ("pep.rst", Kind.TXT),
        ("b.adoc", Kind.TXT),
        ("c.org", Kind.TXT),
        ("d.csv", Kind.TXT),
        ("e.TSV", Kind.TXT),
        ("f.json", Kind.TXT),
        ("g.jsonl", Kind.TXT),
        ("h.log", Kind.TXT),
        ("paper.tex", Kind.TXT),
        ("i.html", Kind.HTML),
        ("j.htm", Kind.HTML),
        ("k.xhtml", Kind.HTML),
        ("l.pdf", Kind.PDF),
        ("m.docx", Kind.DOCX),
        ("macro.docm", None),
        ("template.dotx", None),
        ("movie.srt", None),
        ("Makefile", None),
        ("archive.tar.gz", None),
        ("md", None),
    ],
)
def test_kinds_by_extension_as_the_spec_table(name, kind):
    assert readers.kind_of(name) is kind


def test_the_txt_family_is_one_section_from_line_1():
    doc = readers.read_document(PERF / "python-peps/peps/pep-0008.rst", Kind.TXT)
    assert doc.title is None
    [section] = doc.sections
    assert (section.line, section.headings, section.page) == (1, (), None)
    assert section.text.startswith("PEP: 8\nTitle: Style Guide for Python Code\n")

    csv = readers.read_document(TIKA_DOCS / "testCSV.csv", Kind.TXT)
    assert csv.sections[0].text.startswith("Sample CSV File - Numbers and their Squares,,\n,,\n")

    tex = TORTURE / "py-pdf-sample-files/001-trivial/minimal-document.tex"
    assert (
        readers.read_document(tex, Kind.TXT)
        .sections[0]
        .text.startswith("\\documentclass[a4paper]{scrartcl}\n\n\\begin{document}")
    )


def test_files_without_text_have_no_sections():
    assert readers.read_document(BAT / "empty.txt", Kind.TXT).sections == ()
    assert readers.read_document(BAT / "control_characters.txt", Kind.TXT).sections == ()


def test_a_file_over_64_mb_is_not_read(tmp_path):
    big = tmp_path / "big.md"
    with big.open("wb") as f:
        f.truncate(readers.MAX_BYTES + 1)  # sparse: nothing is written, nothing read
    with pytest.raises(ReadFailed) as failed:
        readers.read_document(big, Kind.MD)
    assert (failed.value.reason, failed.value.detail) == (FailReason.TOO_LARGE, "67,108,865 bytes")
    assert failed.value.message == "larger than 64 MB: 67,108,865 bytes"


def test_a_file_that_cannot_be_opened(tmp_path):
    with pytest.raises(ReadFailed) as failed:
        readers.read_document(tmp_path / "gone.md", Kind.MD)
    assert failed.value.reason is FailReason.UNREADABLE
    assert failed.value.detail == "FileNotFoundError: No such file or directory", "no pod path"


def test_a_reader_bug_is_a_failed_document_not_an_exception(tmp_path, monkeypatch):
    def broken(data: bytes) -> ParsedDocument:
        return {}["missing"]

    monkeypatch.setattr(markdown, "read", broken)
    page = tmp_path / "a.md"
    page.write_text("# A\n")
    with pytest.raises(ReadFailed) as failed:
        readers.read_document(page, Kind.MD)
    assert failed.value.reason is FailReason.MALFORMED
    assert failed.value.detail == "KeyError: 'missing'"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_a_file_without_read_permission(tmp_path):
    page = tmp_path / "secret.md"
    page.write_text("# A\n")
    page.chmod(0)
    with pytest.raises(ReadFailed) as failed:
        readers.read_document(page, Kind.MD)
    assert failed.value.reason is FailReason.UNREADABLE
