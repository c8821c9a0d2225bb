"""When an index is restored at start: a backup named, and the index empty (no chunks, no
notes), or a restore cut short (its mark on the drive); never over what a base holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from metis_indexer.config import IndexerConfig
from metis_indexer.service import restoring


def config(index: Path, restore: bool = True) -> IndexerConfig:
    store = {"endpoint": "http://127.0.0.1:9", "bucket": "b", "secret_dir": str(index)}
    return IndexerConfig.model_validate(
        {
            "sources": [{"drive": "docs", "root": str(index.parent)}],
            "index_dir": str(index),
            **({"restore": {"store": store, "backup": "team-1"}} if restore else {}),
        }
    )


def with_chunks(index: Path, n: int) -> None:
    index.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(index / "index.sqlite3") as db:
        db.execute("CREATE TABLE chunks (id INTEGER PRIMARY KEY)")
        db.executemany("INSERT INTO chunks VALUES (?)", [(i,) for i in range(n)])


@pytest.mark.parametrize(
    ("chunks", "note", "mark", "restore", "wanted"),
    [
        (None, False, False, True, True),
        (0, False, False, True, True),
        (5, False, False, True, False),
        (None, True, False, True, False),
        (5, True, True, True, True),
        (None, False, False, False, False),
    ],
    ids=[
        "no-index-restores",
        "empty-index-restores",
        "chunks-held-never-overwritten",
        "notes-held-never-overwritten",
        "restore-cut-short-restores-again",
        "no-backup-named",
    ],
)
def test_an_index_is_restored_only_when_empty_or_cut_short(
    tmp_path: Path, chunks: int | None, note: bool, mark: bool, restore: bool, wanted: bool
) -> None:
    index = tmp_path / "index"
    index.mkdir()
    if chunks is not None:
        with_chunks(index, chunks)
    if note:
        (index / "notes").mkdir()
        (index / "notes" / "a1.md").write_text("a note\n")
    if mark:
        (index / restoring.MARKER).touch()
    assert restoring.needed(config(index, restore)) is wanted


def test_a_drive_once_restored_from_a_backup_is_never_restored_from_it_again(
    tmp_path: Path,
) -> None:
    index = tmp_path / "index"
    with_chunks(index, 0)  # every document deleted since, every note forgotten
    (index / restoring.RESTORED).write_text("team-1\n")
    assert restoring.needed(config(index)) is False
    (index / restoring.RESTORED).write_text("team-0\n")
    assert restoring.needed(config(index)) is True, "an empty drive named another backup"
    (index / restoring.RESTORED).write_text("team-1\n")
    (index / restoring.MARKER).touch()
    assert restoring.needed(config(index)) is True, "a restore cut short is done again"


@pytest.mark.parametrize(
    ("peers", "store", "restore", "chunks", "restored", "wanted"),
    [
        (True, True, False, None, False, True),
        (False, True, False, None, False, False),
        (True, False, False, None, False, False),
        (True, True, True, None, False, False),
        (True, True, False, 5, False, False),
        (True, True, False, 0, True, False),
    ],
    ids=[
        "empty-replica-with-a-store-starts-from-a-backup",
        "a-single-indexer-has-nothing-to-ask-instead",
        "no-store",
        "a-backup-named-is-restored-instead",
        "chunks-held",
        "restored-once",
    ],
)
def test_a_replica_starts_from_a_backup_only_when_empty_and_told_of_none(
    tmp_path: Path,
    peers: bool,
    store: bool,
    restore: bool,
    chunks: int | None,
    restored: bool,
    wanted: bool,
) -> None:
    index = tmp_path / "index"
    index.mkdir()
    if chunks is not None:
        with_chunks(index, chunks)
    if restored:
        (index / restoring.RESTORED).write_text("b-1\n")
    made = config(index, restore)
    bucket = {"endpoint": "http://127.0.0.1:9", "bucket": "b", "secret_dir": str(index)}
    made = made.model_copy(
        update={
            "peers": ["http://127.0.0.1:7701"] if peers else [],
            "backup_store": IndexerConfig.model_validate(
                {**made.model_dump(), "backup_store": bucket}
            ).backup_store
            if store
            else None,
        }
    )
    assert restoring.seedable(made) is wanted
