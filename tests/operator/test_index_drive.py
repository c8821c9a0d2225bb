"""The index drive's size rule (metis_operator/index_drive.py), as a table: what the memory
holds, on disk, twice (a new index is built beside the one that answers), at least the
operator's floor; and when a drive grows or warns."""

from __future__ import annotations

import pytest

from metis_operator import index_drive
from metis_operator.state import Observation, derive
from metis_operator.status import compose
from tests.operator.answers import indexer_status

GIB = 1 << 30


@pytest.mark.parametrize(
    ("memory_gb", "vectors", "floor", "size"),
    [
        (1, "float32", "10Gi", 10),  # 174,000 chunks need 5 GiB: the floor
        (2, "float32", "10Gi", 10),  # the default base: 349,000 chunks, 9.9 GiB
        (2, "float32", "1Gi", 10),
        (4, "float32", "10Gi", 20),
        (2, "int8", "10Gi", 21),  # int8 holds 2.7 times the chunks in the same memory
        (16, "int8", "10Gi", 168),
        (256, "float32", "10Gi", 1_265),
        (256, "int8", "10Gi", 2_675),
        (2, "float32", "50Gi", 50),  # the operator's floor wins
        (2, "float32", "53687091200", 50),  # any Kubernetes quantity
    ],
)
def test_the_size_follows_what_the_memory_holds(
    memory_gb: int, vectors: str, floor: str, size: int
) -> None:
    assert index_drive.size_gib(memory_gb, vectors, floor) == size  # type: ignore[arg-type]


def test_what_the_memory_holds_is_the_measured_chunk_size() -> None:
    assert index_drive.chunks_held(2, "float32") == 348_829
    assert index_drive.chunks_held(2, "int8") == 927_138


def test_a_drive_grows_never_shrinks() -> None:
    assert index_drive.grows("10Gi", 20)
    assert not index_drive.grows("20Gi", 20)
    assert not index_drive.grows("40Gi", 20), "a claim cannot shrink"
    assert not index_drive.grows("21474836480", 20)
    assert not index_drive.grows(None, 20)


def test_a_drive_past_80_percent_warns() -> None:
    assert index_drive.filling(79 * GIB, 100 * GIB) is None
    assert index_drive.filling(80 * GIB, 100 * GIB) == 0.8
    assert index_drive.filling(1, 0) is None


def drive(used: float, size: int = 10) -> Observation:
    ix = indexer_status(
        phase="ready", drive={"used_bytes": int(used * GIB), "size_bytes": size * GIB}
    )
    return Observation(indexer=ix, index_drive="metis-handbook")


def test_bytes_written_within_a_percent_leave_what_the_status_says_as_it_was() -> None:
    """The drive a node shares with everything else moves at every look: the status is
    written again only when its fill moves by a whole percent."""
    assert compose.warnings(drive(8.51)) == compose.warnings(drive(8.54))
    assert compose.warnings(drive(8.51)) != compose.warnings(drive(8.61))


def test_a_filling_drive_is_a_warning_a_condition_and_in_the_status() -> None:
    full = drive(8.5)
    [warning] = compose.warnings(full)
    assert warning.startswith("index drive metis-handbook is 85% full (of 10.0 GiB)")
    status = compose.compose(
        {},
        derive(full),
        full,
        generation=1,
        address=None,
        revisions={},
        with_reranker=False,
        now="2026-12-06T00:00:00Z",
    )
    [condition] = [c for c in status.conditions or [] if c.type == "DriveFilling"]
    assert (condition.status, condition.reason) == ("True", "AboveThreshold")
    assert condition.message == warning
    assert status.observed is not None and status.observed.drive is not None
    assert (status.observed.drive.size_gib, status.observed.drive.used_percent) == (10.0, 85)


def test_a_roomy_drive_says_so_and_warns_nothing() -> None:
    roomy = drive(2.0)
    assert compose.warnings(roomy) == []
    [condition] = [
        c for c in compose.conditions(derive(roomy), roomy, 1, False) if c.type == "DriveFilling"
    ]
    assert (condition.status, condition.reason, condition.message) == (
        "False",
        "BelowThreshold",
        "",
    )
    assert not [
        c
        for c in compose.conditions(derive(Observation()), Observation(), 1, False)
        if c.type == "DriveFilling"
    ], "absent while no indexer has said"


def test_a_drive_that_cannot_grow_is_a_warning() -> None:
    note = "index drive metis-handbook has 10Gi, ... cannot grow"
    assert compose.warnings(Observation(child_notes=(note,))) == [note]
