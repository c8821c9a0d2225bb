"""The Helm chart (charts/metis) on a real control plane: `helm install` with the default
values, a KnowledgeBase served by an operator that has only the chart's RBAC becomes Ready;
`helm upgrade` with a changed setting rolls the operator's Deployment (a new pod template, a
new ReplicaSet) while the base keeps its index (the operator replaced as the rollout would,
nothing reindexed, no child remade); the base deleted, `helm uninstall` leaves nothing of the
release but the CRD, which Helm never deletes from a chart's crds/ (Helm's documented rule:
deleting it would delete every base of the cluster).

The control plane is this module's own: the other modules apply manifests/ to the session's,
whose cluster-scoped objects (the ClusterRoles, metis-system) carry the same names as the
chart's, and Helm installs only what nothing else made. As in the operator's other tests, the
operator runs as a local process with the service account's identity and the indexer pods on
the stand-in kubelet (tests/kube/pods.py); the chart's Deployment is checked as an object (its
pods are admitted under the namespace's restricted Pod Security Standard)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from metis_dev.process import wait_for
from tests.kube.conftest import fresh_namespace
from tests.kube.operator_support import CRD, Operator, get_kb, kb, kb_path, looks, wait_state
from tests.kube.pods import StandInPods, port_of
from tests.kube.test_operator_lifecycle import apply_kb, children, write_documents
from tests.support import go_tools
from tests.support.model_server import start_model_server

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "metis"
RELEASE, NAMESPACE = "metis", "metis-system"
OPERATOR = "/apis/apps/v1/namespaces/metis-system/deployments/metis-operator"


@pytest.fixture(scope="module")
def plane(kube_binaries: Path) -> Iterator[ControlPlane]:
    """A control plane for this module alone (see the module's docstring)."""
    with ControlPlane(kube_binaries) as cp:
        print(f"\nhelm's control plane up in {cp.started_in:.1f} s at {cp.server}")
        yield cp


@pytest.fixture(scope="module")
def helm_binary() -> Path:
    """helm from tools/helm/build.sh (built once a machine, minutes; then cached)."""
    return go_tools.built("helm")


class Helm:
    """helm against `plane`, its configuration and caches in a folder of the test's."""

    def __init__(self, binary: Path, plane: ControlPlane, home: Path) -> None:
        self.binary = binary
        self.env = {
            **os.environ,
            "KUBECONFIG": str(plane.kubeconfig),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str) -> str:
        out = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            env=self.env,
        )
        assert out.returncode == 0, f"helm {' '.join(args)}: {out.stdout}{out.stderr}"
        return out.stdout

    def manifest(self) -> list[dict[str, Any]]:
        """The objects of the release's current revision."""
        text = self("get", "manifest", RELEASE, "-n", NAMESPACE)
        return [d for d in yaml.safe_load_all(text) if d]


def present(plane: ControlPlane, objects: list[dict[str, Any]]) -> list[str]:
    """Which of `objects` exist (kind/name), by kubectl."""
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    out = plane.kubectl(
        "get", "-f", "-", "--ignore-not-found", "-o", "name", input=json.dumps(listed)
    )
    return out.stdout.split()


def replica_sets(plane: ControlPlane) -> list[dict[str, Any]]:
    """The operator Deployment's ReplicaSets, oldest first."""
    items = plane.rest().get(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets"
        "?labelSelector=app.kubernetes.io/name=metis-operator"
    )["items"]
    return sorted(
        items, key=lambda r: int(r["metadata"]["annotations"]["deployment.kubernetes.io/revision"])
    )


def env_of(template: dict[str, Any]) -> dict[str, str | None]:
    (container,) = template["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


@dataclasses.dataclass
class Base:
    """The test's base and what serves it: the operator (a local process with the chart's
    service account's identity) and the stand-in kubelet of its namespace."""

    namespace: str
    kubelet: Kubelet
    operator: Operator


@contextlib.contextmanager
def served_base(plane: ControlPlane, work: Path) -> Iterator[Base]:
    """A base of six documents in a namespace of its own, Ready."""
    docs = work / "docs"
    docs.mkdir()
    write_documents(docs, 6)
    (work / "operator").mkdir()
    pool = f"cpu-{secrets.token_hex(3)}"
    with contextlib.ExitStack() as stack:
        models = start_model_server()
        stack.callback(models.stop)
        ns = stack.enter_context(fresh_namespace(plane, f"t-{secrets.token_hex(4)}"))
        kubelet = stack.enter_context(Kubelet(plane, ns, work / "kubelet"))
        pods = StandInPods(plane, ns, kubelet)
        stack.enter_context(pods.machine({"pool": pool}))
        pods.drive("docs", docs)
        pods.model_service("minilm", port_of(models))
        operator = pods.operator(work / "operator").start()
        stack.callback(operator.stop)
        spec = {
            "sources": [{"drive": "docs"}],
            "embedding": {"deployment": "minilm"},
            "placement": {"labels": {"pool": pool}},
            "rescan_seconds": 0,
        }
        apply_kb(plane, ns, kb("handbook", spec))
        wait_state(plane, ns, "handbook", "Ready", alive=operator.check_alive, timeout=300)
        yield Base(ns, kubelet, operator)


def two_replica_sets(plane: ControlPlane) -> list[dict[str, Any]] | None:
    found = replica_sets(plane)
    return found if len(found) == 2 else None


def upgrade_rolls_the_operator(plane: ControlPlane, helm: Helm) -> None:
    """helm upgrade with a changed setting and resources: a new pod template, a new
    ReplicaSet beside the first."""
    (first,) = replica_sets(plane)
    generation = plane.rest().get(OPERATOR)["metadata"]["generation"]
    helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--set-string=operator.extraEnv.METIS_LOG_FORMAT=json",
        "--set=operator.resources.limits.memory=768Mi",
    )
    deployment = plane.rest().get(OPERATOR)
    assert deployment["metadata"]["generation"] == generation + 1
    template = deployment["spec"]["template"]
    assert env_of(template)["METIS_LOG_FORMAT"] == "json"
    (container,) = template["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == "768Mi"
    old, new = wait_for(
        lambda: two_replica_sets(plane), timeout=120, what="the operator's new ReplicaSet"
    )
    assert old["metadata"]["uid"] == first["metadata"]["uid"]
    hash_of = "pod-template-hash"
    assert new["metadata"]["labels"][hash_of] != old["metadata"]["labels"][hash_of]
    assert env_of(new["spec"]["template"])["METIS_LOG_FORMAT"] == "json"


def test_install_upgrade_and_uninstall_the_chart(
    plane: ControlPlane, helm_binary: Path, tmp_path: Path
) -> None:
    helm = Helm(helm_binary, plane, tmp_path / "helm")
    # The namespace is the team's: made before, under the restricted Pod Security Standard;
    # the release installs into it and leaves it.
    plane.kubectl("create", "namespace", NAMESPACE)
    plane.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    helm("install", RELEASE, str(CHART), "-n", NAMESPACE)
    plane.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    installed = helm.manifest()
    assert len(present(plane, installed)) == len(installed)
    assert "Namespace" not in {o["kind"] for o in installed}
    # The operator's pods pass the restricted standard (the ReplicaSet could make them).
    wait_for(
        lambda: plane.rest().get(
            f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app.kubernetes.io/name=metis-operator"
        )["items"],
        timeout=120,
        what="the chart's operator pods admitted",
    )

    with served_base(plane, tmp_path) as base:
        ns, operator = base.namespace, base.operator
        index = get_kb(plane, ns, "handbook")["status"]["observed"]["index"]
        assert index["documents"] == 6 and index["chunks"] > 0
        made = {k: o["metadata"]["uid"] for k, o in children(plane, ns, "handbook").items()}
        indexers = set(base.kubelet.pods)

        upgrade_rolls_the_operator(plane, helm)
        # The operator replaced, as the rollout replaces its pod: the base keeps its index
        # (no pass since), its children and its indexer.
        operator.stop()
        operator.env["METIS_LOG_FORMAT"] = "json"
        operator.start()
        wait_for(
            lambda: looks(operator, timer=True) >= 3,
            timeout=60,
            what="3 timer looks by the new operator",
            alive=operator.check_alive,
        )
        after = get_kb(plane, ns, "handbook")["status"]
        assert after["state"] == "Ready", after
        assert after["observed"]["index"] == index
        now = {k: o["metadata"]["uid"] for k, o in children(plane, ns, "handbook").items()}
        assert now == made
        assert set(base.kubelet.pods) == indexers
        base.kubelet.check()

        # The base deleted while the operator runs (the finalizer is its), then the release.
        plane.kubectl("delete", "kb", "handbook", "-n", ns, "--wait=false")
        wait_for(
            lambda: plane.rest().gone(kb_path(ns, "handbook")),
            timeout=120,
            what="the base deleted",
            alive=operator.check_alive,
        )

    upgraded = helm.manifest()
    assert {o["kind"] for o in upgraded} >= {
        "ClusterRole",
        "ClusterRoleBinding",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "NetworkPolicy",
    }
    helm("uninstall", RELEASE, "-n", NAMESPACE)
    wait_for(
        lambda: not present(plane, upgraded), timeout=180, what="every object of the release gone"
    )
    left = plane.kubectl(
        "get",
        "clusterroles,clusterrolebindings,namespaces",
        "-l",
        "app.kubernetes.io/part-of=metis",
        "-o",
        "name",
    ).stdout.split()
    assert left == []
    assert plane.rest().get(f"/api/v1/namespaces/{NAMESPACE}")["status"]["phase"] == "Active"
    # Helm keeps the CRD of crds/ (and so every base of the cluster): it is the admin's.
    plane.rest().get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}")
