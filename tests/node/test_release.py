"""`make release` into a real registry, and the release installed from it.

The registry is the CNCF distribution registry (Debian's `docker-registry`) on a loopback
port, over plain HTTP with htpasswd (bcrypt) auth, its storage in a temporary folder. The
release command pushes both images and the chart there; the registry then serves each
image at the digest the release recorded, the chart from oci:// carries the release's
version and the registry's images, and metis.yaml names every image by digest. Where the
machine's real node can run, it pulls the released images from that registry with a pull
secret (the indexer in a plain Pod; the operator as `helm install` from the OCI chart
deploys it), and a pull without the secret is refused for want of credentials.

The registry and the release are the session's (`registry`, `released`: conftest.py and
tests/node/registry.py), shared with tests/node/test_readme.py.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_dev import node, release
from metis_dev.build import ensure_binaries
from metis_dev.node import wait_for
from metis_dev.plane import ControlPlane
from tests.kube.conftest import fresh_namespace
from tests.node.registry import PULL_SECRET, USER, Helm, Registry, Released

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


def test_the_release_says_each_step_and_records_what_it_pushed(
    released: Released, registry: Registry
) -> None:
    """The version defaults to pyproject's; each step is a line with the seconds so far;
    the password is never printed."""
    recorded, out, output = released
    version = release.project_version()
    assert recorded.version == version and recorded.registry == registry.name
    assert recorded.images["indexer"].ref == f"{registry.name}/metis-indexer:{version}"
    assert recorded.images["operator"].ref == f"{registry.name}/metis-operator:{version}"
    assert recorded.chart_url == f"oci://{registry.name}/charts/metis"
    for step in ("building both images", "pushing localhost/metis-indexer", "pushed the chart"):
        assert any(step in line and line.startswith("[") for line in output.splitlines()), step
    assert f"wrote {out / 'metis.yaml'}" in output
    assert registry.password not in output


def test_the_registry_serves_each_image_at_the_recorded_digest(
    released: Released, registry: Registry
) -> None:
    recorded, _, _ = released
    accept = {"Accept": ", ".join(MANIFEST_TYPES)}
    for pushed in recorded.images.values():
        name, tag = pushed.ref.removeprefix(f"{registry.host}/").rsplit(":", 1)
        for reference in (tag, pushed.digest):
            got = registry.get(f"/v2/{name}/manifests/{reference}", headers=accept)
            assert got.status_code == 200, got.text
            assert got.headers["Content-Type"] in MANIFEST_TYPES
            assert got.headers["Docker-Content-Digest"] == pushed.digest
        refused = registry.get(f"/v2/{name}/manifests/{tag}", authenticated=False, headers=accept)
        assert refused.status_code == 401


def test_the_chart_from_the_registry_is_the_release_pointed_at_the_registry(
    released: Released, registry: Registry, tmp_path: Path
) -> None:
    """`helm show` and `helm template` of oci://…/charts/metis: the release's version, the
    registry's images as the defaults, METIS_INDEXER_IMAGE the release's indexer."""
    recorded, _, _ = released
    helm = Helm(registry, tmp_path)
    source = [recorded.chart_url, "--version", recorded.version, "--plain-http"]
    chart = yaml.safe_load(helm("show", "chart", *source))
    assert (chart["name"], chart["version"]) == ("metis", recorded.version)
    assert chart["appVersion"] == recorded.version
    values = yaml.safe_load(helm("show", "values", *source))
    assert values["image"]["repository"] == f"{registry.name}/metis-operator"
    assert values["indexerImage"]["repository"] == f"{registry.name}/metis-indexer"
    rendered = helm("template", "metis", *source, "-n", "metis-system")
    assert release.container_images(yaml.safe_load_all(rendered)) == [
        recorded.images["operator"].ref,
        recorded.images["indexer"].ref,
    ]


def test_the_manifest_names_every_image_by_its_pushed_digest(
    released: Released,
) -> None:
    recorded, out, _ = released
    objects = [o for o in yaml.safe_load_all((out / recorded.manifest).read_text()) if o]
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "Namespace", "ClusterRole", "Deployment"} <= kinds
    assert release.container_images(objects) == [
        recorded.images["operator"].pinned,
        recorded.images["indexer"].pinned,
    ]


# --------------------------------------------------------------------------- docs/release.md

NAMESPACE = "metis-system"
OPERATOR_PODS = (
    f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app.kubernetes.io/name%3Dmetis-operator"
)


@pytest.fixture
def plane() -> Iterator[ControlPlane]:
    """A control plane of the test's own, no node: docs/release.md's installs make the
    cluster-wide objects the suite's shared cluster holds already (tests/kube's `install`)."""
    with ControlPlane(ensure_binaries()) as cp:
        yield cp


def create_pull_secret(cp: ControlPlane, registry: Registry) -> None:
    cp.kubectl(
        *("-n", NAMESPACE, "create", "secret", "docker-registry", PULL_SECRET),
        f"--docker-server={registry.host}",
        f"--docker-username={USER}",
        f"--docker-password={registry.password}",
    )


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    (c,) = pod["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in c["env"]}


def test_the_manifest_installs_as_the_docs_say(
    released: Released, registry: Registry, plane: ControlPlane
) -> None:
    """`kubectl apply -f metis.yaml`, the pull secret, the operator's service account
    pulling with it, and METIS_INDEXER_IMAGE_PULL_SECRETS for the indexers: the operator's
    new pods name the secret, the pinned operator and the pinned indexer."""
    recorded, out, _ = released
    plane.kubectl("apply", "-f", str(out / recorded.manifest))
    create_pull_secret(plane, registry)
    patch = json.dumps({"imagePullSecrets": [{"name": PULL_SECRET}]})
    plane.kubectl("-n", NAMESPACE, "patch", "serviceaccount", "metis-operator", "-p", patch)
    env = f"METIS_INDEXER_IMAGE_PULL_SECRETS={PULL_SECRET}"
    plane.kubectl("-n", NAMESPACE, "set", "env", "deployment/metis-operator", env)

    def rolled() -> list[dict[str, Any]]:
        pods = plane.rest().get(OPERATOR_PODS)["items"]
        return [p for p in pods if "METIS_INDEXER_IMAGE_PULL_SECRETS" in env_of(p)]

    for pod in wait_for(rolled, timeout=60, what="an operator pod of the new template"):
        assert pod["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}]
        assert pod["spec"]["containers"][0]["image"] == recorded.images["operator"].pinned
        assert env_of(pod)["METIS_INDEXER_IMAGE"] == recorded.images["indexer"].pinned


def test_helm_installs_from_the_registry_as_the_docs_say(
    released: Released,
    registry: Registry,
    plane: ControlPlane,
    tmp_path: Path,
) -> None:
    """The namespace made first (the pull secret must be there before the operator's pods),
    then `helm install oci://…` cluster-wide into it."""
    recorded, _, _ = released
    plane.kubectl("create", "namespace", NAMESPACE)
    restricted = "pod-security.kubernetes.io/enforce=restricted"
    plane.kubectl("label", "namespace", NAMESPACE, restricted)
    create_pull_secret(plane, registry)
    helm = Helm(registry, tmp_path, plane.kubeconfig)
    helm(
        *("install", "metis", recorded.chart_url, "--version", recorded.version),
        *("--namespace", NAMESPACE, "--set", "namespace.create=false"),
        *("--set", f"imagePullSecrets[0].name={PULL_SECRET}"),
        "--plain-http",
    )
    plane.rest().get("/apis/rbac.authorization.k8s.io/v1/clusterroles/metis-operator")
    pods = wait_for(
        lambda: plane.rest().get(OPERATOR_PODS)["items"], timeout=60, what="operator pods"
    )
    for pod in pods:
        assert pod["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}]
        assert pod["spec"]["containers"][0]["image"] == recorded.images["operator"].ref
        assert env_of(pod)["METIS_INDEXER_IMAGE"] == recorded.images["indexer"].ref
        assert env_of(pod)["METIS_INDEXER_IMAGE_PULL_SECRETS"] == PULL_SECRET


# --------------------------------------------------------------------------- the real node


def pull_secret(registry: Registry) -> dict[str, Any]:
    """What `kubectl create secret docker-registry` makes."""
    config = release.auth_config(registry.host, USER, registry.password)
    data = base64.b64encode(json.dumps(config).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": PULL_SECRET},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": data},
    }


def sleeper(name: str, image: str, *, secret: bool) -> dict[str, Any]:
    """A Pod that only holds the image's container running: the pull is what it tests."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "c",
                "image": image,
                "imagePullPolicy": "Always",
                "command": ["sleep", "infinity"],
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if secret:
        spec["imagePullSecrets"] = [{"name": PULL_SECRET}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def container(kube: ControlPlane, ns: str, pod: str) -> dict[str, Any] | None:
    """The pod's one container status, once the kubelet reported it."""
    status = kube.rest().get(f"/api/v1/namespaces/{ns}/pods/{pod}")["status"]
    found = status.get("containerStatuses") or []
    return found[0] if found else None


@pytest.fixture
def team(kube: ControlPlane, registry: Registry) -> Iterator[str]:
    """A fresh namespace holding the registry's pull secret."""
    with fresh_namespace(kube, f"release-{secrets.token_hex(3)}") as ns:
        kube.rest().post(f"/api/v1/namespaces/{ns}/secrets", pull_secret(registry))
        yield ns


def test_the_node_pulls_the_released_indexer_with_the_pull_secret(
    real_node: node.Node,
    kube: ControlPlane,
    team: str,
    released: Released,
) -> None:
    indexer = released[0].images["indexer"]
    kube.rest().post(f"/api/v1/namespaces/{team}/pods", sleeper("pulled", indexer.ref, secret=True))

    def running() -> dict[str, Any] | None:
        real_node.check()
        status = container(kube, team, "pulled")
        return status if status and "running" in status["state"] else None

    status = wait_for(running, timeout=300, what="the pod pulling with its secret Running")
    assert status["imageID"].endswith(f"@{indexer.digest}"), status


def test_without_the_secret_the_registry_refuses_the_node(
    real_node: node.Node,
    kube: ControlPlane,
    team: str,
    released: Released,
) -> None:
    """imagePullPolicy Always: the node asks the registry even where containerd has the
    image, and with no credentials it is told 401."""
    indexer = released[0].images["indexer"]
    kube.rest().post(
        f"/api/v1/namespaces/{team}/pods", sleeper("refused", indexer.ref, secret=False)
    )

    def refused() -> dict[str, Any] | None:
        status = container(kube, team, "refused")
        waiting = (status or {}).get("state", {}).get("waiting", {})
        # ErrImagePull holds the registry's answer; ImagePullBackOff, between tries, not.
        return waiting if waiting.get("reason") == "ErrImagePull" else None

    waiting = wait_for(refused, timeout=180, what="the pull without a secret refused")
    assert "401 Unauthorized" in waiting.get("message", ""), waiting
    assert "running" not in (container(kube, team, "refused") or {}).get("state", {})


def test_helm_installs_the_chart_from_the_registry_and_the_node_pulls_the_operator(
    real_node: node.Node,
    kube: ControlPlane,
    team: str,
    registry: Registry,
    released: Released,
    tmp_path: Path,
) -> None:
    """docs/release.md's `helm install` from oci:// into an existing namespace holding the
    pull secret. For the suite's shared cluster, singleNamespace and --skip-crds: the
    release renders nothing cluster-scoped that other tests' objects would collide with."""
    recorded = released[0]
    install = [
        *("install", "metis", recorded.chart_url, "--version", recorded.version),
        *("--namespace", team, "--set", "namespace.create=false"),
        *("--set", f"imagePullSecrets[0].name={PULL_SECRET}"),
        *("--set", "singleNamespace=true", "--skip-crds", "--plain-http"),
    ]
    helm = Helm(registry, tmp_path, kube.kubeconfig)
    helm(*install)
    operator = recorded.images["operator"]
    pods = f"/api/v1/namespaces/{team}/pods?labelSelector=app.kubernetes.io/name%3Dmetis-operator"

    def pulled() -> list[str] | None:
        real_node.check()
        ids = [
            s.get("imageID", "")
            for p in kube.rest().get(pods)["items"]
            for s in p["status"].get("containerStatuses") or []
        ]
        return ids if len(ids) == 2 and all(ids) else None

    # A container has an imageID once its image is pulled, running or not (the operator
    # reaches no API server from this node's pods: the test cluster's listens on loopback).
    ids = wait_for(pulled, timeout=300, what="both operator replicas' images pulled")
    assert all(i.endswith(f"@{operator.digest}") for i in ids), ids
    helm("uninstall", "metis", "--namespace", team)
