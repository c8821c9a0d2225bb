"""Words as search compares them (a search "by words").

Lower case, accents folded, a word is a run of letters and digits; a single
letter is dropped, a single digit kept; no stemming, no stop words.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections import Counter

import numpy as np
import numpy.typing as npt

_WORD = re.compile(r"[^\W_]+")
_ASCII_WORDS = str.maketrans(
    {chr(c): chr(c).lower() if chr(c).isalnum() else " " for c in range(128)}
)
"""ASCII text's letters and digits lower-cased, every other character a space. In ASCII,
`_WORD` matches runs of `[A-Za-z0-9]` and nothing else, so splitting the translated text
finds the same words in the same order, in a third of the time: a pass counts every
chunk's words, and most chunks are ASCII."""


@functools.cache
def _combining() -> npt.NDArray[np.bool_]:
    """Whether each code point is a combining mark, as a table indexed by code point."""
    table = np.zeros(sys.maxunicode + 1, dtype=bool)
    table[[cp for cp in range(sys.maxunicode + 1) if unicodedata.combining(chr(cp))]] = True
    return table


def fold(text: str) -> str:
    """Lower-case and strip accents, so `Configuração` and `configuracao` meet.

    The marks are dropped over the text's code points as an array: a regular expression
    of every combining mark tests each character against hundreds of ranges, and folding
    was most of what indexing a chunk cost."""
    text = text.lower()
    if text.isascii():
        return text
    text = unicodedata.normalize("NFKD", text)
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return points[~_combining()[points]].tobytes().decode("utf-32-le", "surrogatepass")


def _kept(w: str) -> bool:
    """A single letter is no word to search by; a single digit is."""
    return len(w) > 1 or w.isdigit()


def _found(text: str) -> list[str]:
    """Every run of letters and digits of the folded text, single letters included."""
    if text.isascii():
        return text.translate(_ASCII_WORDS).split()
    return _WORD.findall(fold(text))


def words(text: str) -> list[str]:
    """The words of `text`, in order, as the keyword index stores them."""
    return [w for w in _found(text) if _kept(w)]


def counts(text: str) -> Counter[str]:
    """`Counter(words(text))`, counted before single letters are dropped: the rule is
    then tested once per distinct word rather than once per word (a pass counts the
    words of every chunk)."""
    found = Counter(_found(text))
    for w in [w for w in found if not _kept(w)]:
        del found[w]
    return found
