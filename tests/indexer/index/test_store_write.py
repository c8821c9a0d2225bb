"""A document's chunks are written from its flat columns: each chunk's stored words are
the blob one chunk alone would give (what `load_chunks` reads back)."""

from __future__ import annotations

import pickle
import time

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from metis_indexer.index import store
from metis_indexer.index.memory import Index, Replacement
from metis_indexer.index.store import Terms, _terms_blob, _terms_blobs

from .helpers import chunk, new_index, record


@hypothesis.given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 999)), max_size=6), max_size=8
    )
)
def test_a_documents_blobs_are_each_chunks_own(chunks):
    sizes = np.array([len(c) for c in chunks], dtype=np.int64)
    term_ids = np.array([t for c in chunks for t, _ in c], dtype=np.int32)
    counts = np.array([n for c in chunks for _, n in c], dtype=np.int32)
    assert _terms_blobs(term_ids, counts, sizes) == [
        _terms_blob(
            np.array([t for t, _ in c], dtype=np.int32), np.array([n for _, n in c], dtype=np.int32)
        )
        for c in chunks
    ]


@hypothesis.given(
    st.lists(
        st.dictionaries(st.text("abcé", min_size=1, max_size=3), st.integers(1, 9), max_size=5),
        max_size=6,
    )
)
def test_a_documents_words_are_named_once_and_pickle_whole(chunks):
    terms = Terms.of(chunks)
    assert [terms.words[i] for i in terms.which] == [w for c in chunks for w in c]
    assert len(terms.words) == len({w for c in chunks for w in c})
    assert terms.counts.tolist() == [n for c in chunks for n in c.values()]
    assert terms.sizes.tolist() == [len(c) for c in chunks]
    again = pickle.loads(pickle.dumps(terms))
    assert again.words == terms.words and again.which.tolist() == terms.which.tolist()
    assert again.counts.tolist() == terms.counts.tolist()


def _stored_words(index) -> list[set[str]]:
    """Each chunk's words as the store holds them: its term ids read back through `terms`."""
    db = index.store._reader
    word = dict(db.execute("SELECT id, word FROM terms"))
    out = []
    for (blob,) in db.execute("SELECT terms FROM chunks ORDER BY id"):
        ids = np.frombuffer(blob, dtype="<i4")[: len(blob) // 8]
        out.append({word[int(i)] for i in ids})
    return out


@pytest.mark.parametrize("kept", [store.WRITTEN_WORDS, 4], ids=["every-word", "a-few-words"])
def test_words_keep_their_ids_across_documents_and_restarts(tmp_path, monkeypatch, kept):
    """The writer names new words without asking SQLite while it holds every word on disk
    (`kept` large), and looks them up once it cannot (`kept` small): either way a word has
    one id, and a restarted writer goes on from the words on disk."""
    monkeypatch.setattr(store, "WRITTEN_WORDS", kept)
    texts = ["alpha beta gamma", "beta delta", "gamma epsilon alpha zeta", "eta theta beta"]
    index = new_index(tmp_path)
    for i, text in enumerate(texts[:2]):
        index.put_document(record(f"{i}.md"), [chunk(text)], None)
    index.store.close()
    index = Index(tmp_path)
    index.load()
    for i, text in enumerate(texts[2:], start=2):
        index.put_document(record(f"{i}.md"), [chunk(text)], None)
    db = index.store._reader
    words = [w for (w,) in db.execute("SELECT word FROM terms")]
    assert sorted(words) == sorted({w for t in texts for w in t.split()})
    assert _stored_words(index) == [set(t.split()) for t in texts]
    assert index.store._every_word == (kept > 4)


def test_a_document_that_fails_takes_back_the_words_it_named(tmp_path):
    """A document rolled back leaves no word behind in the writer's ids either: the next
    document that brings the word writes it."""
    index = new_index(tmp_path)
    index.put_document(record("a.md"), [chunk("alpha")], None)
    bad = Replacement(record("b.md"), [chunk("omega")], np.zeros((2, 8), np.float32))  # 2 vectors
    good = Replacement(record("c.md"), [chunk("alpha psi")], None)
    errors = index.put_documents([bad, good])
    assert errors[0] is not None and errors[1] is None
    assert "omega" not in index.store._written_words
    index.put_document(record("d.md"), [chunk("omega")], None)
    assert _stored_words(index)[-1] == {"omega"}


def test_the_log_is_copied_into_the_database_by_the_checkpointer(tmp_path, monkeypatch):
    """SQLite's own checkpoints are off for the writer (the log would grow with every chunk
    written); once the log holds `CHECKPOINT_BYTES`, the checkpointer's thread copies it,
    and a later write starts it over, empty."""
    monkeypatch.setattr(store, "CHECKPOINT_BYTES", 256 * 1024)
    index = new_index(tmp_path, dim=1024)
    wal = tmp_path / "index.sqlite3-wal"
    rng = np.random.default_rng(3)
    big = 0
    while wal.stat().st_size < store.CHECKPOINT_BYTES:  # 8 vectors of 4 KB a document
        index.put_document(
            record(f"{big}.md", chunks=8),
            [chunk(f"text {big} {j}") for j in range(8)],
            rng.standard_normal((8, 1024)).astype(np.float32),
        )
        big += 1
    small = 0
    deadline = time.monotonic() + 30
    while wal.stat().st_size >= store.CHECKPOINT_BYTES:  # the checkpointer's thread may lag
        assert time.monotonic() < deadline, "the log was never copied and started over"
        index.put_document(record(f"small-{small}.md"), [chunk(f"small {small}")], None)
        small += 1
    assert small >= 1
    index.store.close()
    again = Index(tmp_path)
    again.load()
    assert again.chunk_count == 8 * big + small


def test_the_writer_lets_go_of_its_words_when_a_pass_settles(tmp_path):
    """The writer's word ids are a pass's working set: gone once the pass settles, and the
    next write reads them again, so a word it had named keeps its id."""
    index = new_index(tmp_path)
    index.put_document(record("a.md"), [chunk("alpha beta")], None)
    assert index.store._written_words
    index.settle()
    assert not index.store._written_words
    index.put_document(record("b.md"), [chunk("beta gamma")], None)
    words = [w for (w,) in index.store._reader.execute("SELECT word FROM terms")]
    assert sorted(words) == ["alpha", "beta", "gamma"]
    assert _stored_words(index) == [{"alpha", "beta"}, {"beta", "gamma"}]
