"""The decisions over a backup's `state.json`, without I/O: what every indexer sharing a
store answers of a backup (completed, running, failed, abandoned), whether a start or a
delete of it is refused, the time given to them."""

from __future__ import annotations

import pytest

from metis_indexer.backups import manifest
from metis_indexer.backups.manifest import BackupRefused, FileSum, Manifest, State
from metis_indexer.schema import Backup, Chunks

SUM = FileSum(bytes=10, sha256="a" * 64)
STARTED = "2026-12-07T10:00:00Z"
T0 = manifest.stamp(STARTED)
ABANDONED = 60.0


def backup(**changes: object) -> Backup:
    fields: dict[str, object] = {
        "name": "handbook-1",
        "phase": "Running",
        "started_at": STARTED,
        "finished_at": None,
        "bytes": 0,
        "chunks": 1234,
        "notes": 3,
        "model": "minilm",
        "dimensions": 384,
        "chunking": Chunks(size=1200, overlap=200),
        "base": "handbook",
        "error": None,
    }
    return Backup.model_validate({**fields, **changes})


def state(**changes: object) -> State:
    return manifest.starting(backup(), "handbook-0", "run-a").model_copy(update=changes)


def whole() -> Manifest:
    return Manifest(
        format=manifest.FORMAT,
        base="handbook",
        name="handbook-1",
        started_at=STARTED,
        finished_at="2026-12-07T10:00:05Z",
        chunks=1234,
        notes=3,
        model="minilm",
        dimensions=384,
        chunking=Chunks(size=1200, overlap=200),
        files={manifest.INDEX: SUM, manifest.NOTES: SUM},
    )


def test_a_state_lives_beside_the_manifest_and_is_no_backup_of_its_own() -> None:
    key = manifest.key("team-a/handbook", "b1", manifest.STATE)
    assert key == "team-a/handbook/b1/state.json"
    assert manifest.named("team-a/handbook", key) is None, "no manifest: no completed backup"
    assert manifest.named("team-a/handbook", key, manifest.STATE) == "b1"


def test_a_state_just_started_says_what_the_start_knew() -> None:
    s = state()
    assert (s.phase, s.by, s.run, s.updated_at, s.error) == (
        "Running",
        "handbook-0",
        "run-a",
        STARTED,
        None,
    )
    assert manifest.read_state("handbook-1", s.model_dump_json().encode()) == s
    seen = manifest.seen(None, s, T0, ABANDONED)
    assert seen == backup(), "answered as the indexer that runs it answers it"


def test_a_state_from_a_newer_indexer_is_read_its_new_fields_aside() -> None:
    s = state()
    raw = s.model_dump_json().replace('"run":', '"later":1,"run":').encode()
    assert manifest.read_state("handbook-1", raw) == s


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"not json", "its state.json is not one"),
        (state(name="other").model_dump_json().encode(), "its state.json is of backup other"),
        (
            state().model_dump_json().replace(STARTED, "yesterday").encode(),
            "its state.json is not one (started_at",
        ),
        (
            state().model_dump_json().replace('"Running"', '"Completed"').encode(),
            "its state.json is not one (phase",
        ),
    ],
    ids=["not-json", "another-backup's", "not-a-time", "completed-is-the-manifest's"],
)
def test_a_state_that_is_none_says_why(raw: bytes, said: str) -> None:
    with pytest.raises(BackupRefused, match="backup handbook-1") as e:
        manifest.read_state("handbook-1", raw)
    assert said in str(e.value)


@pytest.mark.parametrize(
    ("after", "phase"),
    [
        (0, "Running"),
        (ABANDONED, "Running"),  # heard of ABANDONED seconds ago: not yet
        (ABANDONED + 1, "Failed"),
        (-30, "Running"),  # a clock behind the writer's: live
    ],
    ids=["just-heard", "at-the-limit", "past-the-limit", "clock-behind"],
)
def test_a_running_state_not_heard_of_is_abandoned(after: float, phase: str) -> None:
    heard = "2026-12-07T10:05:00Z"
    s = state(updated_at=heard)
    seen = manifest.seen(None, s, manifest.stamp(heard) + after, ABANDONED)
    assert seen is not None and seen.phase == phase
    if phase == "Running":
        assert seen.error is None and seen.finished_at is None
    else:
        assert seen.error == (
            "backup handbook-1 was abandoned: its indexer (handbook-0) stopped answering at "
            "2026-12-07T10:05:00Z"
        )
        assert seen.finished_at == heard


def test_a_failed_state_is_failed_as_written_however_old() -> None:
    s = state(phase="Failed", updated_at="2026-12-07T10:01:00Z", error="backup handbook-1: x")
    for at in (T0, T0 + 10 * ABANDONED):
        seen = manifest.seen(None, s, at, ABANDONED)
        assert seen is not None
        assert (seen.phase, seen.error, seen.finished_at) == (
            "Failed",
            "backup handbook-1: x",
            "2026-12-07T10:01:00Z",
        )


def test_the_manifest_answers_whatever_the_state_says() -> None:
    for s in (None, state(), state(phase="Failed", error="x")):
        seen = manifest.seen(whole(), s, T0 + 1, ABANDONED, here=backup(), run="run-a")
        assert seen == whole().as_backup()


def test_neither_manifest_nor_state_is_no_backup() -> None:
    assert manifest.seen(None, None, T0, ABANDONED) is None


def test_this_processs_own_backup_answers_unless_another_start_took_the_name() -> None:
    here = backup(phase="Failed", finished_at="2026-12-07T10:00:09Z", error="backup x: mine")
    # Its own state (or none: the store lost it, or never took it), this process says best.
    assert manifest.seen(None, None, T0, ABANDONED, here=here, run="run-a") == here
    mine = state(updated_at="2026-12-07T10:00:08Z")
    assert manifest.seen(None, mine, T0, ABANDONED, here=here, run="run-a") == here
    # Another start of the name (another indexer, after this one's was abandoned): its own.
    theirs = state(by="handbook-1", run="run-b")
    seen = manifest.seen(None, theirs, T0, ABANDONED, here=here, run="run-a")
    assert seen is not None and seen.phase == "Running" and seen.error is None


@pytest.mark.parametrize(
    ("completed", "s", "after", "code"),
    [
        (False, None, 0, None),
        (True, None, 0, "BACKUP_EXISTS"),
        (True, state(), 0, "BACKUP_EXISTS"),
        (False, state(), 0, "BACKUP_RUNNING"),
        (False, state(), ABANDONED + 1, None),  # abandoned: written over
        (False, state(phase="Failed", error="x"), 0, None),  # failed: tried again
    ],
    ids=["new", "completed", "completed-state-left", "running", "abandoned", "failed"],
)
def test_a_start_is_refused_by_a_completed_backup_or_a_live_one(
    completed: bool, s: State | None, after: float, code: str | None
) -> None:
    refusal = manifest.refused("handbook-1", completed, s, T0 + after, ABANDONED)
    assert (refusal and refusal.code) == code
    if code == "BACKUP_RUNNING":
        assert refusal is not None
        assert refusal.message.startswith(
            "backup handbook-1 is running on handbook-0 (started at 2026-12-07T10:00:00Z)"
        )


@pytest.mark.parametrize(
    ("completed", "s", "after", "refused"),
    [
        (False, state(), 0, True),
        (False, state(), ABANDONED + 1, False),
        (False, state(phase="Failed", error="x"), 0, False),
        (True, state(), 0, False),  # its state left beside a manifest: the backup is whole
        (False, None, 0, False),
    ],
    ids=["running", "abandoned", "failed", "completed", "none"],
)
def test_a_backup_running_anywhere_is_not_deleted(
    completed: bool, s: State | None, after: float, refused: bool
) -> None:
    refusal = manifest.undeletable("handbook-1", completed, s, T0 + after, ABANDONED)
    assert (refusal is not None) == refused
    if refusal is not None:
        assert refusal == (
            "BACKUP_RUNNING",
            "backup handbook-1 is running on handbook-0; delete it once it ends",
        )
