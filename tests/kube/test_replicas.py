"""Replicas on the real control plane, with indexer pods on the real node where the
machine has one (else the stand-in kubelet, where a replica past the first listens on
a port of its own): a second replica gets a Deployment and an index drive of its own,
takes the vectors its peer holds rather than asking the model for them again, and is
counted in the status and `kubectl get kb`; scaled back, its children go.

Model calls are counted at the model server (`GET /health`: the texts it embedded)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metis_dev.plane import ControlPlane, gone
from metis_dev.process import wait_for
from metis_indexer.changes.peers import NEW_CHECKS
from tests.kube.operator_support import Operator, kb, wait_state
from tests.kube.pods import Pods
from tests.kube.test_operator_lifecycle import apply_kb, write_documents
from tests.support.model_server import ModelServer

PEER_SHARE = 0.15
"""What a new replica may cost the model beyond the peer's first `NEW_CHECKS` vectors it
checks, as a share of a full pass's embedding calls: it checks one in 16 of the rest
(`peers.CHECK_RATE`, 6.25 % on average)."""


@pytest.fixture
def machine(pods: Pods) -> Iterator[tuple[str, str]]:
    """A machine with a pool label of this test's own: (node name, pool)."""
    pool = f"cpu-{secrets.token_hex(3)}"
    with pods.machine({"pool": pool}) as name:
        yield name, pool


def embedded(models: ModelServer) -> int:
    return int(httpx.get(f"{models.base_url}/health", timeout=10).json()["embedded"])


def test_a_second_replica_takes_its_peers_vectors_and_scales_away(
    kube: ControlPlane,
    pods: Pods,
    machine: tuple[str, str],
    pod_operator: Operator,
    pod_models: ModelServer,
    tmp_path: Path,
) -> None:
    ns, (host, pool), alive = pods.namespace, machine, pod_operator.check_alive
    docs = tmp_path / "docs"
    docs.mkdir()
    write_documents(docs, 120)
    pods.drive("docs", docs)
    pods.model_service("minilm", int(pod_models.base_url.rsplit(":", 1)[1]))
    spec = {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "minilm"},
        "placement": {"labels": {"pool": pool}},
        "rescan_seconds": 0,
    }
    apply_kb(kube, ns, kb("handbook", spec))
    s = wait_state(kube, ns, "handbook", "Ready", alive=alive, timeout=300)
    assert s["replicas"] == "1/1"
    assert s["observed"]["replicas"] == {"wanted": 1, "answering": 1}
    full_pass = embedded(pod_models)
    assert full_pass >= s["observed"]["index"]["chunks"]

    apply_kb(kube, ns, kb("handbook", {**spec, "replicas": 2}))
    s = wait_state(
        kube,
        ns,
        "handbook",
        "Ready",
        alive=alive,
        timeout=300,
        check=lambda s: s["replicas"] == "2/2",
    )
    cost = embedded(pod_models) - full_pass
    assert cost <= NEW_CHECKS + PEER_SHARE * full_pass, (
        f"the second replica cost {cost} of {full_pass}"
    )
    # One machine in this cluster for the pool: both run there, and the status says so.
    assert any(
        w.startswith(f"2 replicas but machine(s) {host} run several")
        for w in s["observed"]["warnings"]
    ), s["observed"]["warnings"]
    api = kube.rest()
    second = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/metis-handbook-replica-1")
    volumes = second["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "index",
        "persistentVolumeClaim": {"claimName": "metis-handbook-replica-1"},
    } in (volumes)
    claim = api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/metis-handbook-replica-1")
    assert claim["status"]["phase"] == "Bound"
    budget = api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/metis-handbook")
    assert budget["spec"]["maxUnavailable"] == 1
    wait_for(
        lambda: (
            api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/metis-handbook")[
                "status"
            ].get("expectedPods")
            == 2
        ),
        timeout=60,
        what="the budget counting both replicas",
        alive=alive,
    )
    table = kube.kubectl("get", "kb", "handbook", "-n", ns).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert "REPLICAS" in header and "2/2" in row, table

    apply_kb(kube, ns, kb("handbook", spec))
    wait_state(
        kube,
        ns,
        "handbook",
        "Ready",
        alive=alive,
        timeout=120,
        check=lambda s: s["replicas"] == "1/1",
    )
    for path in (
        f"/apis/apps/v1/namespaces/{ns}/deployments/metis-handbook-replica-1",
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims/metis-handbook-replica-1",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/metis-handbook",
    ):
        wait_for(lambda p=path: gone(kube, p), timeout=120, what=f"{path} deleted", alive=alive)
    pods.check()
