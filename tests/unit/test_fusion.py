import pytest

from metis_indexer.fusion import reciprocal_rank


def test_an_item_both_lists_found_beats_one_only_one_found_first():
    fused = reciprocal_rank([[1, 2, 3], [2, 4]])
    assert [item for item, _ in fused] == [2, 1, 4, 3]
    assert dict(fused)[2] == pytest.approx(1 / 62 + 1 / 61)
    assert dict(fused)[1] == pytest.approx(1 / 61)


def test_one_list_keeps_its_order_and_empty_lists_fuse_to_nothing():
    assert [i for i, _ in reciprocal_rank([[5, 3, 9]])] == [5, 3, 9]
    assert reciprocal_rank([[], []]) == []
