"""The backup kinds: a KnowledgeBaseBackup (one backup of a base, made once) and a
KnowledgeBaseBackupSchedule (a backup every so often, the newest `keep` kept), after
CloudNativePG's Backup and ScheduledBackup. Their spec and status as the operator reads
and writes them; their CRDs are generated from these models (`metis_operator.api.crd`).

A backup is named after its object: the indexer writes it under <prefix>/<name>/ of the
base's object store (spec.backup.object_store), and a base restores it by that name
(spec.restore.backup)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from metis_operator.api.spec import NAME_MAX, NAME_RE

Method = Literal["object_store"]
"""How a backup is made. object_store: the indexer writes a consistent copy of its index
and notes to the base's object store. (A VolumeSnapshot of the index drive is not built
yet.)"""
Phase = Literal["Pending", "Running", "Completed", "Failed"]
FINAL: tuple[Phase, ...] = ("Completed", "Failed")
STAMP = "%Y%m%d%H%M%S"


def stamped(name: str, at: dt.datetime) -> str:
    """A backup named for what made it (a schedule, a base) and when: `<name>-YYYYMMDDhhmmss`,
    so that a list sorted by name is sorted by time."""
    return f"{name}-{at.strftime(STAMP)}"


EVERY_RE = re.compile(r"^([0-9]+h)?([0-9]+m)?$")
"""A schedule's interval, as Go and Flux write a duration: 24h, 6h, 1h30m, 90m."""
EVERY_MIN_MINUTES = 5
KEEP_MIN, KEEP_DEFAULT, KEEP_MAX = 1, 7, 100
SCHEDULE_NAME_MAX = 48
"""A schedule's name, short enough for its backups' `<schedule>-<YYYYMMDDhhmmss>` to be a
label value's 63 characters."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def _base_name(v: str) -> str:
    if len(v) > NAME_MAX or not NAME_RE.match(v):
        raise ValueError(
            f"{v!r} is not a KnowledgeBase's name: lowercase letters, digits and -, at most "
            f"{NAME_MAX} characters"
        )
    return v


_BASE = "The KnowledgeBase of this namespace to back up; it needs spec.backup.object_store."


class BackupSpec(_Spec):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "a backup's spec cannot change: it is made once",
                }
            ]
        }
    )

    knowledge_base: str = Field(
        max_length=NAME_MAX, description=_BASE, json_schema_extra={"pattern": NAME_RE.pattern}
    )
    method: Method = Field(
        default="object_store",
        description="How it is made. object_store: the indexer writes a consistent copy of "
        "its index and notes to the base's object store, checksummed; searches are answered "
        "meanwhile. (volume_snapshot, a CSI snapshot of the index drive, is not built yet.)",
    )

    @field_validator("knowledge_base")
    @classmethod
    def _base(cls, v: str) -> str:
        return _base_name(v)


class BackupStatus(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    phase: Phase | None = Field(
        default=None,
        description="Pending: not started yet (the base's indexer does not answer, or runs "
        "another backup). Running: the indexer writes it. Completed: whole in the object "
        "store. Failed: message says why.",
    )
    started_at: str | None = Field(
        default=None,
        alias="startedAt",
        description="When the indexer started it.",
        json_schema_extra={"format": "date-time"},
    )
    finished_at: str | None = Field(
        default=None,
        alias="finishedAt",
        description="When it completed or failed.",
        json_schema_extra={"format": "date-time"},
    )
    bytes: int | None = Field(
        default=None,
        description="Bytes it takes in the object store.",
        json_schema_extra={"format": "int64"},
    )
    chunks: int | None = Field(default=None, description="Chunks it holds.")
    notes: int | None = Field(default=None, description="Notes it holds.")
    model: str | None = Field(default=None, description="The embedding model of its vectors.")
    dimensions: int | None = Field(default=None, description="The vectors' dimensions.")
    chunking: str | None = Field(
        default=None, description="The chunking it was cut with, as size/overlap characters."
    )
    size: str | None = Field(
        default=None, description="Its size in words (12.3 MiB), as kubectl get shows it."
    )
    message: str | None = Field(default=None, description="Why it failed, or what it waits for.")

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def read(cls, raw: Mapping[str, Any] | None) -> BackupStatus:
        try:
            return cls.model_validate(dict(raw or {}))
        except ValidationError:
            return cls()


class KnowledgeBaseBackup(BaseModel):
    """The whole object as the API server holds it: the schema's root."""

    model_config = ConfigDict(
        json_schema_extra={
            "description": "One backup of a KnowledgeBase, made once when the object is "
            "created: the base's indexer writes its index and notes to the base's object "
            "store (spec.backup.object_store) under the object's name, which a new base "
            "restores with spec.restore. Deleting the object deletes the backup.",
        }
    )

    api_version: str | None = Field(
        default=None, alias="apiVersion", description="The API group and version of this object."
    )
    kind: str | None = Field(
        default=None, description="The kind of this object, KnowledgeBaseBackup."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: BackupSpec = Field(description="The base backed up, and how.")
    status: BackupStatus | None = Field(
        default=None, description="What the operator observed of it; only the operator writes it."
    )


class ScheduleSpec(_Spec):
    knowledge_base: str = Field(
        max_length=NAME_MAX, description=_BASE, json_schema_extra={"pattern": NAME_RE.pattern}
    )
    every: str = Field(
        max_length=16,
        description=f"How often a backup is made, as hours and minutes (24h, 6h, 1h30m, 90m), "
        f"at least {EVERY_MIN_MINUTES}m. The first is made when the schedule is created.",
        json_schema_extra={
            "pattern": EVERY_RE.pattern,
            "x-kubernetes-validations": [
                {
                    "rule": "self != ''",
                    "message": "spec.every must be a duration such as 24h or 1h30m",
                }
            ],
        },
    )
    keep: int = Field(
        default=KEEP_DEFAULT,
        ge=KEEP_MIN,
        le=KEEP_MAX,
        description=f"The completed backups kept: the oldest beyond it are deleted (their "
        f"KnowledgeBaseBackups, and so their copies). {KEEP_MIN} to {KEEP_MAX}; not set, "
        f"{KEEP_DEFAULT}.",
    )
    suspend: bool = Field(default=False, description="true: no new backups until false again.")

    @field_validator("knowledge_base")
    @classmethod
    def _base(cls, v: str) -> str:
        return _base_name(v)

    @field_validator("every")
    @classmethod
    def _every(cls, v: str) -> str:
        if every_seconds(v) is None:
            raise ValueError(
                f"{v!r} is not an interval of at least {EVERY_MIN_MINUTES}m, as hours and "
                "minutes (24h, 6h, 1h30m, 90m)"
            )
        return v


def every_seconds(every: str) -> int | None:
    """`every` in seconds, None when it is no interval or a too short one."""
    m = EVERY_RE.match(every)
    if not every or m is None:
        return None
    hours, minutes = (int(g[:-1]) if g else 0 for g in m.groups())
    seconds = hours * 3600 + minutes * 60
    return seconds if seconds >= EVERY_MIN_MINUTES * 60 else None


class ScheduleStatus(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    last_backup: str | None = Field(
        default=None, alias="lastBackup", description="The name of the last backup it made."
    )
    last_scheduled_at: str | None = Field(
        default=None,
        alias="lastScheduledAt",
        description="When it made its last backup.",
        json_schema_extra={"format": "date-time"},
    )
    next_at: str | None = Field(
        default=None,
        alias="nextAt",
        description="When it makes the next one.",
        json_schema_extra={"format": "date-time"},
    )
    message: str | None = Field(default=None, description="What it did last, in words.")

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class KnowledgeBaseBackupSchedule(BaseModel):
    """The whole object as the API server holds it: the schema's root."""

    model_config = ConfigDict(
        json_schema_extra={
            "description": "Backups of a KnowledgeBase on a schedule: a KnowledgeBaseBackup "
            "named <schedule>-<YYYYMMDDhhmmss> every spec.every, the newest spec.keep "
            "completed ones kept. Its name is at most 48 characters.",
            "x-kubernetes-validations": [
                {
                    "rule": f"size(self.metadata.name) <= {SCHEDULE_NAME_MAX}",
                    "message": f"metadata.name must be at most {SCHEDULE_NAME_MAX} characters "
                    "(its backups are named <schedule>-<YYYYMMDDhhmmss>)",
                }
            ],
        }
    )

    api_version: str | None = Field(
        default=None, alias="apiVersion", description="The API group and version of this object."
    )
    kind: str | None = Field(
        default=None, description="The kind of this object, KnowledgeBaseBackupSchedule."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ScheduleSpec = Field(description="The base, how often, how many kept.")
    status: ScheduleStatus | None = Field(
        default=None, description="What the operator did; only the operator writes it."
    )
