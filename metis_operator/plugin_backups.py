"""`kubectl metis backup` and `restore`: the objects they make, as pure functions over the
objects as the API server gives them.

A backup is a KnowledgeBaseBackup the operator carries out (docs/backups.md); a restore
is a new KnowledgeBase: the spec of the base backed up (or one given in a file) with
`spec.restore` naming the backup and the object store it was written to. A base is
never restored in place: what a team has keeps answering until it deletes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from metis_operator.api.backup import FINAL, BackupSpec, BackupStatus
from metis_operator.api.identity import API_VERSION, BACKUP_KIND, KIND
from metis_operator.api.spec import KnowledgeBaseSpec


class BackupRefused(ValueError):
    """What the user must fix first, said as one sentence."""


def backup_object(base: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The KnowledgeBaseBackup of `base` named `name`; refused for a base that has no
    object store to write to (the operator would fail it)."""
    base_name = base["metadata"]["name"]
    if not (base.get("spec") or {}).get("backup"):
        raise BackupRefused(
            f"knowledge base {base_name} has no spec.backup.object_store: give it one "
            "(docs/backups.md) and ask again"
        )
    spec = BackupSpec.model_validate({"knowledge_base": base_name})
    return {
        "apiVersion": API_VERSION,
        "kind": BACKUP_KIND,
        "metadata": {"name": name, "namespace": base["metadata"]["namespace"]},
        "spec": spec.model_dump(mode="json"),
    }


def finished(backup: Mapping[str, Any]) -> BackupStatus | None:
    """The backup's status once it has completed or failed; None while it has not."""
    status = BackupStatus.read(backup.get("status"))
    return status if status.phase in FINAL else None


def said(name: str, status: BackupStatus) -> str:
    """A finished backup in one line."""
    if status.phase == "Failed":
        return f"backup {name} failed: {status.message or 'no reason given'}"
    return (
        f"backup {name} completed: {status.chunks or 0:,} chunks, {status.notes or 0:,} notes, "
        f"{status.size or '0 B'} ({status.model or 'no model'}, chunking {status.chunking})"
    )


def restored_base(
    name: str,
    namespace: str,
    backup: Mapping[str, Any],
    source: Mapping[str, Any] | None,
    given: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The KnowledgeBase `name` restored from `backup`: the spec `given` (a manifest's) or
    else the backed-up base's (`source`), with `spec.restore` naming the backup in the
    object store the source base writes to (or, with the source gone, the store the given
    spec names in its own spec.backup)."""
    backup_name = backup["metadata"]["name"]
    of = str((backup.get("spec") or {}).get("knowledge_base") or "")
    if given is None and source is None:
        raise BackupRefused(
            f"knowledge base {of}, which backup {backup_name} is of, no longer exists: give "
            "the new base's spec with -f FILE (a KnowledgeBase manifest; spec.restore is "
            "filled in)"
        )
    spec = dict((given if given is not None else source or {}).get("spec") or {})
    store = ((source or {}).get("spec") or {}).get("backup") or spec.get("backup") or {}
    if not store.get("object_store"):
        raise BackupRefused(
            f"no object store to restore backup {backup_name} from: knowledge base {of} "
            "has no spec.backup.object_store, nor has the spec given"
        )
    spec["restore"] = {"object_store": store["object_store"], "backup": backup_name}
    try:
        KnowledgeBaseSpec.model_validate(spec)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BackupRefused(f"the new base's spec is refused: {where}: {first['msg']}") from None
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
