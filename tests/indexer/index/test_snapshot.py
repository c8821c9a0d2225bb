"""The load's snapshot beside the store: read back only while it is of the store as it is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from metis_indexer.index import snapshot
from metis_indexer.index.memory import Index, Replacement

from .helpers import chunk, new_index, record

DIM = 16


def fill(index: Index, seed: int, documents: int = 40, first: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(first, first + documents):
        texts = [f"doc{i} part{j} common word{i % 9} w{j}" for j in range(3)]
        vectors = rng.standard_normal((3, DIM)).astype(np.float32)
        index.put_document(record(f"f{i}.md"), [chunk(t, (f"H{i % 4}",)) for t in texts], vectors)


def answers(index: Index) -> list[object]:
    """Dense and keyword answers to fixed questions, by chunk id (rows may differ)."""
    rng = np.random.default_rng(99)
    out: list[object] = []
    allowed = index.allowed(None)
    for q in rng.standard_normal((5, DIM)).astype(np.float32):
        q /= np.linalg.norm(q)
        out.append([(int(index.row_chunk[r]), round(s, 5)) for r, s in index.dense(q, allowed, 8)])
    for words in (["common"], ["word3", "w1"], ["doc7"]):
        hits = index.by_words(words, None, 500)  # every match: ties fall by row
        out.append(sorted((int(index.row_chunk[r]), s) for r, s in hits))
    live = np.flatnonzero(index.alive[: index.n_rows]).tolist()
    out.append(
        sorted(
            (int(index.row_chunk[r]), c.headings, c.record.path)
            for r, c in zip(live, index.cited(live), strict=True)
        )
    )
    return out


def snapshot_files(folder: Path) -> set[str]:
    return {p.name for p in folder.glob(f"{snapshot.PREFIX}*")} | {
        p.name for p in folder.glob(snapshot.MANIFEST)
    }


def loaded(folder: Path, kind: str) -> Index:
    index = Index(folder, kind)  # type: ignore[arg-type]
    index.load()
    index.settle()
    return index


@pytest.mark.parametrize("kind", ["float32", "int8"])
def test_a_second_load_reads_the_snapshot_and_answers_as_the_store_does(tmp_path, kind):
    writer = new_index(tmp_path, DIM, kind)
    fill(writer, 1)
    writer.drop_files([("docs", "f3.md")])
    writer.settle()
    first = loaded(tmp_path, kind)  # from the store: saves a snapshot
    files = snapshot_files(tmp_path)
    assert snapshot.MANIFEST in files
    second = loaded(tmp_path, kind)
    assert snapshot_files(tmp_path) == files, "read, not saved again"
    assert answers(second) == answers(first) == answers(writer)
    if kind == "int8":
        assert second.vectors.base, "vectors are read from the snapshot's files"


def test_a_write_after_the_snapshot_sends_the_load_back_to_the_store(tmp_path):
    writer = new_index(tmp_path, DIM, "int8")
    fill(writer, 2)
    loaded(tmp_path, "int8")
    files = snapshot_files(tmp_path)
    fill(writer, 3, documents=2, first=40)  # new chunks
    writer.drop_files([("docs", "f5.md")])
    writer.settle()
    again = loaded(tmp_path, "int8")
    assert snapshot_files(tmp_path).isdisjoint(files - {snapshot.MANIFEST}), "saved anew"
    assert answers(again) == answers(writer)
    assert {e.record.path for e in again.files.values()} >= {"f41.md"}


def test_a_damaged_or_missing_snapshot_file_is_read_from_the_store_instead(tmp_path):
    writer = new_index(tmp_path, DIM, "int8")
    fill(writer, 4)
    loaded(tmp_path, "int8")
    codes = next(tmp_path.glob(f"{snapshot.PREFIX}*.codes.npy"))
    with codes.open("r+b") as f:
        f.truncate(codes.stat().st_size // 2)
    assert answers(loaded(tmp_path, "int8")) == answers(writer)
    next(tmp_path.glob(f"{snapshot.PREFIX}*.tfs.npy")).unlink()
    assert answers(loaded(tmp_path, "int8")) == answers(writer)


def test_a_snapshot_of_another_database_is_not_taken_even_at_the_same_generation(tmp_path):
    first = new_index(tmp_path, DIM, "int8")
    fill(first, 5)
    loaded(tmp_path, "int8")
    first_answers = answers(first)
    first.store.move_aside(tmp_path)  # retired: it reads nothing more
    second = new_index(tmp_path, DIM, "int8")
    fill(second, 6)  # as many chunk changes: the same generation
    assert answers(loaded(tmp_path, "int8")) == answers(second) != first_answers


def test_a_reader_keeps_its_snapshot_when_another_load_replaces_it(tmp_path):
    """Two indexers may load one folder: one's snapshot files are unlinked by the other's
    save, and what the first mapped stays readable."""
    writer = new_index(tmp_path, DIM, "int8")
    fill(writer, 7)
    reader = loaded(tmp_path, "int8")
    before = answers(reader)
    fill(writer, 8, documents=5, first=40)
    loaded(tmp_path, "int8")
    mapped = {Path(a.filename).name for a in reader.vectors.base.values()}
    assert mapped and not snapshot_files(tmp_path) & mapped
    assert answers(reader) == before


SAVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from metis_indexer.index.memory import Index
    Index(Path(sys.argv[1]), "int8").load()
    """
)


def test_a_kill_while_the_snapshot_is_saved_leaves_a_consistent_index(tmp_path):
    writer = new_index(tmp_path, 256, "int8")
    rng = np.random.default_rng(10)
    for i in range(0, 3000, 50):
        writer.put_documents(
            [
                Replacement(
                    record(f"f{j}.md"), [chunk(f"doc{j} common")], rng.standard_normal((1, 256))
                )
                for j in range(i, i + 50)
            ]
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], env=env)
    deadline = time.monotonic() + 60
    while not any(tmp_path.glob(f"{snapshot.PREFIX}*.npy")) and proc.poll() is None:
        assert time.monotonic() < deadline, "the load never began its snapshot"
    # Killed once its first file is there: with 15 more to write and sync, before the
    # manifest in practice (seen every time here), though nothing below depends on when.
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = Index(tmp_path, "int8")
    again.load()
    q = np.asarray(rng.standard_normal(256), np.float32)
    q /= np.linalg.norm(q)
    allowed = again.allowed(None)
    want = writer.dense(q, writer.allowed(None), 10)
    assert [(int(again.row_chunk[r]), round(s, 5)) for r, s in again.dense(q, allowed, 10)] == [
        (int(writer.row_chunk[r]), round(s, 5)) for r, s in want
    ]
    assert again.chunk_count == 3000


def test_a_snapshot_that_cannot_be_saved_leaves_no_file_and_the_load_stands(tmp_path):
    writer = new_index(tmp_path, DIM, "int8")
    fill(writer, 11)
    unsaveable = np.zeros(3, dtype=object)  # np.save refuses objects without pickles
    with pytest.raises(ValueError):
        snapshot.write(tmp_path, ("x", 1), 3, {"a": np.zeros(3), "b": unsaveable}, {})
    assert snapshot_files(tmp_path) == set()
    assert answers(loaded(tmp_path, "int8")) == answers(writer)


def test_rows_loaded_from_a_snapshot_are_compacted_and_added_to_like_any_others(tmp_path):
    indexes = {kind: new_index(tmp_path / kind, DIM, kind) for kind in ("float32", "int8")}
    rng = np.random.default_rng(12)
    vectors = rng.standard_normal((2400, DIM)).astype(np.float32)
    for index in indexes.values():
        index.put_documents(
            [
                Replacement(record(f"f{i}.md"), [chunk(f"doc{i}")], vectors[i : i + 1])
                for i in range(2400)
            ]
        )
    again = loaded(tmp_path / "int8", "int8")
    assert again.vectors.base
    for index in (again, indexes["float32"]):
        index.drop_files([("docs", f"f{i}.md") for i in range(0, 2400, 2)])
        assert index.dead == 0, "dead rows were reclaimed"
        index.put_document(record("new.md"), [chunk("new")], vectors[:1] * -1)
    assert not again.vectors.base, "every row is this process's own after a compaction"
    assert answers(again) == answers(indexes["float32"])
