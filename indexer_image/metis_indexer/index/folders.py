"""Which folder of the index drive holds the index that answers, and where another is built
beside it.

The index that answers is in the drive's own folder (`index_dir`), or in a folder of it
that the pointer file `POINTER` names. An index of other chunks is built in a folder of
its own (`index-<n>`) while the one that answers goes on answering, and takes its place
when the pointer names it: a rename, whole or not at all, so a kill at any moment leaves
one index that answers. What a kill leaves besides (a build not finished, an old index not
yet removed) is what the pointer does not name: the writer resumes the one and removes
the other.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

from metis_indexer.files import sync_folder

POINTER = "live-index"
"""The file naming the folder of the index that answers; absent: the drive's own folder."""
BUILT = re.compile(r"index-([0-9]{1,9})")
"""The names of folders an index is built in."""
OWN_FILES = (
    "index.sqlite3",
    "index.sqlite3-wal",
    "index.sqlite3-shm",
    "snapshot.json",
    "snapshot-*",
)
"""What an index in the drive's own folder is made of (`store.Store`, `snapshot`): not the
writer lock, nor a damaged index moved aside for a person to look at."""


def live(index_dir: Path) -> Path:
    """The folder of the index that answers. A pointer that cannot be read, or that names
    no folder an index is built in, is the drive's own folder: an index is derived data,
    and what the pointer named is read again from the sources."""
    try:
        name = (index_dir / POINTER).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return index_dir
    return index_dir / name if BUILT.fullmatch(name) else index_dir


def next_name(live_name: str | None, present: list[str]) -> str:
    """The folder a new index is built in: the one a build left (the first, if several),
    else the one numbered after the answering one and every folder present."""
    left = sorted((n for n in present if BUILT.fullmatch(n) and n != live_name), key=_number)
    if left:
        return left[0]
    numbers = [_number(n) for n in present if BUILT.fullmatch(n)]
    if live_name is not None and BUILT.fullmatch(live_name):
        numbers.append(_number(live_name))
    return f"index-{max(numbers, default=0) + 1}"


def _number(name: str) -> int:
    match = BUILT.fullmatch(name)
    assert match is not None
    return int(match.group(1))


def beside(index_dir: Path, answering: Path) -> Path:
    """The folder to build an index in beside `answering`'s."""
    return index_dir / next_name(_name(index_dir, answering), _built(index_dir))


def left_over(index_dir: Path, answering: Path, building: Path | None = None) -> list[Path]:
    """What a kill or a switch left on the drive besides `answering` (and `building`): the
    folders of other indexes, and the drive's own index files when another folder answers."""
    keep = {answering, building}
    found = [index_dir / n for n in _built(index_dir) if index_dir / n not in keep]
    if answering != index_dir and any(_own_files(index_dir)):
        found.append(index_dir)
    return found


def publish(index_dir: Path, folder: Path) -> None:
    """`folder`'s index answers from now on, even after a kill: the pointer is written
    whole under another name, synced, then renamed over the old one, and the rename synced."""
    name = _name(index_dir, folder)
    staged = index_dir / f".{POINTER}.new"
    with open(staged, "w", encoding="utf-8") as f:
        f.write(f"{name or ''}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, index_dir / POINTER)
    sync_folder(index_dir)


def remove(index_dir: Path, folder: Path) -> None:
    """An index no longer wanted: its folder, or in the drive's own folder its files only."""
    if folder != index_dir:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in _own_files(index_dir):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def size(index_dir: Path, folder: Path) -> int:
    """Bytes an index takes on the drive."""
    paths = _own_files(index_dir) if folder == index_dir else folder.glob("*")
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total


def _name(index_dir: Path, folder: Path) -> str | None:
    return None if folder == index_dir else folder.name


def _built(index_dir: Path) -> list[str]:
    try:
        entries = list(os.scandir(index_dir))
        return sorted(e.name for e in entries if e.is_dir() and BUILT.fullmatch(e.name))
    except OSError:
        return []


def _own_files(index_dir: Path) -> list[Path]:
    return [path for pattern in OWN_FILES for path in index_dir.glob(pattern) if path.is_file()]


def drive_use(index_dir: Path) -> tuple[int, int] | None:
    """Bytes in use on the index drive and its size, as a writer without root's reserve
    sees them (statvfs); None where it cannot be read."""
    try:
        fs = os.statvfs(index_dir)
    except OSError:
        return None
    size = fs.f_blocks * fs.f_frsize
    return size - fs.f_bavail * fs.f_frsize, size
