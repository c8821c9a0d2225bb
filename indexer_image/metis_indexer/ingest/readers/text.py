"""The txt family (.txt, .rst, .csv, .json, .log, .tex…): one section from line 1.

The index keeps only "the line each passage starts at" for these kinds, and the
chunker derives that from offsets, so the whole file is one section that starts
at line 1. Titles and headings are not guessed (an .rst title would be, but a
citation does not promise it).
"""

from __future__ import annotations

from metis_indexer.documents import Kind, ParsedDocument, Section
from metis_indexer.ingest.readers import encoding


def read(data: bytes) -> ParsedDocument:
    text = encoding.decode_text(data)
    sections = (Section(headings=(), text=text, line=1),) if text.strip() else ()
    return ParsedDocument(title=None, kind=Kind.TXT, sections=sections)
