"""Walking a source: the files of a drive (or of one folder of it) that Metis reads.

What is listed: files whose extension is in the table of
`readers.KINDS`; every other file is counted by extension. Hidden files and
folders (any path part starting with `.`: `.git`, `.DS_Store`, `.metis`) are
neither listed nor counted.

Symbolic links: a link to a regular file inside the drive is listed under the
link's own path (it is the name the user put there). A link that leads out of
the drive, to a hidden path, to something other than a file, or nowhere, is
skipped and counted. Links to folders are never descended, even inside the
drive: that is where loops and whole trees listed twice come from (`os.walk`,
`find` and git make the same choice). A folder reached twice anyway (a bind
mount inside itself) is walked once.

What is not a regular file (a named pipe, a socket, a device node) is neither listed
nor counted, and the walk opens nothing. A listed name swapped for one after the walk
fails its document when opened (`readers.open_inside`), without waiting on it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import stat
from pathlib import Path, PurePosixPath

from metis_indexer import limits
from metis_indexer.documents import Kind
from metis_indexer.ingest.readers import kind_of


class SourceError(Exception):
    """A source that cannot be listed at all: its folder is missing or leaves the drive.

    A pass must not take this for an empty source (that would drop every document
    of it); it reports the source instead.
    """


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    """A file to read: its path in the drive (POSIX, relative), and what a pass compares."""

    path: str
    absolute: Path
    root: Path
    """The drive's real root: the file opened for reading must still be inside it."""
    kind: Kind
    size: int
    mtime_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class Listing:
    files: tuple[Found, ...]
    """In path order."""
    skipped: dict[str, int]
    """Files not read, by extension in lower case (".png"; "" for none)."""
    links_skipped: int
    """Symbolic links not followed: out of the drive, to a folder, hidden, or broken."""
    unreadable: tuple[str, ...]
    """Folders that could not be listed (permissions): their files are neither
    listed nor gone, so a pass should keep what it indexed from them."""


def check_path(path: str | None) -> PurePosixPath:
    """A source's `path` as a folder of its drive; ValueError saying what is wrong.

    None or "" is the whole drive. No . or .. parts.
    """
    if not path:
        return PurePosixPath()
    problem = limits.path_problem(path)
    if problem is not None:
        raise ValueError(f"source path {path!r} {problem}")
    return PurePosixPath(path)


def walk(drive_root: Path, path: str | None = None) -> Listing:
    """The files under `path` of the drive mounted at `drive_root`."""
    folder = check_path(path)
    root = os.path.realpath(drive_root)
    if not os.path.isdir(root):
        raise SourceError("the drive is not a folder here (is it mounted?)")
    start = os.path.join(root, *folder.parts)
    real_start = os.path.realpath(start)
    if not _inside(real_start, root):
        raise SourceError(f"source path {path!r} leads out of its drive (a symbolic link)")
    if not os.path.isdir(real_start):
        raise SourceError(f"source path {path!r} is not a folder of the drive")
    return _Walk(root).run(start, folder)


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _hidden(relative: str) -> bool:
    return any(part.startswith(".") for part in relative.split("/"))


def _extension(name: str) -> str:
    return PurePosixPath(name).suffix.lower()


class _Walk:
    def __init__(self, root: str) -> None:
        self.root = root
        self.files: list[Found] = []
        self.skipped: collections.Counter[str] = collections.Counter()
        self.links_skipped = 0
        self.unreadable: list[str] = []
        self.seen: set[tuple[int, int]] = set()

    def run(self, start: str, folder: PurePosixPath) -> Listing:
        prefix = "".join(f"{part}/" for part in folder.parts)
        if not any(part.startswith(".") for part in folder.parts):
            first = os.stat(start)
            self.seen.add((first.st_dev, first.st_ino))
            stack = [(start, prefix)]
            while stack:
                directory, within = stack.pop()
                stack.extend(self._list(directory, within))
        if prefix.rstrip("/") in self.unreadable:
            raise SourceError(f"the source folder {str(folder)!r} cannot be listed")
        return Listing(
            files=tuple(sorted(self.files, key=lambda f: f.path)),
            skipped=dict(self.skipped),
            links_skipped=self.links_skipped,
            unreadable=tuple(self.unreadable),
        )

    def _list(self, directory: str, prefix: str) -> list[tuple[str, str]]:
        """Records the folder's files; returns its subfolders to walk."""
        subfolders: list[tuple[str, str]] = []
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    relative = prefix + entry.name
                    try:
                        if entry.is_symlink():
                            self._link(entry, relative)
                        elif entry.is_dir(follow_symlinks=False):
                            info = entry.stat(follow_symlinks=False)
                            if (info.st_dev, info.st_ino) not in self.seen:
                                self.seen.add((info.st_dev, info.st_ino))
                                subfolders.append((entry.path, relative + "/"))
                        elif entry.is_file(follow_symlinks=False):
                            self._file(entry.path, relative, entry.stat(follow_symlinks=False))
                    except OSError:  # gone since it was listed
                        continue
        except OSError:
            self.unreadable.append(prefix.rstrip("/"))
        return subfolders

    def _link(self, entry: os.DirEntry[str], relative: str) -> None:
        real = os.path.realpath(entry.path)
        target = os.path.relpath(real, self.root).replace(os.sep, "/")
        try:
            info = os.stat(real)
        except OSError:  # broken, or a loop of links
            info = None
        if (
            info is None
            or not _inside(real, self.root)
            or _hidden(target)
            or not stat.S_ISREG(info.st_mode)
        ):
            self.links_skipped += 1
            return
        self._file(entry.path, relative, info)

    def _file(self, absolute: str, relative: str, info: os.stat_result) -> None:
        kind = kind_of(relative)
        if kind is None:
            self.skipped[_extension(relative)] += 1
            return
        self.files.append(
            Found(relative, Path(absolute), Path(self.root), kind, info.st_size, info.st_mtime_ns)
        )
