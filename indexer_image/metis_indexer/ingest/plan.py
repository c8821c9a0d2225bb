"""What a pass reads and what it drops (docs/reference/indexing.md, "The index and passes").

`scan_source` walks a source (I/O) and `merged` puts the sources' listings together;
`plan` is the decision over plain data: a file
whose size and mtime are those recorded, built with the index's settings, is left
alone (unless the pass is full); a known file no longer listed is dropped, unless
it lies in a folder that could not be listed (a folder we cannot see is not a
folder that is empty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence

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


def source_key(source: SourceConfig) -> Key:
    """A source as the pass knows it: (drive, folder); "" for the whole drive."""
    return (source.drive, source.path or "")


def named(source: SourceConfig) -> str:
    """A source as a person reads it: its drive, and its folder where it has one."""
    return f"{source.drive}/{source.path}" if source.path else source.drive


def scan_source(source: SourceConfig) -> Scan:
    """Walk one source; one that cannot be listed, or a folder of it, is a problem to
    show."""
    try:
        found = sources.walk(source.root, source.path)
    except sources.SourceError as e:
        return Scan({}, [source_key(source)], {}, [f"source {source.drive}: {e}"])
    return Scan(
        {(source.drive, f.path): f for f in found.files},
        [(source.drive, folder) for folder in found.unreadable],
        dict(found.skipped),
        [f"source {source.drive}: cannot list {u}" for u in found.unreadable],
    )


def merged(scans: Iterable[Scan]) -> Scan:
    """The sources' listings as one, in the order given."""
    files: dict[Key, sources.Found] = {}
    skipped: dict[str, int] = {}
    unseen: list[Key] = []
    problems: list[str] = []
    for one in scans:
        files.update(one.files)
        for ext, n in one.skipped.items():
            skipped[ext] = skipped.get(ext, 0) + n
        unseen += one.unseen
        problems += one.problems
    return Scan(files, unseen, skipped, problems)


def still_listing(
    configured: Sequence[SourceConfig], in_flight: Collection[Key]
) -> list[SourceConfig]:
    """The sources whose previous listing has not returned. None of them is listed again
    until it has: a listing stuck in a hung drive holds its thread for good, and one more
    each time the pass is tried again would pin threads without bound."""
    return [s for s in configured if source_key(s) in in_flight]


class ListingHung(Exception):
    """Sources whose listing did not finish in time: the pass stops and is tried again.
    What was indexed from them is kept (a listing that did not finish says nothing of
    what is gone)."""

    def __init__(self, hung: Sequence[SourceConfig], seconds: float) -> None:
        names = ", ".join(named(s) for s in hung)
        which = "source" if len(hung) == 1 else "sources"
        super().__init__(
            f"the listing of {which} {names} did not finish in {seconds:g} s (is the drive "
            "hung?); the pass is tried again once it has, and what was indexed from it is kept"
        )
        self.hung = [source_key(s) for s in hung]


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
