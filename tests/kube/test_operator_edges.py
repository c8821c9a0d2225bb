"""The operator's edges on the real control plane: `kubectl explain` documents every
field of a base, each base gets a NetworkPolicy and a token Secret, and both installs
(cluster-wide, and one namespace with a Role) are accepted by the API server, the
namespaced one running an operator that needs no cluster-wide right; a base being
deleted, or whose CRD was, is never written to again.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from metis_dev.process import free_port, wait_for
from tests.kube.operator_support import (
    CRD,
    ROOT,
    Operator,
    install,
    kb,
    kb_path,
    make_drive,
    model_service,
    running_operator,
    wait_state,
)
from tests.support import processes
from tests.support.model_server import ModelServer

CRD_FILE = ROOT / "crds" / "knowledgebase.yaml"
OVERLAY = ROOT / "manifests" / "overlays" / "namespaced"


def _schema() -> dict[str, Any]:
    (version,) = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"])


def _objects(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field of the schema that has fields of its own, as kubectl names it."""
    if node.get("properties"):
        yield path, node
    for name, child in node.get("properties", {}).items():
        if name != "metadata":  # kubectl explains ObjectMeta from the API itself
            yield from _objects(child, f"{path}.{name}")
        yield from _objects(child.get("items", {}), f"{path}.{name}")


OBJECTS = dict(_objects(_schema(), "kb"))


def explain(kube: ControlPlane, path: str) -> tuple[str, dict[str, str]]:
    """kubectl's description of `path`, and of each of its fields by name (once the
    API server publishes the CRD's schema: discovery follows it by a moment)."""

    def published() -> str:
        done = kube.kubectl("explain", path, check=False)
        return done.stdout if done.returncode == 0 else ""

    out = wait_for(published, timeout=60, what=f"kubectl explain {path}")
    head, _, fields = out.partition("\nFIELDS:\n")
    description = head.partition("DESCRIPTION:\n")[2]
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in fields.splitlines():
        start = re.match(r"^  (\w+)\s+<", line)
        if start:
            current = found.setdefault(start.group(1), [])
        elif line.startswith("    "):
            current.append(line.strip())
    return " ".join(description.split()), {k: " ".join(v) for k, v in found.items()}


@pytest.mark.parametrize("path", sorted(OBJECTS))
def test_kubectl_explain_describes_every_field(
    kube: ControlPlane, installed: None, path: str
) -> None:
    description, fields = explain(kube, path)
    assert description and description != "<empty>"
    assert sorted(fields) == sorted(OBJECTS[path]["properties"])
    undocumented = [f for f, said in fields.items() if not said or "<no description>" in said]
    assert undocumented == []
    if path == "kb.status":
        for kind in ("Ready", "Reconciling", "Stalled", "Paused"):
            assert kind in fields["conditions"]


# --------------------------------------------------------------------------- a base's edge


def test_a_base_gets_a_network_policy_and_a_token_made_once(
    kube: ControlPlane, operator: Operator, models: ModelServer, namespace: str, tmp_path: Path
) -> None:
    api, ns = kube.rest(), namespace
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    (tmp_path / "docs").mkdir()
    make_drive(kube, ns, "docs", tmp_path / "docs")
    body = kb("handbook", {"sources": [{"drive": "docs"}], "embedding": {"deployment": "minilm"}})
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
    base = api.get(f"/apis/metis.astraeus.io/v1/namespaces/{ns}/knowledgebases/handbook")

    policy = wait_for(
        lambda: api.get(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies")["items"],
        timeout=60,
        what="the base's NetworkPolicy",
        alive=operator.check_alive,
    )[0]
    # The children are applied one after another: the policy may come before the rest.
    deployment = wait_for(
        lambda: api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/metis-handbook"),
        timeout=60,
        what="the base's Deployment",
        alive=operator.check_alive,
    )
    secret = wait_for(
        lambda: api.get(f"/api/v1/namespaces/{ns}/secrets/metis-handbook"),
        timeout=60,
        what="the base's token Secret",
        alive=operator.check_alive,
    )
    assert policy["metadata"]["name"] == "metis-handbook"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == base["metadata"]["uid"]
    spec = policy["spec"]
    assert spec["podSelector"] == deployment["spec"]["selector"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {
            "from": [
                {"podSelector": {}},
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "metis-system"}
                    }
                },
            ],
            "ports": [{"protocol": "TCP", "port": operator.indexer_port}],
        }
    ]

    assert secret["type"] == "Opaque"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == base["metadata"]["uid"]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 43
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {
        "name": "METIS_API_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "metis-handbook", "key": "token"}},
    } in container["env"]

    # A later reconciliation (it rewrites the configuration) keeps the token.
    kube.kubectl(
        "patch", "kb", "handbook", "-n", ns, "--type=merge", "-p", '{"spec":{"rescan_seconds":0}}'
    )
    wait_for(
        lambda: (
            '"rescan_seconds": 0'
            in api.get(f"/api/v1/namespaces/{ns}/configmaps/metis-handbook")["data"]["config.json"]
        ),
        timeout=60,
        what="the new configuration",
        alive=operator.check_alive,
    )
    again = api.get(f"/api/v1/namespaces/{ns}/secrets/metis-handbook")
    assert again["data"] == secret["data"]
    assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]


def test_a_teams_pool_pull_secrets_and_peers_reach_the_pods(
    kube: ControlPlane, installed: None, models: ModelServer, namespace: str, tmp_path: Path
) -> None:
    """A tainted pool runs the base that tolerates its taint and not the one that does
    not, which says which taint; the operator's pull secret is copied into the team's
    namespace and named by the pods; the NetworkPolicy admits the peers it is told."""
    api, ns, tag = kube.rest(), namespace, secrets.token_hex(3)
    pool, pull = f"search-{tag}", f"regcred-{tag}"
    kube.kubectl(
        "create", "secret", "docker-registry", pull, "-n", "metis-system",
        "--docker-server=registry.team.example:5000", "--docker-username=team",
        "--docker-password=s3cret",
    )  # fmt: skip
    kube.add_node(pool, {"pool": pool})
    kube.kubectl("taint", "node", pool, f"dedicated={pool}:NoSchedule")
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    (tmp_path / "docs").mkdir()
    make_drive(kube, ns, "docs", tmp_path / "docs")
    env = {
        "METIS_INDEXER_IMAGE_PULL_SECRETS": pull,
        "METIS_NETWORK_ALLOW_NAMESPACES": "monitoring",
        "METIS_NETWORK_ALLOW_CIDRS": "10.96.0.0/12",
    }
    (tmp_path / "operator").mkdir()
    place = {"labels": {"pool": pool}}
    toleration = {"key": "dedicated", "operator": "Equal", "value": pool, "effect": "NoSchedule"}
    bases = {
        "refused": {"placement": place},
        "tolerated": {
            "placement": {**place, "tolerations": [toleration]},
            "pod": {"labels": {"team": "support"}, "annotations": {"example.com/cost": "42"}},
        },
    }
    try:
        with (
            Kubelet(kube, ns, tmp_path / "kubelet") as kubelet,
            running_operator(
                kube, tmp_path / "operator", free_port(), namespaces=(ns,), env=env
            ) as op,
        ):
            kubelet.hold = True  # it binds the index drives; no pod need run
            for name, extra in bases.items():
                body = kb(name, {"sources": [{"drive": "docs"}],
                                 "embedding": {"deployment": "minilm"}, **extra})  # fmt: skip
                kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
            s = wait_state(
                kube, ns, "refused", "Pending", alive=op.check_alive,
                check=lambda s: "taint" in s["reason"],
            )  # fmt: skip
            assert s["reason"].startswith(
                "machines have taints it does not tolerate "
                f"(dedicated={pool}:NoSchedule): add them to placement.tolerations"
            )

            def scheduled() -> dict[str, Any] | None:
                found = api.get(
                    f"/api/v1/namespaces/{ns}/pods?labelSelector=app.kubernetes.io%2Finstance"
                    "%3Dtolerated"
                )["items"]
                return next((p for p in found if p["spec"].get("nodeName") == pool), None)

            pod = wait_for(scheduled, timeout=60, what="tolerated's pod on the tainted node",
                           alive=op.check_alive)  # fmt: skip
            assert pod["metadata"]["labels"]["team"] == "support"
            assert pod["metadata"]["annotations"]["example.com/cost"] == "42"
            assert toleration in pod["spec"]["tolerations"]
            assert pod["spec"]["imagePullSecrets"] == [{"name": "metis-tolerated-pull"}]
            copy = api.get(f"/api/v1/namespaces/{ns}/secrets/metis-tolerated-pull")
            assert copy["type"] == "kubernetes.io/dockerconfigjson"
            auths = json.loads(base64.b64decode(copy["data"][".dockerconfigjson"]))["auths"]
            assert list(auths) == ["registry.team.example:5000"]
            assert base64.b64decode(auths["registry.team.example:5000"]["auth"]) == b"team:s3cret"
            policy = api.get(
                f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/metis-tolerated"
            )
            peers = policy["spec"]["ingress"][0]["from"]
            assert {"ipBlock": {"cidr": "10.96.0.0/12"}} in peers
            monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
            assert {"namespaceSelector": monitoring} in peers
    finally:
        kube.kubectl("delete", "node", pool, "--ignore-not-found", "--wait=false", check=False)
        kube.kubectl("delete", "secret", pull, "-n", "metis-system", "--ignore-not-found",
                     check=False)  # fmt: skip


# --------------------------------------------------------------------------- the installs


def test_the_cluster_wide_install_is_accepted_as_is(kube: ControlPlane, installed: None) -> None:
    built = kube.kubectl("kustomize", str(ROOT / "manifests")).stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(built) if d}
    assert {"PodDisruptionBudget", "ClusterRole", "Role", "Deployment"} <= kinds
    kube.kubectl("apply", "--dry-run=server", "-k", str(ROOT / "manifests"))


def _namespaced_install(kube: ControlPlane, namespace: str, folder: Path) -> str:
    """The overlay, set to `namespace` the way its comment says, as built YAML."""
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump({"namespace": namespace, "resources": [os.path.relpath(OVERLAY, folder)]})
    )
    return kube.kubectl("kustomize", str(folder)).stdout


def test_a_single_namespace_install_runs_with_a_role_only(
    kube: ControlPlane, installed: None, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    built = _namespaced_install(kube, ns, tmp_path / "install")
    docs = [d for d in yaml.safe_load_all(built) if d]
    assert {d["kind"] for d in docs} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "NetworkPolicy",
    }
    assert {d["metadata"]["namespace"] for d in docs} == {ns}
    kube.kubectl("apply", "-f", "-", input=built)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {
        "name": "METIS_NAMESPACES",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in container["env"]

    user = f"system:serviceaccount:{ns}:metis-operator"

    def can(*args: str) -> bool:
        said = kube.kubectl("auth", "can-i", *args, f"--as={user}", check=False)
        return said.stdout.strip() == "yes"

    assert can("patch", "knowledgebases.metis.astraeus.io/status", "-n", ns)
    assert can("create", "networkpolicies.networking.k8s.io", "-n", ns)
    assert can("create", "leases.coordination.k8s.io", "-n", ns)
    assert not can("patch", "knowledgebases.metis.astraeus.io/status", "-n", "default")
    assert not can("list", "customresourcedefinitions.apiextensions.k8s.io")
    assert not can("create", "secrets", "-n", "default")

    # The operator itself, as that service account and for that namespace only, serves
    # a base there: a base naming a drive that does not exist is Failed, saying so.
    kubeconfig = kube.write_kubeconfig(
        tmp_path / "operator.kubeconfig",
        user,
        groups=("system:serviceaccounts", f"system:serviceaccounts:{ns}"),
    )
    health = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "METIS_NAMESPACES": ns,
        "POD_NAMESPACE": ns,
        "METIS_HEALTH_PORT": str(health),
        "METIS_METRICS_PORT": "0",
        "METIS_URL_TEMPLATE": "http://127.0.0.1:{port}",
        "METIS_POLL_SECONDS": "1",
    }
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "metis-operator")],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:

        def alive() -> None:
            if proc.poll() is not None:
                raise AssertionError(f"metis-operator exited:\n{log.read_text()[-4000:]}")

        body = kb(
            "handbook", {"sources": [{"drive": "nowhere"}], "embedding": {"deployment": "minilm"}}
        )
        kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
        status = wait_state(kube, ns, "handbook", "Failed", timeout=90, alive=alive)
        assert "nowhere" in status["reason"]
    finally:
        processes.stop(proc)


# --------------------------------------------------------------------------- a base going


CHILD_KINDS = (
    "/api/v1/namespaces/{ns}/configmaps",
    "/api/v1/namespaces/{ns}/services",
    "/api/v1/namespaces/{ns}/secrets",
    "/api/v1/namespaces/{ns}/persistentvolumeclaims",
    "/apis/apps/v1/namespaces/{ns}/deployments",
    "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
)


def owned(kube: ControlPlane, ns: str, uids: set[str]) -> list[str]:
    """Every object of the namespace a base of `uids` owns, as kind/name."""
    api, found = kube.rest(), []
    for collection in CHILD_KINDS:
        for item in api.get(collection.format(ns=ns))["items"]:
            meta = item["metadata"]
            if {r["uid"] for r in meta.get("ownerReferences") or []} & uids:
                found.append(f"{collection.rsplit('/', 1)[1]}/{meta['name']}")
    return sorted(found)


def bases_made(
    kube: ControlPlane, ns: str, models: ModelServer, tmp: Path, *names: str
) -> set[str]:
    """Bases `names` with every child made; their uids."""
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    (tmp / "docs").mkdir()
    make_drive(kube, ns, "docs", tmp / "docs")
    uids = set()
    for name in names:
        body = kb(name, {"sources": [{"drive": "docs"}], "embedding": {"deployment": "minilm"}})
        kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
        uids.add(kube.rest().get(kb_path(ns, name))["metadata"]["uid"])
    wait_for(
        lambda: len(owned(kube, ns, uids)) == 6 * len(names),
        timeout=90,
        what="every child of the bases",
    )
    return uids


def reconciled(operator: Operator) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in operator.metrics().splitlines()
        if line.startswith("metis_operator_reconciliations_total{")
    )


def tracked(operator: Operator, ns: str, name: str) -> bool:
    """Whether the operator still keeps a loop for the base (its state gauge)."""
    return f'knowledgebase="{name}",namespace="{ns}"' in operator.metrics()


def test_a_base_being_deleted_is_never_written_to_again(
    kube: ControlPlane, operator: Operator, models: ModelServer, namespace: str, tmp_path: Path
) -> None:
    """Held by another controller's finalizer, the base lingers with a deletionTimestamp:
    its children are not made again and its status is not written, while the operator
    keeps turning (the other base's loop)."""
    ns, api = namespace, kube.rest()
    uids = bases_made(kube, ns, models, tmp_path, "going", "staying")
    path = kb_path(ns, "going")
    kube.kubectl(
        "patch",
        "kb",
        "going",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":["example.com/hold"]}}',
    )
    kube.kubectl("delete", "kb", "going", "-n", ns, "--wait=false")
    wait_for(
        lambda: not tracked(operator, ns, "going"),
        timeout=30,
        what="the operator to forget the base being deleted",
        alive=operator.check_alive,
    )
    before = api.get(path)
    assert before["metadata"]["deletionTimestamp"]
    kube.kubectl("delete", "configmap", "metis-going", "-n", ns)
    turns = reconciled(operator)
    wait_for(
        lambda: reconciled(operator) >= turns + 6,
        timeout=60,
        what="six more turns of the other base's loop",
        alive=operator.check_alive,
    )
    after = api.get(path)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "configmaps/metis-going" not in owned(kube, ns, uids)
    assert "configmaps/metis-staying" in owned(kube, ns, uids)
    kube.kubectl(
        "patch", "kb", "going", "-n", ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
    )


def test_deleting_the_crd_leaves_no_loop_and_no_child_once_the_kind_is_back(
    kube: ControlPlane, operator: Operator, models: ModelServer, namespace: str, tmp_path: Path
) -> None:
    """The kind goes with every base (an issue-30 finding: loops kept making children after
    each collection and writing statuses that failed). The operator forgets every base
    and writes nothing for them. Kubernetes' garbage collector cannot tell a base of a kind
    that is gone from one it cannot reach, so it keeps the children until the kind is
    served again (kubernetes/kubernetes#102641, as intended there); then it removes them,
    and the operator, which knows no base, makes none again."""
    ns = namespace
    uids = bases_made(kube, ns, models, tmp_path, "first", "second")
    try:
        kube.kubectl("delete", "crd", CRD, "--timeout=120s")
        wait_for(
            lambda: not tracked(operator, ns, "first") and not tracked(operator, ns, "second"),
            timeout=60,
            what="the operator to forget both bases",
            alive=operator.check_alive,
        )
    finally:
        install(kube)
    wait_for(
        lambda: owned(kube, ns, uids) == [],
        timeout=120,
        what="the garbage collector to remove every child once the kind is served",
        alive=operator.check_alive,
    )
    operator.check_alive()


def test_a_child_the_api_server_refuses_is_the_bases_state(
    kube: ControlPlane, operator: Operator, models: ModelServer, namespace: str, tmp_path: Path
) -> None:
    """A quota of no more Services: the base is Pending, its reason the API server's words
    (not a base without a status and an error in the operator's log alone); it goes on
    once the quota is lifted."""
    ns, api = namespace, kube.rest()
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    (tmp_path / "docs").mkdir()
    make_drive(kube, ns, "docs", tmp_path / "docs")
    # No quota controller runs here: the quota's status (what admission compares) is
    # written as the controller would.
    quota = {"metadata": {"name": "no-services"}, "spec": {"hard": {"services": "1"}}}
    api.post(f"/api/v1/namespaces/{ns}/resourcequotas", quota)
    api.patch(
        f"/api/v1/namespaces/{ns}/resourcequotas/no-services/status",
        {"status": {"hard": {"services": "1"}, "used": {"services": "1"}}},
    )
    body = kb("handbook", {"sources": [{"drive": "docs"}], "embedding": {"deployment": "minilm"}})
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
    status = wait_state(
        kube,
        ns,
        "handbook",
        "Pending",
        timeout=60,
        check=lambda s: s["reason"].startswith("the API server refused"),
        alive=operator.check_alive,
    )
    assert status["reason"].startswith("the API server refused Service metis-handbook (")
    assert "quota" in status["reason"]
    api.delete(f"/api/v1/namespaces/{ns}/resourcequotas/no-services")
    wait_for(
        lambda: api.get(f"/api/v1/namespaces/{ns}/services/metis-handbook"),
        timeout=60,
        what="the Service once the quota is lifted",
        alive=operator.check_alive,
    )
