"""Words as search compares them (spec 002, "By words").

Lower case, accents folded, a word is a run of letters and digits; a single
letter is dropped, a single digit kept; no stemming, no stop words.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

_WORD = re.compile(r"[^\W_]+")


@functools.cache
def _combining_marks() -> re.Pattern[str]:
    """A class of every combining mark, built once: faster than a per-character test."""
    ranges: list[str] = []
    start = prev = -2
    for cp in range(sys.maxunicode + 1):
        if unicodedata.combining(chr(cp)):
            if cp != prev + 1:
                if start >= 0:
                    ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(prev))}")
                start = cp
            prev = cp
    ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(prev))}")
    return re.compile(f"[{''.join(ranges)}]+")


def fold(text: str) -> str:
    """Lower-case and strip accents, so `Configuração` and `configuracao` meet."""
    text = text.lower()
    if text.isascii():
        return text
    return _combining_marks().sub("", unicodedata.normalize("NFKD", text))


def words(text: str) -> list[str]:
    """The words of `text`, in order, as the keyword index stores them."""
    return [w for w in _WORD.findall(fold(text)) if len(w) > 1 or w.isdigit()]
