"""Reciprocal-rank fusion (`metis_indexer.search.fusion`): each item scores the sum of
1 / (60 + rank)."""

import pytest

from metis_indexer.search.fusion import RRF_K, reciprocal_rank


def test_an_item_both_lists_found_beats_one_only_one_found_first():
    fused = reciprocal_rank([[1, 2, 3], [2, 4]])
    assert [item for item, _ in fused] == [2, 1, 4, 3]
    assert dict(fused)[2] == pytest.approx(1 / 62 + 1 / 61)
    assert dict(fused)[1] == pytest.approx(1 / 61)


def test_one_list_keeps_its_order_and_empty_lists_fuse_to_nothing():
    assert [i for i, _ in reciprocal_rank([[5, 3, 9]])] == [5, 3, 9]
    assert reciprocal_rank([[], []]) == []


def test_every_score_is_worked_out_by_hand():
    """Fusion's constant is 60 and ranks count from 1."""
    assert RRF_K == 60
    assert reciprocal_rank([[7, 8, 9], [9, 7]]) == [
        (7, 1 / 61 + 1 / 62),
        (9, 1 / 63 + 1 / 61),
        (8, 1 / 62),
    ]
    assert reciprocal_rank([[3, 4]], k=0) == [(3, 1.0), (4, 0.5)]


@pytest.mark.parametrize(
    ("rankings", "order"),
    [
        ([[9, 2], [4, 2]], [2, 9, 4]),  # a larger item met first stays first
        ([[4, 2], [9, 2]], [2, 4, 9]),  # and a smaller one met first too
    ],
    ids=["first-list-only-has-the-larger-id", "first-list-only-has-the-smaller-id"],
)
def test_a_tie_keeps_the_order_items_were_first_met(rankings, order):
    """Two firsts of one list each tie at 1/61: the first list's (the keyword leg's) comes first,
    whatever the items' numbers, so a search answers the same order every time."""
    fused = reciprocal_rank(rankings)
    assert [item for item, _ in fused] == order
    assert [score for _, score in fused] == [2 / 62, 1 / 61, 1 / 61]
