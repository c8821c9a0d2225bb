"""The keyword leg's cut: the k best scores above 0, ties to the lower row, whether the
rows it ranks come from a sample's floor (large indexes) or are every row above 0."""

import numpy as np
import pytest

from metis_indexer.index.memory import SAMPLE, top_positive


def reference(scores: np.ndarray, k: int) -> list[int]:
    """Every row above 0 in one whole sort."""
    rows = np.flatnonzero(scores > 0)
    return rows[np.lexsort((rows, -scores[rows]))][:k].tolist()


@pytest.mark.parametrize(
    ("n", "share", "values", "k"),
    [
        (200_000, 0.65, 7, 200),  # most rows match, a few score values: ties at every cut
        (200_000, 0.65, 10_000, 50),
        (200_000, 0.001, 5, 200),  # fewer rows above 0 than the sample's floor needs
        (200_000, 0.0005, 1000, 200),  # fewer rows above 0 than k
        (300, 0.5, 4, 50),  # too few rows to sample
        (10 * SAMPLE, 1.0, 3, 10),
    ],
)
def test_the_k_best_positive_scores_with_ties_to_the_lower_row(n, share, values, k):
    rng = np.random.default_rng(n + k + values)
    scores = np.where(rng.random(n) < share, rng.integers(1, values + 1, n) / 7, 0).astype(
        np.float32
    )
    assert top_positive(scores, k) == reference(scores, k)


def test_nothing_above_zero_ranks_nothing():
    assert top_positive(np.zeros(100_000, np.float32), 50) == []
    assert top_positive(np.zeros(0, np.float32), 50) == []
