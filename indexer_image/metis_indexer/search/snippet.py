"""The snippet of a result: up to 240 characters around the sentence holding most
of the question's words (the `snippet` of a result's citation)."""

from __future__ import annotations

import re
from collections.abc import Collection

from metis_indexer.index import tokens

LIMIT = 240
_WORD_SLACK = 24
_SENTENCE_END = re.compile(r"(?<=[.!?…。！？])\s+|\n\s*\n")


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence, splitting after end punctuation and at blank lines."""
    spans = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        if m.start() > start:
            spans.append((start, m.start()))
        start = m.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def snippet(text: str, question_words: Collection[str], limit: int = LIMIT) -> str:
    """The best sentence, widened with its neighbours' text or cut to `limit` characters.

    Cut ends are marked with `…`, so a reader knows the passage goes on.
    """
    spans = sentences(text)
    if not spans:
        return ""
    wanted = set(question_words)

    def hits(span: tuple[int, int]) -> int:
        return len(wanted.intersection(tokens.words(text[span[0] : span[1]])))

    best = max(spans, key=hits)  # the first of equals: earlier sentences win ties
    start, end = best
    if end - start > limit:
        first = _first_hit(text, start, end, wanted)
        start = max(start, min(first - limit // 3, end - limit))
        end = start + limit
    else:
        room = limit - (end - start)
        before = min(room // 2, start)
        start -= before
        end = min(len(text), end + room - before)
        start = max(0, min(start, end - limit))
    start, end = _on_words(text, start, end)
    out = text[start:end].strip()
    out = re.sub(r"\s+", " ", out)
    prefix = "…" if start > 0 else ""
    suffix = "…" if end < len(text) else ""
    return _fit(prefix + out + suffix, limit)


def _first_hit(text: str, start: int, end: int, wanted: set[str]) -> int:
    for m in re.finditer(r"[^\W_]+", text[start:end]):
        if tokens.fold(m.group()) in wanted:
            return start + m.start()
    return start


def _on_words(text: str, start: int, end: int) -> tuple[int, int]:
    """Move a window's cut ends off the middle of words (not past a short word's length)."""
    if 0 < start < len(text) and not text[start - 1].isspace():
        nxt = text.find(" ", start, min(end, start + _WORD_SLACK))
        if nxt != -1:
            start = nxt + 1
    if 0 < end < len(text) and not text[end].isspace():
        prev = text.rfind(" ", max(start, end - _WORD_SLACK), end)
        if prev > start:
            end = prev
    return start, end


def _fit(s: str, limit: int) -> str:
    return s if len(s) <= limit else s[: limit - 1] + "…"
