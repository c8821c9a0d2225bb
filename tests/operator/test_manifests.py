"""The install manifests as files: the operator's Deployment agrees with its own
settings (ports, flags), runs two replicas a disruption budget keeps one of, and the
single-namespace Role grants what the ClusterRole grants in a namespace. (The API
server's view of them is tested in tests/kube/test_operator_edges.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_operator.settings import load

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "nodes"}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


@pytest.fixture(scope="module")
def operator() -> list[dict[str, Any]]:
    return documents(MANIFESTS / "operator" / "operator.yaml")


@pytest.fixture(scope="module")
def container(operator: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(operator, "Deployment", "metis-operator")["spec"]["template"]["spec"]["containers"]
    return c


def test_the_container_runs_with_settings_the_operator_accepts(container: dict[str, Any]) -> None:
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    # main.py reads its flags strictly: a kopf flag such as --liveness would stop it.
    settings = load(env, container.get("args", []))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == settings.runtime.health_port
    assert ports["metrics"] == settings.runtime.metrics_port != settings.runtime.health_port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_each_replica_knows_its_name_and_namespace(container: dict[str, Any]) -> None:
    fields = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert fields == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_two_replicas_and_a_budget_that_keeps_one(operator: list[dict[str, Any]]) -> None:
    dep = one(operator, "Deployment", "metis-operator")
    pdb = one(operator, "PodDisruptionBudget", "metis-operator")
    assert dep["spec"]["replicas"] == 2
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]


def test_limited_unprivileged_and_as_checkov_wants(
    operator: list[dict[str, Any]], container: dict[str, Any]
) -> None:
    resources = container["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert {"cpu", "memory"} <= resources["limits"].keys()
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    pod = one(operator, "Deployment", "metis-operator")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] >= 10000


def test_the_namespaced_role_grants_what_the_cluster_role_grants_in_a_namespace() -> None:
    cluster = one(documents(MANIFESTS / "rbac.yaml"), "ClusterRole", "metis-operator")["rules"]
    overlay = documents(MANIFESTS / "overlays" / "namespaced" / "rbac.yaml")
    role = one(overlay, "Role", "metis-operator")["rules"]
    assert role == [r for r in cluster if not CLUSTER_SCOPED & set(r["resources"])]
    binding = one(overlay, "RoleBinding", "metis-operator")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "metis-operator",
    }


def test_leader_election_leases_only_in_the_operators_namespace() -> None:
    identity = documents(MANIFESTS / "operator" / "identity.yaml")
    (rule,) = one(identity, "Role", "metis-operator-leader-election")["rules"]
    assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
    cluster = one(documents(MANIFESTS / "rbac.yaml"), "ClusterRole", "metis-operator")["rules"]
    assert not any("leases" in r["resources"] for r in cluster)


def test_only_metrics_and_health_reach_the_operator(
    operator: list[dict[str, Any]], container: dict[str, Any]
) -> None:
    policy = one(operator, "NetworkPolicy", "metis-operator")["spec"]
    dep = one(operator, "Deployment", "metis-operator")
    assert policy["podSelector"] == dep["spec"]["selector"]
    (rule,) = policy["ingress"]
    assert {p["port"] for p in rule["ports"]} == {p["name"] for p in container["ports"]}
