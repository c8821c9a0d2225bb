"""Word on real files: headings by style identity in any language, titles, and failures."""

from __future__ import annotations

import zipfile

import pytest

from metis_indexer.documents import FailReason, Kind, ReadFailed
from metis_indexer.ingest import readers
from metis_indexer.ingest.readers import docx

from .paths import POI, TIKA_WORD, TORTURE

PANDOC = TORTURE / "pandoc-test-docx/test/docx"
LEGACY_DOC = "cpansearch.perl.org_src_tobyink_acme-rundoc-0.001_word-lib_hello_world.docm"


def read(path):
    return readers.read_document(path, Kind.DOCX)


def test_localized_heading_style_ids_are_known_by_their_name():
    # German Word: style ids berschrift1..3, whose w:name is "heading 1".."heading 3".
    doc = read(POI / "document/Styles.docx")
    assert doc.kind is Kind.DOCX
    [section] = doc.sections
    assert section.headings == ("Heading1", "Heading2", "Heading3")
    assert section.text == "Standard"
    assert section.page is None and section.line is None


def test_custom_heading_styles_are_known_by_their_outline_level():
    # Persian styles "تیتر اول" / "تیتر دوم", marked only by w:outlineLvl.
    doc = read(POI / "integration/stress004.docx")
    assert doc.title == "کلیدهای تدبر قرآن و پیروزی در زندگی"  # core properties
    assert doc.sections[1].headings == ("نویسنده:",)
    assert doc.sections[1].text == "دکتر خالد بن عبدالکریم اللاحم"
    # "Section Heading", outline level 0:
    doc = read(POI / "document/60316.docx")
    assert [s.headings for s in doc.sections] == [
        ("Objective",),
        ("Experience",),
        ("Education",),
        ("References",),
    ]
    assert doc.sections[-1].text == "References are available upon request."


def test_title_style_when_there_are_no_core_properties():
    doc = read(POI / "document/61787.docx")  # python-docx would invent "Word Document"
    assert doc.title == "Personal Worldview Essay"
    assert [s.headings for s in doc.sections][:4] == [
        (),
        ("Basics",),
        ("Body", "Introduction"),
        ("Body", "Body Paragraphs", "Your worldview"),
    ]
    assert doc.sections[2].text.startswith("Write an introduction that describes your personal")


def test_text_boxes_are_read_once():
    # The box is in mc:AlternateContent twice (DrawingML and a VML fallback).
    [section] = read(TIKA_WORD / "testWORD_text_box.docx").sections
    assert section.text == (
        "This text is directly in the body of the document.\n"
        "This text is inside of a text box in the body of the document."
    )


def test_tracked_changes_read_as_accepted():
    assert read(PANDOC / "track_changes_insertion.docx").sections[0].text == (
        "This is a text with two exciting insertions."
    )
    assert read(PANDOC / "track_changes_deletion.docx").sections[0].text == (
        "This is a text with a deletion."
    )
    assert read(PANDOC / "golden/track_changes_move.docx").sections[0].text == (
        "Here is some text.\nHere is the text to be moved.\nHere is some more text."
    )


def test_strict_open_xml():
    [section] = read(TORTURE / "docling-test-data/tests/data/docx/sources/Strict.docx").sections
    assert section.text == "Some text"


def test_a_template_content_type_is_still_read():
    doc = read(POI / "integration/stress014.docx")  # main part: ...template.main+xml
    assert doc.sections[1].headings == ("ABSTRACT",)
    assert doc.sections[1].text.startswith("All manuscripts must be accompanied by an abstract")


def test_a_paragraph_style_without_a_name():
    [section] = read(TIKA_WORD / "testWORD_no_format.docx").sections
    assert section.text == "This is a piece of text that causes an exception."


@pytest.mark.parametrize(
    ("path", "reason", "detail"),
    [
        (
            POI / "document/bug53475-password-is-pass.docx",
            FailReason.PASSWORD,
            "an encrypted Office document",
        ),
        (
            POI / "document" / LEGACY_DOC,
            FailReason.NOT_A_DOCUMENT,
            "a legacy Word (.doc) or other OLE file",
        ),
        (
            POI / "document/clusterfuzz-testcase-minimized-POIFuzzer-6709287337197568.docx",
            FailReason.MALFORMED,
            "BadZipFile: Bad magic number for central directory",
        ),
        (
            TIKA_WORD / "testWORD_truncated.docx",
            FailReason.MALFORMED,
            "BadZipFile: File is not a zip file",
        ),
        (
            POI / "document/clusterfuzz-testcase-minimized-POIXWPFFuzzer-6733884933668864.docx",
            FailReason.MALFORMED,
            "BadZipFile: Bad CRC-32 for file 'word/theme/theme1.xml'",
        ),
        (
            POI / "integration/stress025.docx",
            FailReason.NOT_A_DOCUMENT,
            "its main part is application/vnd.openxmlformats-officedocument.themeManager+xml",
        ),
    ],
    ids=["encrypted", "legacy-doc", "corrupt-zip", "truncated", "bad-crc", "no-document-part"],
)
def test_failures_name_the_reason_and_the_detail(path, reason, detail):
    with pytest.raises(ReadFailed) as failed:
        read(path)
    assert (failed.value.reason, failed.value.detail) == (reason, detail)


def test_a_zip_bomb_is_refused_from_its_central_directory(tmp_path):
    bomb = tmp_path / "bomb.docx"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        with z.open("word/document.xml", "w", force_zip64=True) as member:
            block = b"\0" * (1 << 20)
            for _ in range(docx.MAX_UNCOMPRESSED // len(block) + 1):
                member.write(block)
    assert bomb.stat().st_size < 2 * 1024 * 1024
    with pytest.raises(ReadFailed) as failed:
        read(bomb)
    assert failed.value.reason is FailReason.TOO_BIG_UNCOMPRESSED
    assert failed.value.detail == "269,484,040 bytes unpacked, over the limit of 268,435,456"
