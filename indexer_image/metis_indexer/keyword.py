"""BM25 over an inverted index kept as sparse arrays, in the manner of bm25s.

Postings live in a few immutable term-major segments (`terms`, `indptr`, `rows`,
`tfs`), so adding a document never rewrites the whole index; segments are merged
when they pile up. Unlike bm25s, scores are not precomputed: a pass adds and
drops documents while searches run, which moves `N`, `df` and the average length.
A query therefore gathers the postings of its few terms and scores them in a
handful of vectorised operations; documents and idf stay exact at every moment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

K1 = 1.2
"""Term-frequency saturation: Lucene's default."""
B = 0.75
"""Length normalisation: Lucene's default."""


@dataclasses.dataclass(slots=True)
class Segment:
    """Postings of a batch of rows, grouped by term (CSC: term → rows)."""

    terms: npt.NDArray[np.int32]
    indptr: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int32]
    tfs: npt.NDArray[np.uint16]
    """Counts of a term in a chunk: a chunk holds at most 4,000 characters."""
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
    ) -> Segment:
        """Group (row, term, tf) triples by term."""
        order = np.lexsort((rows, terms))
        terms, rows, tfs = terms[order], rows[order], tfs[order]
        unique, starts = np.unique(terms, return_index=True)
        indptr = np.append(starts, len(terms)).astype(np.int64)
        return cls(unique.astype(np.int32), indptr, rows.astype(np.int32), tfs.astype(np.uint16))

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
    return Segment.build(rows[keep], terms[keep], tfs[keep])


def _per_term(seg: Segment, flags: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """How many postings of each term of `seg` are flagged."""
    counts = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    return counts[seg.indptr[1:]] - counts[seg.indptr[:-1]]


def idf(n_docs: int, df: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Lucene's idf, always positive: log(1 + (N - df + 0.5) / (df + 0.5))."""
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


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
        lengths = np.bincount(np.repeat(np.arange(len(rows)), sizes), weights=counts,
                              minlength=len(rows))
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

    def compact(self, alive: npt.NDArray[np.bool_]) -> None:
        """Merge the newest segment into the one before while it is at least half its size.

        Like a binary counter, this keeps about log2(n) segments and writes each
        posting O(log n) times, where merging everything on each add would be O(n²).
        """
        segs = self.segments
        while len(segs) >= 2 and 2 * len(segs[-1].rows) >= len(segs[-2].rows):
            segs[-2:] = [_merged(segs[-2:], alive)]

    def merge(self, alive: npt.NDArray[np.bool_]) -> None:
        """Everything in one segment, without dead rows (after a load, or to renumber)."""
        if self.segments:
            self.segments = [_merged(self.segments, alive)]

    def remap(self, new_row: npt.NDArray[np.int64], alive: npt.NDArray[np.bool_]) -> None:
        """Renumber rows after the caller compacted its row space (dead rows dropped)."""
        self.merge(alive)
        lengths = self.lengths[: len(alive)][alive]
        self.lengths = np.zeros(max(len(lengths), 1024), dtype=np.float32)
        self.lengths[: len(lengths)] = lengths
        if self.segments:
            seg = self.segments[0]
            term_of = np.repeat(seg.terms, np.diff(seg.indptr))
            self.segments = [Segment.build(new_row[seg.rows].astype(np.int32), term_of, seg.tfs)]

    def _weigh(self, alive: npt.NDArray[np.bool_], all_alive: bool) -> None:
        """Every posting's BM25 term score for the live rows as they are now."""
        stale = [seg for seg in self.segments if seg.weights is None]
        if self._weighted_at == self._generation and not stale:
            return
        n_terms = max((int(seg.terms[-1]) + 1 for seg in self.segments if len(seg.terms)),
                      default=0)
        df = np.zeros(n_terms, dtype=np.float64)
        for seg in self.segments:
            live = np.diff(seg.indptr) if all_alive else _per_term(seg, alive[seg.rows])
            np.add.at(df, seg.terms, live)
        term_idf = idf(self.live_rows, df)
        avgdl = self.live_length / self.live_rows or 1.0
        for seg in self.segments:
            tfs = seg.tfs.astype(np.float32)
            norm = self.k1 * (1.0 - self.b + self.b * self.lengths[seg.rows] / avgdl)
            scale = term_idf[np.repeat(seg.terms, np.diff(seg.indptr))] * (self.k1 + 1.0)
            seg.weights = (scale * tfs / (tfs + norm)).astype(np.float32)
        self._weighted_at = self._generation

    def scores(
        self,
        term_ids: npt.NDArray[np.int32],
        alive: npt.NDArray[np.bool_],
        all_alive: bool = False,
    ) -> npt.NDArray[np.float32] | None:
        """BM25 of every row for the query's distinct terms (0 for rows holding none, and
        for dead rows), or None when no live row holds any.

        `all_alive` says no row is dead, which spares a mask per term.
        """
        if len(term_ids) == 0 or self.live_rows <= 0:
            return None
        self._weigh(alive, all_alive)
        scores = np.zeros(len(alive), dtype=np.float32)
        matched = False
        term_ids = term_ids.astype(np.int32)
        for seg in self.segments:
            assert seg.weights is not None
            for span in seg.spans(term_ids):
                if span is None:
                    continue
                rows, weights = seg.rows[span], seg.weights[span]
                if not all_alive:
                    ok = alive[rows]
                    rows, weights = rows[ok], weights[ok]
                np.add.at(scores, rows, weights)  # numpy ≥ 1.25 makes ufunc.at fast
                matched = True
        return scores if matched else None
