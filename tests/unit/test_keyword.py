"""BM25 against a term-by-term reference, on real text."""

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from metis_indexer.keyword import KeywordIndex
from metis_indexer.tokens import words

PEPS = Path(__file__).resolve().parents[2].parent / "shared/data/perf/python-peps"


def reference_scores(docs, query, k1=1.2, b=0.75):
    """BM25 written out term by term: the slow, obvious version."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    out = []
    for doc in docs:
        score = 0.0
        for term in set(query):
            tf = doc.count(term)
            if tf:
                df = sum(1 for d in docs if term in d)
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
    index.add(np.asarray(rows), np.array(ids, np.int32), np.array(counts, np.int32),
              np.array(sizes, np.int64))


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
            assert np.allclose(partial, reference_scores(docs[:31], q), rtol=1e-4, atol=1e-5)
        assert len(index.segments) <= math.log2(r + 1) + 1
    assert np.allclose(dense(index, vocab.lookup(q), alive), reference_scores(docs, q),
                       rtol=1e-4, atol=1e-5)


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
    assert np.allclose(dense(index, vocab.lookup(q), alive), reference_scores(docs, q),
                       rtol=1e-4, atol=1e-5)
    snap = index.snapshot(alive)
    assert index.install(snap, snap.weigh(index)) and index.weighed
