"""The int8 form of the vectors against the exact float32 product: same rows, same scores."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from metis_indexer.index import vectors
from metis_indexer.index.vectors import (
    RESCORE_MIN,
    Best,
    FloatVectors,
    Int8Vectors,
    best,
    calibrate,
    encode,
    top,
)


def units(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def both(tmp_path, rows: np.ndarray) -> tuple[FloatVectors, Int8Vectors]:
    exact, int8 = FloatVectors(rows.shape[1]), Int8Vectors(rows.shape[1], tmp_path)
    for held in (exact, int8):
        held.ensure_capacity(len(rows), 0)
        for start in range(0, len(rows), 1000):  # as documents arrive, calibrated by the first
            held.put(start, rows[start : start + 1000])
    return exact, int8


def recall(exact: FloatVectors, int8: Int8Vectors, queries: np.ndarray, mask, k: int) -> float:
    hits = 0
    for q in queries:
        want, got = exact.nearest(q, mask, k), int8.nearest(q, mask, k)
        hits += len({r for r, _ in want} & {r for r, _ in got})
        found = dict(want)
        assert all(s == pytest.approx(found[r], abs=1e-6) for r, s in got if r in found)
    return hits / (k * len(queries))


def test_codes_give_each_row_back_within_half_a_step():
    rng = np.random.default_rng(1)
    rows = units(rng.standard_normal((50, 64)))
    scale = calibrate(rows)
    codes, back = encode(rows, scale)
    decoded = codes * back[:, None] * scale
    step = np.abs(rows / scale).max(axis=1) / 127
    assert np.all(np.abs(decoded - rows) <= (0.5 * step * scale.max())[:, None] + 1e-7)


def test_a_zero_row_has_a_zero_code_and_nothing_is_calibrated_from_zeros():
    assert calibrate(np.zeros((3, 4), np.float32)) is None
    codes, back = encode(np.zeros((1, 4), np.float32), np.ones(4, np.float32))
    assert not codes.any() and back[0] == 0


@pytest.mark.parametrize("loud", [1.0, 8.0])
def test_int8_finds_the_exact_top_50_on_random_and_lopsided_vectors(tmp_path, loud):
    """`loud`: a few dimensions far larger than the rest, as real embeddings have."""
    rng = np.random.default_rng(2)
    raw = rng.standard_normal((6000, 128)).astype(np.float32)
    raw[:, :4] *= loud
    rows = units(raw)
    exact, int8 = both(tmp_path, rows)
    queries = units(rng.standard_normal((30, 128)) + rows[rng.integers(0, 6000, 30)] * 3)
    assert recall(exact, int8, queries, np.ones(len(rows), bool), 50) >= 0.99


def test_only_allowed_rows_are_answered_and_compaction_keeps_rows_in_step(tmp_path):
    rng = np.random.default_rng(3)
    rows = units(rng.standard_normal((3000, 64)))
    exact, int8 = both(tmp_path, rows)
    mask = rng.random(3000) < 0.1
    q = rows[int(np.flatnonzero(~mask)[0])]
    got, want = int8.nearest(q, mask, 20), exact.nearest(q, mask, 20)
    assert all(mask[r] for r, _ in got)
    assert [r for r, _ in got] == [r for r, _ in want], "fewer allowed rows than are rescored"
    keep = rng.random(3000) < 0.5
    for held in (exact, int8):
        held.keep(keep, 3000)
    assert np.array_equal(int8.exact(np.arange(int(keep.sum()))), rows[keep])
    assert recall(exact, int8, rows[:10], np.ones(int(keep.sum()), bool), 10) == 1.0


def test_nothing_is_answered_before_a_vector_arrives(tmp_path):
    int8 = Int8Vectors(8, tmp_path)
    int8.ensure_capacity(4, 0)
    int8.put(0, np.zeros((4, 8), np.float32))
    assert int8.nearest(np.ones(8, np.float32) / np.sqrt(8), np.ones(4, bool), 3) == []
    assert list(tmp_path.iterdir()) == [], "the float32 file is unlinked while in use"


def reference_scan(int8: Int8Vectors, rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The scan as plain numpy: int32 products of every row's code with the query's code."""
    codes, back = encode(rows, int8.dim_scale)
    z = q * int8.dim_scale
    zmax = float(np.abs(z).max())
    qc = np.round(z * (127 / zmax)).astype(np.int8)
    raw = (codes.astype(np.int32) @ qc.astype(np.int32)).astype(np.float32)
    return raw * back * np.float32(zmax / 127)


def test_packed_blocks_and_the_tail_score_every_row_as_a_plain_product(tmp_path):
    rng = np.random.default_rng(6)
    rows = units(rng.standard_normal((1000, 48)))
    int8 = Int8Vectors(48, tmp_path, block=64)
    int8.ensure_capacity(len(rows), 0)
    at = 0
    for size in (5, 59, 1, 200, 64, 300, 371):  # across block edges, as documents arrive
        int8.put(at, rows[at : at + size])
        at += size
    assert len(int8.blocks) == 1000 // 64 and int8.tail_rows == 1000 % 64
    for q in units(rng.standard_normal((5, 48))):
        assert np.array_equal(int8.scan(q, 1000), reference_scan(int8, rows, q))


def test_compaction_packs_the_kept_rows_as_if_they_had_come_alone(tmp_path):
    rng = np.random.default_rng(7)
    rows = units(rng.standard_normal((700, 32)))
    int8 = Int8Vectors(32, tmp_path / "a", block=50)
    int8.ensure_capacity(700, 0)
    int8.put(0, rows)
    keep = rng.random(700) < 0.4
    int8.keep(keep, 700)
    int8.ensure_capacity(max(int(keep.sum()), 1024), int(keep.sum()))
    fresh = Int8Vectors(32, tmp_path / "b", block=50)
    fresh.dim_scale = int8.dim_scale
    fresh.ensure_capacity(int(keep.sum()), 0)
    fresh.put(0, rows[keep])
    q = units(rng.standard_normal((1, 32)))[0]
    assert int8.filled == int(keep.sum())
    assert np.array_equal(int8.scan(q, int8.filled), fresh.scan(q, fresh.filled))
    int8.put(int8.filled, rows[:3])  # rows come after the kept ones
    assert np.array_equal(int8.scan(q, int8.filled)[-3:], reference_scan(int8, rows[:3], q))


def test_rows_without_vectors_before_the_first_put_score_zero_and_rows_only_grow(tmp_path):
    """After a change of model every row lost its vector; new ones come after them."""
    rng = np.random.default_rng(8)
    rows = units(rng.standard_normal((10, 16)))
    int8 = Int8Vectors(16, tmp_path, block=4)
    int8.ensure_capacity(20, 0)
    int8.put(9, rows)
    scores = int8.scan(rows[0], 19)
    assert not scores[:9].any() and scores[9] > 0.9
    with pytest.raises(ValueError, match="after the last"):
        int8.put(3, rows[:1])


def test_the_best_rows_of_each_piece_hold_the_best_rows_of_all(tmp_path):
    """nearest keeps each scan thread's running best candidates as its blocks come: the
    same candidates, so the same answers, as the best of one whole scan."""
    rng = np.random.default_rng(13)
    rows = units(rng.standard_normal((3000, 32)))
    int8 = Int8Vectors(32, tmp_path, block=256)
    int8.ensure_capacity(3000, 0)
    int8.put(0, rows)
    mask = rng.random(3000) < 0.7
    for q in units(rng.standard_normal((5, 32))):
        candidates = np.asarray(top(int8.scan(q, 3000), mask, RESCORE_MIN), dtype=np.int64)
        scores = rows[candidates] @ q
        order = np.lexsort((candidates, -scores))[:30]
        want = [(int(candidates[i]), float(scores[i])) for i in order]
        assert int8.nearest(q, mask, 30) == want


def by_score_then_row(rows: np.ndarray, scores: np.ndarray, k: int) -> list[int]:
    """The k best rows, ties to the lower row: a whole sort, the reference."""
    return sorted(rows[np.lexsort((rows, -scores))[:k]].tolist())


@pytest.mark.parametrize("k", [1, 7, 40, 100, 150])
def test_the_best_k_break_ties_at_the_cut_by_the_lower_row(k):
    """Scores of a few values: the k-th is nearly always one of many equal scores."""
    rng = np.random.default_rng(k)
    rows = rng.permutation(150).astype(np.int64)
    scores = rng.integers(0, 6, 150).astype(np.float32)
    got, got_scores = best(rows, scores, k)
    assert sorted(got.tolist()) == by_score_then_row(rows, scores, k)
    assert np.array_equal(got_scores, scores[np.argsort(rows)][got])


def test_a_running_best_over_blocks_is_the_best_of_them_all():
    rng = np.random.default_rng(21)
    scores = rng.integers(0, 40, 5000).astype(np.float32)  # ties everywhere
    mask = rng.random(5000) < 0.8
    running = Best(60)
    for at in range(0, 5000, 333):
        running.add(at, scores[at : at + 333], mask[at : at + 333])
    allowed = np.flatnonzero(mask)
    assert sorted(running.rows.tolist()) == by_score_then_row(allowed, scores[allowed], 60)
    assert np.array_equal(running.scores, scores[running.rows])


def test_a_scan_whose_other_thread_is_busy_is_scanned_by_its_own(tmp_path):
    """Blocks are claimed one at a time: a pool thread held by other work claims none, and
    the caller's thread scans them all."""
    rng = np.random.default_rng(22)
    rows = units(rng.standard_normal((1000, 16)))
    int8 = Int8Vectors(16, tmp_path, block=64)
    int8.ensure_capacity(1000, 0)
    int8.put(0, rows)
    q = rows[3]
    release = threading.Event()
    busy = [vectors._pool().submit(release.wait) for _ in range(vectors.THREADS - 1)]
    try:
        assert np.array_equal(int8.scan(q, 1000), reference_scan(int8, rows, q))
        assert int8.nearest(q, np.ones(1000, bool), 1)[0][0] == 3
    finally:
        release.set()
    assert all(done.result() for done in busy)
