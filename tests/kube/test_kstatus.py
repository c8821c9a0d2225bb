"""The status the operator composes, read by the real kstatus library (what Flux and
kpt act on): Current only when Ready at the observed generation, Failed when
Stalled, InProgress otherwise. No control plane: the checker reads JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from metis_dev.build import ensure_binaries
from metis_operator.state import Observation, State, Verdict
from metis_operator.status import compose
from tests.kube.operator_support import read_kstatus


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return ensure_binaries()


def base(state: State, generation: int, observed: int) -> dict[str, Any]:
    status = compose.compose(
        {},
        Verdict(state, f"why {state}"),
        Observation(),
        generation=observed,
        address=None,
        revisions={},
        with_reranker=False,
        now="2026-01-01T00:00:00Z",
    ).dump()
    return {
        "apiVersion": "metis.astraeus.io/v1",
        "kind": "KnowledgeBase",
        "metadata": {"name": "handbook", "namespace": "team", "generation": generation},
        "status": status,
    }


@pytest.mark.parametrize(
    ("state", "generation", "observed", "expected"),
    [
        (State.READY, 3, 3, "Current"),
        (State.READY, 4, 3, "InProgress"),
        (State.INDEXING, 3, 3, "InProgress"),
        (State.STARTING, 3, 3, "InProgress"),
        (State.PENDING, 3, 3, "InProgress"),
        (State.WAITING, 3, 3, "InProgress"),
        (State.FAILED, 3, 3, "Failed"),
    ],
    ids=[
        "ready",
        "ready-but-a-newer-generation",
        "indexing",
        "starting",
        "pending",
        "waiting",
        "failed",
    ],
)
def test_kstatus_reads_each_state_as_meant(
    bin_dir: Path, state: State, generation: int, observed: int, expected: str
) -> None:
    seen = read_kstatus(bin_dir, base(state, generation, observed))
    assert seen["status"] == expected, seen
    if expected != "Current":
        assert seen["message"]
