"""The local files of a backup: made from the index and the notes, and unpacked into an
empty index drive.

The index is copied with SQLite's `VACUUM INTO` rather than the online backup API: it is
one read transaction, so under WAL the passes go on writing and the copy is the index as
of its start, whole; it writes a compact file (no free pages, no log), the smallest
object to upload; and it never starts over, where the backup API copying in steps starts
again whenever another connection writes the source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import sqlite3
import tarfile
from pathlib import Path

from metis_indexer.backups.manifest import FileSum
from metis_indexer.config import ChunkingConfig

READ_BYTES = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Held:
    """What an index copy holds, from its own tables."""

    chunks: int
    model: str | None
    dimensions: int | None
    chunking: ChunkingConfig | None


def copy_index(database: Path, into: Path) -> None:
    """A consistent copy of the index at `database` into `into` (which must not exist)."""
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, isolation_level=None)
    try:
        db.execute("VACUUM INTO ?", (str(into),))
    finally:
        db.close()


def held(database: Path) -> Held:
    """The chunks a copy holds and what it was built with (its `meta`)."""
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, isolation_level=None)
    try:
        (chunks,) = db.execute("SELECT count(*) FROM chunks").fetchone()
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    finally:
        db.close()
    chunking = None
    with contextlib.suppress(KeyError, ValueError):
        chunking = ChunkingConfig(size=int(meta["chunk_size"]), overlap=int(meta["chunk_overlap"]))
    dimensions = int(meta["dimensions"]) if meta.get("dimensions", "0") not in ("", "0") else None
    return Held(int(chunks), meta.get("model") or None, dimensions, chunking)


def chunk_count(database: Path) -> int:
    """Chunks an index holds; 0 where it has none, or no file, or no chunks table yet."""
    if not database.is_file():
        return 0
    try:
        db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, isolation_level=None)
        try:
            return int(db.execute("SELECT count(*) FROM chunks").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def rename_source(database: Path, old: str, new: str) -> int:
    """A clone into another base: the notes' documents, of source `old`, made `new`'s;
    how many files were renamed."""
    db = sqlite3.connect(database, isolation_level=None)
    try:
        with db:
            db.execute("DELETE FROM files WHERE source = ?", (new,))
            done = db.execute("UPDATE files SET source = ? WHERE source = ?", (new, old))
            return done.rowcount
    finally:
        db.close()


def tar_notes(folder: Path, into: Path) -> int:
    """The notes' folder as a tarball at `into` (POSIX pax, each file's mtime to the
    nanosecond, so a restored note is skipped by the next pass by its size and mtime);
    how many notes (Markdown files) it holds."""
    count = 0
    with tarfile.open(into, "w", format=tarfile.PAX_FORMAT) as tar:
        if not folder.is_dir():
            return 0
        for path in sorted(folder.rglob("*")):
            if not (path.is_file() or path.is_dir()) or path.is_symlink():
                continue
            info = tar.gettarinfo(str(path), arcname=path.relative_to(folder).as_posix())
            ns = path.stat().st_mtime_ns
            info.pax_headers = {"mtime": f"{ns // 10**9}.{ns % 10**9:09d}"}
            if path.is_file():
                with path.open("rb") as f:
                    tar.addfile(info, f)
                count += path.parent == folder and path.suffix == ".md"
            else:
                tar.addfile(info)
    return count


def unpack_notes(tarball: Path, folder: Path) -> None:
    """The notes' tarball unpacked into `folder` (tarfile's "data" filter: nothing outside
    it, no links out, no devices), each file given its exact mtime back."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r") as tar:
        members = tar.getmembers()
        tar.extractall(folder, filter="data")
    for member in sorted(members, key=lambda m: m.name.count("/"), reverse=True):
        exact = member.pax_headers.get("mtime")
        if exact is None:
            continue
        seconds, _, fraction = exact.partition(".")
        ns = int(seconds) * 10**9 + int((fraction + "000000000")[:9])
        os.utime(folder / member.name, ns=(ns, ns), follow_symlinks=False)


def summed(path: Path) -> FileSum:
    """A file's size and SHA-256."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(READ_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return FileSum(bytes=size, sha256=digest.hexdigest())


def remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
