"""The readers' boundary: what comes out can be stored and sent to a model, is bounded
in size, and was read from inside its drive, whatever the name listed became."""

from __future__ import annotations

import json
import os

import pytest

from metis_indexer.documents import FailReason, Kind, ParsedDocument, ReadFailed
from metis_indexer.ingest import readers
from metis_indexer.ingest.runner import file_hash

from .paths import TIKA_PDF

SURROGATE_PDF = TIKA_PDF / "testPDFVarious.pdf"
"""pypdf returns lone surrogates for its Gothic text."""


def all_text(doc: ParsedDocument) -> str:
    return "".join(
        [doc.title or ""]
        + [h for s in doc.sections for h in s.headings]
        + [s.text for s in doc.sections]
    )


def test_a_pdf_whose_parser_yields_lone_surrogates_comes_out_storable():
    doc = readers.read_document(SURROGATE_PDF, Kind.PDF)
    text = all_text(doc)
    assert "Gothic text" in text
    assert "\ufffd" in text, "the surrogates are replaced, not dropped silently"
    text.encode("utf-8")  # would raise on a lone surrogate
    json.dumps(text, ensure_ascii=False).encode("utf-8")


def test_nul_characters_are_replaced(tmp_path):
    page = tmp_path / "nul.md"
    page.write_bytes(b"# Title\x00here\n\nBody with a \x00 NUL.\n")
    text = all_text(readers.read_document(page, Kind.MD))
    assert "\x00" not in text and "here" in text and "NUL" in text


def test_storable_replaces_only_what_cannot_be_stored():
    fine = "Configura\u00e7\u00e3o \U0001f600 \u65e5\u672c"
    assert readers.storable(fine) == fine
    assert readers.storable("a\ud800b\x00c\udfffd") == "a\ufffdb\ufffdc\ufffdd"


def test_text_past_the_bound_fails_the_document(monkeypatch, tmp_path):
    page = tmp_path / "long.txt"
    page.write_text("word " * 400)
    monkeypatch.setattr(readers, "MAX_TEXT", 1000)
    with pytest.raises(ReadFailed) as e:
        readers.read_document(page, Kind.TXT)
    assert e.value.reason is FailReason.TOO_BIG_UNCOMPRESSED
    assert "at most 1,000" in e.value.detail
    monkeypatch.setattr(readers, "MAX_TEXT", 2000)
    assert readers.read_document(page, Kind.TXT).sections


@pytest.fixture
def drive(tmp_path):
    root = tmp_path / "drive"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "page.md").write_text("# Inside\n\nThe drive's own words.\n")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "secret.md").write_text("# Hidden\n\nzanzibar inside a hidden folder\n")
    outside = tmp_path / "outside.md"
    outside.write_text("# Outside\n\nzanzibar outside the drive\n")
    return root


def swap_for_link(name, target):
    name.unlink()
    os.symlink(target, name)


def test_a_name_that_became_a_link_out_of_the_drive_is_not_read(drive):
    page = drive / "docs" / "page.md"
    assert readers.read_document(page, Kind.MD, drive).title == "Inside"
    swap_for_link(page, drive.parent / "outside.md")
    with pytest.raises(ReadFailed) as e:
        readers.read_document(page, Kind.MD, drive)
    assert e.value.reason is FailReason.UNREADABLE
    assert e.value.detail == "it became a link that leads out of its drive"
    with pytest.raises(ReadFailed):
        file_hash(page, drive)


def test_a_folder_that_became_a_link_out_of_the_drive_is_not_read(drive, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "page.md").write_text("# Elsewhere\n\nzanzibar\n")
    os.rename(drive / "docs", tmp_path / "moved")
    os.symlink(elsewhere, drive / "docs")
    with pytest.raises(ReadFailed, match="leads out of its drive"):
        readers.read_document(drive / "docs" / "page.md", Kind.MD, drive)


def test_a_link_to_a_hidden_file_of_the_drive_is_not_read(drive):
    page = drive / "docs" / "page.md"
    swap_for_link(page, drive / ".hidden" / "secret.md")
    with pytest.raises(ReadFailed, match="leads out of its drive"):
        readers.read_document(page, Kind.MD, drive)


def test_a_link_inside_the_drive_is_read(drive):
    (drive / "docs" / "other.md").write_text("# Other\n\nStill inside.\n")
    link = drive / "docs" / "alias.md"
    os.symlink(drive / "docs" / "other.md", link)
    assert readers.read_document(link, Kind.MD, drive).title == "Other"
    assert file_hash(link, drive) == file_hash(drive / "docs" / "other.md")


def test_failure_details_carry_no_pod_paths(tmp_path):
    gone = tmp_path / "gone.md"
    with pytest.raises(ReadFailed) as e:
        readers.read_document(gone, Kind.MD)
    assert str(tmp_path) not in e.value.detail
    assert e.value.detail == "FileNotFoundError: No such file or directory"
