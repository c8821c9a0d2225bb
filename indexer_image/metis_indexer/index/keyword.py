"""BM25 over an inverted index kept as sparse arrays, in the manner of bm25s.

Postings live in a few immutable term-major segments (`terms`, `indptr`, `rows`,
`tfs`), so adding a document never rewrites the whole index; segments are merged
when they pile up. Each posting's BM25 term score is cached, as bm25s computes
it once at index time, but only for rows that stand still: a pass adds and drops
documents while searches run, which moves `N`, `df` and the average length of
every posting. Until the cache is renewed (after a pass, or once loaded), a
query weighs only its own terms' postings with the statistics as they are, by
the same formula: scores are exact at every moment, and a search during a pass
costs its postings, never a re-weighing of the whole index.

Rarity (idf) is counted in chunks, what a base searches (spec 000). Counted in documents
instead, a word that fills many chunks of a few long documents reads as rare: SciFact's
abstracts (one or two chunks) gained +0.007 nDCG@10 by it, long documents lost more
(bench/results/quality.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import numpy.typing as npt

K1 = 1.2
"""Term-frequency saturation: Lucene's default."""
B = 0.75
"""Length normalisation: Lucene's default."""
MERGE_FAN_IN = 4
"""Segments merged at once. Two at a time (a binary counter) wrote each posting about 10 times
while writing 100,000 chunks in groups of 16 documents, 2.2 s of the build; four, about 5 times,
for at most three segments of each size (a query looks a term up in each: microseconds)."""


@dataclasses.dataclass(slots=True)
class Segment:
    """Postings of a batch of rows, grouped by term (CSC: term → rows)."""

    terms: npt.NDArray[np.int32]
    indptr: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int32]
    tfs: npt.NDArray[np.uint8] | npt.NDArray[np.uint16]
    """Counts of a term in a chunk: a chunk holds at most 4,000 characters. One byte each
    where a segment's counts all fit (nearly always): a posting is most of what a chunk
    costs in memory besides its vector."""
    weights: npt.NDArray[np.float32] | None = None
    """Each posting's whole BM25 term score, idf · tf · (k1 + 1) / (tf + k1 · (1 − b +
    b · length / avgdl)): what bm25s computes once at index time, kept here until rows
    come or go (which moves N, df and the average length)."""

    @classmethod
    def build(
        cls,
        rows: npt.NDArray[np.int32],
        terms: npt.NDArray[np.int32],
        tfs: npt.NDArray[np.integer],
        runs: bool = False,
    ) -> Segment:
        """Group (row, term, tf) triples by term. A stable sort keeps each term's rows in
        the order they came, ascending in practice (a batch of new rows, segments merged
        oldest first, a renumbering that keeps order); nothing depends on that order, as a
        term holds a row once and scores are summed per row.

        `runs`: the triples come as a few runs each grouped by term already (segments being
        merged), which numpy's stable sort (timsort) merges in linear time: 2-4 × faster
        there than its quicksort, and slower on unordered triples."""
        keys = (terms.astype(np.int64) << 32) | np.arange(len(terms), dtype=np.int64)
        # keys are unique, so sorting them is the stable argsort (3 × faster than argsort)
        order = np.sort(keys, kind="stable" if runs else None) & 0xFFFF_FFFF
        terms, rows, tfs = terms[order], rows[order], tfs[order]
        starts = np.flatnonzero(_firsts(terms))
        unique = terms[starts]
        indptr = np.append(starts, len(terms)).astype(np.int64)
        narrow = np.uint8 if len(tfs) == 0 or int(tfs.max()) <= 255 else np.uint16
        return cls(unique.astype(np.int32), indptr, rows.astype(np.int32), tfs.astype(narrow))

    def spans(self, term_ids: npt.NDArray[np.int32]) -> list[slice | None]:
        """Where each term's postings are, or None where this segment lacks the term."""
        at = np.searchsorted(self.terms, term_ids).tolist()
        out: list[slice | None] = []
        for term, pos in zip(term_ids.tolist(), at, strict=True):
            if pos == len(self.terms) or self.terms[pos] != term:
                out.append(None)
            else:
                out.append(slice(int(self.indptr[pos]), int(self.indptr[pos + 1])))
        return out


def _merged(segments: Sequence[Segment], alive: npt.NDArray[np.bool_]) -> Segment:
    rows = np.concatenate([s.rows for s in segments])
    terms = np.concatenate([np.repeat(s.terms, np.diff(s.indptr)) for s in segments])
    tfs = np.concatenate([s.tfs for s in segments])
    keep = alive[rows]
    return Segment.build(rows[keep], terms[keep], tfs[keep], runs=True)


def _live_per_term(seg: Segment, alive: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """How many of each term's postings in `seg` are of live rows: its chunk frequency."""
    counts = np.concatenate([[0], np.cumsum(alive[seg.rows], dtype=np.int64)])
    return counts[seg.indptr[1:]] - counts[seg.indptr[:-1]]


def _firsts(ordered: npt.NDArray[np.integer]) -> npt.NDArray[np.bool_]:
    """Where each run of equal values of a sorted array begins: what `np.unique` finds,
    without the sort it would do again."""
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return first


def idf(n_docs: int, df: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Lucene's idf, always positive: log(1 + (N - df + 0.5) / (df + 0.5))."""
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """The statistics and postings of a KeywordIndex at one generation."""

    generation: int
    segments: tuple[Segment, ...]
    alive: npt.NDArray[np.bool_]
    lengths: npt.NDArray[np.float32]
    """The index's lengths array as it was: rows added later are written beyond the rows
    of these segments, and a renumbering replaces the array rather than change it."""
    live_rows: int
    live_length: float

    def weigh(self, index: KeywordIndex) -> list[npt.NDArray[np.float32]]:
        """Each posting's BM25 term score, segment by segment, at this snapshot."""
        segments = self.segments
        n_terms = max((int(seg.terms[-1]) + 1 for seg in segments if len(seg.terms)), default=0)
        df = np.zeros(n_terms, dtype=np.float64)
        for seg in segments:
            np.add.at(df, seg.terms, _live_per_term(seg, self.alive))
        term_idf = idf(self.live_rows, df)
        avgdl = self.live_length / self.live_rows if self.live_rows else 1.0
        return [
            index.term_scores(
                term_idf[np.repeat(seg.terms, np.diff(seg.indptr))],
                seg.tfs,
                self.lengths[seg.rows],
                avgdl,
            )
            for seg in segments
        ]


class KeywordIndex:
    """BM25 scores for rows of the in-memory index.

    Rows are the in-memory index's row numbers. Dropped rows stay in postings
    until their segment is merged, and are masked out with the caller's `alive`;
    the statistics BM25 needs (live rows, their total length) are kept as rows
    come and go, so a query costs what its postings cost, not the index's size.
    """

    def __init__(self, k1: float = K1, b: float = B) -> None:
        self.k1 = k1
        self.b = b
        self.segments: list[Segment] = []
        self.lengths = np.zeros(0, dtype=np.float32)
        self.live_rows = 0
        self.live_length = 0.0
        self._weighted_at = -1
        self._generation = 0
        """Bumped whenever rows come or go: the cached weights are of one generation."""

    def ensure_capacity(self, rows: int) -> None:
        if rows > len(self.lengths):
            grown = np.zeros(max(rows, 2 * len(self.lengths), 1024), dtype=np.float32)
            grown[: len(self.lengths)] = self.lengths
            self.lengths = grown

    def add(
        self,
        rows: Sequence[int] | npt.NDArray[np.int64],
        term_ids: npt.NDArray[np.int32],
        counts: npt.NDArray[np.integer],
        sizes: npt.NDArray[np.int64],
    ) -> None:
        """Add rows as one segment: `sizes[i]` (term id, count) pairs belong to `rows[i]`,
        in order, in the flat `term_ids` and `counts`."""
        if len(rows) == 0:
            return
        rows = np.asarray(rows, dtype=np.int64)
        self.ensure_capacity(int(rows.max()) + 1)
        row_of = np.repeat(rows, sizes)
        lengths = np.bincount(
            np.repeat(np.arange(len(rows)), sizes), weights=counts, minlength=len(rows)
        )
        self.lengths[rows] = lengths
        self.live_rows += len(rows)
        self.live_length += float(lengths.sum())
        self._generation += 1
        self.segments.append(Segment.build(row_of.astype(np.int32), term_ids, counts))

    def drop(self, rows: npt.NDArray[np.int64]) -> None:
        """Rows the caller marked dead: they leave the statistics now, the postings later."""
        self.live_rows -= len(rows)
        self.live_length -= float(self.lengths[rows].sum())
        self._generation += 1

    def compact(
        self, alive: npt.NDArray[np.bool_], swap: AbstractContextManager[object] | None = None
    ) -> None:
        """Merge the newest `MERGE_FAN_IN` segments into one while the oldest of them is at
        most twice the size of the newest.

        Like a counter in base 4, this keeps about 3 log4(n) segments and writes each
        posting about log4(n) times, where merging everything on each add would be O(n²).
        A merge builds its segment outside `swap` (the caller's lock, which its searches
        hold), which it holds only to put the segment in place of the merged ones: a
        merge of a large index's oldest segments takes a few hundred milliseconds.
        """
        segs, f = self.segments, MERGE_FAN_IN
        while len(segs) >= f and len(segs[-f].rows) <= 2 * len(segs[-1].rows):
            merged = _merged(segs[-f:], alive)
            with swap or contextlib.nullcontext():
                segs[-f:] = [merged]

    def merge(self, alive: npt.NDArray[np.bool_]) -> None:
        """Everything in one segment, without dead rows (after a load, or to renumber)."""
        if self.segments:
            self.segments = [_merged(self.segments, alive)]

    def remap(
        self, new_row: npt.NDArray[np.int64], alive: npt.NDArray[np.bool_], capacity: int = 1024
    ) -> None:
        """Renumber rows after the caller compacted its row space (dead rows dropped), with
        room for `capacity` rows. The postings are merged into one segment and renumbered
        as they stand: `new_row` keeps the rows' order, so each term's rows stay grouped.
        Only new arrays are made: a shallow copy of this index (`copy.copy`) renumbered
        leaves the original as searches go on reading it."""
        self.merge(alive)
        lengths = self.lengths[: len(alive)][alive]
        self.lengths = np.zeros(max(len(lengths), capacity), dtype=np.float32)
        self.lengths[: len(lengths)] = lengths
        if self.segments:
            [seg] = self.segments
            seg.rows = new_row[seg.rows].astype(np.int32)

    def snapshot_parts(self, n: int) -> dict[str, npt.NDArray[Any]]:
        """The postings (one segment after a load) and the first n rows' lengths."""
        parts = {"lengths": self.lengths[:n]}
        if self.segments:
            [seg] = self.segments
            parts.update(terms=seg.terms, indptr=seg.indptr, rows=seg.rows, tfs=seg.tfs)
        return parts

    def from_snapshot(self, parts: dict[str, npt.NDArray[Any]], n: int) -> None:
        """Take n live rows and their postings from `snapshot_parts` as saved."""
        self.ensure_capacity(n)
        self.lengths[:n] = parts["lengths"]
        self.live_rows = n
        self.live_length = float(self.lengths[:n].sum(dtype=np.float64))
        self.segments = (
            [
                Segment(
                    np.array(parts["terms"]),
                    np.array(parts["indptr"]),
                    np.array(parts["rows"]),
                    np.array(parts["tfs"]),
                )
            ]
            if n
            else []
        )  # a load's rows are one segment: KeyError where a part is missing
        self._generation += 1

    def postings(self, term_ids: npt.NDArray[np.int32]) -> npt.NDArray[np.int64]:
        """How many chunks hold each term, rows dropped since their segment's last merge
        included: what tells a common word from a telling one, read from the segments'
        offsets alone, where an exact count would cost a mask a term."""
        counts = np.zeros(len(term_ids), dtype=np.int64)
        for seg in self.segments:
            for i, span in enumerate(seg.spans(term_ids)):
                if span is not None:
                    counts[i] += span.stop - span.start
        return counts

    @property
    def weighed(self) -> bool:
        """Whether every posting's cached weight is of the rows as they are now."""
        return self._weighted_at == self._generation and all(
            seg.weights is not None for seg in self.segments
        )

    def snapshot(self, alive: npt.NDArray[np.bool_]) -> Snapshot:
        """What weighing every posting reads, taken under the caller's lock so the weighing
        itself can run outside it (`install` keeps the result if nothing moved meanwhile)."""
        return Snapshot(
            self._generation,
            tuple(self.segments),
            alive.copy(),
            self.lengths,
            self.live_rows,
            self.live_length,
        )

    def install(self, snap: Snapshot, weights: Sequence[npt.NDArray[np.float32]]) -> bool:
        """Cache `weights` (of `snap.weigh`) unless rows came or went since the snapshot."""
        same = len(self.segments) == len(snap.segments) and all(
            a is b for a, b in zip(self.segments, snap.segments, strict=False)
        )
        if snap.generation != self._generation or not same:
            return False
        for seg, w in zip(snap.segments, weights, strict=True):
            seg.weights = w
        self._weighted_at = self._generation
        return True

    def term_scores(
        self,
        term_idf: npt.NDArray[np.float64],
        tfs: npt.NDArray[np.uint8] | npt.NDArray[np.uint16],
        lengths: npt.NDArray[np.float32],
        avgdl: float,
    ) -> npt.NDArray[np.float32]:
        """BM25 term scores of postings, element by element: the one formula both the cache
        and a query's own weighing use, so their scores are the same to the last bit."""
        tf = tfs.astype(np.float32)
        norm = self.k1 * (1.0 - self.b + self.b * lengths / avgdl)
        return (term_idf * (self.k1 + 1.0) * tf / (tf + norm)).astype(np.float32)

    def scores(
        self,
        term_ids: npt.NDArray[np.int32],
        alive: npt.NDArray[np.bool_],
        all_alive: bool = False,
    ) -> npt.NDArray[np.float32] | None:
        """BM25 of every row for the query's distinct terms (0 for rows holding none, and
        for dead rows), or None when no live row holds any.

        With the cache current (`weigh`), a query sums cached weights, as bm25s does. While
        a pass adds and drops rows, it weighs only its own terms' postings instead, with the
        statistics as they are now: exact at every moment, at the cost of its postings
        rather than the whole index's. `all_alive` says no row is dead, which spares a mask
        per term.
        """
        if len(term_ids) == 0 or self.live_rows <= 0:
            return None
        term_ids = term_ids.astype(np.int32)
        if self.weighed:
            return self._cached_scores(term_ids, alive, all_alive)
        found = list(self._postings(term_ids, alive, all_alive, lambda seg: seg.tfs))
        if not found:
            return None
        df = np.zeros(len(term_ids), dtype=np.float64)
        for i, rows, _ in found:
            df[i] += len(rows)
        term_idf = idf(self.live_rows, df)
        avgdl = self.live_length / self.live_rows
        scores = np.zeros(len(alive), dtype=np.float32)
        for i, rows, tfs in found:
            weights = self.term_scores(
                np.full(len(rows), term_idf[i]), tfs, self.lengths[rows], avgdl
            )
            np.add.at(scores, rows, weights)
        return scores

    def _cached_scores(
        self, term_ids: npt.NDArray[np.int32], alive: npt.NDArray[np.bool_], all_alive: bool
    ) -> npt.NDArray[np.float32] | None:
        """Scores as sums of cached weights: what bm25s does at query time."""
        scores = np.zeros(len(alive), dtype=np.float32)
        matched = False
        for _, rows, weights in self._postings(term_ids, alive, all_alive, _weights):
            np.add.at(scores, rows, weights)  # numpy ≥ 1.25 makes ufunc.at fast
            matched = True
        return scores if matched else None

    def _postings(
        self,
        term_ids: npt.NDArray[np.int32],
        alive: npt.NDArray[np.bool_],
        all_alive: bool,
        column: Callable[[Segment], npt.NDArray[Any]],
    ) -> Iterator[tuple[int, npt.NDArray[np.int32], npt.NDArray[Any]]]:
        """Each query term's live postings in each segment: (term index, rows, values of
        `column`)."""
        for seg in self.segments:
            values = column(seg)
            for i, span in enumerate(seg.spans(term_ids)):
                if span is None:
                    continue
                rows, vals = seg.rows[span], values[span]
                if not all_alive:
                    ok = alive[rows]
                    rows, vals = rows[ok], vals[ok]
                yield i, rows, vals


def _weights(seg: Segment) -> npt.NDArray[np.float32]:
    assert seg.weights is not None, "weights are cached for every segment once weighed"
    return seg.weights
