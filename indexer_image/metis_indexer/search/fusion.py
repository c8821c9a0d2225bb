"""Reciprocal-rank fusion of the search's legs (by meaning, by words)."""

from __future__ import annotations

from collections.abc import Sequence

RRF_K = 60
"""Keeps one list's first place from deciding alone."""


def reciprocal_rank(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Items of several rankings by the sum of 1 / (k + rank), rank from 1; best first.

    Ties keep the order in which items were first met, so fusion is deterministic.
    """
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])
