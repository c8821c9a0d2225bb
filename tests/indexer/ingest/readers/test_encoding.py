"""Bytes to text on real files: marks, UTF-16/32 without a mark, Latin-1, line endings."""

from __future__ import annotations

import pytest

from metis_indexer.ingest.readers import encoding

from .paths import BAT, CHARDET, TORTURE

WIN_1252 = TORTURE / (
    "apache-tika-test-documents/tika-encoding-detectors/tika-encoding-detector-icu4j"
    "/src/test/resources/test-documents/testTXT_win-1252.txt"
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (BAT / "test_UTF-16LE.txt", "hello world\n"),
        (BAT / "test_UTF-16BE-complicated.txt", "上一伊刀\nfoo bar\nhello world"),
        (BAT / "test_BOM.txt", "hello world\n"),
    ],
    ids=["utf-16le-bom", "utf-16be-bom", "utf-8-bom-dropped"],
)
def test_a_byte_order_mark_names_the_encoding_and_is_dropped(path, expected):
    assert encoding.decode_text(path.read_bytes()) == expected


@pytest.mark.parametrize(
    "name",
    [
        "UTF-16LE/nobom-utf16le",
        "UTF-16BE/nobom-utf16be",
        "UTF-32LE/nobom-utf32le",
        "UTF-32BE/nobom-utf32be",
    ],
)
def test_utf_16_and_32_without_a_mark_are_known_by_their_zero_bytes(name):
    text = encoding.decode_text((CHARDET / f"{name}.txt").read_bytes())
    lines = text.split("\n")
    assert lines[0] == "DateTime,Bid,Ask"
    assert lines[1] == "07/19/2015 21:00:15.469,1.083,1.08332"
    assert len(lines) == 21  # 20 CRLF line ends, the last line unterminated


def test_utf_32_with_a_mark():
    text = encoding.decode_text((CHARDET / "UTF-32/bom-utf-32-le.srt").read_bytes())
    assert text.startswith("1\n00:00:06,500 --> 00:00:09,000\nAbout 2 months ago I found")


def test_text_that_is_not_utf8_is_latin1():
    text = encoding.decode_text((CHARDET / "iso-8859-1/_ude_1.txt").read_bytes())
    assert text.startswith("Nas paginas que em seguida se leem acha-se tão bem determinada")
    assert "observação, a missão da poesia\ncontemporanea" in text


def test_latin1_reads_windows_quotes_as_browsers_do():
    text = encoding.decode_text(WIN_1252.read_bytes())
    assert "“windows” encoding" in text


def test_a_file_of_nul_bytes_is_not_mistaken_for_utf16():
    text = encoding.decode_text((BAT / "regression_tests/issue_3631.txt").read_bytes())
    assert text == "END\n"


def test_cr_only_line_endings_count_as_lines():
    data = (CHARDET / "SHIFT_JIS/_ude_1.txt").read_bytes()
    assert data.count(b"\r") == 753 and b"\n" not in data
    assert encoding.decode_text(data).count("\n") == 753


def test_controls_are_dropped_and_only_newline_breaks_lines():
    text = encoding.decode_text((BAT / "nonprintable.txt").read_bytes())
    assert text == "hello world\n\t\n"
    assert encoding.clean("a\r\nb\rc\fd\x0be\x85f\u2028g\u2029h\x00i") == "a\nb\nc d e f g hi"
    assert encoding.clean("x\r\ny").splitlines() == ["x", "y"]
