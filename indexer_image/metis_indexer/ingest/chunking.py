"""Cutting a document's sections into the chunks that are embedded and searched.

A chunk is at most `size` characters of one section; it ends at a
paragraph, sentence or line end when one falls in its second half; the next one starts
`overlap` characters before it ended, on a word; a sentence cut in two is whole in one
of them. The exact rules, with positions as offsets in the section's text:

- The text counts up to its last non-whitespace character. A chunk is a span of it
  with leading and trailing whitespace trimmed, so it is never empty.
- A chunk starting at `a` runs to the end of the text when that is at most `size` away.
  Otherwise it is cut at the last of these in `[a + ceil(size/2), a + size]`:
  a paragraph end (the end of a line's text, when a blank line follows), else a
  sentence end (just after `. ! ? …` and any closing quotes or brackets, followed by
  whitespace; or just after `。！？` and closers, which need none), else a line end,
  else a whitespace character; else it is cut hard at `a + size`.
- A sentence is the trimmed text between two consecutive paragraph or sentence ends.
  When a chunk ends strictly inside a sentence of at most `size` characters that
  started after the chunk did, the next chunk starts at that sentence's first
  character, so the sentence is whole in it. This is the one case where two chunks
  overlap by more than `overlap` (by less than `size`).
- Otherwise the next chunk starts at the first word start at or after
  `max(end - overlap, a + 1)`, `end` being where the trimmed chunk ends, so they
  overlap by at most `overlap`. A word start is a non-whitespace character after
  whitespace, after a CJK character or at the text's start, or a CJK letter (those
  scripts write no spaces). When no word starts before the first non-whitespace
  character `r` at or after `end` (a long word cut hard), it starts at `r`; and when
  `r` is `ceil(size/2)` or more past that start (a long blank run), at `r` too, so no
  chunk holds only what the previous one did.

Guaranteed: every chunk is at most `size` characters; every non-whitespace character is
in a chunk; every sentence of at most `size` characters is whole in at least one chunk;
each chunk after a section's first starts on a word start or exactly where the previous
one ended, and ends further into the text than the previous one.
"""

from __future__ import annotations

import array
import bisect
import re
from collections.abc import Iterator

from metis_indexer import limits
from metis_indexer.documents import Chunk, ParsedDocument

_CLOSERS = "\"'”’)\\]}»」』）"
# Both start with one character class, which the regex engine skips to quickly. A run of
# `.!?…` is tried at its first mark only, so a row of dots (a table of contents) stays
# linear; a run of `。！？` needs no space after it.
_SENTENCE_END = re.compile(
    rf"[.!?…。！？](?:(?<=[。！？])[。！？]*[{_CLOSERS}]*"
    rf"|(?<![.!?…]{{2}})[.!?…]*[{_CLOSERS}]*(?=\s|\Z))"
)
# A line break, a blank line, and the rest of the blank run: a run is one paragraph end.
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n\s*")
_CJK_LETTERS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK = _CJK_LETTERS + "\u3000-\u303f\uff00-\uffef"
_WORD_START = re.compile(rf"(?<![^\s{_CJK}])\S|[{_CJK_LETTERS}]")
_NON_SPACE = re.compile(r"\S")
# Greedy, so they backtrack from the end of the searched range: the last match, found in C.
_LAST_SPACE = re.compile(r"(?s:.*)\s")
_LAST_NON_SPACE = re.compile(r"(?s:.*)\S")


def chunk_document(doc: ParsedDocument, size: int = 1200, overlap: int = 200) -> list[Chunk]:
    """Cut every section of `doc` into chunks that keep its title, headings, page and line."""
    check(size, overlap)
    chunks = []
    for index, section in enumerate(doc.sections):
        text = section.text
        line, counted = section.line, 0
        for start, end in _Cutter(text, size, overlap).spans():
            if line is not None:
                line += text.count("\n", counted, start)
                counted = start
            chunks.append(
                Chunk(
                    title=doc.title,
                    headings=section.headings,
                    text=text[start:end],
                    page=section.page,
                    line=line,
                    section=index,
                    start=start,
                )
            )
    return chunks


def chunk_text(text: str, size: int = 1200, overlap: int = 200) -> list[tuple[int, int]]:
    """The `(start, end)` spans of the chunks of one section's text, in order."""
    check(size, overlap)
    return list(_Cutter(text, size, overlap).spans())


def check(size: int, overlap: int) -> None:
    """Refuse what the limits do not allow (`limits`), before any text is cut."""
    if not limits.CHUNK_SIZE_MIN <= size <= limits.CHUNK_SIZE_MAX:
        raise ValueError(
            f"chunking size must be {limits.CHUNK_SIZE_MIN} to {limits.CHUNK_SIZE_MAX} "
            f"characters, not {size}"
        )
    if not limits.overlap_allowed(size, overlap):
        raise ValueError(
            f"chunking overlap must be at least 0 and less than half the size ({size}), "
            f"not {overlap}"
        )


class _Cutter:
    """One section's text, with its paragraph and sentence ends found once.

    Each cut is then a bisect and a few searches bounded by the chunk size, so a text is
    cut in time linear in its length.
    """

    __slots__ = ("half", "n", "overlap", "paragraphs", "sentences", "size", "text")

    def __init__(self, text: str, size: int, overlap: int) -> None:
        self.text = text
        self.n = len(text.rstrip())
        self.size = size
        self.overlap = overlap
        self.half = (size + 1) // 2
        # Arrays of 8 bytes an end, not lists of ints: a 64 MB file may hold millions.
        self.paragraphs = array.array("q", self._paragraph_ends())
        self.sentences = array.array(
            "q", (m.end() for m in _SENTENCE_END.finditer(text, 0, self.n))
        )

    def _paragraph_ends(self) -> Iterator[int]:
        """Where each line's text ends that a blank line follows (before its trailing blanks)."""
        text = self.text
        for m in _BLANK_LINE.finditer(text, 0, self.n):
            end = m.start()
            while end and text[end - 1].isspace():  # a few blanks at most, in practice
                end -= 1
            yield end

    def spans(self) -> Iterator[tuple[int, int]]:
        """The trimmed `(start, end)` of each chunk, in order."""
        text, n = self.text, self.n
        first = _NON_SPACE.search(text, 0, n)
        if first is None:
            return
        start = first.start()
        while n - start > self.size:
            last = _LAST_NON_SPACE.match(text, start, self._end(start))
            assert last is not None  # a chunk starts on a non-space, and ends after it
            end = last.end()
            yield start, end
            start = self._next_start(start, end)
        yield start, n

    def _end(self, start: int) -> int:
        """Where a chunk that cannot reach the end of the text is cut (before trimming)."""
        low, high = start + self.half, start + self.size
        for ends in (self.paragraphs, self.sentences):
            i = bisect.bisect_right(ends, high)
            if i and ends[i - 1] >= low:
                return ends[i - 1]
        line_end = self.text.rfind("\n", low, high + 1)
        if line_end >= 0:
            return line_end
        space = _LAST_SPACE.match(self.text, low, high + 1)
        return space.end() - 1 if space else high

    def _next_start(self, start: int, end: int) -> int:
        """Where the chunk after the trimmed span `[start, end)` starts."""
        sentence = self._cut_sentence(start, end)
        if sentence is not None:
            return sentence
        after = _NON_SPACE.search(self.text, end, self.n)
        assert after is not None  # the text, rstripped to `n`, goes on past a cut
        resume = after.start()
        word = _WORD_START.search(self.text, max(end - self.overlap, start + 1), resume + 1)
        nearest = word.start() if word else resume
        return resume if resume - nearest >= self.half else nearest

    def _cut_sentence(self, start: int, end: int) -> int | None:
        """The start of the sentence that `[start, end)` cuts, when the next chunk can hold it."""
        i = bisect.bisect_right(self.sentences, end)
        j = bisect.bisect_right(self.paragraphs, end)
        before = max(self.sentences[i - 1] if i else 0, self.paragraphs[j - 1] if j else 0)
        after = min(
            self.sentences[i] if i < len(self.sentences) else self.n,
            self.paragraphs[j] if j < len(self.paragraphs) else self.n,
        )
        if before <= start:
            return None  # the sentence started no later than this chunk did
        first = _NON_SPACE.search(self.text, before, end)
        if first is None:
            return None  # the chunk ends where a sentence does
        # Every end (and the text's) follows a non-space character, so `after - head` is the
        # sentence's trimmed length, and the next chunk resumes before `after`.
        head = first.start()
        return head if after - head <= self.size else None
