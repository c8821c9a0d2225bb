"""What a pass reads and what it drops (README, "The index and passes").

`scan` walks the sources (I/O); `plan` is the decision over plain data: a file
whose size and mtime are those recorded, built with the index's settings, is left
alone (unless the pass is full); a known file no longer listed is dropped, unless
it lies in a folder that could not be listed (a folder we cannot see is not a
folder that is empty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from metis_indexer.config import SourceConfig
from metis_indexer.index.memory import IndexSettings
from metis_indexer.index.store import FileRecord
from metis_indexer.ingest import sources

Key = tuple[str, str]
"""A file as a pass knows it: (drive, path in the drive)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Scan:
    """Every readable file of the sources, and what the walk could not see."""

    files: Mapping[Key, sources.Found]
    unseen: Sequence[Key] = ()
    """(drive, folder) that could not be listed; "" for a whole source."""
    skipped: Mapping[str, int] = dataclasses.field(default_factory=dict)
    problems: Sequence[str] = ()


def scan(configured: Sequence[SourceConfig]) -> Scan:
    """Walk every source; a source or folder that cannot be listed is a problem to show."""
    files: dict[Key, sources.Found] = {}
    skipped: dict[str, int] = {}
    unseen: list[Key] = []
    problems: list[str] = []
    for source in configured:
        try:
            found = sources.walk(source.root, source.path)
        except sources.SourceError as e:
            problems.append(f"source {source.drive}: {e}")
            unseen.append((source.drive, source.path or ""))
            continue
        for f in found.files:
            files[(source.drive, f.path)] = f
        for ext, n in found.skipped.items():
            skipped[ext] = skipped.get(ext, 0) + n
        unseen += [(source.drive, folder) for folder in found.unreadable]
        problems += [f"source {source.drive}: cannot list {u}" for u in found.unreadable]
    return Scan(files, unseen, skipped, problems)


@dataclasses.dataclass(frozen=True, slots=True)
class ToRead:
    """A file a pass reads: its key, and what the walk found of it."""

    key: Key
    found: sources.Found


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What a pass does: the files it reads, in path order, and the known files it drops."""

    to_read: list[ToRead]
    to_drop: list[Key]


def plan(
    listing: Scan, known: Mapping[Key, FileRecord], settings: IndexSettings, full: bool
) -> Plan:
    """The files to read and the known files to drop."""
    to_drop = [key for key in known if key not in listing.files and not _under(key, listing.unseen)]
    to_read = [
        ToRead(key, found)
        for key, found in sorted(listing.files.items())
        if full
        or key not in known
        or known[key].built_with != settings.key
        or (known[key].size, known[key].mtime_ns) != (found.size, found.mtime_ns)
    ]
    return Plan(to_read, to_drop)


def _under(key: Key, folders: Sequence[Key]) -> bool:
    drive, path = key
    return any(d == drive and (not f or path.startswith(f + "/")) for d, f in folders)
