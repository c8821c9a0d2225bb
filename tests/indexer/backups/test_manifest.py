"""The decisions over a backup's layout, without I/O: keys, which keys are manifests,
what a manifest must hold for a restore, whether a downloaded object is the one it
names, and what a restore embeds again."""

from __future__ import annotations

import pytest

from metis_indexer.backups import manifest
from metis_indexer.backups.manifest import BackupRefused, FileSum, Manifest
from metis_indexer.schema import Chunks

SUM = FileSum(bytes=10, sha256="a" * 64)


def made(**changes: object) -> Manifest:
    fields: dict[str, object] = {
        "format": manifest.FORMAT,
        "base": "handbook",
        "name": "handbook-1",
        "started_at": "2026-12-07T10:00:00Z",
        "finished_at": "2026-12-07T10:00:05Z",
        "chunks": 1234,
        "notes": 3,
        "model": "minilm",
        "dimensions": 384,
        "chunking": Chunks(size=1200, overlap=200),
        "files": {manifest.INDEX: SUM, manifest.NOTES: SUM},
    }
    return Manifest.model_validate({**fields, **changes})


@pytest.mark.parametrize(
    ("prefix", "name", "key"),
    [
        ("", "b1", "b1/manifest.json"),
        ("team-a/handbook", "b1", "team-a/handbook/b1/manifest.json"),
        ("/team-a/", "b1", "team-a/b1/manifest.json"),
    ],
    ids=["no-prefix", "prefix", "slashes-trimmed"],
)
def test_a_backup_lives_under_its_prefix_and_name(prefix: str, name: str, key: str) -> None:
    assert manifest.key(prefix, name, manifest.MANIFEST) == key
    assert manifest.named(prefix, key) == name


@pytest.mark.parametrize(
    "key",
    [
        "p/b1/index.sqlite3",  # an object, not a manifest: a backup cut short
        "p/b1/deeper/manifest.json",  # not a backup's name
        "other/b1/manifest.json",  # another prefix
        "p/B1/manifest.json",  # not an object's name
    ],
    ids=["object-not-manifest", "nested", "other-prefix", "uppercase"],
)
def test_only_a_manifest_under_the_prefix_is_a_backup(key: str) -> None:
    assert manifest.named("p", key) is None


def test_a_manifest_is_read_back_whole() -> None:
    m = made()
    assert manifest.read("handbook-1", m.model_dump_json().encode()) == m
    assert m.as_backup().bytes == 20 and m.as_backup().phase == "Completed"


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"not json", "its manifest is not one"),
        (made(format=2).model_dump_json().encode(), "format 2; this indexer restores format 1"),
        (
            made(files={manifest.INDEX: SUM}).model_dump_json().encode(),
            "names no notes.tar",
        ),
        (made(name="other").model_dump_json().encode(), "is of backup other"),
    ],
    ids=["not-json", "newer-format-refused", "object-missing", "another-backup's"],
)
def test_a_manifest_that_cannot_be_restored_says_why(raw: bytes, said: str) -> None:
    with pytest.raises(BackupRefused, match="backup handbook-1") as e:
        manifest.read("handbook-1", raw)
    assert said in str(e.value)


@pytest.mark.parametrize(
    ("got", "said"),
    [
        (SUM, None),
        (FileSum(bytes=11, sha256="a" * 64), "size 11 bytes, the manifest says 10"),
        (FileSum(bytes=10, sha256="b" * 64), "sha256 bbbbbbbbbbbbbbbb…"),
    ],
    ids=["same", "size-differs", "sha256-differs"],
)
def test_an_object_must_be_the_one_its_manifest_names(got: FileSum, said: str | None) -> None:
    why = manifest.mismatch("handbook-1", manifest.INDEX, SUM, got)
    if said is None:
        assert why is None
    else:
        assert why is not None
        assert why.startswith("backup handbook-1: index.sqlite3 does not match its manifest")
        assert said in why


@pytest.mark.parametrize(
    ("model", "size", "overlap", "said"),
    [
        ("minilm", 1200, 200, None),
        (None, 1200, 200, None),  # the model not asked yet: nothing said of it
        ("e5-small", 1200, 200, "embedding model minilm → e5-small: 1,234 chunks are embedded"),
        ("minilm", 800, 100, "chunking 1200/200 → 800/100"),
    ],
    ids=["same", "model-unknown-yet", "model-differs", "chunking-differs"],
)
def test_what_a_restore_embeds_again_is_said(
    model: str | None, size: int, overlap: int, said: str | None
) -> None:
    again = manifest.reembedding(made(), model, size, overlap)
    assert (again is None) if said is None else (again is not None and said in again)


def test_a_new_replica_starts_from_the_newest_backup_of_its_model_and_chunking() -> None:
    old = made(name="b-1", finished_at="2026-12-06T10:00:00Z")
    new = made(name="b-2", finished_at="2026-12-07T10:00:00Z")
    other_model = made(name="b-3", finished_at="2026-12-07T11:00:00Z", model="e5-small")
    other_cut = made(
        name="b-4", finished_at="2026-12-07T12:00:00Z", chunking=Chunks(size=800, overlap=100)
    )
    other_base = made(name="r-1", finished_at="2026-12-07T13:00:00Z", base="runbooks")
    found = [old, new, other_model, other_cut, other_base]
    assert manifest.newest_of(found, "handbook", "minilm", 384, 1200, 200) == new
    assert manifest.newest_of(found, "handbook", "minilm", None, 1200, 200) == new, "no dims yet"
    assert manifest.newest_of(found, "handbook", "minilm", 768, 1200, 200) is None
    assert manifest.newest_of(found, "handbook", "e5-small", 384, 1200, 200) == other_model
    assert manifest.newest_of(found, "handbook", "bge-m3", 384, 1200, 200) is None
    assert manifest.newest_of(found, "runbooks", "minilm", 384, 1200, 200) == other_base
    assert manifest.newest_of(found, "faq", "minilm", 384, 1200, 200) is None, "not another's"
    assert manifest.newest_of([], "handbook", "minilm", 384, 1200, 200) is None
