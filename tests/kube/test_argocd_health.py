"""Argo CD's health check (manifests/argocd/health.lua) on bases of the real control plane,
as the API server serves them: the status each state's base really carries, written by the
operator, run in gopher-lua (Argo CD's Lua runtime; tools/lua-health). A base starting, then
Ready, then Waiting for its stopped model; one Failed; one Pending, then paused; and a spec
change the stopped operator has not observed. Indexing lasts as long as a pass, which a poll
catches on one machine and misses on a faster one: its object, captured from a run here, is
checked by tests/repository/test_argocd_health_lua.py. And the argocd-cm snippet, patched in.

The indexer pods run on the stand-in kubelet (local `metis serve` processes): the states
are the operator's, whichever kubelet runs the pods. Every wait polls with a deadline."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from tests.kube.conftest import fresh_namespace
from tests.kube.operator_support import Operator, get_kb, kb, wait_state
from tests.kube.pods import StandInPods, port_of
from tests.kube.test_operator_lifecycle import apply_kb, write_documents
from tests.repository.test_argocd_health_lua import (
    CONFIG_MAP,
    KEY,
    SCRIPT,
    argo_health,
)
from tests.support import go_tools
from tests.support.model_server import ModelServer


@pytest.fixture(scope="module")
def lua_health() -> Path:
    """Built (or skipped) as the unit test does: it needs Go once, not a cluster."""
    return go_tools.built("lua-health")


@pytest.fixture
def stand_in(
    kube: ControlPlane, installed: None, namespace: str, tmp_path: Path
) -> Iterator[StandInPods]:
    """The stand-in kubelet for this test's namespace: a base Ready in seconds, no image."""
    with Kubelet(kube, namespace, tmp_path / "kubelet") as kubelet:
        yield StandInPods(kube, namespace, kubelet)


@pytest.fixture
def own_operator(stand_in: StandInPods, tmp_path: Path) -> Iterator[Operator]:
    """The operator for this test's namespace alone, reaching the stand-in's indexers."""
    workdir = tmp_path / "operator"
    workdir.mkdir()
    op = stand_in.operator(workdir).start()
    yield op
    op.stop()


def test_argo_cd_reads_each_state_the_operator_writes(
    kube: ControlPlane,
    stand_in: StandInPods,
    own_operator: Operator,
    models: ModelServer,
    lua_health: Path,
    tmp_path: Path,
) -> None:
    ns, operator, alive = stand_in.namespace, own_operator, own_operator.check_alive

    def reads(name: str, state: str, expected: str) -> dict[str, str]:
        """Argo CD's reading of the base as served now, in `state`; its message is the
        operator's reason."""
        obj = get_kb(kube, ns, name)
        seen = argo_health(lua_health, obj)
        assert obj["status"]["state"] == state, obj["status"]
        assert seen["status"] == expected, seen
        if expected != "Suspended":
            said = f"{state}: {obj['status']['reason']}"
            if expected == "Progressing" and obj["status"].get("progress"):
                said += f" ({obj['status']['progress']})"
            assert seen["message"] == said, seen
        return seen

    docs = tmp_path / "docs"
    docs.mkdir()
    write_documents(docs, 6)
    stand_in.drive("docs", docs)
    stand_in.model_service("minilm", port_of(models))
    pool = f"cpu-{secrets.token_hex(3)}"
    spec: dict[str, Any] = {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "minilm"},
        "rescan_seconds": 0,
    }
    apply_kb(kube, ns, kb("broken", {**spec, "sources": [{"drive": "absent"}]}))
    apply_kb(kube, ns, kb("nowhere", {**spec, "placement": {"labels": {"pool": "nowhere"}}}))
    with stand_in.machine({"pool": pool}):
        handbook = {**spec, "placement": {"labels": {"pool": pool}}}
        with stand_in.held():
            apply_kb(kube, ns, kb("handbook", handbook))
            wait_state(kube, ns, "handbook", "Starting", alive=alive)
            reads("handbook", "Starting", "Progressing")
        wait_state(kube, ns, "handbook", "Ready", alive=alive, timeout=180)
        reads("handbook", "Ready", "Healthy")

        s = wait_state(kube, ns, "broken", "Failed", alive=alive)
        assert "drive absent does not exist" in s["reason"]
        reads("broken", "Failed", "Degraded")

        wait_state(kube, ns, "nowhere", "Pending", alive=alive)
        reads("nowhere", "Pending", "Progressing")
        kube.kubectl("annotate", "kb", "nowhere", "-n", ns, "metis.astraeus.io/paused=true")
        wait_state(
            kube,
            ns,
            "nowhere",
            "Pending",
            alive=alive,
            check=lambda s: any(
                c["type"] == "Paused" and c["status"] == "True" for c in s["conditions"]
            ),
        )
        seen = reads("nowhere", "Pending", "Suspended")
        assert seen["message"].startswith("Paused: annotation metis.astraeus.io/paused"), seen
        assert seen["message"].endswith("(left in state Pending)"), seen

        models.stop()
        wait_state(kube, ns, "handbook", "Waiting", alive=alive)
        reads("handbook", "Waiting", "Progressing")

        # A change the operator has not observed yet (it is stopped): the status is still
        # generation 1's, and Argo CD waits for generation 2.
        operator.stop()
        apply_kb(kube, ns, kb("handbook", {**handbook, "chunking": {"size": 400, "overlap": 50}}))
        obj = get_kb(kube, ns, "handbook")
        assert (obj["metadata"]["generation"], obj["status"]["observedGeneration"]) == (2, 1)
        assert argo_health(lua_health, obj) == {
            "status": "Progressing",
            "message": "Waiting for the operator to observe generation 2 "
            "(status is of generation 1)",
        }


def test_the_snippet_patches_argo_cds_config_map(kube: ControlPlane) -> None:
    """The README's command adds the check to an argocd-cm and keeps what it held."""
    with fresh_namespace(kube, "argocd") as ns:
        kube.rest().post(
            f"/api/v1/namespaces/{ns}/configmaps",
            {"metadata": {"name": "argocd-cm"}, "data": {"url": "https://argocd.example"}},
        )
        kube.kubectl("-n", ns, "patch", "configmap", "argocd-cm", "--patch-file", str(CONFIG_MAP))
        cm = kube.rest().get(f"/api/v1/namespaces/{ns}/configmaps/argocd-cm")
    assert cm["data"] == {"url": "https://argocd.example", KEY: SCRIPT.read_text()}
    assert cm["metadata"]["labels"]["app.kubernetes.io/part-of"] == "argocd"
