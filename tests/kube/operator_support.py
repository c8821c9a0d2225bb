"""Helpers for the operator's tests against the real control plane.

- `install`: the project's own manifests (`kubectl apply -k manifests/`).
- `Operator`: `metis-operator` as a child process, authenticated as its service
  account, so the RBAC of manifests/rbac.yaml is what it really gets.
- `Kubelet`: plays the kubelet for indexer pods. There is no kubelet here: when
  the real scheduler binds an indexer pod, this starts a real `metis serve` with
  the pod's ConfigMap, its paths rewritten through the pod's volume mounts to the
  hostPath folders of the PersistentVolumes bound to its claims, and reports the
  pod Running once the indexer is ready. It also binds the operator's index
  claims to hostPath volumes (no provisioner here) and follows ConfigMap updates
  into the config file, as a ConfigMap volume does.
- `make_drive`, `model_service`, `kb`: small builders.

Every wait polls with a deadline (`wait_for`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.kube.controlplane import ControlPlane, KubeApiError, free_port, wait_for
from tests.support import processes
from tests.support.processes import Process, metis

ROOT = Path(__file__).resolve().parents[2]
GROUP = "metis.astraeus.io"
CRD = f"knowledgebases.{GROUP}"
OPERATOR_USER = "system:serviceaccount:metis-system:metis-operator"
INDEXER_SELECTOR = "app.kubernetes.io/name=metis-indexer"


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
    api = kube.rest()
    pv = f"{namespace}-{name}"
    api.post("/api/v1/persistentvolumes", _volume(pv, folder, namespace, name))
    claim: dict[str, Any] = {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", claim)


def _volume(name: str, folder: Path, namespace: str, claim: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"metis-test/namespace": namespace}},
        "spec": {
            "capacity": {"storage": "100Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(folder)},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


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

    def __init__(self, target: str, seconds: float = 5.0) -> None:
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
                    self.command, proxy.target + self.path, content=body, timeout=60,
                    headers={"content-type": self.headers.get("content-type", "")},
                )  # fmt: skip
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(answer.status_code)
                    self.send_header("content-type", answer.headers.get("content-type", ""))
                    self.send_header("content-length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)

            do_GET = do_POST = _forward

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
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
    metrics_port: int = dataclasses.field(default_factory=free_port)
    health_port: int = dataclasses.field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    def start(self) -> Operator:
        kubeconfig = self.kube.write_kubeconfig(
            self.workdir / "operator.kubeconfig",
            OPERATOR_USER,
            groups=("system:serviceaccounts", "system:serviceaccounts:metis-system"),
        )
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "METIS_URL_TEMPLATE": "http://127.0.0.1:{port}",
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
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts + 1}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "metis-operator")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        self.starts += 1
        if self.env.get("METIS_LEADER_ELECTION") != "true":
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_for(self._healthy, timeout=timeout, what="the operator's /healthz",
                 alive=self.check_alive)  # fmt: skip

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


# --------------------------------------------------------------------------- the kubelet


@dataclasses.dataclass
class _Pod:
    name: str
    process: Process
    config_path: Path
    configmap: str
    mounts: dict[str, Path]
    config_text: str
    running: bool = False


class Kubelet:
    """Runs the indexer pods of one namespace as local `metis serve` processes.

    `hold = True` keeps newly bound pods from starting (to see a base Starting);
    the processes of pods that are deleted are stopped before new ones start, so
    a replacement takes over the index folder and the port as in a pod.
    """

    def __init__(self, kube: ControlPlane, namespace: str, workdir: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        self.workdir = workdir
        self.hold = False
        self.late_config = False
        """Keep ConfigMap updates from the running pods, as a real kubelet does for up
        to a minute."""
        self.pods: dict[str, _Pod] = {}
        self.errors: list[str] = []
        self.volumes: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for pod in list(self.pods.values()):
            pod.process.stop()
        for pv in self.volumes:
            with contextlib.suppress(KubeApiError):
                self.kube.rest().delete(f"/api/v1/persistentvolumes/{pv}")

    def check(self) -> None:
        """Raise what went wrong in the loop, with the processes' logs."""
        if self.errors:
            logs = "\n".join(p.process.log() for p in self.pods.values())
            raise AssertionError("kubelet: " + "\n".join(self.errors) + "\n" + logs)

    def indexer(self) -> Process:
        """The one running indexer process."""
        running = [p.process for p in self.pods.values() if p.running]
        assert len(running) == 1, f"{len(running)} indexers run: {list(self.pods)}"
        return running[0]

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self._tick()
            except Exception:
                self.errors.append(traceback.format_exc())

    def _tick(self) -> None:
        api = self.kube.rest()
        ns = f"/api/v1/namespaces/{self.namespace}"
        self._bind_index_claims(api.get(f"{ns}/persistentvolumeclaims")["items"])
        pods = api.get(f"{ns}/pods?labelSelector={INDEXER_SELECTOR}")["items"]
        live = {p["metadata"]["uid"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}
        for uid in [u for u in self.pods if u not in live]:
            self.pods.pop(uid).process.stop()
        for uid, pod in live.items():
            known = self.pods.get(uid)
            if known is None:
                if pod["spec"].get("nodeName") and not self.hold:
                    self.pods[uid] = self._start(pod)
                continue
            if not self.late_config:
                self._follow_config(known)
            if not known.running and self._ready(known.process):
                self.kube.mark_pod_running(self.namespace, known.name)
                known.running = True

    def _bind_index_claims(self, claims: list[dict[str, Any]]) -> None:
        for claim in claims:
            name = claim["metadata"]["name"]
            if claim["spec"].get("volumeName") or not name.startswith("metis-"):
                continue
            pv = f"{self.namespace}-{name}"
            if pv in self.volumes:
                continue
            folder = self.workdir / "volumes" / name
            folder.mkdir(parents=True, exist_ok=True)
            self.kube.rest().post(
                "/api/v1/persistentvolumes", _volume(pv, folder, self.namespace, name)
            )
            self.volumes.append(pv)

    def _host_paths(self, pod: dict[str, Any]) -> dict[str, Path]:
        """mountPath → the hostPath of the volume bound to the claim mounted there."""
        api = self.kube.rest()
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        }
        out = {}
        for m in pod["spec"]["containers"][0]["volumeMounts"]:
            if m["name"] in claims:
                pvc = api.get(
                    f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/"
                    f"{claims[m['name']]}"
                )
                pv = api.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
                out[m["mountPath"]] = Path(pv["spec"]["hostPath"]["path"])
        return out

    def _configmap_text(self, name: str) -> str:
        cm = self.kube.rest().get(f"/api/v1/namespaces/{self.namespace}/configmaps/{name}")
        return str(cm["data"]["config.json"])

    @staticmethod
    def _localised(text: str, mounts: dict[str, Path]) -> str:
        """The configuration with paths seen through the mounts, on loopback."""

        def local(path: str) -> str:
            for mount, host in sorted(mounts.items(), key=lambda m: -len(m[0])):
                if path == mount or path.startswith(mount + "/"):
                    return str(host) + path[len(mount) :]
            raise AssertionError(f"{path} is not on a mounted volume: {sorted(mounts)}")

        config = json.loads(text)
        for source in config["sources"]:
            source["root"] = local(source["root"])
        config["index_dir"] = local(config["index_dir"])
        config["host"] = "127.0.0.1"
        return json.dumps(config, indent=2)

    def _start(self, pod: dict[str, Any]) -> _Pod:
        name = pod["metadata"]["name"]
        configmap = next(v["configMap"]["name"] for v in pod["spec"]["volumes"]
                         if "configMap" in v)  # fmt: skip
        mounts = self._host_paths(pod)
        text = self._configmap_text(configmap)
        folder = self.workdir / "pods" / name
        folder.mkdir(parents=True, exist_ok=True)
        config_path = folder / "config.json"
        config_path.write_text(self._localised(text, mounts))
        port = json.loads(text)["port"]
        process = Process(
            f"http://127.0.0.1:{port}",
            metis("serve", "--config", str(config_path)),
            folder / "indexer.log",
            env=self._env(pod),
        ).start()
        return _Pod(name, process, config_path, configmap, mounts, text)

    def _env(self, pod: dict[str, Any]) -> dict[str, str]:
        """The container's environment as a kubelet gives it: values, and keys of
        Secrets (the base's API token)."""
        env = {}
        for var in pod["spec"]["containers"][0].get("env", []):
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref is not None:
                secret = self.kube.rest().get(
                    f"/api/v1/namespaces/{self.namespace}/secrets/{ref['name']}"
                )
                env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            elif "value" in var:
                env[var["name"]] = var["value"]
        return env

    def _follow_config(self, pod: _Pod) -> None:
        text = self._configmap_text(pod.configmap)
        if text != pod.config_text:
            pod.config_path.write_text(self._localised(text, pod.mounts))
            pod.config_text = text

    @staticmethod
    def _ready(process: Process) -> bool:
        try:
            return process.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False


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
    """The base's status once it is in `state` (and `check` holds)."""

    def poll() -> dict[str, Any] | None:
        status = get_kb(kube, namespace, name).get("status") or {}
        return status if status.get("state") == state and check(status) else None

    try:
        return wait_for(poll, timeout=timeout, what=f"kb/{name} {state}", alive=alive)
    except TimeoutError as e:
        status = get_kb(kube, namespace, name).get("status")
        raise AssertionError(f"{e}; its status: {yaml.safe_dump(status)}") from None


def kstatus(kube: ControlPlane, obj: dict[str, Any]) -> dict[str, str]:
    """What sigs.k8s.io/cli-utils' kstatus (Flux's reading) computes for `obj`:
    {"status": "InProgress" | "Current" | "Failed" | ..., "message": ...}."""
    return read_kstatus(kube.bin_dir, obj)


def read_kstatus(bin_dir: Path, obj: dict[str, Any]) -> dict[str, str]:
    out = subprocess.run(
        [str(bin_dir / "kstatus")], input=json.dumps(obj), capture_output=True, text=True,
        check=True, timeout=30,
    )  # fmt: skip
    return dict(json.loads(out.stdout))


def state_events(kube: ControlPlane, namespace: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the base's Events, oldest first (by resourceVersion, etcd's
    own order: timestamps have one-second steps)."""
    items = kube.rest().get(
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name={name}"
    )["items"]
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e.get("message", "")) for e in items]
