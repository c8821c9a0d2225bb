import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from metis_indexer.index import store, texts
from metis_indexer.index.memory import Index, IndexSettings, Replacement

from .helpers import axis, chunk, new_index, record


def keyword_rows(index: Index, text: str) -> list[int]:
    from metis_indexer.index import tokens

    ids = index.store.word_ids(tokens.words(text))
    scores = index.keyword.scores(ids, index.alive)
    return [] if scores is None else np.flatnonzero(scores[: index.n_rows] > 0).tolist()


def test_a_document_round_trips_through_disk(tmp_path):
    index = new_index(tmp_path)
    index.put_document(
        record("a.md", title="Handbook", chunks=2),
        [
            chunk("vacation days", ("Leave",), line=3, title="Handbook"),
            chunk("sick leave rules", ("Leave", "Sick"), title="Handbook"),
        ],
        np.stack([axis(0), axis(1) * 3]),
    )
    again = Index(tmp_path)
    again.load()
    assert again.settings() == IndexSettings("test-model", 8, 1200, 200)
    assert again.chunk_count == 2
    assert [again.headings[h] for h in again.row_headings[:2]] == [("Leave",), ("Leave", "Sick")]
    assert again.row_line[0] == 3
    kept = again.vectors.exact(np.array([1]))[0]
    assert np.allclose(kept, axis(1)), "vectors are kept as unit vectors"
    assert keyword_rows(again, "sick") == [1]
    assert keyword_rows(again, "handbook") == [0, 1], "the title is searchable"
    first = int(again.row_chunk[0])
    assert again.store.texts([first]) == {first: "vacation days"}


def test_replacing_and_dropping_documents(tmp_path):
    index = new_index(tmp_path)
    index.put_document(record("a.md"), [chunk("old words here")], np.stack([axis(0)]))
    index.put_document(record("b.md"), [chunk("other file")], np.stack([axis(1)]))
    index.put_document(record("a.md"), [chunk("new words"), chunk("more")], None)
    assert index.chunk_count == 3
    assert keyword_rows(index, "old") == []
    assert len(keyword_rows(index, "new")) == 1
    index.drop_files([("docs", "b.md")])
    assert index.chunk_count == 2
    assert keyword_rows(index, "other") == []
    again = Index(tmp_path)
    again.load()
    assert again.chunk_count == 2 and not again.has_vector[: again.n_rows].any()
    assert sorted(f.record.path for f in again.files.values()) == ["a.md"]


def test_compaction_keeps_every_live_chunk_findable(tmp_path):
    index = new_index(tmp_path)
    for i in range(2400):
        index.put_document(record(f"f{i}.md"), [chunk(f"common word{i}")], np.stack([axis(i % 8)]))
    index.drop_files([("docs", f"f{i}.md") for i in range(0, 2400, 2)])
    assert index.dead == 0 and index.n_rows == 1200, "dead rows were reclaimed"
    rows = keyword_rows(index, "word2399")
    assert len(rows) == 1
    entry = index.files[int(index.row_file[rows[0]])]
    assert entry.record.path == "f2399.md"
    assert len(keyword_rows(index, "common")) == 1200


def test_int8_answers_match_float32_answers_through_writes_compaction_and_load(tmp_path):
    rng = np.random.default_rng(5)
    dim = 32
    held = {kind: new_index(tmp_path / kind, dim, kind) for kind in ("float32", "int8")}
    for i in range(2400):
        v = rng.standard_normal((2, dim), dtype=np.float32)
        for index in held.values():
            index.put_document(record(f"f{i}.md"), [chunk("a"), chunk("b")], v)
    for index in held.values():
        index.drop_files([("docs", f"f{i}.md") for i in range(0, 2400, 2)])
        assert index.dead == 0, "dead rows were reclaimed"
    again = Index(tmp_path / "int8", "int8")
    again.load()
    for q in rng.standard_normal((20, dim), dtype=np.float32):
        q /= np.linalg.norm(q)
        allowed = held["float32"].allowed(None)
        want = held["float32"].dense(q, allowed, 10)
        for got in (held["int8"].dense(q, allowed, 10), again.dense(q, allowed, 10)):
            assert [r for r, _ in got] == [r for r, _ in want]
            assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-6)
        assert again.vectors.resident_bytes() < held["float32"].vectors.resident_bytes() / 3


def test_a_failed_write_leaves_memory_and_disk_as_they_were(tmp_path):
    index = new_index(tmp_path)
    index.put_document(record("a.md"), [chunk("alpha")], None)
    with pytest.raises(ValueError, match="1 chunks but 2 vectors"):
        index.put_document(record("b.md"), [chunk("beta gamma")], np.zeros((2, 8), np.float32))
    index.store._writer.execute("PRAGMA query_only = ON")
    with pytest.raises(sqlite3.OperationalError):
        index.put_document(record("c.md"), [chunk("delta")], None)
    index.store._writer.execute("PRAGMA query_only = OFF")
    assert index.store.word_ids(["delta", "beta"]).size == 0, "no word of a failed write stays"
    assert index.chunk_count == 1
    index.put_document(record("d.md"), [chunk("epsilon")], None)
    again = Index(tmp_path)
    again.load()
    assert keyword_rows(again, "epsilon") != [] and again.chunk_count == 2


def test_documents_written_together_fail_alone(tmp_path):
    index = new_index(tmp_path)
    index.put_document(record("old.md"), [chunk("former text")], None)
    errors = index.put_documents(
        [
            Replacement(record("a.md"), [chunk("alpha words")], np.stack([axis(0)])),
            Replacement(record("b.md"), [chunk("beta \ud800 surrogate")], None),
            Replacement(
                record("c.md"), [chunk("gamma"), chunk("delta")], np.zeros((1, 8), np.float32)
            ),
            Replacement(record("old.md"), [chunk("latter text")], np.stack([axis(2)])),
        ]
    )
    assert errors[0] is None and errors[3] is None
    assert isinstance(errors[1], UnicodeEncodeError), "text SQLite cannot store"
    assert isinstance(errors[2], ValueError) and "2 chunks but 1 vectors" in str(errors[2])
    assert index.store.word_ids(["beta", "surrogate", "gamma"]).size == 0, (
        "no word of a document that failed stays"
    )
    again = Index(tmp_path)
    again.load()
    assert sorted(f.record.path for f in again.files.values()) == ["a.md", "old.md"]
    assert keyword_rows(again, "alpha") != [] and keyword_rows(again, "latter") != []
    assert keyword_rows(again, "former") == []
    for mem in (index, again):
        assert mem.chunk_count == 2
        assert np.allclose(mem.vectors.exact(np.array(keyword_rows(mem, "latter")))[0], axis(2))


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from metis_indexer.documents import Chunk
    from metis_indexer.index.memory import Index, IndexSettings, Replacement
    from metis_indexer.index.store import FileRecord
    index = Index(__import__("pathlib").Path(sys.argv[1]))
    if index.settings() is None:
        index.adopt(IndexSettings("m", 8, 1200, 200))
    index.load()
    print("ready", flush=True)
    i = 0
    group = int(sys.argv[2])
    while True:
        documents = []
        for _ in range(group):
            n = 1 + i % 7
            chunks = [Chunk(None, (), f"doc {i} part {j} word{i}x{j}", None, 1, 0, 0)
                      for j in range(n)]
            rec = FileRecord("docs", f"d{i % 50}.md", "md", 1, 1, "h", "indexed", "t", chunks=n)
            documents.append(Replacement(rec, chunks, np.ones((n, 8), np.float32)))
            i += 1
        index.put_documents(documents)
        print("put", i, flush=True)
    """
)


@pytest.mark.parametrize("group", [1, 8], ids=["one-per-transaction", "eight-per-transaction"])
def test_a_kill_at_any_moment_loses_at_most_the_documents_in_flight(tmp_path, group):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(group)],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        # Kill once it has said it committed some documents: it is writing the next one by
        # then (or a later one, as the pipe lags), so the kill lands mid-flight.
        puts = 5 + 20 * attempt
        for _ in range(puts):
            assert proc.stdout.readline().startswith(b"put "), "the writer stopped"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        index = Index(tmp_path)
        index.load()
        assert index.chunk_count > 0
        for entry in index.files.values():
            rows = index.alive[: index.n_rows] & (index.row_file[: index.n_rows] == entry.id)
            assert rows.sum() == entry.record.chunks, entry.record.path
        count = index.store._reader.execute("PRAGMA integrity_check").fetchone()[0]
        assert count == "ok"
        index.store.close()


def test_a_word_unknown_to_a_question_is_found_once_a_document_brings_it(tmp_path):
    index = new_index(tmp_path)
    index.put_document(record("a.md"), [chunk("alpha")], None)
    assert keyword_rows(index, "zebra") == []
    index.put_document(record("b.md"), [chunk("zebra crossing")], None)
    assert len(keyword_rows(index, "zebra")) == 1


def test_new_chunking_keeps_the_index_and_a_new_model_keeps_its_chunks(tmp_path):
    index = new_index(tmp_path)
    index.put_document(record("a.md"), [chunk("alpha words")], np.stack([axis(0)]))
    index.adopt(IndexSettings("test-model", 8, 400, 100))
    assert index.chunk_count == 1 and index.has_vector[0], "same model: vectors stay"
    index.adopt(IndexSettings("other-model", 4, 400, 100))
    assert index.chunk_count == 1 and not index.has_vector[: index.n_rows].any()
    assert keyword_rows(index, "alpha") == [0], "still found by words"
    index.put_document(record("b.md"), [chunk("beta")], np.ones((1, 4), np.float32))
    again = Index(tmp_path)
    again.load()
    assert again.settings() == IndexSettings("other-model", 4, 400, 100)
    assert again.vectors.dimensions == 4 and again.has_vector[: again.n_rows].tolist() == [
        False,
        True,
    ]


def tfs_of(index: Index, word: str) -> list[int]:
    """The counts of `word` in the live rows holding it, in row order."""
    [term] = index.store.word_ids([word]).tolist()
    found = []
    for seg in index.keyword.segments:
        for span in seg.spans(np.array([term], np.int32)):
            if span is not None:
                pairs = zip(seg.rows[span], seg.tfs[span], strict=True)
                found += [(int(r), int(t)) for r, t in pairs if index.alive[r]]
    return [t for _, t in sorted(found)]


def test_words_of_an_older_version_are_counted_again_from_the_stored_texts(tmp_path, monkeypatch):
    """An index written when BM25 counted the title once (words version 1) and loaded by
    this version: adopting this version's settings (a pass's first step) counts its words
    again without reading its documents; a load alone keeps what is stored."""
    monkeypatch.setattr(texts, "TITLE_WEIGHT", 1)
    old = Index(tmp_path)
    old.adopt(IndexSettings("test-model", 8, 1200, 200, words="1"))
    old.put_document(
        record("a.md", title="Handbook", chunks=2),
        [chunk("vacation days handbook", title="Handbook"), chunk("sick leave", title="Handbook")],
        np.stack([axis(0), axis(1)]),
    )
    old.store.close()
    monkeypatch.undo()
    assert texts.TITLE_WEIGHT == 2 and texts.WORDS_VERSION == "2"

    index = Index(tmp_path)
    index.load()
    assert index.settings().words == "1"
    assert tfs_of(index, "handbook") == [2, 1], "loading alone keeps the stored counts"
    chunk_ids = index.row_chunk[: index.n_rows].tolist()
    index.adopt(IndexSettings("test-model", 8, 1200, 200))
    assert tfs_of(index, "handbook") == [3, 2]
    assert index.settings() == IndexSettings("test-model", 8, 1200, 200, words="2")
    assert index.has_vector[: index.n_rows].all(), "the same model: vectors stay"
    assert index.row_chunk[: index.n_rows].tolist() == chunk_ids, "no chunk was written again"
    [entry] = index.files.values()
    assert entry.record.built_with == "", "the document's record is as it was: not read again"

    again = Index(tmp_path)
    again.load()
    assert tfs_of(again, "handbook") == [3, 2] and keyword_rows(again, "sick") == [1]


def test_words_counted_again_may_be_words_no_chunk_had(tmp_path, monkeypatch):
    monkeypatch.setattr(texts, "searched", lambda title, headings, text: text)
    old = new_index(tmp_path)
    old.adopt(IndexSettings("test-model", 8, 1200, 200, words="0"))
    old.put_document(record("a.md", title="Handbook"), [chunk("vacation", title="Handbook")], None)
    monkeypatch.undo()
    assert keyword_rows(old, "handbook") == []
    old.adopt(IndexSettings("test-model", 8, 1200, 200))
    assert keyword_rows(old, "handbook") == [0], "a question finds the word new to the index"
    assert keyword_rows(old, "vacation") == [0]


def test_an_index_that_never_recorded_its_words_has_them_counted_again():
    meta = IndexSettings("m", 8, 1200, 200).as_meta()
    del meta["words"]
    before = IndexSettings.from_meta(meta)
    assert before is not None and before.words == "" and before != IndexSettings("m", 8, 1200, 200)
    assert before.key == IndexSettings("m", 8, 1200, 200).key, "documents are not read again"


def test_a_loaded_index_scores_words_as_the_index_that_wrote_it(tmp_path):
    """A load builds the keyword index in one piece; the writer built it document by
    document, merging as it went, and dropped some: the same chunks score the same."""
    index = new_index(tmp_path)
    rng = np.random.default_rng(9)
    vocabulary = [f"w{i}" for i in range(60)]
    for i in range(300):
        parts = [" ".join(rng.choice(vocabulary, int(rng.integers(3, 40)))) for _ in range(3)]
        index.put_document(record(f"f{i}.md"), [chunk(p) for p in parts], None)
    index.drop_files([("docs", f"f{i}.md") for i in range(0, 300, 7)])
    index.settle()
    again = Index(tmp_path)
    again.load()
    again.settle()
    assert len(again.keyword.segments) == 1 and len(index.keyword.segments) > 1
    for question in ("w1", "w2 w3 w40", "w59 w7 w7 w0"):
        by_chunk = [
            {int(held.row_chunk[r]): s for r, s in held.by_words(question.split(), None, 900)}
            for held in (index, again)
        ]
        assert by_chunk[0] == by_chunk[1] and len(by_chunk[0]) > 100


def test_an_index_format_is_read_up_to_this_indexers_own():
    assert store.newer_format(None) is None, "an index written before formats were checked"
    assert store.newer_format("1") is None
    assert "format 2 by a newer indexer" in (store.newer_format("2") or "")
    assert "'v2' is not one this indexer knows" in (store.newer_format("v2") or "")
