"""How the searches of the last minute were answered, for the status: a base whose index
is complete may still answer most questions by words only (its embedding model too slow
for questions, or down), and a status that says "searches are answered" must know it.

One bucket per second of the window, each holding its counts by outcome and the words of
its fallbacks: the memory is bounded however many searches come."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Literal

from metis_indexer.schema import Searches

WINDOW_SECONDS = 60
"""The searches a status tells of: those of the last minute, long enough for a few
questions of a quiet base, short enough that an outage that ended leaves the status soon."""
REASON_CHARS = 200
"""At most this much of a fallback's words in a status (a model's error may be long)."""
REASONS_PER_SECOND = 8
"""Different fallback words kept per second (errors that name a request each differ)."""

Fallback = Literal["by_words_only", "without_reranker"]
"""What a search answered without: the embedding model (by words only), the reranker."""
Outcome = Literal["answered", "by_words_only", "without_reranker", "failed"]
"""How one search ended: as asked, one of the fallbacks, or failed (a 5xx answer)."""
WORST_FIRST: tuple[Outcome, ...] = ("failed", "by_words_only", "without_reranker", "answered")
"""A search counts once, by the worst that befell it."""


def outcome(fallbacks: Sequence[tuple[Fallback, str]]) -> tuple[Outcome, str | None]:
    """A search that answered: its outcome, and the words of the fallback it is counted
    by (None when it answered as asked)."""
    for worst in WORST_FIRST:
        for kind, why in fallbacks:
            if kind == worst:
                return kind, why
    return "answered", None


def short(text: str) -> str:
    """A fallback's words as a status shows them: one line, at most REASON_CHARS."""
    line = " ".join(text.split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1].rstrip() + "…"


@dataclasses.dataclass(slots=True)
class _Second:
    second: int
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    reasons: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


class RecentSearches:
    """The rolling account. Times are given (`now`, in seconds of a monotonic clock), so
    the account is a pure structure and its window is tested with any clock."""

    def __init__(self, seconds: int = WINDOW_SECONDS) -> None:
        self.seconds = seconds
        self._buckets: collections.deque[_Second] = collections.deque()

    def record(self, now: float, what: Outcome, reason: str | None = None) -> None:
        self._expire(now)
        second = int(now)
        if not self._buckets or self._buckets[-1].second < second:
            self._buckets.append(_Second(second))
        bucket = self._buckets[-1]  # a clock that went back counts in the newest second
        bucket.counts[what] += 1
        said = short(reason) if reason else ""
        if said and (said in bucket.reasons or len(bucket.reasons) < REASONS_PER_SECOND):
            bucket.reasons[said] += 1

    def account(self, now: float) -> Searches:
        """The window's counts, and its most frequent fallback words (of equally frequent
        ones, those met last): a search is counted for `seconds` at most, and
        `seconds` - 1 at least."""
        self._expire(now)
        counts: collections.Counter[str] = collections.Counter()
        reasons: collections.Counter[str] = collections.Counter()
        for bucket in reversed(self._buckets):  # newest first: ties go to the later words
            counts.update(bucket.counts)
            reasons.update({r: bucket.reasons[r] for r in reversed(bucket.reasons)})
        top = reasons.most_common(1)
        return Searches(
            seconds=self.seconds,
            answered=counts["answered"],
            by_words_only=counts["by_words_only"],
            without_reranker=counts["without_reranker"],
            failed=counts["failed"],
            reason=top[0][0] if top else None,
        )

    def _expire(self, now: float) -> None:
        oldest = int(now) - self.seconds
        while self._buckets and self._buckets[0].second <= oldest:
            self._buckets.popleft()
