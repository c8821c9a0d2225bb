"""How large a base's index drive is: what its memory holds, on disk, with room to build
a new index beside it. A drive of one size for every base would be too small for a base
given 64 GiB and too large for most; a full drive is the usual silent failure of a
stateful operator, so the size follows `placement.memory_gb`, grows with it where the
storage class allows, and the base warns well before it fills (`FILLING`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from metis_indexer.limits import VectorKind

GIB = 1 << 30
RESIDENT_BYTES = {"float32": 4_925, "int8": 1_853}
"""Memory a chunk takes once loaded, at 1,024 dimensions (docs/performance.md: 4.81 KiB
float32, 1.81 KiB int8, both measured after a load in a fresh process)."""
DISK_BYTES = {"int8": 12_100, "float32": 15_200}
"""The index drive a chunk takes at 1,024 dimensions, SQLite and the load's snapshot
together. int8 measured: a million chunks, 6.9 GB of SQLite and a 5.2 GB snapshot
(bench/results/search-million.md). float32 is that plus the 3,072 bytes its snapshot
holds more per chunk (float32 vectors rather than int8 codes), derived, not measured."""
MEMORY_FOR_CHUNKS = 0.8
"""The share of the memory that holds chunks; the rest is the process, a pass's batches
and the page cache."""
BESIDE = 2
"""A change of chunking or model builds a new index beside the one that answers, and a
load writes its snapshot anew beside the old: twice the index, for a while."""
FILLING = 0.8
"""A drive used past this share warns: in the status, a condition and an alert."""


def chunks_held(memory_gb: int, vectors: VectorKind) -> int:
    """The chunks a base's memory holds, at 1,024 dimensions (fewer dimensions hold more
    chunks and take less disk alike)."""
    return int(memory_gb * GIB * MEMORY_FOR_CHUNKS / RESIDENT_BYTES[vectors])


def size_gib(memory_gb: int, vectors: VectorKind, floor: str, least_gib: int | None = None) -> int:
    """The drive's size in GiB: what the memory holds, on disk, twice; at least `floor`
    (the operator's `METIS_INDEX_STORAGE`, a Kubernetes quantity), rounded up, and at
    least `least_gib` (the base's `index_drive.size_gb`)."""
    wanted = chunks_held(memory_gb, vectors) * DISK_BYTES[vectors] * BESIDE
    return max(math.ceil(wanted / GIB), math.ceil(parse_quantity(floor) / GIB), least_gib or 0)


def class_note(claim: Mapping[str, Any], wanted: str | None) -> str | None:
    """What to say when a drive has another StorageClass than the base asks (a class is
    fixed when the drive is made); None when it has that one, or the base asks none."""
    have = (claim.get("spec") or {}).get("storageClassName")
    if wanted is None or have == wanted:
        return None
    name = (claim.get("metadata") or {}).get("name", "?")
    return (
        f"index drive {name} has StorageClass {have or '(the default)'}, the base asks "
        f"{wanted}: a drive keeps the class it was made with, so only new replicas get "
        f"{wanted}; to move the index, make a new base"
    )


def grows(requested: str | None, wanted_gib: int) -> bool:
    """Whether a claim that asks `requested` must grow to `wanted_gib`; never shrinks (a
    claim cannot)."""
    if requested is None:
        return False
    return parse_quantity(requested) < Decimal(wanted_gib) * GIB


def filling(used: int, size: int) -> float | None:
    """The share of the drive in use when it is past `FILLING`; None below it or unknown."""
    if size <= 0:
        return None
    share = used / size
    return share if share >= FILLING else None
