"""Bytes to text, by one rule, with line breaks every reader can count.

The rule: text that is not UTF-8 is read as Latin-1, UTF-16 by its
byte-order mark. We also read UTF-32 by its mark, and UTF-16/32 without one when
the NUL bytes give it away (an ASCII-heavy text with every other byte zero is
not Latin-1). "Latin-1" is decoded the way browsers read the label: windows-1252,
whose five unassigned bytes keep their Latin-1 code points, so curly quotes and
euro signs of older Windows files come out right.

Every reader's text goes through `clean`, so `\\n` is the only line break: CRLF
and CR-only endings become `\\n`, and characters Python's `splitlines` would also
break on (form feed, NEL, line and paragraph separators) become spaces. That is
what lets a section's `line` plus a count of `\\n` name the source line exactly.
"""

from __future__ import annotations

import codecs
import re

_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

_CP1252_HOLES = {0x81, 0x8D, 0x8F, 0x90, 0x9D}
_LATIN1_TABLE = "".join(
    chr(b) if b < 0x80 or b in _CP1252_HOLES else bytes([b]).decode("cp1252") for b in range(256)
)

_SPACE_FOR = "\f\v\x85\u2028\u2029"
_DROPPED = [c for c in range(0x20) if chr(c) not in "\t\n\r\f\v"] + [0x7F]
_CLEAN_TABLE: dict[int, str | None] = {c: None for c in _DROPPED}
_CLEAN_TABLE.update({ord(c): " " for c in _SPACE_FOR})

_WIDE: tuple[tuple[str, int, int, int, float], ...] = (
    # name, code unit width, a lane mostly zero, the lane of the low byte, share of zeros
    ("utf-32-le", 4, 3, 0, 0.9),
    ("utf-32-be", 4, 0, 3, 0.9),
    ("utf-16-le", 2, 1, 0, 0.5),
    ("utf-16-be", 2, 0, 1, 0.5),
)

_SNIFF = 4096
"""Bytes looked at to guess UTF-16/32 without a mark: plenty for a pattern of NULs."""


def bom(data: bytes) -> tuple[str, int] | None:
    """The encoding a byte-order mark names, and the mark's length."""
    for mark, name in _BOMS:
        if data.startswith(mark):
            return name, len(mark)
    return None


def latin1(data: bytes) -> str:
    """Latin-1 as browsers read it (windows-1252); never fails."""
    return data.decode("latin-1").translate(_LATIN1_TABLE)


def wide_without_bom(data: bytes) -> str | None:
    """UTF-16/32 without a mark, when its zero bytes fall in one lane only.

    Text of mostly ASCII or Latin letters encoded as UTF-16 has a zero in every
    other byte, and UTF-32 always has one in its top byte. A file of NULs, or
    binary, has zeros in every lane and is left to the other rules; a strict
    decode confirms the guess.
    """
    head = data[:_SNIFF]
    for name, width, zero_lane, letter_lane, share in _WIDE:
        units = len(head) // width
        if units < 8 or len(data) % width:
            continue
        zeros = head[zero_lane : units * width : width].count(0) / units
        letters_zero = head[letter_lane : units * width : width].count(0) / units
        if zeros > share and letters_zero < 0.1:
            try:
                return data.decode(name)
            except UnicodeDecodeError:
                continue
    return None


def decode(data: bytes) -> str:
    """A text file's bytes as text, by the rule above (mark, UTF-8, else Latin-1)."""
    marked = bom(data)
    if marked is not None:
        name, skip = marked
        return data[skip:].decode(name, errors="replace")
    if b"\x00" in data[:_SNIFF]:
        wide = wide_without_bom(data)
        if wide is not None:
            return wide
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return latin1(data)


_NEWLINES = re.compile(r"\r\n?")


def clean(text: str) -> str:
    """`\\n` as the only line break; C0 controls other than tab dropped."""
    if "\r" in text:
        text = _NEWLINES.sub("\n", text)
    return text.translate(_CLEAN_TABLE)


def decode_text(data: bytes) -> str:
    """`decode`, then `clean`: what every text-like reader starts from."""
    return clean(decode(data))
