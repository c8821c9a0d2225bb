"""A backup's layout and the decisions over it, without I/O.

A backup named N of a base is three objects under `<prefix>/N/`: `index.sqlite3` (a
consistent copy of the index), `notes.tar` (the notes' folder, mtimes to the nanosecond)
and `manifest.json`, written last, naming both with their size and SHA-256. No manifest,
no backup: a backup cut short at any moment is no backup, and every earlier one whole.

While it runs, and after it failed, `state.json` beside them says so to every indexer
that shares the store (the replicas of a base behind one Service): which one runs it, and
when it was last heard of. A state not heard of for a while is an abandoned backup (its
indexer killed), which a start of the same name writes over. The decisions over the two
(`seen`, `refused`, `undeletable`) take the time as an argument.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Sequence
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from metis_indexer import limits
from metis_indexer.schema import Backup, Chunks

FORMAT = 1
"""The manifest's format: a restore refuses another (an indexer older than the backup)."""
INDEX = "index.sqlite3"
NOTES = "notes.tar"
MANIFEST = "manifest.json"
STATE = "state.json"
"""A backup not completed: running (renewed every heartbeat), or failed; deleted once the
manifest is written. What every indexer sharing the store answers of it."""
OBJECTS = (INDEX, NOTES)
"""The objects a manifest names, in the order they are uploaded (the manifest after them)."""
_NAME = re.compile(limits.BACKUP_NAME)


class FileSum(BaseModel):
    """An object's size and SHA-256 (hex), as the manifest records it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    """`manifest.json`: what a backup holds, and the checksums its objects are checked by."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int
    base: str
    name: str
    started_at: str
    finished_at: str
    chunks: int
    notes: int
    model: str | None
    dimensions: int | None
    chunking: Chunks
    files: dict[str, FileSum]

    def as_backup(self) -> Backup:
        return Backup(
            name=self.name,
            phase="Completed",
            started_at=self.started_at,
            finished_at=self.finished_at,
            bytes=sum(f.bytes for f in self.files.values()),
            chunks=self.chunks,
            notes=self.notes,
            model=self.model,
            dimensions=self.dimensions,
            chunking=self.chunking,
            base=self.base,
            error=None,
        )


class BackupRefused(Exception):
    """A backup that cannot be restored: the message names the backup and the object."""


def folder(prefix: str, name: str) -> str:
    """The key prefix a backup's objects share: `<prefix>/<name>/` ("" → `<name>/`); with
    no name, the one every backup's shares."""
    under = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    return f"{under}{name}/" if name else under


def key(prefix: str, name: str, obj: str) -> str:
    return folder(prefix, name) + obj


def named(prefix: str, found: str, obj: str = MANIFEST) -> str | None:
    """The name of the backup whose `obj` (its manifest) is at key `found`; None for
    another key."""
    start = folder(prefix, "")
    if not found.startswith(start) or not found.endswith("/" + obj):
        return None
    name = found[len(start) : -len(obj) - 1]
    return name if _NAME.fullmatch(name) else None


def read(backup: str, raw: bytes) -> Manifest:
    """The manifest of `backup` from its bytes; BackupRefused saying why it is not one this
    indexer restores (not JSON, a format it does not know, an object missing)."""
    try:
        loaded = Manifest.model_validate_json(raw)
    except ValidationError as e:
        formats = [err for err in e.errors() if err["loc"] == ("format",)]
        raise BackupRefused(
            f"backup {backup}: its manifest is not one (" + _first(e) + ")"
            if not formats
            else f"backup {backup}: its manifest's format is not a number"
        ) from None
    if loaded.format != FORMAT:
        raise BackupRefused(
            f"backup {backup}: its manifest is of format {loaded.format}; this indexer "
            f"restores format {FORMAT} (a backup made by a newer indexer)"
        )
    missing = [o for o in OBJECTS if o not in loaded.files]
    if missing:
        raise BackupRefused(f"backup {backup}: its manifest names no {', '.join(missing)}")
    if loaded.name != backup:
        raise BackupRefused(f"backup {backup}: its manifest is of backup {loaded.name}")
    return loaded


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc']) or 'manifest'}: {err['msg']}"


def mismatch(backup: str, obj: str, wanted: FileSum, got: FileSum) -> str | None:
    """Why a downloaded object is not the one the manifest names (size first, then the
    SHA-256); None when it is."""
    if got.bytes != wanted.bytes:
        return (
            f"backup {backup}: {obj} does not match its manifest (size {got.bytes:,} bytes, "
            f"the manifest says {wanted.bytes:,})"
        )
    if got.sha256 != wanted.sha256:
        return (
            f"backup {backup}: {obj} does not match its manifest (sha256 {got.sha256[:16]}…, "
            f"the manifest says {wanted.sha256[:16]}…)"
        )
    return None


def reembedding(restored: Manifest, model: str | None, size: int, overlap: int) -> str | None:
    """What a restored index embeds again because the configuration differs from the
    backup's: the model (known once the configured model has answered: `model`) or the
    chunking (`size`, `overlap`); None when nothing is."""
    said: list[str] = []
    if restored.model and model and restored.model != model:
        said.append(
            f"embedding model {restored.model} → {model}: {restored.chunks:,} chunks are "
            "embedded again beside the restored ones"
        )
    chunking = restored.chunking
    if (chunking.size, chunking.overlap) != (size, overlap):
        said.append(
            f"chunking {chunking.size}/{chunking.overlap} → {size}/{overlap}: every document "
            "is cut and embedded again beside the restored index, which answers meanwhile"
        )
    return "; ".join(said) or None


class State(BaseModel):
    """`state.json`: a backup not completed, as every indexer sharing the store sees it —
    running (its `updated_at` renewed every heartbeat by the indexer `by`), or failed (with
    its `error`). Deleted once the manifest is written; `run` tells one start from another
    of the same name (two indexers on one host name, a restart)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    base: str
    phase: Literal["Running", "Failed"]
    started_at: str
    updated_at: str
    by: str
    run: str
    error: str | None
    chunks: int
    notes: int
    model: str | None
    dimensions: int | None
    chunking: Chunks

    @field_validator("started_at", "updated_at")
    @classmethod
    def _stamped(cls, at: str) -> str:
        stamp(at)
        return at


class Refusal(NamedTuple):
    """Why a backup is not started or deleted: the API's code and its message."""

    code: str
    message: str


def stamp(at: str) -> float:
    """Seconds since the epoch of a time as the indexer writes it (`2026-12-07T10:00:00Z`);
    ValueError for another."""
    return float(calendar.timegm(time.strptime(at, "%Y-%m-%dT%H:%M:%SZ")))


def starting(backup: Backup, by: str, run: str) -> State:
    """The state of a backup just started by the indexer `by`: Running, heard of now."""
    return State(
        name=backup.name,
        base=backup.base,
        phase="Running",
        started_at=backup.started_at,
        updated_at=backup.started_at,
        by=by,
        run=run,
        error=None,
        chunks=backup.chunks,
        notes=backup.notes,
        model=backup.model,
        dimensions=backup.dimensions,
        chunking=backup.chunking,
    )


def read_state(backup: str, raw: bytes) -> State:
    """The state of `backup` from its bytes; BackupRefused saying why it is not one."""
    try:
        loaded = State.model_validate_json(raw)
    except ValidationError as e:
        raise BackupRefused(f"backup {backup}: its {STATE} is not one ({_first(e)})") from None
    if loaded.name != backup:
        raise BackupRefused(f"backup {backup}: its {STATE} is of backup {loaded.name}")
    return loaded


def abandoned(state: State, at: float, seconds: float) -> bool:
    """Whether a Running state's indexer has stopped answering: not heard of for more than
    `seconds` at `at` (a state heard of in the future, a clock ahead, is live)."""
    return state.phase == "Running" and at - stamp(state.updated_at) > seconds


def live(state: State | None, at: float, seconds: float) -> bool:
    """Whether a state says its backup runs still, somewhere."""
    return state is not None and state.phase == "Running" and not abandoned(state, at, seconds)


def seen(
    completed: Manifest | None,
    state: State | None,
    at: float,
    seconds: float,
    *,
    here: Backup | None = None,
    run: str | None = None,
) -> Backup | None:
    """A backup as the store tells it at `at` (seconds since the epoch): Completed by its
    manifest, whatever else there is; else `here` — this process's own backup of that name,
    running or the last failed, started as `run` — unless the state is another start's;
    else its state: Running while heard of within `seconds`, then Failed (abandoned), or
    Failed as written; None with neither (no such backup)."""
    if completed is not None:
        return completed.as_backup()
    if here is not None and (state is None or state.run == run):
        return here
    if state is None:
        return None
    error = state.error
    if abandoned(state, at, seconds):
        error = (
            f"backup {state.name} was abandoned: its indexer ({state.by}) stopped answering "
            f"at {state.updated_at}"
        )
    running = live(state, at, seconds)
    return Backup(
        name=state.name,
        phase="Running" if running else "Failed",
        started_at=state.started_at,
        finished_at=None if running else state.updated_at,
        bytes=0,
        chunks=state.chunks,
        notes=state.notes,
        model=state.model,
        dimensions=state.dimensions,
        chunking=state.chunking,
        base=state.base,
        error=error,
    )


def refused(
    name: str, completed: bool, state: State | None, at: float, seconds: float
) -> Refusal | None:
    """Why a backup `name` is not started at `at`: the store holds a completed one, or a
    live state says another start runs it (on any indexer); None when it may start — over
    a failed or abandoned state, or what a kill left."""
    if completed:
        return Refusal(
            "BACKUP_EXISTS", f"the store holds a backup {name} already: delete it, or name another"
        )
    if state is not None and live(state, at, seconds):
        return Refusal(
            "BACKUP_RUNNING",
            f"backup {name} is running on {state.by} (started at {state.started_at}); ask "
            "again when it has finished",
        )
    return None


def undeletable(
    name: str, completed: bool, state: State | None, at: float, seconds: float
) -> Refusal | None:
    """Why a backup `name` is not deleted at `at`: it runs still, on any indexer (its
    objects would be written again after the delete); None when it may be."""
    if not completed and state is not None and live(state, at, seconds):
        return Refusal(
            "BACKUP_RUNNING", f"backup {name} is running on {state.by}; delete it once it ends"
        )
    return None


def newest_of(
    found: Sequence[Manifest],
    base: str,
    model: str,
    dimensions: int | None,
    size: int,
    overlap: int,
) -> Manifest | None:
    """The backup a new replica starts from: the newest of its own base (a store's prefix
    may hold other bases' backups, with their documents and notes) made with its model (and
    dimensions, where known) and chunking, so the pass after it embeds only what changed
    since; None when none is (a backup of another model saves it nothing)."""
    usable = [
        m
        for m in found
        if (m.base, m.model, m.chunking.size, m.chunking.overlap) == (base, model, size, overlap)
        and dimensions in (None, m.dimensions)
    ]
    return max(usable, key=lambda m: (m.finished_at, m.name), default=None)
