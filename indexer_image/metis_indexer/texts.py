"""The texts a chunk is embedded, searched by words and reranked as: one place, so the
three stay in step (spec 002). The model's own prefixes are added by its client
(`models.prefixes`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from metis_indexer.documents import Chunk
from metis_indexer.index import tokens


def context(title: str | None, headings: Sequence[str]) -> tuple[str, ...]:
    """Title and headings, outermost first; a first heading that repeats the title
    (a Markdown page's `# Title`) is said once."""
    if title and headings and headings[0] == title:
        headings = headings[1:]
    return tuple(p for p in (title, *headings) if p)


def embedded(chunk: Chunk) -> str:
    """What is embedded: `Title > H1 > H2`, then the passage."""
    path = " > ".join(context(chunk.title, chunk.headings))
    return f"{path}\n\n{chunk.text}" if path else chunk.text


def searched(title: str | None, headings: Sequence[str], text: str) -> str:
    """What BM25 indexes of a chunk, and what the reranker reads: title, headings, text."""
    return "\n".join(p for p in (title, *headings, text) if p)


def counted(title: str | None, headings: Sequence[str], text: str) -> Counter[str]:
    """A chunk's words and how often each occurs: what the keyword index stores of it."""
    return tokens.counts(searched(title, headings, text))
