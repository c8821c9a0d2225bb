"""The KnowledgeBase resource's identity: its group, version, kind and plural, and every
annotation the operator reads or writes under its group."""

from __future__ import annotations

from metis_operator import kube

GROUP = "metis.astraeus.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "KnowledgeBase"
PLURAL = "knowledgebases"
RESOURCE = {"group": GROUP, "version": VERSION, "plural": PLURAL}
"""As kopf names a resource."""
BACKUP_KIND = "KnowledgeBaseBackup"
BACKUP_PLURAL = "knowledgebasebackups"
BACKUP_RESOURCE = {"group": GROUP, "version": VERSION, "plural": BACKUP_PLURAL}
SCHEDULE_KIND = "KnowledgeBaseBackupSchedule"
SCHEDULE_PLURAL = "knowledgebasebackupschedules"
SCHEDULE_RESOURCE = {"group": GROUP, "version": VERSION, "plural": SCHEDULE_PLURAL}
SCHEDULE_LABEL = f"{GROUP}/schedule"
"""On a KnowledgeBaseBackup a schedule made: the schedule's name."""
FINALIZER = f"{GROUP}/finalizer"
KOPF_PREFIX = f"kopf.{GROUP}"
"""kopf's own annotations. Not the group itself: kopf leaves every annotation under its
prefix out of the changes it reacts to, and the user's requests (reindex, evaluate)
are annotations under the group."""

REINDEX = f"{GROUP}/reindex"
"""Annotation: a new value asks for a pass; a value starting with `full` reads everything."""
EVALUATE = f"{GROUP}/evaluate"
"""Annotation: a new value runs the evaluation set (`k=5` in it sets k; 10 by default)."""
PAUSED = f"{GROUP}/paused"
"""Annotation: "true" leaves the base and its children untouched."""
DEFERRED_REINDEX = f"{GROUP}/deferred-reindex"
"""Annotation the operator writes: the value of a reindex asked while the base was
paused, run when the pause ends (then removed)."""
DEFERRED_EVALUATE = f"{GROUP}/deferred-evaluate"
"""Annotation the operator writes: the value of an evaluation asked while the base was
paused, run when the pause ends (then removed)."""
REVISION = f"{GROUP}/revision"
"""On a drive's claim: the revision of the data it holds (a data source's)."""
HASH_ANNOTATION = f"{GROUP}/applied-hash"
"""On each child: the hash of the manifest last applied."""
POD_INPUTS_ANNOTATION = f"{GROUP}/pod-inputs"
"""On the Deployment: a hash of what of the base's spec its pod was made from."""


def path(namespace: str, name: str) -> str:
    """The base's path on the API server."""
    return kube.path(API_VERSION, PLURAL, namespace, name)


def backup_path(namespace: str, name: str | None = None) -> str:
    """A KnowledgeBaseBackup's path (or the namespace's backups')."""
    return kube.path(API_VERSION, BACKUP_PLURAL, namespace, name)
