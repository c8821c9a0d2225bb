"""The stand-in kubelet (metis_dev/kubelet.py) says only what runs: every base's Service
is the same loopback port there, so a second base's indexer pod is not started while the
first holds it, and waits saying who holds it; an indexer that exits, or one whose port
another process answers on, is never reported Running. Indexer pods made by hand (the
operator's own reading of a waiting pod is its tests'); every wait polls with a deadline."""

from __future__ import annotations

import http.server
import json
import os
import secrets
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metis_dev.kubelet import (
    EXITED,
    INDEXER_SELECTOR,
    INSTANCE_LABEL,
    PORT_IN_USE,
    IndexerClient,
    Kubelet,
    listening,
)
from metis_dev.plane import ControlPlane
from metis_dev.process import free_port, wait_for
from tests.kube.operator_support import make_drive

TIMEOUT = 120
"""An indexer starts in seconds; a loaded machine takes many more."""


def test_listening_names_the_process_that_holds_the_port() -> None:
    with socket.socket() as held, socket.socket() as bound:
        held.bind(("127.0.0.1", 0))
        held.listen()
        bound.bind(("127.0.0.1", 0))  # bound, not listening
        port, other = held.getsockname()[1], bound.getsockname()[1]
        child = subprocess.Popen(["sleep", "60"])
        try:
            assert listening(os.getpid(), port)
            assert not listening(child.pid, port)
            assert not listening(os.getpid(), other)
        finally:
            child.kill()
            child.wait()
        assert not listening(child.pid, port)  # gone


@pytest.fixture
def kubelet(kube: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Kubelet]:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.md").write_text("# Page\n\nHow the team handles incidents.\n")
    make_drive(kube, namespace, "docs", docs)
    with Kubelet(kube, namespace, tmp_path / "kubelet") as k:
        yield k


def make_bases(kube: ControlPlane, ns: str, port: int, folder: Path, *bases: str) -> None:
    """What the operator makes for each base's indexer pod: its ConfigMap, and its index
    drive (a folder under `folder`, its claim bound at once)."""
    for base in bases:
        config = {
            "name": base,
            "sources": [{"drive": "docs", "root": "/sources/docs"}],
            "index_dir": "/index",
            "port": port,
        }
        kube.rest().post(
            f"/api/v1/namespaces/{ns}/configmaps",
            {"metadata": {"name": f"metis-{base}"}, "data": {"config.json": json.dumps(config)}},
        )
        (folder / base).mkdir()
        make_drive(kube, ns, f"metis-{base}", folder / base)


def start_pod(kube: ControlPlane, ns: str, base: str, node: str) -> str:
    """The indexer pod of `base` on `node`; its name."""
    name = f"metis-{base}-{secrets.token_hex(3)}"
    key, value = INDEXER_SELECTOR.split("=")
    mounts = {"config": "/etc/metis", "index": "/index", "docs": "/sources/docs"}
    pod = {
        "metadata": {"name": name, "labels": {key: value, INSTANCE_LABEL: base}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "indexer",
                    "image": "metis-indexer:test",
                    "volumeMounts": [{"name": n, "mountPath": p} for n, p in mounts.items()],
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": f"metis-{base}"}},
                {"name": "index", "persistentVolumeClaim": {"claimName": f"metis-{base}"}},
                {"name": "docs", "persistentVolumeClaim": {"claimName": "docs"}},
            ],
        },
    }
    kube.rest().post(f"/api/v1/namespaces/{ns}/pods", pod)
    return name


def pod_status(kube: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return dict(kube.rest().get(f"/api/v1/namespaces/{ns}/pods/{name}").get("status") or {})


def waiting(status: dict[str, Any]) -> dict[str, str]:
    """The waiting state of the pod's container, if it waits."""
    [container] = status.get("containerStatuses") or [{}]
    return dict((container.get("state") or {}).get("waiting") or {})


def wait_running(kubelet: Kubelet, kube: ControlPlane, ns: str, name: str) -> None:
    wait_for(
        lambda: pod_status(kube, ns, name).get("phase") == "Running",
        timeout=TIMEOUT,
        what=f"pod {name} Running",
        alive=kubelet.check,
    )


def wait_waiting(
    kubelet: Kubelet, kube: ControlPlane, ns: str, name: str, reason: str, *, ran: bool = False
) -> dict[str, Any]:
    """The pod's status once its container waits for `reason`; unless it `ran`, the pod is
    never reported Running meanwhile."""

    def alive() -> None:
        kubelet.check()
        status = pod_status(kube, ns, name)
        assert ran or status.get("phase") != "Running", f"{name} reported Running: {status}"

    def says() -> dict[str, Any] | None:
        status = pod_status(kube, ns, name)
        return status if waiting(status).get("reason") == reason else None

    return wait_for(says, timeout=TIMEOUT, what=f"pod {name} waiting, {reason}", alive=alive)


def assert_not_running(status: dict[str, Any]) -> None:
    ready = {c["type"]: c["status"] for c in status["conditions"]}
    assert status["phase"] == "Pending", status
    assert ready["Ready"] == ready["ContainersReady"] == "False", status


def test_a_second_base_waits_for_the_port_the_first_holds_and_a_dead_indexer_is_not_running(
    kube: ControlPlane, namespace: str, node_object: str, kubelet: Kubelet, tmp_path: Path
) -> None:
    ns, port = namespace, free_port()
    service = IndexerClient(f"http://127.0.0.1:{port}")
    make_bases(kube, ns, port, tmp_path, "alpha", "beta")
    alpha = start_pod(kube, ns, "alpha", node_object)
    wait_running(kubelet, kube, ns, alpha)
    assert service.status()["name"] == "alpha"

    beta = start_pod(kube, ns, "beta", node_object)
    status = wait_waiting(kubelet, kube, ns, beta, PORT_IN_USE)
    assert_not_running(status)
    said = waiting(status)["message"]
    assert f"port {port}, its Service's, is held by pod {ns}/{alpha} of knowledge base" in said
    assert service.status()["name"] == "alpha"

    # alpha's indexer dies: its pod says so, and beta takes the port it left.
    indexer = kubelet.indexer().process.proc
    assert indexer is not None
    os.kill(indexer.pid, signal.SIGKILL)
    status = wait_waiting(kubelet, kube, ns, alpha, EXITED, ran=True)
    assert_not_running(status)
    assert "exited with code -9" in waiting(status)["message"]
    assert status["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == -9
    wait_running(kubelet, kube, ns, beta)
    assert service.status()["name"] == "beta"


class Answers(http.server.BaseHTTPRequestHandler):
    """Another process's server on the port: ready to anything asked."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_an_indexer_whose_port_another_process_answers_on_is_never_running(
    kube: ControlPlane, namespace: str, node_object: str, kubelet: Kubelet, tmp_path: Path
) -> None:
    ns, port = namespace, free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
        make_bases(kube, ns, port, tmp_path, "alpha")
        alpha = start_pod(kube, ns, "alpha", node_object)
        status = wait_waiting(kubelet, kube, ns, alpha, EXITED)
        assert_not_running(status)
        assert "address already in use" in waiting(status)["message"]
    finally:
        server.shutdown()
        server.server_close()
