"""Fixtures for tests that need a real Kubernetes control plane.

`kube` (session scope) starts etcd, kube-apiserver, kube-controller-manager
and kube-scheduler once per test session (metis_dev.plane, the package behind
`metis-dev cluster up`), sets KUBECONFIG for the session and stops every process
at the end, even when a test fails. The binaries are built by metis_dev/build.sh
the first time on a machine; that happens right after collection, outside any
per-test timeout, and only when a collected test uses `kube` or `kube_binaries`.

Environment:
  METIS_KUBE_ASSETS   where the binaries live (default ~/.cache/metis/kube/<version>)
  METIS_KUBE_KEEP=1   keep the work dir (certs, etcd data, component logs) after the run
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metis_dev import node
from metis_dev.build import ensure_binaries
from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from metis_dev.process import free_port, wait_for
from tests.kube.operator_support import Operator, install, running_operator
from tests.kube.pods import (
    Pods,
    RealPods,
    StandInPods,
    real_node,
    scale_operator_to_zero,
)
from tests.support.model_server import ModelServer, start_model_server

STAND_IN: list[str] = []
"""Modules whose indexer pods ran on the stand-in kubelet, and why: said at the end."""


def _wants_kube(item: pytest.Item) -> bool:
    return bool({"kube", "kube_binaries"} & set(getattr(item, "fixturenames", ())))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build missing binaries before the first test, so that a cold build (tens
    of minutes on a small machine) is not charged to a test's timeout."""
    if any(_wants_kube(item) for item in session.items):
        capture = session.config.pluginmanager.getplugin("capturemanager")
        if capture is None:
            ensure_binaries()
            return
        with capture.global_and_fixture_disabled():  # show build progress live
            ensure_binaries()


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def kube_binaries() -> Path:
    """The folder of the built binaries (kubectl among them), for tests that start a
    cluster of their own (`metis-dev cluster up`, `make demo`)."""
    return ensure_binaries()


@pytest.fixture(scope="session")
def kube() -> Iterator[ControlPlane]:
    """A running control plane; KUBECONFIG points at it for the session."""
    # SIGTERM (a CI job cancelled, `timeout`) would end pytest without any
    # teardown; as an interrupt, pytest still runs the fixture's teardown.
    # (The children die with pytest in any case: PR_SET_PDEATHSIG.)
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    saved = os.environ.get("KUBECONFIG")
    try:
        keep = os.environ.get("METIS_KUBE_KEEP") == "1"
        with ControlPlane(ensure_binaries(), keep_workdir=keep) as cp:
            print(f"\nkube control plane up in {cp.started_in:.1f} s at {cp.server} ({cp.workdir})")
            os.environ["KUBECONFIG"] = str(cp.kubeconfig)
            yield cp
    finally:
        if saved is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def kubectl(kube: ControlPlane) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`kubectl(*args, input=None, check=True)` against the test cluster."""
    return kube.kubectl


@contextlib.contextmanager
def fresh_namespace(kube: ControlPlane, name: str) -> Iterator[str]:
    """Namespace `name`, made and ready for pods; deleted afterwards (not waited for)."""
    kube.rest().post("/api/v1/namespaces", {"metadata": {"name": name}})
    # Pods are refused until the service-account controller made `default`.
    wait_for(
        lambda: kube.rest().get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=60,
        what=f"service account default in {name}",
    )
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def node_object(kube: ControlPlane) -> Iterator[str]:
    """A Ready node object of its own, with no kubelet behind it (a stand-in kubelet runs
    what the test binds to it); gone after the test."""
    name = f"cpu-{secrets.token_hex(3)}"
    kube.add_node(name)
    yield name
    kube.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def namespace(kube: ControlPlane) -> Iterator[str]:
    """A fresh namespace for one test."""
    with fresh_namespace(kube, f"t-{secrets.token_hex(4)}") as name:
        yield name


@pytest.fixture(scope="module")
def installed(kube: ControlPlane) -> None:
    """The CRD, RBAC and namespace of manifests/, once per module."""
    install(kube)


@pytest.fixture
def models() -> Iterator[ModelServer]:
    """`metis models` (the real local model) for one test."""
    server = start_model_server()
    yield server
    server.stop()


@pytest.fixture
def operator(kube: ControlPlane, installed: None, tmp_path: Path) -> Iterator[Operator]:
    """The operator as a local process, for one test."""
    workdir = tmp_path / "operator"
    workdir.mkdir()
    with running_operator(kube, workdir, free_port()) as op:
        yield op


@pytest.fixture(scope="module")
def pods_node(
    kube: ControlPlane,
    installed: None,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[node.Node, str] | None]:
    """The real node for this module's indexer pods (and the indexer image's name), or
    None where the machine cannot run it now (the reason is kept for the summary).
    Module-scoped: the node leaves the cluster with the module, so no other test's pod
    is ever placed on it."""
    claimed, why = node.claim_or_why()
    if claimed is None:
        STAND_IN.append(f"{request.module.__name__}: {why}")
        yield None
        return
    # The manifests' operator replicas would land on the node (an image it cannot pull).
    scale_operator_to_zero(kube)
    with real_node(kube, Path(tmp_path_factory.mktemp("node")), claimed) as found:
        yield found


@pytest.fixture
def pods(
    kube: ControlPlane, pods_node: tuple[node.Node, str] | None, namespace: str, tmp_path: Path
) -> Iterator[Pods]:
    """Where this test's indexer pods run: the real node, or the stand-in kubelet."""
    if pods_node is None:
        with Kubelet(kube, namespace, tmp_path / "kubelet") as kubelet:
            yield StandInPods(kube, namespace, kubelet)
    else:
        yield RealPods(kube, namespace, *pods_node)


@pytest.fixture
def pod_models(pods: Pods) -> Iterator[ModelServer]:
    """`metis models` where `pods`' indexers and the operator reach it."""
    server = pods.models()
    yield server
    server.stop()


@pytest.fixture
def pod_operator(pods: Pods, tmp_path: Path) -> Iterator[Operator]:
    """The operator as a local process, reaching `pods`' indexers."""
    workdir = tmp_path / "operator"
    workdir.mkdir()
    op = pods.operator(workdir).start()
    yield op
    op.stop()
    print(f"operator log: {op.log_path}; pods on {pods.kind}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in STAND_IN:
        terminalreporter.write_line(f"indexer pods ran on the stand-in kubelet in {line}")
