"""The one writer of a base's status. A step of a base's loop (a reconciliation, a pause,
an evaluation) collects what it decided in a `StatusUpdate`: the new status, the lines
to log and the Events to post; `apply` then writes the status if it changed (a merge
patch of the difference), logs the lines and posts the Events, in that order: an Event
tells of a status already written, and the tests wait for the status, then for the
Events."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from metis_operator import kube, report
from metis_operator.api import identity
from metis_operator.api.status_types import KnowledgeBaseStatus
from metis_operator.context import Context
from metis_operator.status.compose import merge_patch

log = logging.getLogger("metis_operator")


class Gone(Exception):
    """The base is gone, going (deleted, waiting on another's finalizer) or its kind is (the
    CRD deleted): nothing more is written of it or for it, children included."""


def being_deleted(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


@dataclasses.dataclass(frozen=True)
class Event:
    """A core/v1 Event to post about the base: `kind` is Normal or Warning."""

    kind: str
    reason: str
    action: str
    message: str


@dataclasses.dataclass(frozen=True)
class Line:
    """A line about the base, logged with `fields` as its `extra=` (report.say)."""

    message: str
    fields: Mapping[str, str]


@dataclasses.dataclass
class StatusUpdate:
    """What one step decided for the base `body`: its new status (None leaves it as it
    is), then what is said of it, in order."""

    body: Mapping[str, Any]
    status: KnowledgeBaseStatus | None = None
    lines: list[Line] = dataclasses.field(default_factory=list)
    events: list[Event] = dataclasses.field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        meta = self.body["metadata"]
        return meta["namespace"], meta["name"]

    def say(self, message: str, **fields: str) -> None:
        self.lines.append(Line(message, fields))

    def post(self, kind: str, reason: str, action: str, message: str) -> None:
        self.events.append(Event(kind, reason, action, message))


class Written(Protocol):
    """What remembers the status this process last wrote of a base (a base's loop)."""

    status: dict[str, Any] | None

    def previous(self) -> dict[str, Any]: ...


async def apply(ctx: Context, base: Written, update: StatusUpdate) -> None:
    """Patch what changed of the status (`base.status` is then what was written), log
    the lines, then post the Events. The caller holds the base's lock."""
    if update.status is not None:
        new = update.status.dump()
        patch = merge_patch(base.previous(), new)
        if patch:
            namespace, name = update.key
            try:
                await ctx.cluster.merge_patch(
                    identity.path(namespace, name) + "/status", {"status": patch}
                )
            except kube.ApiError as e:
                if e.status == 404:
                    raise Gone(f"its status cannot be written: {e}") from None
                raise
        base.status = new
    for line in update.lines:
        report.say(update.key, line.message, **line.fields)
    for event in update.events:
        await post_event(ctx, update.body, event)


async def post_event(ctx: Context, body: Mapping[str, Any], event: Event) -> None:
    """An Event from metis-operator; one that cannot be posted is logged, never raised."""
    meta = body["metadata"]
    posted = report.event(
        body, kind=event.kind, reason=event.reason, action=event.action, message=event.message
    )
    try:
        await ctx.cluster.post(kube.path("v1", "events", meta["namespace"]), posted)
    except (kube.ApiError, OSError) as e:
        key = (meta["namespace"], meta["name"])
        log.warning("cannot post an Event: %s", e, extra=report.about(key))
