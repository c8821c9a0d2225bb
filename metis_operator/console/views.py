"""What the cluster console shows of the cluster, as pure functions over plain data (no I/O).

- `base_view`: a KnowledgeBase as the Bases page and its own page show it, its status
  read through the models the operator writes it with (metis_operator/api/status_types.py).
- `event_view`: an Event about a base, as the base's page lists it.
- `backup_view`: a KnowledgeBaseBackup, as its base's page lists it.
- `when`: an API server's timestamp as the pages show it.
- `indexer_url`: where to reach a base's indexer from the console.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, ValidationError

from metis_operator.api.backup import BackupSpec, BackupStatus
from metis_operator.api.spec import KnowledgeBaseSpec
from metis_operator.api.status_types import (
    Condition,
    Evaluation,
    IndexTotals,
    KnowledgeBaseStatus,
    Observed,
    StateName,
)

Shown = StateName | Literal["Unknown"]
"""A base's state as shown: Unknown until the operator has written one."""


def when(timestamp: str | None) -> str:
    """An API server's timestamp (`2026-11-30T21:04:12Z`) as `2026-11-30 21:04 UTC`;
    anything else as it is, none as `—`."""
    if not timestamp:
        return "—"
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d)(:\d\d(\.\d+)?)?Z", timestamp)
    return f"{m[1]} {m[2]} UTC" if m else timestamp


class BackupView(BaseModel):
    """A KnowledgeBaseBackup as its base's page lists it."""

    name: str
    base: str = ""
    phase: str = "Pending"
    created: str = ""
    finished: str | None = None
    chunks: int | None = None
    notes: int | None = None
    size: str | None = None
    message: str | None = None


def backup_view(obj: Mapping[str, Any]) -> BackupView:
    """A KnowledgeBaseBackup (as the API server gives it); one whose spec does not read is
    listed under no base."""
    meta = obj.get("metadata", {})
    status = BackupStatus.read(obj.get("status"))
    try:
        base = BackupSpec.model_validate(obj.get("spec") or {}).knowledge_base
    except ValidationError:
        base = ""
    return BackupView(
        name=meta.get("name", ""),
        base=base,
        phase=status.phase or "Pending",
        created=meta.get("creationTimestamp", ""),
        finished=status.finished_at,
        chunks=status.chunks,
        notes=status.notes,
        size=status.size,
        message=status.message,
    )


class BaseView(BaseModel):
    """A KnowledgeBase as the Bases page shows it."""

    namespace: str
    name: str
    state: Shown = "Unknown"
    reason: str = ""
    index: IndexTotals = Field(default_factory=IndexTotals)
    address: str | None = None
    served: bool = False
    """An indexer of the base has answered the operator (its status holds index totals)."""
    machine: str | None = None
    warnings: list[str] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    """Each source, with the revision it is read at and the one indexed (`sources_said`)."""
    evaluation: Evaluation | None = None
    conditions: list[Condition] = Field(default_factory=list)
    backups: list[BackupView] = Field(default_factory=list)
    """Its KnowledgeBaseBackups, newest first (`Cluster.view` adds them: they are objects
    of their own)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def progress(self) -> tuple[int, int] | None:
        """(read, of) while a pass reads documents; None otherwise."""
        ix = self.index
        if ix.phase in ("scanning", "indexing") and ix.pass_total:
            return min(ix.pass_done or 0, ix.pass_total), ix.pass_total
        return None


def base_view(obj: Mapping[str, Any]) -> BaseView:
    """A KnowledgeBase object (as the API server gives it) as the page shows it."""
    meta = obj.get("metadata", {})
    status = KnowledgeBaseStatus.read(obj.get("status"))
    observed = status.observed or Observed()
    return BaseView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        state=status.state or "Unknown",
        reason=status.reason or ("" if status.state else "not looked at by the operator yet"),
        index=observed.index or IndexTotals(),
        address=observed.address,
        served=observed.index is not None,
        machine=observed.machine,
        warnings=observed.warnings or [],
        sources=_sources(obj.get("spec"), observed),
        evaluation=status.evaluation,
        conditions=status.conditions or [],
    )


def _sources(spec: Any, observed: Observed) -> list[str]:
    """What the base reads, as its page says it; none for a spec the operator refuses
    (its state says why)."""
    try:
        parsed = KnowledgeBaseSpec.model_validate(spec or {})
    except ValidationError:
        return []
    return parsed.sources_said(observed.revisions, observed.indexed_revisions)


class EventView(BaseModel):
    """One Event about a base, as the base's page lists it."""

    type: str = "Normal"
    reason: str = ""
    message: str = ""
    count: int = 1
    last: str = ""


def event_view(obj: Mapping[str, Any]) -> EventView:
    """A core/v1 Event (as JSON) as the base's page lists it: when it was last seen."""
    last = (
        obj.get("lastTimestamp")
        or obj.get("eventTime")
        or (obj.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
    return EventView(
        type=obj.get("type") or "Normal",
        reason=obj.get("reason") or "",
        message=obj.get("message") or "",
        count=obj.get("count") or 1,
        last=str(last),
    )


def indexer_url(address: str, template: str | None) -> str:
    """Where to reach a base's indexer: its `observed.address`, or the Service named
    there through `template` (`http://127.0.0.1:{port}` out of a cluster), as the
    operator's METIS_URL_TEMPLATE."""
    if not template:
        return address.rstrip("/")
    parts = urlsplit(address)
    host = parts.hostname or ""
    name, _, rest = host.partition(".")
    namespace = rest.partition(".")[0]
    return template.format(name=name, namespace=namespace, port=parts.port or 80).rstrip("/")
