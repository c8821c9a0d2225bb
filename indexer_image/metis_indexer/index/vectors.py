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

import copy
import functools
import itertools
import mmap
import os
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numkong
import numpy as np
import numpy.typing as npt

from metis_indexer import limits

Kind = limits.VectorKind

Leg = list[tuple[int, float]]
"""Rows of one leg with their scores, best first."""

RESCORE_MIN = 400
"""Candidates the int8 scan hands to exact rescoring, or 4 × k when that is more."""

BLOCK = 16_384
"""Rows of a packed block of codes (16 MiB at 1,024 dimensions): small enough that the
unpacked tail, scanned the slower way, stays a small share of a large index, and that
threads claiming blocks one at a time end together."""

THREADS = min(2, os.cpu_count() or 1)
"""Threads one int8 scan runs on: two halved the scan on the project's 2-core machines;
more were not tried, and searches run side by side would only contend for them."""

SPAN = 1024
"""Rows a dense scan passes over at once where none of them is allowed (dead, or filtered
out): the rows a pass replaced lie together until a compaction reclaims them."""

FILE_PREFIX = "vectors-"
"""The float32 vectors and int8 codes of the int8 form's rows written since its load, row
for row with memory: files of this process alone (two indexers may load one index folder:
one stands by), unlinked as soon as they are open, so nothing is left behind however the
process ends."""


def allowed_spans(mask: npt.NDArray[np.bool_], span: int = SPAN) -> list[tuple[int, int]]:
    """(start, end) of the runs of `span`-row pieces of `mask` that allow a row, in order:
    what a scan reads, the pieces of no allowed row left out."""
    n = len(mask)
    pieces = -(-n // span)
    padded = np.zeros(pieces * span, dtype=bool)
    padded[:n] = mask
    hit = padded.reshape(pieces, span).any(axis=1)
    edges = np.flatnonzero(np.diff(hit.astype(np.int8), prepend=0, append=0))
    return [
        (int(a) * span, min(int(b) * span, n)) for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]


def top(scores: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], k: int) -> list[int]:
    """Rows of the k best scores among `mask`, best first (ties: lower row first)."""
    rows = np.flatnonzero(mask)
    if len(rows) > k:
        rows = rows[np.argpartition(-scores[rows], k - 1)[:k]]
    return rows[np.lexsort((rows, -scores[rows]))].tolist()


def best(
    rows: npt.NDArray[np.int64], scores: npt.NDArray[np.float32], k: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The k best of `rows` by score, ties to the lower row, in no order: `top`'s rows
    without its sort, for sets that are merged again."""
    if len(rows) <= k:
        return rows, scores
    kth = np.partition(scores, len(scores) - k)[len(scores) - k]
    above = np.flatnonzero(scores > kth)
    tied = np.flatnonzero(scores == kth)
    tied = tied[np.argsort(rows[tied], kind="stable")[: k - len(above)]]
    keep = np.concatenate((above, tied))
    return rows[keep], scores[keep]


class Best:
    """The k best rows of one scan thread's share so far (ties: lower row), kept as each
    block's scores come, while they are fresh in cache. A row below the worst of them
    is out at once (k rows beat it), so a block costs one comparison once k are held;
    the best k of all rows are among the threads' own best k."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.rows = np.zeros(0, dtype=np.int64)
        self.scores = np.zeros(0, dtype=np.float32)
        self.floor = -np.inf

    def add(self, at: int, scores: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_]) -> None:
        """Rows at, at + 1, … of `scores`, those `mask` lets through: after every row held."""
        new = np.flatnonzero(mask & (scores >= self.floor))
        if len(new) == 0:
            return
        self.rows, self.scores = best(
            np.concatenate((self.rows, new + at)),
            np.concatenate((self.scores, scores[new])),
            self.k,
        )
        if len(self.rows) == self.k:
            self.floor = float(self.scores.min())


class Vectors(Protocol):
    """Dense rows, grown and compacted in step with the index's other row fields."""

    kind: Kind
    dimensions: int

    def ensure_capacity(self, capacity: int, n_rows: int) -> None: ...

    def put(self, start: int, rows: npt.NDArray[np.float32]) -> None: ...

    def keep(self, keep: npt.NDArray[np.bool_], n_rows: int, capacity: int = 0) -> None: ...

    def nearest(
        self, query: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], k: int
    ) -> Leg: ...

    def exact(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]: ...

    def resident_bytes(self) -> int: ...

    def snapshot_parts(self, n: int) -> dict[str, npt.NDArray[Any]]: ...

    def from_snapshot(self, parts: Mapping[str, npt.NDArray[Any]], n: int) -> bool: ...


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
        """Grown in place where nothing else holds the matrix (realloc moves its pages
        rather than copying them: half the page faults of a copy, 0.2-0.5 s of writing
        100,000 rows); a copy where a view of it is held."""
        if len(self.matrix) >= capacity:
            return
        try:
            self.matrix.resize((capacity, self.dimensions))
        except ValueError:
            grown = np.zeros((capacity, self.dimensions), dtype=np.float32)
            grown[:n_rows] = self.matrix[:n_rows]
            self.matrix = grown

    def put(self, start: int, rows: npt.NDArray[np.float32]) -> None:
        self.matrix[start : start + len(rows)] = rows

    def keep(self, keep: npt.NDArray[np.bool_], n_rows: int, capacity: int = 0) -> None:
        """The kept rows in a new matrix of room for `capacity` rows (zeros the system
        gives untouched: its spare rows take no memory until written); the old matrix is
        left as it was, for whoever still reads it."""
        kept = int(np.count_nonzero(keep))
        matrix = np.zeros((max(kept, capacity), self.dimensions), dtype=np.float32)
        np.compress(keep, self.matrix[:n_rows], axis=0, out=matrix[:kept])
        self.matrix = matrix

    def nearest(self, query: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], k: int) -> Leg:
        """Rows `mask` allows, scored where there are any (`allowed_spans`)."""
        scores = np.zeros(len(mask), dtype=np.float32)
        for start, end in allowed_spans(mask):
            np.matmul(self.matrix[start:end], query, out=scores[start:end])
        return [(r, float(scores[r])) for r in top(scores, mask, k)]

    def exact(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        return self.matrix[rows]

    def resident_bytes(self) -> int:
        return self.matrix.nbytes

    def snapshot_parts(self, n: int) -> dict[str, npt.NDArray[Any]]:
        return {"floats": self.matrix[:n]}

    def from_snapshot(self, parts: Mapping[str, npt.NDArray[Any]], n: int) -> bool:
        if "floats" not in parts:
            return False
        self.ensure_capacity(n, 0)
        self.matrix[:n] = parts["floats"]
        return True


class RowFile:
    """Fixed-size rows in a file of this process alone, read through a memory map: made
    and unlinked at once, so nothing is left behind however the process ends."""

    def __init__(self, folder: Path, width: int, dtype: str) -> None:
        self.width, self.dtype = width, np.dtype(dtype)
        self.row_bytes = width * self.dtype.itemsize
        self.fd, name = tempfile.mkstemp(prefix=FILE_PREFIX, suffix=f".{dtype}", dir=folder)
        os.unlink(name)
        self._map: npt.NDArray[Any] | None = None

    def __del__(self) -> None:
        """The file's space goes back once nothing holds it: a compaction writes the kept
        rows to new files while searches go on reading the old ones."""
        if hasattr(self, "fd"):
            os.close(self.fd)

    def write(self, start: int, rows: npt.NDArray[Any]) -> None:
        os.pwrite(
            self.fd, np.ascontiguousarray(rows, dtype=self.dtype).tobytes(), start * self.row_bytes
        )

    def truncate(self, rows: int) -> None:
        os.ftruncate(self.fd, rows * self.row_bytes)
        self._map = None  # a map past the end of the file would fault

    def view(self, rows: int) -> npt.NDArray[Any]:
        """The first `rows` rows, mapped (read-only)."""
        if self._map is None or len(self._map) < rows:
            size = os.fstat(self.fd).st_size
            if size < rows * self.row_bytes:
                self.truncate(rows)  # rows never written read as zeros
                size = rows * self.row_bytes
            mapped = mmap.mmap(self.fd, size, prot=mmap.PROT_READ) if size else b""
            self._map = np.frombuffer(mapped, dtype=self.dtype).reshape(-1, self.width)
        return self._map[:rows]


class Int8Vectors:
    """Scaled int8 codes in memory, float32 vectors on disk for exact rescoring.

    Codes are held as full blocks of `BLOCK` rows packed for numkong's `dots_packed`
    (never changed once full) and a tail of unpacked rows scanned with `cdist`; rows are
    only ever added after the last, so a full tail is packed and a new one begun. Only
    the packed form is resident: the raw codes are written to disk beside the float32
    vectors, for compaction (which packs the kept rows again) and the load's snapshot.
    Rows loaded from a snapshot are read from its files (`base`); later rows, and every
    row after a compaction, from this process's own files.
    """

    kind: Kind = "int8"

    def __init__(self, dimensions: int, folder: Path, block: int = BLOCK) -> None:
        self.dimensions = dimensions
        self.block = block
        self.blocks: list[numkong.PackedMatrix] = []
        self.tail = np.zeros((0, dimensions), dtype=np.int8)
        self.tail_rows = 0
        self.row_scale = np.zeros(0, dtype=np.float32)
        """What a row's code must be multiplied by to give its vector back (per dimension
        scaling aside)."""
        self.dim_scale: npt.NDArray[np.float32] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._floats = RowFile(folder, dimensions, "<f4")
        self._codes = RowFile(folder, dimensions, "i1")
        self.base: dict[str, npt.NDArray[Any]] = {}
        """A snapshot's `floats` and `codes` (memory-mapped) for its rows: the first ones."""

    @property
    def filled(self) -> int:
        """Rows holding a code (packed or in the tail)."""
        return len(self.blocks) * self.block + self.tail_rows

    def ensure_capacity(self, capacity: int, n_rows: int) -> None:
        if len(self.row_scale) < capacity:
            scale = np.zeros(capacity, dtype=np.float32)
            scale[:n_rows] = self.row_scale[:n_rows]
            self.row_scale = scale
        self._grow_tail(min(self.block, capacity - len(self.blocks) * self.block))

    def _grow_tail(self, rows: int) -> None:
        if len(self.tail) >= rows:
            return
        tail = np.zeros((rows, self.dimensions), dtype=np.int8)
        tail[: self.tail_rows] = self.tail[: self.tail_rows]
        self.tail = tail

    def put(self, start: int, rows: npt.NDArray[np.float32]) -> None:
        if start < self.filled:
            raise ValueError(f"rows are added after the last ({self.filled}), not at {start}")
        rows = np.ascontiguousarray(rows, dtype="<f4")
        if self.dim_scale is None:
            self.dim_scale = calibrate(rows)
        self._append(np.zeros((start - self.filled, self.dimensions), dtype=np.int8))
        if self.dim_scale is None:
            codes = np.zeros((len(rows), self.dimensions), dtype=np.int8)
        else:
            codes, scale = encode(rows, self.dim_scale)
            self.row_scale[start : start + len(rows)] = scale
        self._append(codes)
        self._floats.write(start, rows)
        self._codes.write(start, codes)

    def _append(self, codes: npt.NDArray[np.int8]) -> None:
        """Codes of the rows after the last, into the tail, packing each tail that fills."""
        at = 0
        while at < len(codes):
            self._grow_tail(min(self.block, self.tail_rows + len(codes) - at))
            take = min(self.block - self.tail_rows, len(codes) - at)
            self.tail[self.tail_rows : self.tail_rows + take] = codes[at : at + take]
            self.tail_rows += take
            at += take
            if self.tail_rows == self.block:
                self.blocks.append(numkong.dots_pack(self.tail))
                self.tail_rows = 0
                room = max(len(self.row_scale) - self.filled, 0)
                self.tail = np.zeros((min(self.block, room), self.dimensions), dtype=np.int8)

    def keep(self, keep: npt.NDArray[np.bool_], n_rows: int, capacity: int = 0) -> None:
        """The kept rows, packed again and written to new files, with room for `capacity`
        rows. The old codes and files are left as they were, for a copy of this holder
        that searches go on reading (`copy.copy`), and go once nothing holds them."""
        old = copy.copy(self)
        kept = np.flatnonzero(keep)
        self._floats = RowFile(self.folder, self.dimensions, "<f4")
        self._codes = RowFile(self.folder, self.dimensions, "i1")
        self.base = {}
        self.row_scale = np.zeros(max(len(kept), capacity), dtype=np.float32)
        self.row_scale[: len(kept)] = old.row_scale[kept]
        self.blocks, self.tail, self.tail_rows = [], np.zeros((0, self.dimensions), np.int8), 0
        step = 8192
        for at in range(0, len(kept), step):
            rows = kept[at : at + step]
            codes = old._rows("codes", rows)
            self._floats.write(at, old._rows("floats", rows))
            self._codes.write(at, codes)
            self._append(codes)
        self.ensure_capacity(max(len(kept), capacity), len(kept))

    def _rows(self, part: str, rows: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        """`floats` or `codes` of rows, from the snapshot's files or this process's own."""
        file = self._floats if part == "floats" else self._codes
        if len(rows) == 0:
            return np.zeros((0, self.dimensions), dtype=file.dtype)
        base = self.base.get(part)
        in_base = 0 if base is None else len(base)
        if int(rows.max()) < in_base:
            assert base is not None
            return np.asarray(base[rows])
        out = np.asarray(file.view(int(rows.max()) + 1)[rows])
        if in_base:
            assert base is not None
            low = rows < in_base
            out[low] = base[rows[low]]
        return out

    def nearest(self, query: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], k: int) -> Leg:
        n = len(mask)
        if self.dim_scale is None or n == 0 or not mask.any():
            return []
        want = max(RESCORE_MIN, 4 * k)
        shares = [Best(want) for _ in range(THREADS)]

        def keep(part: int, at: int, scores: npt.NDArray[np.float32]) -> None:
            shares[part].add(at, scores, mask[at : at + len(scores)])

        self._scan(query, n, keep, mask)
        candidates, _ = best(
            np.concatenate([s.rows for s in shares]),
            np.concatenate([s.scores for s in shares]),
            want,
        )
        candidates = np.sort(candidates)
        scores = self.exact(candidates) @ query
        order = np.lexsort((candidates, -scores))[:k]
        return [(int(candidates[i]), float(scores[i])) for i in order]

    def scan(self, query: npt.NDArray[np.float32], n: int) -> npt.NDArray[np.float32]:
        """Each of the first n rows' approximate score: int8 query · int8 codes, scaled."""
        out = np.zeros(n, dtype=np.float32)

        def keep(_part: int, at: int, scores: npt.NDArray[np.float32]) -> None:
            out[at : at + len(scores)] = scores

        self._scan(query, n, keep)
        return out

    def _scan(
        self,
        query: npt.NDArray[np.float32],
        n: int,
        take: Callable[[int, int, npt.NDArray[np.float32]], None],
        mask: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """Hands each packed block's and the tail's approximate scores (of rows below n) to
        `take` with the number of the thread and the piece's first row; given `mask`, only
        of blocks and spans of the tail where it allows a row. Up to `THREADS`
        threads claim the pieces one at a time, in order (numkong lets go of the
        interpreter lock; so is what `take` does): a thread slowed by other work (the
        keyword leg beside, another process) leaves more pieces to the others, where
        halves fixed in advance would wait for the slower one."""
        assert self.dim_scale is not None
        z = query * self.dim_scale
        zmax = float(np.abs(z).max()) or 1.0
        q = np.round(z * (127 / zmax)).astype(np.int8)[None]
        factor = np.float32(zmax / 127)
        pieces: list[tuple[int, numkong.PackedMatrix | npt.NDArray[np.int8]]] = [
            (at, block)
            for at, block in zip(range(0, n, self.block), self.blocks, strict=False)
            if mask is None or mask[at : at + self.block].any()
        ]
        start = len(self.blocks) * self.block
        tail = self.tail[: max(min(self.tail_rows, n - start), 0)]
        spans = [(0, len(tail))] if mask is None else allowed_spans(mask[start : start + len(tail)])
        pieces += [(start + a, tail[a:b]) for a, b in spans]

        claims = itertools.count()  # its next() is one step under the interpreter lock

        def run(share: int) -> None:
            for i in claims:
                if i >= len(pieces):
                    return
                at, codes = pieces[i]
                if isinstance(codes, numkong.PackedMatrix):
                    raw = np.asarray(numkong.dots_packed(q, codes))[0]
                elif len(codes):
                    raw = np.asarray(numkong.cdist(q, codes, metric="dot"))[0]
                else:
                    continue
                end = min(at + len(raw), n)  # exact in float32: |a dot| < 2^24 at 1,024
                take(
                    share, at, raw[: end - at].astype(np.float32) * self.row_scale[at:end] * factor
                )

        later = [_pool().submit(run, share) for share in range(1, min(THREADS, len(pieces)))]
        run(0)
        for done in later:
            if not done.cancel():  # one still waiting for a thread would claim nothing
                done.result()

    def exact(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The float32 vectors of `rows`, read through memory maps."""
        return self._rows("floats", rows)

    def snapshot_parts(self, n: int) -> dict[str, npt.NDArray[Any]]:
        """What a snapshot keeps of the first n rows (mapped, not copied)."""
        assert not self.base, "a snapshot is taken of rows loaded from the store"
        dim = self.dim_scale if self.dim_scale is not None else np.zeros(0, np.float32)
        return {
            "floats": self._floats.view(n),
            "codes": self._codes.view(n),
            "row_scale": self.row_scale[:n],
            "dim_scale": dim,
        }

    def from_snapshot(self, parts: Mapping[str, npt.NDArray[Any]], n: int) -> bool:
        """Take n rows from a snapshot's parts: codes packed from its file, vectors read
        from it as needed. False when it holds no codes (a float32 load saved it)."""
        if any(name not in parts for name in ("floats", "codes", "row_scale", "dim_scale")):
            return False
        codes = parts["codes"]
        self.base = {"floats": parts["floats"], "codes": codes}
        self.dim_scale = np.array(parts["dim_scale"]) if len(parts["dim_scale"]) else None
        self.ensure_capacity(n, 0)
        self.row_scale[:n] = parts["row_scale"]
        self.blocks, self.tail_rows = [], 0
        for at in range(0, n, self.block):
            self._append(_read_rows(codes, at, min(at + self.block, n)))
        return True

    def resident_bytes(self) -> int:
        packed = sum(block.nbytes for block in self.blocks)
        return packed + self.tail.nbytes + self.row_scale.nbytes


def _read_rows(mapped: npt.NDArray[Any], start: int, end: int) -> npt.NDArray[Any]:
    """Rows of a memory-mapped `.npy` file read with a plain read: pages touched through
    the map would count as this process's memory for as long as it stays mapped."""
    if not isinstance(mapped, np.memmap) or mapped.filename is None:
        return np.array(mapped[start:end])
    width = int(np.prod(mapped.shape[1:]))
    with open(mapped.filename, "rb") as f:
        f.seek(mapped.offset + start * width * mapped.dtype.itemsize)
        rows = np.fromfile(f, dtype=mapped.dtype, count=(end - start) * width)
    return rows.reshape(end - start, *mapped.shape[1:])


@functools.cache
def _pool() -> ThreadPoolExecutor:
    """The threads a scan shares its blocks with (the caller's thread is one more). A
    thread still busy with another scan claims no block of this one."""
    return ThreadPoolExecutor(max_workers=max(THREADS - 1, 1), thread_name_prefix="int8-scan")


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
    y = np.divide(rows, dim_scale, dtype=np.float32)
    peak = np.maximum(y.max(axis=1), -y.min(axis=1)) if len(y) else np.zeros(0, np.float32)
    stretch = np.divide(127, peak, out=np.zeros_like(peak), where=peak > 0)
    y *= stretch[:, None]  # in place: a load encodes every vector
    codes = np.rint(y, out=y).astype(np.int8)
    back = np.divide(peak, 127, out=np.zeros_like(peak), where=peak > 0)
    return codes, back.astype(np.float32)
