"""The dense rows of the index, held one of two ways (the `vectors` setting):

- `float32`: the unit vectors themselves in memory; a search is one exact product.
- `int8`: a scaled int8 code per vector in memory (a quarter of the bytes), scanned for
  candidates with numkong's int8 dot-product kernels; the best few hundred are rescored
  exactly against the float32 vectors kept in a file beside the store and read through
  a memory map. Answers are exact float32 scores; only which rows reach the rescoring
  is approximate, and the margin of a few hundred makes a miss rare.

Codes are scaled twice: each dimension by the largest magnitude it had among the first
vectors seen (embeddings have a few loud dimensions that would drown the rest), then
each vector by its own largest magnitude, so no later vector is ever clipped.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path
from typing import Protocol

import numkong
import numpy as np
import numpy.typing as npt

from metis_indexer import limits

Kind = limits.VectorKind

Leg = list[tuple[int, float]]
"""Rows of one leg with their scores, best first."""

RESCORE_MIN = 400
"""Candidates the int8 scan hands to exact rescoring, or 4 × k when that is more."""

FILE_PREFIX = "vectors-"
"""The float32 vectors of the int8 form, row for row with memory: a file of this process
alone (two indexers may load one index folder: one stands by), rebuilt at each load and
unlinked as soon as it is open, so nothing is left behind however the process ends."""


def top(scores: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], k: int) -> list[int]:
    """Rows of the k best scores among `mask`, best first (ties: lower row first)."""
    rows = np.flatnonzero(mask)
    if len(rows) > k:
        rows = rows[np.argpartition(-scores[rows], k - 1)[:k]]
    return rows[np.lexsort((rows, -scores[rows]))].tolist()


class Vectors(Protocol):
    """Dense rows, grown and compacted in step with the index's other row fields."""

    kind: Kind
    dimensions: int

    def ensure_capacity(self, capacity: int, n_rows: int) -> None: ...

    def put(self, start: int, rows: npt.NDArray[np.float32]) -> None: ...

    def keep(self, keep: npt.NDArray[np.bool_], n_rows: int) -> None: ...

    def nearest(
        self, query: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], k: int
    ) -> Leg: ...

    def exact(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]: ...

    def resident_bytes(self) -> int: ...


def make(kind: Kind, dimensions: int, folder: Path) -> Vectors:
    if kind == "int8":
        return Int8Vectors(dimensions, folder)
    return FloatVectors(dimensions)


class FloatVectors:
    """Unit vectors as a float32 matrix in memory (grown by doubling)."""

    kind: Kind = "float32"

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions
        self.matrix = np.zeros((0, dimensions), dtype=np.float32)

    def ensure_capacity(self, capacity: int, n_rows: int) -> None:
        if len(self.matrix) >= capacity:
            return
        grown = np.zeros((capacity, self.dimensions), dtype=np.float32)
        grown[:n_rows] = self.matrix[:n_rows]
        self.matrix = grown

    def put(self, start: int, rows: npt.NDArray[np.float32]) -> None:
        self.matrix[start : start + len(rows)] = rows

    def keep(self, keep: npt.NDArray[np.bool_], n_rows: int) -> None:
        self.matrix = np.ascontiguousarray(self.matrix[:n_rows][keep])

    def nearest(self, query: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], k: int) -> Leg:
        scores = self.matrix[: len(mask)] @ query
        return [(r, float(scores[r])) for r in top(scores, mask, k)]

    def exact(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        return self.matrix[rows]

    def resident_bytes(self) -> int:
        return self.matrix.nbytes


class Int8Vectors:
    """Scaled int8 codes in memory, float32 vectors on disk for exact rescoring."""

    kind: Kind = "int8"

    def __init__(self, dimensions: int, folder: Path) -> None:
        self.dimensions = dimensions
        self.codes = np.zeros((0, dimensions), dtype=np.int8)
        self.row_scale = np.zeros(0, dtype=np.float32)
        """What a row's code must be multiplied by to give its vector back (per dimension
        scaling aside)."""
        self.dim_scale: npt.NDArray[np.float32] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self._fd, name = tempfile.mkstemp(prefix=FILE_PREFIX, suffix=".f32", dir=folder)
        os.unlink(name)
        self._map: npt.NDArray[np.float32] | None = None

    def __del__(self) -> None:
        self._map = None
        os.close(self._fd)

    def ensure_capacity(self, capacity: int, n_rows: int) -> None:
        if len(self.codes) >= capacity:
            return
        codes = np.zeros((capacity, self.dimensions), dtype=np.int8)
        codes[:n_rows] = self.codes[:n_rows]
        scale = np.zeros(capacity, dtype=np.float32)
        scale[:n_rows] = self.row_scale[:n_rows]
        self.codes, self.row_scale = codes, scale

    def put(self, start: int, rows: npt.NDArray[np.float32]) -> None:
        rows = np.ascontiguousarray(rows, dtype="<f4")
        if self.dim_scale is None:
            self.dim_scale = calibrate(rows)
        if self.dim_scale is not None:
            codes, scale = encode(rows, self.dim_scale)
            self.codes[start : start + len(rows)] = codes
            self.row_scale[start : start + len(rows)] = scale
        os.pwrite(self._fd, rows.tobytes(), start * self.dimensions * 4)

    def keep(self, keep: npt.NDArray[np.bool_], n_rows: int) -> None:
        self.codes = np.ascontiguousarray(self.codes[:n_rows][keep])
        self.row_scale = np.ascontiguousarray(self.row_scale[:n_rows][keep])
        kept = np.flatnonzero(keep)
        block = 8192
        for at in range(0, len(kept), block):
            rows = self.exact(kept[at : at + block])
            os.pwrite(self._fd, rows.tobytes(), at * self.dimensions * 4)
        os.ftruncate(self._fd, len(kept) * self.dimensions * 4)
        self._map = None

    def nearest(self, query: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], k: int) -> Leg:
        n = len(mask)
        if self.dim_scale is None or n == 0 or not mask.any():
            return []
        scanned = self.scan(query, n)
        candidates = np.asarray(top(scanned, mask, max(RESCORE_MIN, 4 * k)), dtype=np.int64)
        scores = self.exact(candidates) @ query
        best = np.lexsort((candidates, -scores))[:k]
        return [(int(candidates[i]), float(scores[i])) for i in best]

    def scan(self, query: npt.NDArray[np.float32], n: int) -> npt.NDArray[np.float32]:
        """Each of the first n rows' approximate score: int8 query · int8 codes, scaled."""
        assert self.dim_scale is not None
        z = query * self.dim_scale
        zmax = float(np.abs(z).max()) or 1.0
        q = np.round(z * (127 / zmax)).astype(np.int8)
        raw = numkong.cdist(q[None], self.codes[:n], metric="dot", out_dtype="float32")
        return np.asarray(raw)[0] * self.row_scale[:n] * np.float32(zmax / 127)

    def exact(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The float32 vectors of `rows`, read through the memory map."""
        if len(rows) == 0:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        needed = int(rows.max()) + 1
        if self._map is None or len(self._map) < needed:
            mapped = mmap.mmap(self._fd, os.fstat(self._fd).st_size, prot=mmap.PROT_READ)
            self._map = np.frombuffer(mapped, dtype="<f4").reshape(-1, self.dimensions)
        return np.asarray(self._map[rows])

    def resident_bytes(self) -> int:
        return self.codes.nbytes + self.row_scale.nbytes


def calibrate(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32] | None:
    """Each dimension's scale from the nonzero rows given; None while there are none."""
    present = rows[np.any(rows != 0, axis=1)]
    if len(present) == 0:
        return None
    return np.maximum(np.abs(present).max(axis=0), np.float32(1e-6)).astype(np.float32)


def encode(
    rows: npt.NDArray[np.float32], dim_scale: npt.NDArray[np.float32]
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    """Int8 codes of rows divided by the dimension scales, each row stretched to ±127,
    and the factor that gives each row back (0 for a zero row)."""
    y = rows / dim_scale
    peak = np.abs(y).max(axis=1) if len(y) else np.zeros(0, np.float32)
    stretch = np.divide(127, peak, out=np.zeros_like(peak), where=peak > 0)
    codes = np.round(y * stretch[:, None]).astype(np.int8)
    back = np.divide(peak, 127, out=np.zeros_like(peak), where=peak > 0)
    return codes, back.astype(np.float32)
