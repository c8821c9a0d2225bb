"""Chunks of real documents have the words the regular expression finds: counting split
ASCII text on translated spaces instead (`tokens`), and the counts must not change, or
`texts.WORDS_VERSION` would have to."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from metis_indexer.documents import ReadFailed
from metis_indexer.index import texts
from metis_indexer.index.tokens import fold
from metis_indexer.ingest import chunking, readers, sources

from .paths import CHARDET, PERF


def regex_counts(title, headings, text) -> Counter[str]:
    """A chunk's words as the regular expression over the folded text counts them."""
    found = re.findall(r"[^\W_]+", fold(texts.searched(title, headings, text)))
    return Counter(w for w in found if len(w) > 1 or w.isdigit())


def chunks_of(folder: Path, every: int) -> list:
    listing = sources.walk(folder)
    out = []
    for f in listing.files[::every]:
        try:
            document = readers.read_document(f.absolute, f.kind, folder)
        except ReadFailed:
            continue
        out += chunking.chunk_document(document, 1200, 200)
    return out


@pytest.mark.parametrize(
    ("folder", "every"),
    [(CHARDET, 1), (PERF / "python-peps", 10)],
    ids=["chardet-every-encoding", "python-peps-every-tenth"],
)
def test_chunks_count_the_words_the_regular_expression_finds(folder, every):
    chunks = chunks_of(folder, every)
    assert any(not c.text.isascii() for c in chunks)
    assert any(c.text.isascii() for c in chunks)
    for c in chunks:
        counted = texts.counted(c.title, c.headings, c.text)
        assert list(counted.items()) == list(regex_counts(c.title, c.headings, c.text).items())
