"""Which files a pass reads and which it drops, as a table over plain data."""

from __future__ import annotations

from pathlib import Path

import pytest

from metis_indexer.documents import Kind
from metis_indexer.index.memory import IndexSettings
from metis_indexer.index.store import FileRecord
from metis_indexer.ingest.plan import Key, Scan, plan
from metis_indexer.ingest.sources import Found

SETTINGS = IndexSettings("bge-m3", 1024, 1200, 200)
OTHER = IndexSettings("bge-m3", 1024, 800, 100)


def found(path: str, size: int = 10, mtime_ns: int = 1) -> Found:
    return Found(path, Path("/drives/docs") / path, Path("/drives/docs"), Kind.MD, size, mtime_ns)


def known(
    path: str,
    size: int = 10,
    mtime_ns: int = 1,
    built_with: str = SETTINGS.key,
    drive: str = "docs",
) -> FileRecord:
    return FileRecord(
        drive,
        path,
        "md",
        size,
        mtime_ns,
        "h",
        "indexed",
        "2026-01-01T00:00:00Z",
        built_with=built_with,
    )


def scan(*files: Found, unseen: tuple[Key, ...] = ()) -> Scan:
    return Scan({("docs", f.path): f for f in files}, unseen)


CASES = [
    # (what, listed, known, full, read, dropped)
    ("a new file is read", scan(found("a.md")), [], False, ["a.md"], []),
    ("the same size and mtime: left alone", scan(found("a.md")), [known("a.md")], False, [], []),
    ("a full pass reads it anyway", scan(found("a.md")), [known("a.md")], True, ["a.md"], []),
    (
        "another size: read (its hash decides later)",
        scan(found("a.md", size=11)),
        [known("a.md")],
        False,
        ["a.md"],
        [],
    ),
    ("another mtime: read", scan(found("a.md", mtime_ns=2)), [known("a.md")], False, ["a.md"], []),
    (
        "built with other settings: read",
        scan(found("a.md")),
        [known("a.md", built_with=OTHER.key)],
        False,
        ["a.md"],
        [],
    ),
    ("gone from its source: dropped", scan(), [known("a.md")], False, [], [("docs", "a.md")]),
    (
        "in a folder that could not be listed: kept",
        scan(unseen=(("docs", "team"),)),
        [known("team/a.md")],
        False,
        [],
        [],
    ),
    (
        "beside that folder, not in it: dropped",
        scan(unseen=(("docs", "team"),)),
        [known("teams/a.md")],
        False,
        [],
        [("docs", "teams/a.md")],
    ),
    (
        "a source that could not be listed keeps all of it",
        scan(unseen=(("docs", ""),)),
        [known("x/a.md")],
        False,
        [],
        [],
    ),
    (
        "another drive's unseen folder does not keep it",
        scan(unseen=(("wiki", ""),)),
        [known("a.md")],
        False,
        [],
        [("docs", "a.md")],
    ),
    ("read in path order", scan(found("b.md"), found("a.md")), [], False, ["a.md", "b.md"], []),
]


@pytest.mark.parametrize(
    ("listed", "records", "full", "read", "dropped"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_plan(
    listed: Scan, records: list[FileRecord], full: bool, read: list[str], dropped: list[Key]
) -> None:
    planned = plan(listed, {(r.source, r.path): r for r in records}, SETTINGS, full)
    assert [entry.key[1] for entry in planned.to_read] == read
    assert planned.to_drop == dropped
