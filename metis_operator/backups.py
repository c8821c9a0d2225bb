"""Backups of bases: a KnowledgeBaseBackup made once by its base's indexer, and a
KnowledgeBaseBackupSchedule that makes one every so often and keeps the newest.

The decisions are pure functions over plain data (`refusal`, `from_indexer`,
`on_refused`, `schedule_plan`), tested as tables in tests/operator/test_backups.py; the
steps (`step`, `forget`, `schedule_step`) do the I/O: they read the base, call its
indexer (indexer_client.py) and return the new status. `Follower` runs them: one task
per unfinished backup (a look every poll interval until it is done) and one per schedule
(a look a minute), started and stopped by the kinds' watch events. Not kopf's timers nor
its deletion handlers: both put kopf's finalizer on the objects, and an operator that is
gone (uninstalled, its CRDs deleted) would leave them undeletable.

A backup's life: Pending until its base's indexer takes it (`POST /v1/backups` with the
object's name; asked again after an operator restart, which the indexer answers
BACKUP_EXISTS), Running while the indexer writes it (`GET /v1/backups/{name}` at each
poll), then Completed or Failed, said once in an Event. A base that does not exist or
has no spec.backup fails the backup at once, naming what is missing. Deleting the
object deletes the copy (`DELETE /v1/backups/{name}`), best effort: a base that is gone
or an indexer that does not answer is said in an Event; the object is gone already (no
finalizer holds it), and a backup deleted while no operator runs keeps its copy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from metis_indexer.schema import Backup
from metis_operator import children, indexer_client, kube
from metis_operator.api import identity
from metis_operator.api.backup import (
    FINAL,
    BackupSpec,
    BackupStatus,
    ScheduleSpec,
    ScheduleStatus,
    every_seconds,
    stamped,
)
from metis_operator.context import Context
from metis_operator.status import write
from metis_operator.status.compose import merge_patch

log = logging.getLogger("metis_operator")


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def has_backup_store(base: Mapping[str, Any]) -> bool:
    store = ((base.get("spec") or {}).get("backup") or {}).get("object_store")
    return bool(store)


def expected_since(base: Mapping[str, Any]) -> float | None:
    """For a base with spec.backup: since when a backup is expected (its creation, in Unix
    seconds); None for one without."""
    if not has_backup_store(base):
        return None
    created = _meta(base).get("creationTimestamp")
    return _seconds(created) if created else None


def _seconds(stamp: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def refusal(spec: BackupSpec, namespace: str, base: Mapping[str, Any] | None) -> str | None:
    """Why a backup of `base` cannot be made at all, naming what is missing; None when it
    can."""
    name = spec.knowledge_base
    if base is None:
        return f"KnowledgeBase {name} does not exist in namespace {namespace}"
    if _meta(base).get("deletionTimestamp"):
        return f"KnowledgeBase {name} is being deleted"
    if not has_backup_store(base):
        return (
            f"KnowledgeBase {name} has no spec.backup.object_store: name the object store its "
            "backups go to"
        )
    return None


def size(n: int) -> str:
    """Bytes in words, as `kubectl get kbbackup` shows them: 512 B, 12.3 MiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def from_indexer(b: Backup) -> BackupStatus:
    """The indexer's account of a backup as the object's status."""
    return BackupStatus(
        phase=b.phase,
        started_at=b.started_at,
        finished_at=b.finished_at,
        bytes=b.bytes,
        chunks=b.chunks,
        notes=b.notes,
        model=b.model,
        dimensions=b.dimensions,
        chunking=f"{b.chunking.size}/{b.chunking.overlap}",
        size=size(b.bytes),
        message=b.error or None,
    )


REFUSALS = ("BACKUP_EXISTS", "BACKUP_RUNNING", "NO_BACKUP_STORE", "BACKUP_NOT_FOUND")
"""The indexer's own answers to the backups routes; any other error that passes (a 5xx,
a STANDBY) is an indexer not serving yet."""


def on_refused(code: str, message: str, base: str) -> BackupStatus | None:
    """The status after the indexer refused to start a backup: Pending for what passes
    (another backup runs; the object store has not reached its configuration yet), Failed
    for the rest; None for BACKUP_EXISTS (it is this object's: ask where it stands)."""
    if code == "BACKUP_EXISTS":
        return None
    if code == "BACKUP_RUNNING":
        return BackupStatus(
            phase="Pending", message=f"another backup of {base} is running; this one waits"
        )
    if code == "NO_BACKUP_STORE":
        return BackupStatus(
            phase="Pending",
            message=f"the indexer of {base} has no object store yet (its configuration with "
            "spec.backup reaches the pod within a minute or two)",
        )
    return BackupStatus(phase="Failed", message=f"the indexer of {base} refused it: {message}")


async def step(ctx: Context, body: Mapping[str, Any]) -> BackupStatus:
    """One look at an unfinished backup: started, or asked where it stands."""
    meta = _meta(body)
    namespace, name = meta["namespace"], meta["name"]
    try:
        spec = BackupSpec.model_validate(body.get("spec") or {})
    except ValidationError as e:
        return BackupStatus(phase="Failed", message=f"the spec is invalid: {e.errors()[0]['msg']}")
    previous = BackupStatus.read(body.get("status"))
    base = await ctx.cluster.get(identity.path(namespace, spec.knowledge_base))
    if (why := refusal(spec, namespace, base)) is not None:
        return BackupStatus(phase="Failed", message=why)
    assert base is not None
    owner = children.Owner.of(base)
    said = f"KnowledgeBase {spec.knowledge_base}"
    running = previous.phase == "Running"
    try:
        try:
            if running:
                return from_indexer(await indexer_client.backup(ctx, owner, name))
            return from_indexer(await indexer_client.start_backup(ctx, owner, name))
        except indexer_client.BackupRefused as e:
            if e.code == "BACKUP_NOT_FOUND":
                return BackupStatus(
                    phase="Failed",
                    message=f"the indexer of {said} no longer knows it (did its pod restart "
                    "while it ran?)",
                )
            if e.temporary and e.code not in REFUSALS:
                raise  # not serving yet: as an indexer that does not answer
            if (refused := on_refused(e.code, str(e), said)) is not None:
                return refused
            return from_indexer(await indexer_client.backup(ctx, owner, name))
    except indexer_client.IndexerError as e:
        waits = f"waiting for the indexer of {said}: {e}"
        return previous.model_copy(update={"phase": previous.phase or "Pending", "message": waits})


def finished_event(before: BackupStatus, after: BackupStatus) -> write.Event | None:
    """The Event of a backup that has just finished, said once."""
    if after.phase == before.phase or after.phase not in FINAL:
        return None
    if after.phase == "Completed":
        what = f"{after.chunks} chunks, {after.notes} notes, {after.size}"
        return write.Event("Normal", "BackupCompleted", "Backup", f"backup completed: {what}")
    return write.Event("Warning", "BackupFailed", "Backup", f"backup failed: {after.message}")


def completed_at(body: Mapping[str, Any]) -> tuple[tuple[str, str], float] | None:
    """(its base's key, when it finished) for a completed backup; None for any other."""
    status = BackupStatus.read(body.get("status"))
    base = (body.get("spec") or {}).get("knowledge_base")
    if status.phase != "Completed" or not status.finished_at or not base:
        return None
    finished = _seconds(status.finished_at)
    return ((_meta(body)["namespace"], base), finished) if finished is not None else None


async def forget(ctx: Context, body: Mapping[str, Any]) -> str | None:
    """The copy of a deleted backup deleted from the object store; what kept it from
    being deleted, if anything (said in an Event by the handler; the object goes)."""
    meta = _meta(body)
    namespace, name = meta["namespace"], meta["name"]
    status = BackupStatus.read(body.get("status"))
    if status.phase in (None, "Pending"):
        return None  # nothing was written
    base_name = (body.get("spec") or {}).get("knowledge_base", "")
    base = await ctx.cluster.get(identity.path(namespace, base_name)) if base_name else None
    if base is None or _meta(base).get("deletionTimestamp"):
        return (
            f"KnowledgeBase {base_name} is gone: the copy of backup {name} stays in its "
            "object store (delete it there, or restore it into a new base)"
        )
    try:
        await indexer_client.delete_backup(ctx, children.Owner.of(base), name)
    except indexer_client.BackupRefused as e:
        if e.code == "BACKUP_NOT_FOUND":
            return None
        return f"its copy could not be deleted: {e}"
    return None


@dataclasses.dataclass(frozen=True)
class ScheduledBackup:
    """A backup a schedule made, as the schedule's plan reads it."""

    name: str
    created: dt.datetime
    phase: str | None


@dataclasses.dataclass(frozen=True)
class SchedulePlan:
    make: str | None
    """The name of the backup to make now, if one is due."""
    delete: tuple[str, ...]
    """The backups to delete: completed ones past `keep`, failed ones older than the
    newest completed one."""
    next_at: dt.datetime


def schedule_plan(
    name: str, spec: ScheduleSpec, made: Sequence[ScheduledBackup], now: dt.datetime
) -> SchedulePlan:
    """What a schedule does now: a backup when none was made in the last `every` (and the
    schedule is not suspended), and the oldest deleted past `keep`."""
    interval = dt.timedelta(seconds=every_seconds(spec.every) or 86_400)
    newest = max((b.created for b in made), default=None)
    due = not spec.suspend and (newest is None or now - newest >= interval)
    make = stamped(name, now) if due else None
    done = sorted((b for b in made if b.phase == "Completed"), key=lambda b: b.created)
    delete = [b.name for b in done[: max(0, len(done) - spec.keep)]]
    if done:
        delete += [b.name for b in made if b.phase == "Failed" and b.created < done[-1].created]
    next_at = now + interval if due or newest is None else newest + interval
    return SchedulePlan(make, tuple(sorted(delete)), next_at)


def _scheduled(body: Mapping[str, Any]) -> ScheduledBackup | None:
    meta = _meta(body)
    created = meta.get("creationTimestamp")
    at = _seconds(created) if created else None
    if at is None:
        return None
    phase = BackupStatus.read(body.get("status")).phase
    return ScheduledBackup(meta["name"], dt.datetime.fromtimestamp(at, dt.UTC), phase)


def _stamp(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


async def schedule_step(ctx: Context, body: Mapping[str, Any]) -> ScheduleStatus:
    """One look at a schedule: its backups listed, one made when due, the oldest deleted."""
    meta = _meta(body)
    namespace, name = meta["namespace"], meta["name"]
    previous = ScheduleStatus.model_validate(body.get("status") or {})
    try:
        spec = ScheduleSpec.model_validate(body.get("spec") or {})
    except ValidationError as e:
        return previous.model_copy(
            update={"message": f"the spec is invalid: {e.errors()[0]['msg']}"}
        )
    listed = await ctx.cluster.call(
        "GET",
        identity.backup_path(namespace),
        query={"labelSelector": f"{identity.SCHEDULE_LABEL}={name}"},
    )
    made = [b for item in (listed or {}).get("items") or [] if (b := _scheduled(item))]
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    plan = schedule_plan(name, spec, made, now)
    status = previous.model_copy(update={"next_at": _stamp(plan.next_at)})
    if plan.make is not None:
        await ctx.cluster.post(
            identity.backup_path(namespace), _scheduled_backup(namespace, name, plan.make, spec)
        )
        status = status.model_copy(
            update={
                "last_backup": plan.make,
                "last_scheduled_at": _stamp(now),
                "message": f"made backup {plan.make}",
            }
        )
    for old in plan.delete:
        try:
            await ctx.cluster.delete(identity.backup_path(namespace, old))
        except kube.ApiError as e:
            if e.status != 404:
                raise
    if plan.delete:
        said = f"deleted {', '.join(plan.delete)} (keep {spec.keep})"
        status = status.model_copy(
            update={"message": f"{status.message or ''}; {said}".lstrip("; ")}
        )
    return status


def _scheduled_backup(
    namespace: str, schedule: str, name: str, spec: ScheduleSpec
) -> dict[str, Any]:
    return {
        "apiVersion": identity.API_VERSION,
        "kind": identity.BACKUP_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {identity.SCHEDULE_LABEL: schedule},
        },
        "spec": {"knowledge_base": spec.knowledge_base, "method": "object_store"},
    }


SCHEDULE_SECONDS = 60.0
"""How often a schedule looks whether a backup is due (its interval is 5 minutes at least)."""
DELETE_TRIES = 3
"""How often the copy of a deleted backup is asked to go, an indexer that does not answer."""
Key = tuple[str, str, str]
"""(plural, namespace, name)."""


class Follower:
    """The backups' and schedules' tasks: one per unfinished backup, one per schedule."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.tasks: dict[Key, asyncio.Task[None]] = {}

    def seen(self, plural: str, body: Mapping[str, Any], *, deleted: bool) -> None:
        """A watch event of a backup or a schedule: its task started or stopped; a completed
        backup's time into its base's metric; a deleted backup's copy deleted."""
        meta = _meta(body)
        key = (plural, meta["namespace"], meta["name"])
        if plural == identity.BACKUP_PLURAL and (done := completed_at(body)) is not None:
            self.ctx.metrics.backup_finished(*done)
        if deleted:
            if (task := self.tasks.pop(key, None)) is not None:
                task.cancel()
            if plural == identity.BACKUP_PLURAL:
                self._start(("deleted", *key[1:]), self._forget(body))
            return
        if key in self.tasks:
            return
        if plural == identity.SCHEDULE_PLURAL:
            self._start(key, self._follow_schedule(key))
        elif BackupStatus.read(body.get("status")).phase not in FINAL:
            self._start(key, self._follow_backup(key))

    def _start(self, key: Key, work: Any) -> None:
        task = asyncio.create_task(work, name=f"{key[0]} {key[1]}/{key[2]}")
        self.tasks[key] = task
        task.add_done_callback(
            lambda t: self.tasks.pop(key, None) if self.tasks.get(key) is t else None
        )

    async def _follow_backup(self, key: Key) -> None:
        _, namespace, name = key
        path = identity.backup_path(namespace, name)
        while True:
            try:
                body = await self.ctx.cluster.get(path)
                if body is None:
                    return
                before = BackupStatus.read(body.get("status"))
                after = await step(self.ctx, body)
                await self._write(path, body, after.dump())
                if (event := finished_event(before, after)) is not None:
                    log.info("backup %s/%s: %s", namespace, name, event.message)
                    await write.post_event(self.ctx, body, event)
                if after.phase in FINAL:
                    return
            except (kube.ApiError, OSError) as e:
                log.warning("backup %s/%s: %s", namespace, name, e)
            await asyncio.sleep(self.ctx.settings.poll.interval_seconds)

    async def _follow_schedule(self, key: Key) -> None:
        _, namespace, name = key
        path = kube.path(identity.API_VERSION, identity.SCHEDULE_PLURAL, namespace, name)
        while True:
            try:
                body = await self.ctx.cluster.get(path)
                if body is None:
                    return
                await self._write(path, body, (await schedule_step(self.ctx, body)).dump())
            except (kube.ApiError, OSError) as e:
                log.warning("schedule %s/%s: %s", namespace, name, e)
            await asyncio.sleep(SCHEDULE_SECONDS)

    async def _write(self, path: str, body: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        if patch := merge_patch(body.get("status") or {}, new):
            await self.ctx.cluster.merge_patch(f"{path}/status", {"status": patch})

    async def _forget(self, body: Mapping[str, Any]) -> None:
        """A deleted backup's copy deleted, a few tries; what kept it said in a Warning."""
        kept = None
        for attempt in range(DELETE_TRIES):
            if attempt:
                await asyncio.sleep(self.ctx.settings.poll.interval_seconds)
            try:
                kept = await forget(self.ctx, body)
                break
            except indexer_client.IndexerError as e:
                kept = f"its copy could not be deleted: {e}"
            except (kube.ApiError, OSError) as e:
                kept = f"its copy could not be deleted: {e}"
        if kept:
            meta = _meta(body)
            log.warning("backup %s/%s: %s", meta["namespace"], meta["name"], kept)
            await write.post_event(
                self.ctx, body, write.Event("Warning", "CopyKept", "Delete", kept)
            )
