"""Argo CD's health check for KnowledgeBases (manifests/argocd/health.lua), run in
gopher-lua, Argo CD's own Lua runtime (tools/lua-health, built and cached by its build.sh),
on statuses the operator's composer makes for each state: Healthy only when Ready at the
observed generation, Degraded when Failed, Suspended when paused, Progressing otherwise.
tests/kube/test_argocd_health.py runs it on bases of a real control plane. No cluster here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_operator.state import Observation, State, Verdict
from metis_operator.status import compose
from tests.support import go_tools

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "manifests" / "argocd" / "health.lua"
CONFIG_MAP = ROOT / "manifests" / "argocd" / "argocd-cm.yaml"
KEY = "resource.customizations.health.metis.astraeus.io_KnowledgeBase"
"""Argo CD's key for a group's kind: resource.customizations.health.<group>_<kind>."""
INDEXING = Path(__file__).with_name("argocd_health_indexing.json")
"""A base Indexing, as the API server served it in a run of tests/kube/test_argocd_health.py's
fixtures (the stand-in kubelet, 300 documents, read while the pass ran; managedFields left
out): too short-lived to be caught there every run, so its status is checked here."""


def argo_health(binary: Path, obj: dict[str, Any], script: Path = SCRIPT) -> dict[str, str]:
    """What Argo CD makes of `obj` with the check: {"status": ..., "message": ...}."""
    out = subprocess.run(
        [str(binary), str(script)],
        input=json.dumps(obj),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


@pytest.fixture(scope="session")
def lua_health() -> Path:
    return go_tools.built("lua-health")


def base(status: dict[str, Any] | None, generation: int = 3) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "metis.astraeus.io/v1",
        "kind": "KnowledgeBase",
        "metadata": {"name": "handbook", "namespace": "team", "generation": generation},
    }
    if status is not None:
        obj["status"] = status
    return obj


def composed(state: State, observed: int = 3) -> dict[str, Any]:
    """The status the operator writes in `state` for generation `observed`."""
    return compose.compose(
        {},
        Verdict(state, f"why {state}"),
        Observation(),
        generation=observed,
        address=None,
        revisions={},
        with_reranker=False,
        now="2026-01-01T00:00:00Z",
    ).dump()


def test_the_config_map_holds_the_script_under_argo_cds_key() -> None:
    cm = yaml.safe_load(CONFIG_MAP.read_text())
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == (
        "ConfigMap",
        "argocd-cm",
        "argocd",
    )
    assert cm["metadata"]["labels"]["app.kubernetes.io/part-of"] == "argocd"
    assert cm["data"] == {KEY: SCRIPT.read_text()}


@pytest.mark.parametrize(
    ("state", "observed", "expected"),
    [
        (State.READY, 3, "Healthy"),
        (State.READY, 2, "Progressing"),
        (State.PENDING, 3, "Progressing"),
        (State.STARTING, 3, "Progressing"),
        (State.INDEXING, 3, "Progressing"),
        (State.WAITING, 3, "Progressing"),
        (State.FAILED, 3, "Degraded"),
        (State.FAILED, 2, "Progressing"),
    ],
    ids=[
        "ready",
        "ready-but-a-newer-generation",
        "pending",
        "starting",
        "indexing",
        "waiting",
        "failed",
        "failed-but-a-newer-generation",
    ],
)
def test_each_state_reads_as_meant(
    lua_health: Path, state: State, observed: int, expected: str
) -> None:
    seen = argo_health(lua_health, base(composed(state, observed)))
    assert seen["status"] == expected, seen
    if observed == 3:
        assert seen["message"] == f"{state}: why {state}"
    else:
        assert seen["message"] == (
            "Waiting for the operator to observe generation 3 (status is of generation 2)"
        )


def test_a_base_indexing_is_progressing_with_its_progress(lua_health: Path) -> None:
    obj = json.loads(INDEXING.read_text())
    assert obj["status"]["state"] == "Indexing"
    assert argo_health(lua_health, obj) == {
        "status": "Progressing",
        "message": f"Indexing: {obj['status']['reason']} ({obj['status']['progress']})",
    }


def test_a_paused_base_is_suspended_whatever_its_state(lua_health: Path) -> None:
    for state in (State.READY, State.FAILED, State.INDEXING):
        status = compose.paused(composed(state, observed=2), "2026-01-01T00:00:00Z")
        seen = argo_health(lua_health, base(status.dump()))
        assert seen == {
            "status": "Suspended",
            "message": 'Paused: annotation metis.astraeus.io/paused is "true": the operator '
            f"leaves the base and its children as they are (left in state {state})",
        }
    paused_at_once = compose.paused({}, "2026-01-01T00:00:00Z").dump()
    assert argo_health(lua_health, base(paused_at_once))["status"] == "Suspended"


def test_a_base_the_operator_has_not_seen_is_progressing(lua_health: Path) -> None:
    seen = argo_health(lua_health, base(None))
    assert seen == {
        "status": "Progressing",
        "message": "Waiting for the operator to report the base's state",
    }


@pytest.mark.parametrize(
    ("state", "expected"),
    [("Ready", "Healthy"), ("Failed", "Degraded"), ("Waiting", "Progressing"), ("Gone", "Unknown")],
)
def test_without_conditions_the_state_decides(lua_health: Path, state: str, expected: str) -> None:
    """A status with no conditions (written by hand, or by an operator before them)."""
    seen = argo_health(
        lua_health, base({"state": state, "reason": "because", "observedGeneration": 3})
    )
    assert seen["status"] == expected, seen
    assert seen["message"].endswith(f"{state}: because")
