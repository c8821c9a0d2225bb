"""The rolling account of the last minute's searches, as tables over a given clock: what
each search counts as, when it leaves the window, which words the status gives."""

from __future__ import annotations

import pytest

from metis_indexer.schema import Searches
from metis_indexer.search_health import (
    REASON_CHARS,
    REASONS_PER_SECOND,
    Fallback,
    Outcome,
    RecentSearches,
    outcome,
    short,
)

SLOW = "embedding model m did not answer (no answer within 10 s): results by keywords only"
DOWN = "embedding model m did not answer (connection refused): results by keywords only"
RERANKER = "reranker r did not answer (no answer within 10 s): results in the fused order"
NOTHING = Searches(
    seconds=60, answered=0, by_words_only=0, without_reranker=0, failed=0, reason=None
)


@pytest.mark.parametrize(
    ("fallbacks", "counted"),
    [
        pytest.param([], ("answered", None), id="as-asked"),
        pytest.param([("without_reranker", RERANKER)], ("without_reranker", RERANKER), id="rr"),
        pytest.param([("by_words_only", SLOW)], ("by_words_only", SLOW), id="words"),
        pytest.param(
            [("without_reranker", RERANKER), ("by_words_only", DOWN)],
            ("by_words_only", DOWN),
            id="the-worst-counts",
        ),
    ],
)
def test_a_search_counts_once_by_the_worst_that_befell_it(
    fallbacks: list[tuple[Fallback, str]], counted: tuple[Outcome, str | None]
) -> None:
    assert outcome(fallbacks) == counted


Searched = tuple[float, Outcome, str | None]


@pytest.mark.parametrize(
    ("searched", "now", "account"),
    [
        pytest.param([], 100.0, NOTHING, id="none"),
        pytest.param(
            [(100.0, "answered", None), (100.5, "answered", None)],
            101.0,
            NOTHING.model_copy(update={"answered": 2}),
            id="answered",
        ),
        pytest.param(
            [
                (100.0, "answered", None),
                (101.0, "by_words_only", SLOW),
                (102.0, "without_reranker", RERANKER),
                (103.0, "failed", "the index is not serving yet: it is loading"),
            ],
            104.0,
            Searches(
                seconds=60,
                answered=1,
                by_words_only=1,
                without_reranker=1,
                failed=1,
                reason="the index is not serving yet: it is loading",
            ),
            id="each-outcome-the-newest-of-equal-words",
        ),
        pytest.param(
            [(100.0, "by_words_only", SLOW), (100.9, "by_words_only", SLOW)],
            159.9,
            NOTHING.model_copy(update={"by_words_only": 2, "reason": SLOW}),
            id="still-in-the-minute",
        ),
        pytest.param(
            [(100.0, "by_words_only", SLOW), (130.0, "answered", None)],
            160.0,
            NOTHING.model_copy(update={"answered": 1}),
            id="a-minute-on-it-is-gone-with-its-words",
        ),
        pytest.param(
            [(100.0, "by_words_only", SLOW), (101.0, "by_words_only", SLOW)],
            500.0,
            NOTHING,
            id="long-quiet",
        ),
        pytest.param(
            [
                (100.0, "by_words_only", SLOW),
                (110.0, "by_words_only", SLOW),
                (120.0, "by_words_only", DOWN),
            ],
            121.0,
            NOTHING.model_copy(update={"by_words_only": 3, "reason": SLOW}),
            id="the-most-frequent-words",
        ),
        pytest.param(
            [(100.0, "by_words_only", SLOW), (99.0, "failed", "broke")],
            100.5,
            NOTHING.model_copy(update={"by_words_only": 1, "failed": 1, "reason": "broke"}),
            id="a-clock-that-went-back-counts-in-the-newest-second",
        ),
    ],
)
def test_the_account_of_the_last_minute(
    searched: list[Searched], now: float, account: Searches
) -> None:
    recent = RecentSearches()
    for at, what, why in searched:
        recent.record(at, what, why)
    assert recent.account(now) == account


def test_expiry_goes_second_by_second() -> None:
    recent = RecentSearches(seconds=3)
    for at in (10.0, 11.0, 12.0):
        recent.record(at, "failed", f"at {at:g}")
    accounts = [recent.account(now) for now in (12.0, 13.0, 14.0, 14.5, 15.0)]
    assert [(a.failed, a.reason) for a in accounts] == [
        (3, "at 12"),
        (2, "at 12"),
        (1, "at 12"),
        (1, "at 12"),
        (0, None),
    ]


def test_a_second_keeps_a_few_different_words_and_counts_every_search() -> None:
    recent = RecentSearches()
    for i in range(REASONS_PER_SECOND + 5):
        recent.record(100.0, "failed", f"request {i} failed")
    for _ in range(3):
        recent.record(100.0, "failed", "request 99 failed")  # not kept: the second is full
    account = recent.account(100.0)
    assert account.failed == REASONS_PER_SECOND + 8
    assert account.reason == f"request {REASONS_PER_SECOND - 1} failed"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("short", "short"),
        ("two\nlines  and\tblanks", "two lines and blanks"),
        ("x" * (REASON_CHARS + 50), "x" * (REASON_CHARS - 1) + "…"),
    ],
)
def test_words_are_shortened_for_a_status(text: str, said: str) -> None:
    assert short(text) == said
    assert len(short(text)) <= REASON_CHARS
