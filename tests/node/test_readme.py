"""README.md's "Install" and "An example", word for word, on the local cluster with the
real node (issue 43, "Show it works").

A release made by `make release` into a real registry on loopback (the session's
`released`: Debian's docker-registry with password auth, tests/node/registry.py); then, as
README.md and docs/release.md say it: the namespace made first with the pull secret in it,
`helm install` from oci://…/charts/metis, the operator running as pods on the real node
from the released image (the node pulls it with the secret); the example's namespace
`team-a`, its drives filled through a loader pod, `manifests/examples/handbook.yaml`
applied unchanged, its indexer pulling the released image with the pull secret the
operator copied (`metis-handbook-pull`); `kubectl wait` Ready, `kubectl metis search`
citing the leave policy, `helm test` green; a tainted node running a base that tolerates
the taint and refusing one that does not, with a reason that names it; `helm uninstall`
leaving the namespace. The tests run in order, each on what the last left (module-scoped).

Where the test differs from the README, and why:

- The cluster is the module's own control plane (metis_dev.plane), not the session's
  shared one: the README installs cluster-wide (a ClusterRole `metis-operator`, an operator
  for every namespace) into `metis-system` and the base goes into another namespace,
  `team-a`; on the shared cluster the cluster-wide objects of manifests/ (other modules'
  `install`) would refuse a Helm release of the same names, and a cluster-wide operator
  would act on other modules' bases. Its own plane costs ~5 s.
- That plane runs kube-controller-manager's endpoints controller, which every real cluster
  runs and metis_dev's default set leaves out: the API server's service proxy, behind
  `kubectl metis search`, routes by Endpoints objects.
- Pods reach the API server through a relay of the test's (`ApiRelay`): the plane's API
  server listens on loopback only, and the `kubernetes` Service's endpoint (its advertise
  address) is where pods connect (in-cluster config, through kube-proxy). Without it the
  operator's pods crash at their first call: "HTTPSConnection(host='10.0.0.1', port=443):
  Failed to establish a new connection: [Errno 111] Connection refused". The plane
  advertises the node's bridge address (METIS_KUBE_ADVERTISE_ADDRESS) and the relay
  listens there, for the pods only.
- No image of docker.io can be pulled here: the loader pod of documents.yaml runs the
  project's indexer image as the node holds it (it has tar) instead of busybox, and the
  models of embedding-tei.yaml (TEI) are `metis models` on the host behind Services
  `bge-m3` and `bge-reranker` without a selector (as tests/node/test_real_node.py).
- `kubectl cp` needs the API server to reach the node's kubelet, which the local cluster
  does not allow: the API server dials the node by its name (`metis-node`, which the host
  cannot resolve), the kubelet listens on loopback only and admits no caller (anonymous
  and webhook authentication off, no client CA; the API server has no client certificate
  for it). Where the README's command fails so, the same copy is made as kubectl makes it
  (the folder's tar, `tar -xmf - -C …` run in the loader's container), through containerd.
- On a machine of two cores the handbook's indexer (1 core, placement.cpu_cores' least)
  leaves no room for another base: the handbook is deleted before the taint's bases.

Measured on two shared cores, images and binaries cached: ~100 s from the control plane's
start to the uninstall (plus ~10 s for the release, once per session), of which 31 s was
`kubectl delete pod metis-loader` until the loader's grace period went to 0 (its `sleep`,
PID 1, ignores SIGTERM); ~20 s the handbook's indexer draining before the tolerating base
has its core.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import posixpath
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import yaml

from metis_dev import images, node
from metis_dev.components import DEFAULT_CONTROLLERS, ENDPOINTS
from metis_dev.node import wait_for
from metis_dev.plane import ControlPlane
from metis_dev.process import ControlPlaneError
from tests.kube.operator_support import ROOT, wait_state
from tests.kube.pods import real_node as real_node_of
from tests.node.registry import PULL_SECRET, USER, Helm, Registry, Released, forget_pulled
from tests.support import processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SYSTEM = "metis-system"
TEAM = "team-a"
QUESTION = "How many holidays do I get?"
TAINT = "dedicated=search:NoSchedule"
EXAMPLES = ROOT / "manifests" / "examples"
CLOCK = {"start": time.monotonic()}
"""When the module's cluster began to start: `say` counts from there."""


def say(what: str) -> None:
    print(f"\n[{time.monotonic() - CLOCK['start']:6.1f} s] {what}", flush=True)


# --------------------------------------------------------------------------- the cluster


class ApiRelay:
    """TCP from `listen` to `target`, a thread per direction of each connection: the pods'
    way to an API server that listens on loopback."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.connections = 0
        self._server = socket.create_server(listen)
        self._server.settimeout(0.5)
        self._stop = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="api relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._open -= {source, sink}

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def plane(kube_binaries: Path) -> Iterator[ControlPlane]:
    """A control plane of the module's own (see the module's doc), with the endpoints
    controller, advertising the pods' bridge address as the API server's."""
    why = node.unusable() or node.in_use()
    if why:
        pytest.skip(f"no real node now: {why}")
    CLOCK["start"] = time.monotonic()
    controllers = (*DEFAULT_CONTROLLERS, ENDPOINTS)
    cp = ControlPlane(kube_binaries, controllers=controllers)
    with mock.patch.dict(os.environ, {"METIS_KUBE_ADVERTISE_ADDRESS": node.GATEWAY}):
        cp.start()
    try:
        say(f"control plane up in {cp.started_in:.1f} s")
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def real_node(
    built: images.Built,
    plane: ControlPlane,
    released: Released,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[node.Node]:
    """The real node registered with this module's plane (conftest's is the shared
    plane's), and the relay that takes its pods to the API server."""
    claimed, why = node.claim_or_why()
    if claimed is None:
        pytest.skip(f"no real node now: {why}")
    with real_node_of(plane, Path(tmp_path_factory.mktemp("node")), claimed) as (n, _):
        # containerd keeps its images between nodes: without the released references
        # the node must pull them now, from the registry, with the secrets.
        forget_pulled(n)
        port = int(plane.server.rsplit(":", 1)[1])
        slice_ = plane.rest().get(
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"
        )
        assert slice_["endpoints"][0]["addresses"] == [node.GATEWAY], slice_
        assert slice_["ports"][0]["port"] == port, slice_
        relay = ApiRelay((node.GATEWAY, port), ("127.0.0.1", port))
        try:
            yield n
        finally:
            relay.close()
            say(f"the API relay carried {relay.connections} connection(s) of the pods")
            forget_pulled(n)


def kubectl(plane: ControlPlane, *args: str, input: str | None = None) -> str:
    return plane.kubectl(*args, input=input, timeout=360).stdout


def get(plane: ControlPlane, path: str) -> dict[str, Any]:
    return dict(plane.rest().get(path))


def pods(plane: ControlPlane, ns: str, selector: str) -> list[dict[str, Any]]:
    found = get(plane, f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")["items"]
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def events(plane: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name={name}"
    return list(get(plane, path)["items"])


# --------------------------------------------------------------------------- Install


@pytest.fixture(scope="module")
def helm(
    plane: ControlPlane,
    real_node: node.Node,
    registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Helm:
    """helm logged in to the registry (`helm registry login … --password-stdin`)."""
    return Helm(registry, tmp_path_factory.mktemp("helm"), plane.kubeconfig)


@pytest.fixture(scope="module")
def chart(released: Released) -> list[str]:
    """The chart as `helm install` and `helm upgrade` name it (plain HTTP: loopback)."""
    recorded = released[0]
    return [recorded.chart_url, "--version", recorded.version, "--plain-http"]


@pytest.fixture(scope="module")
def installed(
    plane: ControlPlane, real_node: node.Node, registry: Registry, helm: Helm, chart: list[str]
) -> list[dict[str, Any]]:
    """docs/release.md's "Installing with Helm": the namespace first, labelled restricted,
    the pull secret in it, then `helm install` from oci://; the operator's pods rolled out
    on the real node (NOTES.txt's `kubectl rollout status`)."""
    kubectl(plane, "create", "namespace", SYSTEM)
    restricted = "pod-security.kubernetes.io/enforce=restricted"
    kubectl(plane, "label", "namespace", SYSTEM, restricted)
    kubectl(
        plane,
        *("-n", SYSTEM, "create", "secret", "docker-registry", PULL_SECRET),
        f"--docker-server={registry.host}",
        f"--docker-username={USER}",
        f"--docker-password={registry.password}",
    )
    helm(
        *("install", "metis", *chart, "--namespace", SYSTEM),
        *("--set", "namespace.create=false", "--set", f"imagePullSecrets[0].name={PULL_SECRET}"),
    )
    say("helm install done; waiting for the operator's rollout")
    rollout = ("-n", SYSTEM, "rollout", "status", "deployment/metis-operator", "--timeout=180s")
    try:
        kubectl(plane, *rollout)
    except ControlPlaneError as e:
        raise AssertionError(f"{e}\n{operator_logs(real_node)}") from None
    say("the operator rolled out")
    return pods(plane, SYSTEM, "app.kubernetes.io/name%3Dmetis-operator")


def operator_logs(n: node.Node, chars: int = 3000) -> str:
    """The operator's container logs as the kubelet wrote them (`kubectl logs` cannot
    reach the kubelet here)."""
    logs = sorted((n.work / "pod-logs").glob(f"{SYSTEM}_metis-operator-*/*/*.log"))
    return "\n".join(f"{p}:\n{p.read_text(errors='replace')[-chars:]}" for p in logs[-2:])


def test_the_operator_runs_on_the_node_from_the_released_image(
    plane: ControlPlane, released: Released, installed: list[dict[str, Any]]
) -> None:
    """Both replicas on the real node, pulled from the registry with the secret (the
    chart's pullPolicy Always), Ready, and one leads: in-cluster, through the `kubernetes`
    Service, they reach the API server."""
    operator = released[0].images["operator"]
    assert len(installed) == 2
    for pod in installed:
        assert pod["spec"]["nodeName"] == node.NODE_NAME
        assert pod["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}]
        (status,) = pod["status"]["containerStatuses"]
        assert status["image"] == operator.ref and status["ready"] is True, status
        assert status["imageID"].endswith(f"@{operator.digest}"), status
    lease = get(plane, f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases/metis-operator")
    assert lease["spec"]["holderIdentity"] in {p["metadata"]["name"] for p in installed}


# --------------------------------------------------------------------------- An example


@pytest.fixture(scope="module")
def models(real_node: node.Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`metis models` on the host, listening on the pods' bridge: its port."""
    port = processes.free_port()
    log = tmp_path_factory.mktemp("models") / "models.log"
    argv = ["-m", "metis_indexer.models.localmodel", "--host", node.GATEWAY, "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: httpx.get(f"http://{node.GATEWAY}:{port}/health", timeout=2).is_success,
            timeout=120,
            what="metis models",
        )
        yield port
    finally:
        processes.stop(proc)


def documents(image: str) -> str:
    """manifests/examples/documents.yaml, its loader running `image` instead of busybox."""
    objects = [o for o in yaml.safe_load_all((EXAMPLES / "documents.yaml").read_text()) if o]
    (loader,) = [o for o in objects if o["kind"] == "Pod"]
    (container,) = loader["spec"]["containers"]
    assert container["image"].startswith("docker.io/library/busybox")
    container["image"] = image
    return str(yaml.safe_dump_all(objects))


def in_container(
    n: node.Node, container: str, *argv: str, input: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`argv` in a container of the node, as its own user, through containerd."""
    exec_id = f"readme-{time.monotonic_ns()}"
    cmd = ["ctr", "--address", str(n.socket), "-n", "k8s.io", "tasks", "exec"]
    return subprocess.run(
        [*cmd, "--exec-id", exec_id, container, *argv], input=input, capture_output=True
    )


def copy_as_kubectl_does(n: node.Node, pod: dict[str, Any], src: Path, dest: str) -> None:
    """`kubectl cp SRC POD:DEST` made as kubectl makes it (k8s.io/kubectl's cp.go): into
    DEST/<name of SRC> where DEST is a folder of the pod, the folder's tar with DEST's name
    as its top, unpacked by `tar -xmf - -C <DEST's parent>` in the container."""
    (status,) = pod["status"]["containerStatuses"]
    container = status["containerID"].removeprefix("containerd://")
    if in_container(n, container, "test", "-d", dest).returncode == 0:
        dest = posixpath.join(dest, src.name)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(src, arcname=posixpath.basename(dest.rstrip("/")))
    target = posixpath.dirname(dest.rstrip("/"))
    done = in_container(n, container, "tar", "-xmf", "-", "-C", target, input=buffer.getvalue())
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def kubectl_cp(plane: ControlPlane, n: node.Node, src: str, dest: str) -> None:
    """The README's `kubectl cp SRC team-a/metis-loader:DEST`, or, where the API server
    cannot reach the kubelet (the local cluster), the same copy through containerd."""
    tried = plane.kubectl("cp", src, f"{TEAM}/metis-loader:{dest}", check=False, timeout=120)
    if tried.returncode == 0:
        return
    said = tried.stderr.strip()
    # The API server dials the kubelet at the node's name (no such host here), and the
    # kubelet listens on loopback only: what the local cluster lacks, not the README.
    assert "dial tcp" in said and f"https://{node.NODE_NAME}:" in said, said
    say(f"kubectl cp {src}: {said.splitlines()[-1][:200]}; copying through containerd")
    loader = get(plane, f"/api/v1/namespaces/{TEAM}/pods/metis-loader")
    copy_as_kubectl_does(n, loader, ROOT / src, dest)


def model_services(plane: ControlPlane, port: int) -> None:
    """Services `bge-m3` and `bge-reranker` (what embedding-tei.yaml makes) in front of
    `metis models` on the host."""
    items = [o for name in ("bge-m3", "bge-reranker") for o in node.model_service(TEAM, name, port)]
    body = {"apiVersion": "v1", "kind": "List", "items": items}
    kubectl(plane, "apply", "-n", TEAM, "-f", "-", input=json.dumps(body))


@pytest.fixture(scope="module")
def handbook(
    plane: ControlPlane,
    real_node: node.Node,
    built: images.Built,
    models: int,
    installed: list[dict[str, Any]],
) -> dict[str, Any]:
    """README.md's "An example", command by command: the documents, the models, the base
    applied and waited for. Its kb's status once Ready."""
    kubectl(plane, "apply", "-f", "-", input=documents(built.refs[images.INDEXER.name]))
    kubectl(
        plane,
        *("wait", "-n", TEAM, "--for=condition=Ready", "pod/metis-loader", "--timeout=5m"),
    )
    kubectl_cp(plane, real_node, "examples/handbook", "/drives/docs/handbook")
    kubectl_cp(plane, real_node, "examples/handbook/runbooks", "/drives/runbooks/")
    deleting = time.monotonic()
    kubectl(plane, "delete", "pod", "-n", TEAM, "metis-loader")
    say(f"kubectl delete pod metis-loader returned after {time.monotonic() - deleting:.1f} s")
    model_services(plane, models)
    say("documents on the drives, models behind their Services; applying handbook.yaml")
    kubectl(plane, "apply", "-n", TEAM, "-f", str(EXAMPLES / "handbook.yaml"))
    listed = kubectl(plane, "get", "kb", "-n", TEAM)
    assert " ".join(listed.splitlines()[0].split()) == (
        "NAME STATE DOCUMENTS CHUNKS PROGRESS LAST INDEXED REPLICAS AGE"
    ), listed
    try:
        kubectl(plane, "wait", "-n", TEAM, "--for=condition=Ready", "kb/handbook", "--timeout=5m")
    except ControlPlaneError as e:
        status = get(plane, f"/apis/metis.astraeus.io/v1/namespaces/{TEAM}/knowledgebases/handbook")
        raise AssertionError(f"{e}\n{yaml.safe_dump(status.get('status'))}") from None
    say("kb/handbook Ready")
    described = kubectl(plane, "describe", "kb", "handbook", "-n", TEAM)
    assert "State:" in described and "Ready" in described.split("Events:")[-1], described
    path = f"/apis/metis.astraeus.io/v1/namespaces/{TEAM}/knowledgebases/handbook"
    return dict(get(plane, path)["status"])


def test_the_drives_hold_what_the_readme_copies(handbook: dict[str, Any]) -> None:
    """Every file of examples/handbook under `docs/handbook`, and the runbook once more on
    `runbooks` (the README copies examples/handbook/runbooks to both drives)."""
    index = handbook["observed"]["index"]
    files = [p for p in (ROOT / "examples" / "handbook").rglob("*") if p.is_file()]
    readable = [p for p in files if ".metis" not in p.parts]
    runbooks = [p for p in readable if "runbooks" in p.parts]
    assert index["documents"] == len(readable) + len(runbooks), index
    assert index["failed"] == 0, index


def test_the_indexer_pulled_the_released_image_with_the_copied_secret(
    plane: ControlPlane, released: Released, handbook: dict[str, Any]
) -> None:
    indexer = released[0].images["indexer"]
    (pod,) = pods(plane, TEAM, "app.kubernetes.io/instance%3Dhandbook")
    assert pod["spec"]["nodeName"] == node.NODE_NAME
    assert pod["spec"]["imagePullSecrets"] == [{"name": "metis-handbook-pull"}]
    (status,) = pod["status"]["containerStatuses"]
    assert status["image"] == indexer.ref
    assert status["imageID"].endswith(f"@{indexer.digest}"), status
    # The node had no such reference (removed at its start): it pulled, and the registry
    # answers no manifest without credentials (test_release.py).
    pulled = [e["message"] for e in events(plane, TEAM, pod["metadata"]["name"])]
    assert any(m.startswith(f'Successfully pulled image "{indexer.ref}"') for m in pulled), pulled
    secret = get(plane, f"/api/v1/namespaces/{TEAM}/secrets/metis-handbook-pull")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"


def kubectl_metis(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl metis ARGS`, the plugin found on PATH (the venv's bin), as a shell finds it."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(plane.kubeconfig),
    }
    return subprocess.run(
        [str(plane.kubectl_path), "metis", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
        check=False,
    )


def test_kubectl_metis_search_cites_the_leave_policy(
    plane: ControlPlane, handbook: dict[str, Any]
) -> None:
    """Through the API server's service proxy, as the README asks it."""
    done = kubectl_metis(plane, "search", "handbook", QUESTION, "-n", TEAM, "--top-k", "2")
    assert done.returncode == 0, f"{done.stderr}\n{done.stdout}"
    print(f"\n{done.stdout}")
    lines = done.stdout.splitlines()
    assert lines[0].strip().startswith("1. docs/handbook/policies/leave.md, line "), done.stdout
    assert any(line.strip().startswith("2. ") for line in lines), done.stdout
    assert "hybrid, reranked" in lines[-1], done.stdout


def test_helm_test_searches_the_base_green(
    plane: ControlPlane, helm: Helm, chart: list[str], handbook: dict[str, Any]
) -> None:
    """The chart's templates/tests/search.yaml: `helm upgrade --reuse-values` naming the
    base, then `helm test`; the upgrade leaves the operator's pods as they were."""
    before = {
        p["metadata"]["name"]
        for p in pods(plane, SYSTEM, "app.kubernetes.io/name%3Dmetis-operator")
    }
    helm(
        *("upgrade", "metis", *chart, "--namespace", SYSTEM, "--reuse-values"),
        *("--set", "test.base=handbook", "--set", f"test.namespace={TEAM}"),
    )
    out = helm("test", "metis", "--namespace", SYSTEM)
    print(f"\n{out}")
    assert "metis-test-search" in out and "Phase:          Succeeded" in out, out
    after = {
        p["metadata"]["name"]
        for p in pods(plane, SYSTEM, "app.kubernetes.io/name%3Dmetis-operator")
    }
    assert after == before


def base(name: str, **placement: Any) -> str:
    spec: dict[str, Any] = {
        "sources": [{"drive": "docs", "path": "handbook"}],
        "embedding": {"deployment": "bge-m3"},
    }
    if placement:
        spec["placement"] = placement
    kb = {"apiVersion": "metis.astraeus.io/v1", "kind": "KnowledgeBase"}
    return json.dumps({**kb, "metadata": {"name": name}, "spec": spec})


def test_a_tainted_node_runs_the_base_that_tolerates_it_and_refuses_the_other(
    plane: ControlPlane, real_node: node.Node, handbook: dict[str, Any]
) -> None:
    """`kubectl taint node` the real node: a base with placement.tolerations for the
    taint runs there; one without is Pending, its reason naming the taint."""
    # Room for one more base on a machine of two cores (the module's doc).
    kubectl(plane, "delete", "kb", "handbook", "-n", TEAM)
    kubectl(plane, "taint", "node", node.NODE_NAME, TAINT)
    try:
        toleration = {"key": "dedicated", "operator": "Equal", "value": "search"}
        tolerant = base("tolerant", tolerations=[{**toleration, "effect": "NoSchedule"}])
        kubectl(plane, "apply", "-n", TEAM, "-f", "-", input=tolerant)
        kubectl(plane, "apply", "-n", TEAM, "-f", "-", input=base("intolerant"))
        refused = wait_state(
            plane,
            TEAM,
            "intolerant",
            "Pending",
            timeout=120,
            check=lambda s: TAINT in s.get("reason", ""),
        )
        say(f"kb/intolerant Pending: {refused['reason']}")
        assert refused["reason"].startswith(f"machines have taints it does not tolerate ({TAINT})")
        (waiting,) = pods(plane, TEAM, "app.kubernetes.io/instance%3Dintolerant")
        assert not waiting["spec"].get("nodeName"), waiting["spec"]
        kubectl(plane, "wait", "-n", TEAM, "--for=condition=Ready", "kb/tolerant", "--timeout=4m")
        say("kb/tolerant Ready on the tainted node")
        (running,) = pods(plane, TEAM, "app.kubernetes.io/instance%3Dtolerant")
        assert running["spec"]["nodeName"] == node.NODE_NAME
        assert {**toleration, "effect": "NoSchedule"} in running["spec"]["tolerations"]
        still = get(
            plane, f"/apis/metis.astraeus.io/v1/namespaces/{TEAM}/knowledgebases/intolerant"
        )
        assert still["status"]["state"] == "Pending", still["status"]
    finally:
        plane.kubectl("taint", "node", node.NODE_NAME, f"{TAINT}-", check=False)


def test_helm_uninstall_leaves_the_namespace(
    plane: ControlPlane, helm: Helm, installed: list[dict[str, Any]]
) -> None:
    """`helm uninstall`: the release's objects go, the namespace and the pull secret the
    user made stay."""
    helm("uninstall", "metis", "--namespace", SYSTEM)
    namespace = get(plane, f"/api/v1/namespaces/{SYSTEM}")
    assert namespace["status"]["phase"] == "Active" and not namespace["metadata"].get(
        "deletionTimestamp"
    )
    assert get(plane, f"/api/v1/namespaces/{SYSTEM}/secrets/{PULL_SECRET}")
    for path in (
        f"/apis/apps/v1/namespaces/{SYSTEM}/deployments/metis-operator",
        f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/metis-operator",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/metis-operator",
    ):
        assert plane.rest().gone(path), path
    assert helm("list", "--namespace", SYSTEM, "--short").strip() == ""
    left = [p["metadata"]["name"] for p in pods(plane, SYSTEM, "")]
    say(f"after helm uninstall, pods of {SYSTEM} not being deleted: {left}")
