"""The limits a knowledge base is held to, in one place: the
operator's spec, the indexer's configuration, the chunker and the sources read them,
and a test holds crds/knowledgebase.yaml to them."""

from __future__ import annotations

from typing import Literal

CHUNK_SIZE_MIN, CHUNK_SIZE_MAX, CHUNK_SIZE_DEFAULT = 200, 4000, 1200
"""Characters a chunk may have."""
CHUNK_OVERLAP_DEFAULT = 200
"""Characters two neighbouring chunks share; at least 0 and less than half the size."""
RESCAN_MIN, RESCAN_MAX, RESCAN_DEFAULT = 10, 86_400, 60
"""Seconds between passes; 0 means only when asked."""
SOURCES_MIN, SOURCES_MAX = 1, 16
"""Sources a base may have."""
PATH_MAX = 512
"""Characters a source's path may have."""
VectorKind = Literal["float32", "int8"]
"""How an index holds its vectors in memory."""
VECTOR_KINDS: tuple[VectorKind, ...] = ("float32", "int8")
VECTORS_DEFAULT: VectorKind = "float32"


def overlap_allowed(size: int, overlap: int) -> bool:
    """The overlap rule: at least 0 and less than half of the size."""
    return overlap >= 0 and 2 * overlap < size


def rescan_allowed(seconds: int) -> bool:
    return seconds == 0 or RESCAN_MIN <= seconds <= RESCAN_MAX


def path_problem(path: str) -> str | None:
    """Why a source's path is not a folder of its drive (relative, no . or ..
    parts), or None when it is one."""
    if path.startswith("/"):
        return "must be relative to its drive, without a leading /"
    if "\0" in path:
        return "contains a NUL character"
    bad = [part for part in path.split("/") if part in (".", "..")]
    if bad:
        return f"has a {bad[0]!r} part; name the folder plainly"
    return None


BACKUP_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
"""A backup's name: a Kubernetes object's (the operator names a backup after its object)."""
