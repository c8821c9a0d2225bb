"""A knowledge base on a real node: the project's indexer image run by a real kubelet.

What the stand-in kubelet of tests/kube cannot show: the image starts under the
Deployment's security settings, its probes pass, a changed ConfigMap reaches the pod as
late as the kubelet delivers it (and the base is not Ready before), a killed container
is restarted by the kubelet with its index kept on the PVC.

The tests run in order on one base (module-scoped): each builds on the last.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metis_dev import images, node
from metis_dev.node import wait_for
from tests.kube.conftest import ControlPlane, fresh_namespace
from tests.kube.operator_support import (
    OPERATOR_USER,
    ROOT,
    get_kb,
    install,
    make_drive,
    state_events,
    wait_state,
)
from tests.support import processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HANDBOOK = """\
apiVersion: metis.astraeus.io/v1
kind: KnowledgeBase
metadata:
  name: handbook
spec:
  sources:
    - drive: docs
      path: handbook
  embedding:
    deployment: minilm
  reranker:
    deployment: minilm
  chunking:
    size: 1200
    overlap: 200
  rescan_seconds: 0
"""
"""manifests/examples/handbook.yaml with the local model for both roles, one drive
and no placement labels (the node is the only machine)."""


@pytest.fixture(scope="module")
def ns(kube: ControlPlane) -> Iterator[str]:
    with fresh_namespace(kube, f"node-{os.getpid()}") as name:
        yield name


@pytest.fixture(scope="module")
def models(real_node: node.Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`metis models` on the host, listening on the pods' bridge: its port."""
    port = processes.free_port()
    log = tmp_path_factory.mktemp("models") / "models.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "metis_indexer.models.localmodel",
                "--host",
                node.GATEWAY,
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: _answers(f"http://{node.GATEWAY}:{port}/health"),
            timeout=120,
            what="metis models",
        )
        yield port
    finally:
        processes.stop(proc)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def model_service(kube: ControlPlane, ns: str, port: int) -> None:
    """Service `minilm` without a selector, its EndpointSlice naming the host's address
    on the pods' bridge: pods and the operator reach the host's model through it."""
    objects = {"apiVersion": "v1", "kind": "List", "items": node.model_service(ns, "minilm", port)}
    kube.kubectl("apply", "-f", "-", input=json.dumps(objects))


class Operator:
    """`metis-operator` on the host with its service account's rights, resolving
    `<svc>.<ns>.svc` by the node's DNS: the URLs it writes for the indexer are the
    in-cluster ones, as in a real cluster. `restart` runs it again with another indexer
    image, as an upgrade of the operator does."""

    def __init__(self, kube: ControlPlane, real_node: node.Node, ns: str, work: Path) -> None:
        self._kube, self._node, self._ns, self._work = kube, real_node, ns, work
        self.kubeconfig = kube.write_kubeconfig(
            work / "operator.kubeconfig",
            OPERATOR_USER,
            groups=("system:serviceaccounts", "system:serviceaccounts:metis-system"),
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, image: str) -> None:
        health = processes.free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "METIS_INDEXER_IMAGE": image,
            "METIS_NAMESPACES": self._ns,
            "METIS_POLL_SECONDS": "1",
            "METIS_PROBE_SECONDS": "5",
            "METIS_METRICS_PORT": str(processes.free_port()),
            "METIS_HEALTH_PORT": str(health),
            "METIS_LEADER_ELECTION": "false",
            "METIS_LOG_FORMAT": "json",
            "POD_NAME": "metis-operator-0",
        }
        env.pop("METIS_URL_TEMPLATE", None)
        argv = self._node.host_command([str(Path(sys.executable).parent / "metis-operator")])
        self.starts += 1
        with (self._work / f"operator-{self.starts}.log").open("wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        wait_for(
            lambda: _answers(f"http://127.0.0.1:{health}/healthz"),
            timeout=60,
            what="the operator's /healthz",
        )

    def restart(self, image: str) -> None:
        self.stop()
        self.start(image)

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop(self.proc)
            self.proc = None

    def alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise AssertionError(f"metis-operator exited ({code}); logs in {self._work}")


@contextlib.contextmanager
def running_operator(
    kube: ControlPlane, real_node: node.Node, image: str, ns: str, work: Path
) -> Iterator[Operator]:
    install(kube)
    # The operator runs here, as a process; the manifests' replicas would pull a
    # registry's image the node cannot reach.
    kube.kubectl("scale", "deployment/metis-operator", "-n", "metis-system", "--replicas=0")
    op = Operator(kube, real_node, ns, work)
    op.start(image)
    try:
        yield op
    finally:
        op.stop()
        print(f"operator logs: {work}")


@pytest.fixture(scope="module")
def operator(
    kube: ControlPlane,
    real_node: node.Node,
    built: images.Built,
    ns: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    image = built.refs[images.INDEXER.name]
    work = tmp_path_factory.mktemp("operator")
    with running_operator(kube, real_node, image, ns, work) as op:
        yield op


def indexer_pod(kube: ControlPlane, ns: str) -> dict[str, Any]:
    pods = kube.rest().get(
        f"/api/v1/namespaces/{ns}/pods?labelSelector=app.kubernetes.io/name=metis-indexer"
    )["items"]
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, [p["metadata"]["name"] for p in pods]
    return dict(running[0])


def container_id(pod: dict[str, Any]) -> str:
    (status,) = pod["status"]["containerStatuses"]
    return str(status["containerID"]).removeprefix("containerd://")


def in_container(n: node.Node, pod: dict[str, Any], *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `argv` inside the indexer's container (as its own user), through containerd."""
    cmd = [
        "ctr",
        "--address",
        str(n.socket),
        "-n",
        "k8s.io",
        "tasks",
        "exec",
        "--exec-id",
        f"check-{time.monotonic_ns()}",
        container_id(pod),
        *argv,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def service_url(kube: ControlPlane, ns: str) -> str:
    svc = kube.rest().get(f"/api/v1/namespaces/{ns}/services/metis-handbook")
    return f"http://{svc['spec']['clusterIP']}:7700"


def indexer_status(kube: ControlPlane, ns: str) -> dict[str, Any]:
    return dict(httpx.get(f"{service_url(kube, ns)}/v1/status", timeout=5).json())


@pytest.fixture(scope="module")
def base(kube: ControlPlane, ns: str, models: int, operator: Operator) -> str:
    """The handbook base applied with `kubectl apply -f`, Ready on the real node."""
    make_drive(kube, ns, "docs", ROOT / "examples")
    model_service(kube, ns, models)
    kube.kubectl("apply", "-n", ns, "-f", "-", input=HANDBOOK)
    wait_state(kube, ns, "handbook", "Ready", timeout=240, alive=operator.alive)
    return "handbook"


def ready_totals(kube: ControlPlane, ns: str, base: str) -> dict[str, int]:
    """The base's documents, chunks and failed once it is Ready."""
    index = wait_state(kube, ns, base, "Ready", timeout=120)["observed"]["index"]
    return {k: index[k] for k in ("documents", "chunks", "failed")}


def test_the_indexer_runs_from_the_image_as_the_deployment_says(
    kube: ControlPlane, real_node: node.Node, built: images.Built, ns: str, base: str
) -> None:
    pod = indexer_pod(kube, ns)
    assert pod["spec"]["nodeName"] == node.NODE_NAME
    (status,) = pod["status"]["containerStatuses"]
    assert status["image"].endswith(built.refs[images.INDEXER.name].split("/", 1)[1])
    assert status["ready"] is True  # the readiness probe (/readyz) passed
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == "True"

    # From inside the container: uid 10001, no capability, no new privileges, the
    # runtime's seccomp filter, a root it cannot write.
    probe = (
        "import os\n"
        "st = dict(l.rstrip('\\n').split(':\\t', 1) for l in open('/proc/self/status'))\n"
        "try:\n"
        "    open('/written', 'w')\n"
        "    root = 'writable'\n"
        "except OSError as e:\n"
        "    root = e.strerror\n"
        "print(os.getuid(), os.getgid(), st['CapEff'], st['CapPrm'], st['NoNewPrivs'],\n"
        "      st['Seccomp'], root)\n"
    )
    out = in_container(real_node, pod, "python3", "-c", probe)
    assert out.returncode == 0, out.stderr
    uid, gid, eff, prm, no_new_privs, seccomp, root = out.stdout.split(maxsplit=6)
    assert (uid, gid) == ("10001", "10001")
    assert int(eff, 16) == 0 and int(prm, 16) == 0
    assert (no_new_privs, seccomp) == ("1", "2")  # 2: a filter (RuntimeDefault)
    assert root.strip() == "Read-only file system"


def test_a_search_through_the_service_answers_with_citations(
    kube: ControlPlane, ns: str, base: str
) -> None:
    answer = httpx.post(
        f"{service_url(kube, ns)}/v1/search",
        json={"query": "How many holidays do I get?", "top_k": 3},
        timeout=30,
    ).json()
    first = answer["results"][0]
    assert first["citation"]["document"].endswith("policies/leave.md")
    assert first["citation"]["line"] >= 1 and first["citation"]["headings"]
    assert answer["reranked"] is True and answer["mode"] == "hybrid"


def test_a_spec_change_reaches_the_pod_through_the_configmap(
    kube: ControlPlane, ns: str, base: str, operator: Operator
) -> None:
    before = get_kb(kube, ns, base)
    generation = before["metadata"]["generation"] + 1
    patch = {"spec": {"chunking": {"size": 800, "overlap": 100}}}
    started = time.monotonic()
    kube.kubectl("patch", "kb", base, "-n", ns, "--type=merge", "-p", json.dumps(patch))
    ready_too_early: list[dict[str, Any]] = []

    def delivered() -> float | None:
        status = get_kb(kube, ns, base).get("status") or {}
        running = indexer_status(kube, ns)["generation"]
        if (
            running < generation
            and status.get("state") == "Ready"
            and (status.get("observedGeneration") == generation)
        ):
            ready_too_early.append(status)
        return time.monotonic() - started if running == generation else None

    took = wait_for(delivered, timeout=180, what="the new configuration in the pod")
    print(f"\nConfigMap change reached the indexer pod after {took:.1f} s")
    assert ready_too_early == []
    s = wait_state(
        kube,
        ns,
        base,
        "Ready",
        timeout=120,
        alive=operator.alive,
        check=lambda s: s.get("observedGeneration") == generation,
    )
    assert indexer_status(kube, ns)["indexed_generation"] == generation
    assert s["observed"]["index"]["documents"] == before["status"]["observed"]["index"]["documents"]


def test_a_killed_indexer_is_restarted_with_its_index(
    kube: ControlPlane,
    real_node: node.Node,
    ns: str,
    base: str,
    operator: Operator,
) -> None:
    totals = ready_totals(kube, ns, base)
    pod = indexer_pod(kube, ns)
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    real_node.ctr("tasks", "kill", "-s", "SIGKILL", container_id(pod))

    events_before = len(state_events(kube, ns, base))

    def restarted() -> bool:
        state = (get_kb(kube, ns, base).get("status") or {}).get("state", "")
        p = indexer_pod(kube, ns)
        return bool(
            p["status"]["containerStatuses"][0]["restartCount"] > restarts and state == "Ready"
        )

    wait_for(restarted, timeout=180, what="the indexer restarted and the base Ready")
    reasons = [reason for reason, _ in state_events(kube, ns, base)[events_before:]]
    # Measured: Waiting ("the operator cannot reach its indexer: connection refused")
    # comes first, while the kubelet still counts the dead container ready; once it is
    # ready again, Starting until its Service routes to it; never Failed or Pending.
    assert "Starting" in reasons and reasons[-1] == "Ready", reasons
    assert set(reasons) <= {"Waiting", "Starting", "Ready"}, reasons
    assert indexer_pod(kube, ns)["metadata"]["uid"] == pod["metadata"]["uid"]  # same pod
    after = get_kb(kube, ns, base)["status"]["observed"]["index"]
    assert {k: after[k] for k in totals} == totals
    # Nothing was read again: the index came back from its PVC.
    assert indexer_status(kube, ns)["last_pass"]["read"] == 0


def test_a_drained_node_leaves_the_base_pending_and_uncordoned_it_comes_back(
    kube: ControlPlane,
    real_node: node.Node,
    ns: str,
    base: str,
    operator: Operator,
) -> None:
    totals = ready_totals(kube, ns, base)
    evicted = indexer_pod(kube, ns)["metadata"]["uid"]
    events_before = len(state_events(kube, ns, base))
    # What a node's maintenance does: cordon, then evict its pods (the Eviction API).
    selector = "--pod-selector=app.kubernetes.io/name=metis-indexer"
    kube.kubectl(
        "drain",
        node.NODE_NAME,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        selector,
        "--timeout=120s",
    )
    try:
        s = wait_state(kube, ns, base, "Pending", timeout=120, alive=operator.alive)
        # While the evicted pod drains, the reason names it first; the scheduler's word after.
        assert "no machine can run it (scheduler: 0/1 nodes are available" in s["reason"]
        assert "unschedulable" in s["reason"]
    finally:
        kube.kubectl("uncordon", node.NODE_NAME)
    s = wait_state(kube, ns, base, "Ready", timeout=180, alive=operator.alive)
    assert indexer_pod(kube, ns)["metadata"]["uid"] != evicted  # a new pod, the same PVC
    assert {k: s["observed"]["index"][k] for k in totals} == totals
    assert indexer_status(kube, ns)["last_pass"]["read"] == 0
    reasons = [reason for reason, _ in state_events(kube, ns, base)[events_before:]]
    assert "Pending" in reasons and reasons[-1] == "Ready", reasons
    assert set(reasons) <= {"Pending", "Waiting", "Starting", "Ready"}, reasons
