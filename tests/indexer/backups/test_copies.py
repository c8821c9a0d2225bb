"""The local files of a backup: the index copied while it is written, the notes' tarball
giving every file its exact mtime back (so the pass after a restore skips it), nothing
unpacked outside its folder, and a clone's notes made the new base's."""

from __future__ import annotations

import io
import os
import sqlite3
import tarfile
import threading
from pathlib import Path

import pytest

from metis_indexer.backups import copies


def test_the_notes_come_back_with_their_mtimes_to_the_nanosecond(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    (notes / ".records").mkdir(parents=True)
    files = {
        notes / "a1.md": b"# A\n\nfirst\n",
        notes / ".records" / "a1.json": b"{}",
        notes / "b2.md": b"second\n",
    }
    for i, (path, data) in enumerate(files.items()):
        path.write_bytes(data)
        os.utime(path, ns=(1_765_000_000_123_456_789 + i, 1_765_000_000_123_456_789 + i))
    tarball = tmp_path / "notes.tar"
    assert copies.tar_notes(notes, tarball) == 2
    back = tmp_path / "back"
    copies.unpack_notes(tarball, back)
    for path, data in files.items():
        there = back / path.relative_to(notes)
        assert there.read_bytes() == data
        assert there.stat().st_mtime_ns == path.stat().st_mtime_ns


def test_a_tarball_reaching_outside_its_folder_is_refused(tmp_path: Path) -> None:
    tarball = tmp_path / "evil.tar"
    with tarfile.open(tarball, "w") as tar:
        info = tarfile.TarInfo("../outside.md")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(tarfile.OutsideDestinationError):
        copies.unpack_notes(tarball, tmp_path / "notes")
    assert not (tmp_path / "outside.md").exists()


def test_the_index_is_copied_whole_while_it_is_written(tmp_path: Path) -> None:
    database = tmp_path / "index.sqlite3"
    db = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE chunks (id INTEGER PRIMARY KEY, text TEXT)")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    db.execute("INSERT INTO meta VALUES ('model', 'm'), ('dimensions', '4')")
    db.execute("INSERT INTO meta VALUES ('chunk_size', '1200'), ('chunk_overlap', '200')")
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():  # each transaction adds ten rows: a copy holds tens
            db.execute("BEGIN")
            db.executemany("INSERT INTO chunks (text) VALUES (?)", [("x" * 100,)] * 10)
            db.execute("COMMIT")

    writer = threading.Thread(target=write)
    writer.start()
    try:
        copies.copy_index(database, tmp_path / "copy")
    finally:
        stop.set()
        writer.join()
    held = copies.held(tmp_path / "copy")
    assert held.chunks % 10 == 0, "a transaction is in the copy whole or not at all"
    assert (held.model, held.dimensions) == ("m", 4)
    assert held.chunking is not None and held.chunking.size == 1200
    assert copies.chunk_count(tmp_path / "absent") == 0


def test_a_clone_makes_the_notes_the_new_base_s(tmp_path: Path) -> None:
    database = tmp_path / "index.sqlite3"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE files (id INTEGER PRIMARY KEY, source TEXT, path TEXT)")
        db.executemany(
            "INSERT INTO files (source, path) VALUES (?, ?)",
            [("metis-old", "a.md"), ("metis-old", "b.md"), ("docs", "x.md")],
        )
    assert copies.rename_source(database, "metis-old", "metis-new") == 2
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT source, path FROM files ORDER BY path").fetchall()
    assert rows == [("metis-new", "a.md"), ("metis-new", "b.md"), ("docs", "x.md")]
