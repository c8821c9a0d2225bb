"""Helpers for the operator's tests against the real control plane.

- `install`: the project's own manifests (`kubectl apply -k manifests/`).
- `Operator`: `metis-operator` as a child process, authenticated as its service
  account, so the RBAC of manifests/rbac.yaml is what it really gets.
- `make_drive`, `model_service`, `kb`: small builders.

The stand-in kubelet that runs indexer pods as local `metis serve` processes is
metis_dev.kubelet's `Kubelet`.

Every wait polls with a deadline (`wait_for`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from metis_dev.kubelet import drive
from metis_dev.plane import ControlPlane
from metis_dev.process import free_port, wait_for
from metis_operator.state import State
from tests.support import processes

ROOT = Path(__file__).resolve().parents[2]
GROUP = "metis.astraeus.io"
CRD = f"knowledgebases.{GROUP}"
OPERATOR_USER = "system:serviceaccount:metis-system:metis-operator"
STATES = {s.value for s in State}


def install(kube: ControlPlane) -> None:
    """Apply manifests/ (CRD, namespace, RBAC, operator Deployment); idempotent."""
    kube.kubectl("apply", "-k", str(ROOT / "manifests"))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")


def kb_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{GROUP}/v1/namespaces/{namespace}/knowledgebases"
    return f"{base}/{name}" if name else base


def kb(name: str, spec: dict[str, Any], **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": f"{GROUP}/v1", "kind": "KnowledgeBase", "metadata": meta, "spec": spec}


# --------------------------------------------------------------------------- objects


def make_drive(
    kube: ControlPlane,
    namespace: str,
    name: str,
    folder: Path,
    annotations: dict[str, str] | None = None,
) -> None:
    """A source drive: a PVC bound to a hostPath PersistentVolume at `folder`."""
    volume, claim = drive(namespace, name, folder, annotations)
    kube.rest().post("/api/v1/persistentvolumes", volume)
    kube.rest().post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", claim)


def model_service(
    kube: ControlPlane, namespace: str, name: str, port: int, selector: dict[str, str] | None = None
) -> None:
    """A Service in front of a model server; the operator reaches it on `port`
    through its URL template (`http://127.0.0.1:{port}` in tests)."""
    spec: dict[str, Any] = {"ports": [{"name": "http", "port": port}]}
    if selector:
        spec["selector"] = selector
    kube.rest().post(
        f"/api/v1/namespaces/{namespace}/services", {"metadata": {"name": name}, "spec": spec}
    )


class StallingProxy:
    """A model server's front: forwards every request, and holds the next `stall`
    `GET /v1/models` calls (a prober's cheap call) for `seconds` before answering."""

    def __init__(self, target: str, seconds: float = 5.0, host: str = "127.0.0.1") -> None:
        self.target, self.seconds = target, seconds
        self.stall = 0
        self.models_calls: list[str] = []
        """`stalled` or `answered`, one per `GET /v1/models`, in order."""
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "GET" and self.path == "/v1/models":
                    stalled = proxy.stall > 0
                    proxy.stall -= stalled
                    proxy.models_calls.append("stalled" if stalled else "answered")
                    if stalled:
                        threading.Event().wait(proxy.seconds)
                answer = httpx.request(
                    self.command,
                    proxy.target + self.path,
                    content=body,
                    timeout=60,
                    headers={"content-type": self.headers.get("content-type", "")},
                )
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(answer.status_code)
                    self.send_header("content-type", answer.headers.get("content-type", ""))
                    self.send_header("content-length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)

            do_GET = do_POST = _forward

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer((host, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- the operator


@dataclasses.dataclass
class Operator:
    """`metis-operator` as a child process with the service account's identity."""

    kube: ControlPlane
    workdir: Path
    indexer_port: int
    poll_seconds: float = 0.5
    namespaces: tuple[str, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Settings over the tests' defaults (leader election off, fast probes)."""
    identity: str = "metis-operator-0"
    url_template: str | None = "http://127.0.0.1:{port}"
    """How it reaches Services: loopback ports for the stand-in kubelet's indexers;
    None, the in-cluster names (a real node's DNS, through `wrap`)."""
    wrap: Callable[[list[str]], list[str]] = lambda argv: argv
    """The command line it runs under (a real node's `host_command`)."""
    metrics_port: int = dataclasses.field(default_factory=free_port)
    health_port: int = dataclasses.field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    def start(self) -> Operator:
        if "METIS_URL_TEMPLATE" in self.env:
            raise ValueError("set the operator's url_template, not METIS_URL_TEMPLATE in env")
        kubeconfig = self.kube.write_kubeconfig(
            self.workdir / "operator.kubeconfig",
            OPERATOR_USER,
            groups=("system:serviceaccounts", "system:serviceaccounts:metis-system"),
        )
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "METIS_INDEXER_PORT": str(self.indexer_port),
            "METIS_POLL_SECONDS": str(self.poll_seconds),
            "METIS_HTTP_TIMEOUT_SECONDS": "2",
            "METIS_NAMESPACES": ",".join(self.namespaces),
            "METIS_METRICS_PORT": str(self.metrics_port),
            "METIS_HEALTH_PORT": str(self.health_port),
            "METIS_PROBE_SECONDS": "1",
            "METIS_MODEL_GRACE_SECONDS": "3",
            "METIS_LEADER_ELECTION": "false",
            "METIS_LOG_FORMAT": "json",
            "POD_NAME": self.identity,
            **self.env,
        }
        if self.url_template is not None:
            env["METIS_URL_TEMPLATE"] = self.url_template
        else:
            env.pop("METIS_URL_TEMPLATE", None)
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts + 1}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.wrap([str(Path(sys.executable).parent / "metis-operator")]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.starts += 1
        if self.env.get("METIS_LEADER_ELECTION") != "true":
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_for(
            self._healthy, timeout=timeout, what="the operator's /healthz", alive=self.check_alive
        )

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.health_port}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"metis-operator exited ({self.proc.returncode}):\n{self.log()}")

    def log(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        processes.stop(self.proc, sig)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text


@contextlib.contextmanager
def running_operator(
    kube: ControlPlane, workdir: Path, indexer_port: int, **kw: Any
) -> Iterator[Operator]:
    op = Operator(kube, workdir, indexer_port, **kw).start()
    try:
        yield op
    finally:
        op.stop()


# --------------------------------------------------------------------------- reading


def looks(op: Operator, *, timer: bool = False) -> float:
    """The running operator process's looks at its bases: its reconciliations (only those
    its timer started, with `timer`) and the timer polls of a Ready base's indexer that
    found its answer unchanged, which end the turn there."""
    counted = (
        'metis_operator_indexer_polls_total{changed="false"}',
        'metis_operator_reconciliations_total{trigger="timer"}'
        if timer
        else "metis_operator_reconciliations_total{",
    )
    return sum(
        float(line.split()[-1]) for line in op.metrics().splitlines() if line.startswith(counted)
    )


def get_kb(kube: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return dict(kube.rest().get(kb_path(namespace, name)))


def wait_state(
    kube: ControlPlane,
    namespace: str,
    name: str,
    state: str,
    *,
    timeout: float = 60,
    check: Callable[[dict[str, Any]], bool] = lambda status: True,
    alive: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """The base's status once it is in `state` (and `check` holds), and once the Event of
    its last change of state is posted: the operator posts it after writing the status,
    so a test reading the Events next would otherwise race it."""

    def poll() -> dict[str, Any] | None:
        status = get_kb(kube, namespace, name).get("status") or {}
        return status if status.get("state") == state and check(status) else None

    def posted() -> bool:
        said = [r for r, _ in state_events(kube, namespace, name) if r in STATES]
        return bool(said) and said[-1] == state

    try:
        found = wait_for(poll, timeout=timeout, what=f"kb/{name} {state}", alive=alive)
        wait_for(posted, timeout=30, what=f"the Event of kb/{name} {state}", alive=alive)
        return found
    except TimeoutError as e:
        status = get_kb(kube, namespace, name).get("status")
        raise AssertionError(f"{e}; its status: {yaml.safe_dump(status)}") from None


def kstatus(kube: ControlPlane, obj: dict[str, Any]) -> dict[str, str]:
    """What sigs.k8s.io/cli-utils' kstatus (Flux's reading) computes for `obj`:
    {"status": "InProgress" | "Current" | "Failed" | ..., "message": ...}."""
    return read_kstatus(kube.bin_dir, obj)


def read_kstatus(bin_dir: Path, obj: dict[str, Any]) -> dict[str, str]:
    out = subprocess.run(
        [str(bin_dir / "kstatus")],
        input=json.dumps(obj),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return dict(json.loads(out.stdout))


def state_events(kube: ControlPlane, namespace: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the base's Events, oldest first (by resourceVersion, etcd's
    own order: timestamps have one-second steps)."""
    items = kube.rest().get(
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name={name}"
    )["items"]
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e.get("message", "")) for e in items]


def kubectl_metis(
    kube: ControlPlane, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl metis ARGS` with the plugin found on PATH, as a user's shell finds it."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig or kube.kubeconfig),
    }
    return subprocess.run(
        [str(kube.kubectl_path), "metis", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr}\n{proc.stdout}"
    return proc.stdout
