"""BM25 against a term-by-term reference, on real text."""

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from metis_indexer.index.keyword import KeywordIndex
from metis_indexer.index.tokens import words

PEPS = Path(__file__).resolve().parents[3].parent / "shared/data/perf/python-peps"


def reference_scores(docs, query, k1=1.2, b=0.75):
    """BM25 written out term by term: the slow, obvious version. `docs` are the chunks a
    base searches: idf, lengths and counts are all the chunks'."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / len(docs)
    out = []
    for doc in docs:
        score = 0.0
        for term in set(query):
            tf = doc.count(term)
            if tf:
                df = sum(term in d for d in docs)
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        out.append(score)
    return out


class Vocabulary(dict):
    """Words to ids, as the store gives them."""

    def add(self, words):
        return [self.setdefault(w, len(self)) for w in words]

    def lookup(self, words):
        return np.array(sorted({self[w] for w in words if w in self}), dtype=np.int32)


def add(vocab, index, rows, docs):
    ids, counts, sizes = [], [], []
    for r in rows:
        c = Counter(docs[r])
        ids += vocab.add(c.keys())
        counts += c.values()
        sizes.append(len(c))
    index.add(
        np.asarray(rows),
        np.array(ids, np.int32),
        np.array(counts, np.int32),
        np.array(sizes, np.int64),
    )


def build(docs, batches=3):
    vocab, index = Vocabulary(), KeywordIndex()
    for part in np.array_split(np.arange(len(docs)), batches):
        add(vocab, index, part.tolist(), docs)
    return vocab, index


def dense(index, ids, alive):
    scores = index.scores(ids, alive)
    return np.zeros(len(alive), np.float32) if scores is None else scores[: len(alive)]


@pytest.fixture(scope="module")
def docs():
    files = sorted(PEPS.rglob("*.rst"))[:60]
    assert len(files) == 60, PEPS
    return [words(f.read_text(encoding="utf-8", errors="replace")[:3000]) for f in files]


@pytest.mark.parametrize("query", ["python generator expressions", "unicode", "zzz not there"])
def test_scores_match_the_reference(docs, query):
    vocab, index = build(docs)
    alive = np.ones(len(docs), dtype=bool)
    q = words(query)
    got = dense(index, vocab.lookup(q), alive)
    assert np.allclose(got, reference_scores(docs, q), rtol=1e-4, atol=1e-5)


def test_dead_rows_score_nothing_and_leave_the_statistics(docs):
    vocab, index = build(docs)
    alive = np.ones(len(docs), dtype=bool)
    alive[::2] = False
    index.drop(np.flatnonzero(~alive))
    q = words("python import module")
    got = dense(index, vocab.lookup(q), alive)
    live_docs = [d for d, a in zip(docs, alive, strict=True) if a]
    want = reference_scores(live_docs, q)
    assert np.all(got[~alive] == 0)
    assert np.allclose(got[alive], want, rtol=1e-4, atol=1e-5)


def test_merging_segments_changes_no_score(docs):
    vocab, index = build(docs, batches=10)
    alive = np.ones(len(docs), dtype=bool)
    alive[3] = False
    index.drop(np.array([3]))
    ids = vocab.lookup(words("the python language"))
    before = dense(index, ids, alive)
    index.merge(alive)
    assert len(index.segments) == 1
    assert np.allclose(before, dense(index, ids, alive))


def test_adding_one_row_at_a_time_keeps_few_segments_and_exact_scores(docs):
    vocab, index = Vocabulary(), KeywordIndex()
    alive = np.ones(len(docs), dtype=bool)
    q = words("python generator expressions")
    for r in range(len(docs)):
        add(vocab, index, [r], docs)
        index.compact(alive)
        if r == 30:  # a query between adds: the cached weights must follow the new rows
            partial = dense(index, vocab.lookup(q), alive)[:31]
            want = reference_scores(docs[:31], q)
            assert np.allclose(partial, want, rtol=1e-4, atol=1e-5)
        assert len(index.segments) <= 3 * math.log(r + 1, 4) + 1
    assert np.allclose(
        dense(index, vocab.lookup(q), alive),
        reference_scores(docs, q),
        rtol=1e-4,
        atol=1e-5,
    )


def test_a_query_after_a_drop_uses_the_new_statistics(docs):
    """Weights cached by one query must not outlive a drop: N, df and the average length
    have moved, though no segment changed."""
    vocab, index = build(docs, batches=1)
    alive = np.ones(len(docs), dtype=bool)
    q = [*words("python import module"), docs[0][0]]  # docs[0][0] is term 0, first in a segment
    dense(index, vocab.lookup(q), alive)
    alive[:10] = False
    index.drop(np.arange(10))
    got = dense(index, vocab.lookup(q), alive)
    assert index.live_rows == len(docs) - 10
    want = reference_scores(docs[10:], q)
    assert np.allclose(got[alive], want, rtol=1e-4, atol=1e-5)


def test_the_lengths_grow_with_the_rows_and_keep_what_they_held():
    index = KeywordIndex()
    one = np.array([1], np.int64)
    index.add([0], np.array([0], np.int32), np.array([3], np.int32), one)
    assert len(index.lengths) == 1024
    index.add([1500], np.array([0], np.int32), np.array([2], np.int32), one)
    assert len(index.lengths) == 2048 and index.lengths[0] == 3 and index.lengths[1500] == 2
    index.ensure_capacity(4097)
    assert len(index.lengths) == 4097 and index.lengths[1500] == 2


def test_four_segments_merge_while_the_oldest_is_at_most_twice_the_newest():
    index = KeywordIndex()
    alive = np.ones(16, dtype=bool)
    start = 0

    def add(n: int) -> None:
        nonlocal start
        rows = list(range(start, start + n))
        start += n
        index.add(
            rows,
            np.zeros(n, np.int32),
            np.ones(n, np.int32),
            np.ones(n, np.int64),
        )
        index.compact(alive)

    for n in (4, 2, 2):
        add(n)
    assert [len(s.rows) for s in index.segments] == [4, 2, 2], "three are not merged"
    add(2)
    assert [len(s.rows) for s in index.segments] == [10], "4 is twice 2: merged"
    for n in (2, 2, 1):
        add(n)
    assert [len(s.rows) for s in index.segments] == [10, 2, 2, 1], "10 > twice 1: kept apart"


def test_renumbering_rows_keeps_each_live_row_s_score(docs):
    """After the index compacts its rows, row r becomes the count of live rows before it."""
    vocab, index = build(docs)
    alive = np.ones(len(docs), dtype=bool)
    alive[::3] = False
    index.drop(np.flatnonzero(~alive))
    index.remap(np.cumsum(alive) - 1, alive)
    live = [d for d, a in zip(docs, alive, strict=True) if a]
    assert len(index.segments) == 1 and len(index.lengths) == 1024
    assert index.lengths[: len(live)].tolist() == [len(d) for d in live]
    q = words("python generator expressions")
    got = dense(index, vocab.lookup(q), np.ones(len(live), dtype=bool))
    want = reference_scores(live, q)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_no_live_row_holding_a_term_is_no_answer(docs):
    vocab, index = build(docs)
    alive = np.ones(len(docs), dtype=bool)
    assert index.scores(np.array([10**6], np.int32), alive) is None
    index.drop(np.arange(len(docs)))
    assert index.scores(vocab.lookup(words("python")), np.zeros(len(docs), bool)) is None


def test_a_term_missing_from_a_segment_does_not_end_the_query(docs):
    vocab, index = build(docs)
    alive = np.ones(len(docs), dtype=bool)
    ids = vocab.lookup(words("python"))
    got = index.scores(np.concatenate([np.array([10**6], np.int32), ids]), alive)
    assert got is not None
    want = reference_scores(docs, ["python"])
    assert np.allclose(got[: len(docs)], want, rtol=1e-4, atol=1e-5)


def test_tiny_documents_and_an_empty_one_match_the_reference():
    """On a few words a document, the average length is felt in every score; a chunk with no
    word (the last row here) still counts as a document of length 0."""
    docs = [["alpha", "beta"], ["beta"], []]
    vocab, index = Vocabulary(), KeywordIndex()
    add(vocab, index, [0, 1, 2], docs)
    alive = np.ones(3, dtype=bool)
    assert index.live_rows == 3 and index.live_length == 3.0
    for q in (["alpha"], ["beta"], ["alpha", "beta"]):
        got = dense(index, vocab.lookup(q), alive)
        assert np.allclose(got, reference_scores(docs, q), rtol=1e-6, atol=1e-7)


def test_an_index_of_wordless_chunks_answers_nothing():
    """A chunk can hold no word at all (only punctuation): no term, so no score and no error."""
    index = KeywordIndex()
    index.add(
        [0],
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        np.array([0], np.int64),
    )
    assert index.live_rows == 1
    assert index.scores(np.array([0], np.int32), np.ones(1, dtype=bool)) is None


def test_scores_weighed_at_query_time_are_the_cached_scores_to_the_bit(docs):
    vocab, index = build(docs, batches=4)
    alive = np.ones(len(docs), dtype=bool)
    alive[5] = False
    index.drop(np.array([5]))
    ids = vocab.lookup(words("python generator expressions unicode the"))
    assert not index.weighed, "rows came and went: the cache is stale"
    during = dense(index, ids, alive).copy()
    snap = index.snapshot(alive)
    assert index.install(snap, snap.weigh(index)) and index.weighed
    assert np.array_equal(during, dense(index, ids, alive))


def test_a_weighing_overtaken_by_a_new_row_is_not_kept(docs):
    vocab, index = build(docs[:-1])
    alive = np.ones(len(docs), dtype=bool)
    snap = index.snapshot(alive)
    weights = snap.weigh(index)
    add(vocab, index, [len(docs) - 1], docs)
    assert not index.install(snap, weights)
    assert not index.weighed
    q = words("python import module")
    assert np.allclose(
        dense(index, vocab.lookup(q), alive),
        reference_scores(docs, q),
        rtol=1e-4,
        atol=1e-5,
    )
    snap = index.snapshot(alive)
    assert index.install(snap, snap.weigh(index)) and index.weighed


def test_a_word_in_many_chunks_of_one_document_is_as_common_as_its_chunks():
    """idf counts the chunks a base searches (spec 000): a word that fills three chunks of
    one long document, of four chunks in all, is held by three of four, not by one
    document of two (issue 28: counted by documents, long documents lost)."""
    docs = [["x", "y"], ["x", "z"], ["x", "w"], ["y", "z"]]
    vocab, index = Vocabulary(), KeywordIndex()
    add(vocab, index, [0, 1, 2, 3], docs)
    got = dense(index, vocab.lookup(["x"]), np.ones(4, dtype=bool))
    idf = math.log(1 + (4 - 3 + 0.5) / (3 + 0.5))
    assert np.allclose(got[:3], idf) and got[3] == 0


def test_postings_and_scores_keep_their_compact_types(docs):
    # The index's memory per chunk (docs/performance.md) rests on these: 4-byte rows and
    # terms, 1-byte term counts (2 where one is over 255), 4-byte lengths, weights and
    # scores. numpy's defaults (int64, float64) would answer the same and take twice the
    # memory.
    vocab, index = build(docs)
    assert index.lengths.dtype == np.float32  # as grown by `add`
    alive = np.ones(len(docs), dtype=bool)
    index.merge(alive)
    index.remap(np.arange(len(docs)), alive)
    # The first document's words hold term 0, the edge of the per-term counts.
    ids = vocab.lookup([*docs[0][:30], *words("python generator expressions")])
    at_query_time = dense(index, ids, alive)
    assert at_query_time.dtype == np.float32
    snap = index.snapshot(alive)
    assert index.install(snap, snap.weigh(index))
    cached = index.scores(ids, alive)
    assert cached.dtype == np.float32  # summed from cached weights
    np.testing.assert_allclose(cached[: len(alive)], at_query_time, rtol=1e-6)
    assert index.lengths.dtype == np.float32  # as renumbered by `remap`
    for seg in index.segments:
        assert (seg.terms.dtype, seg.rows.dtype, seg.tfs.dtype, seg.indptr.dtype) == (
            np.int32,
            np.int32,
            np.uint8,
            np.int64,
        )
        assert seg.weights is not None and seg.weights.dtype == np.float32


def test_a_count_over_255_keeps_two_bytes_and_scores_as_counted():
    index = KeywordIndex()
    index.add(
        [0, 1],
        np.array([0, 1, 0], np.int32),
        np.array([300, 1, 2], np.int32),
        np.array([2, 1]),
    )
    [seg] = index.segments
    assert seg.tfs.dtype == np.uint16 and sorted(seg.tfs.tolist()) == [1, 2, 300]
    scores = index.scores(np.array([0], np.int32), np.ones(2, bool))
    assert scores is not None and scores[0] > scores[1] > 0


def test_weights_of_rows_that_moved_meanwhile_are_not_installed(docs):
    # Weighing runs outside the index's lock; what it weighed is kept only if nothing moved.
    _, index = build(docs[:40], batches=1)
    alive = np.ones(40, dtype=bool)
    snap = index.snapshot(alive)
    weights = snap.weigh(index)
    index.drop(np.array([3]))  # the statistics moved, the segments did not
    assert not index.install(snap, weights) and not index.weighed

    _, index = build(docs[:40], batches=1)
    snap = index.snapshot(alive)
    weights = snap.weigh(index)
    index.merge(alive)  # as many segments, but not the same ones
    assert not index.install(snap, weights) and not index.weighed

    snap = index.snapshot(alive)
    assert index.install(snap, snap.weigh(index)) and index.weighed


def test_a_term_no_row_holds_scores_nothing_from_cached_weights(docs):
    vocab, index = build(docs[:20], batches=1)
    alive = np.ones(20, dtype=bool)
    snap = index.snapshot(alive)
    assert index.install(snap, snap.weigh(index))
    assert index.scores(np.array([len(vocab) + 5], dtype=np.int32), alive) is None
