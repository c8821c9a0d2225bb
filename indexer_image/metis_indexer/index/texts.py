"""The texts a chunk is embedded, searched by words and reranked as: one place, so the
three stay in step. The index counts a chunk's words from `searched`; a pass
embeds `embedded`, and a search reranks `reranked`. The model's own prefixes are added by its
client (`models.prefixes`)."""

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
    return passage(chunk.title, chunk.headings, chunk.text)


def passage(title: str | None, headings: Sequence[str], text: str) -> str:
    """`embedded` of a chunk as the store keeps it (its file's title, its headings and
    text): a new model's vectors made from the stored chunks are those a pass would make."""
    path = " > ".join(context(title, headings))
    return f"{path}\n\n{text}" if path else text


TITLE_WEIGHT = 2
"""How many times BM25 counts a chunk's title: a title field weighed apart from the passage
(BM25F with one length normalisation). On SciFact's train split, 2 gave nDCG@10 +0.005 over
1, and 3 less than 2; a field with its own length normalisation did no better
(docs/quality.md, "Quality: BEIR SciFact")."""


def searched(title: str | None, headings: Sequence[str], text: str) -> str:
    """What BM25 indexes of a chunk: the title `TITLE_WEIGHT` times, headings, text."""
    titles = (title,) * TITLE_WEIGHT if title else ()
    return "\n".join(p for p in (*titles, *headings, text) if p)


WORDS_VERSION = "2"
"""The version of a chunk's words as BM25 counts them (`counted`: `searched`, then
`tokens.counts`). Change it with either: an index whose words are of another version has
them counted again from its stored texts, without reading its documents again
(`Index.adopt`). 1: the title once; 2: the title `TITLE_WEIGHT` times."""


def counted(title: str | None, headings: Sequence[str], text: str) -> Counter[str]:
    """A chunk's words and how often each occurs: what the keyword index stores of it."""
    return tokens.counts(searched(title, headings, text))


def reranked(title: str | None, headings: Sequence[str], text: str) -> str:
    """What the reranker reads of a chunk: title, headings, text, each once."""
    return "\n".join(p for p in (title, *headings, text) if p)
