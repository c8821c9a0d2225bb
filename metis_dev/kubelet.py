"""A stand-in kubelet for Metis indexer pods: there is no container runtime here, so when
the real scheduler binds an indexer pod, this starts a real `metis serve` as a local
process with the pod's ConfigMap, its paths rewritten through the pod's volume mounts to
the hostPath folders of the PersistentVolumes bound to its claims, and reports the pod
Running once its own indexer is ready. It also binds the operator's index claims to hostPath
volumes (no provisioner here) and follows ConfigMap updates into the config file, as a
ConfigMap volume does. A Secret volume (an object store's key pair) is written as files in
a folder of the pod's, and the configuration's `secret_dir`s are rewritten to it. Other
pods are scheduled but never run.

Services are loopback ports: an indexer listens on 127.0.0.1 at the port of its
configuration, so the operator reaches Services with the URL template
`http://127.0.0.1:{port}`. A replica past the first listens on a port of its own, with
its peer (the base's Service) at that port: the Service here is replica 0.

Every base's Service has the same port (the operator's METIS_INDEXER_PORT), so one base
at a time has its indexer here: the pod of another base is not started while that port
is held, and says why (its container waiting, `PortInUse`, naming the pod that holds it).
Started, it would die on the taken port while the other base's indexer answered for it.
A pod is reported Running only once its own process answers ready from the socket
listening on its port; one whose indexer exits is reported waiting (`IndexerExited`,
with the exit code and the log's last line), and is not restarted.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from metis_dev.plane import ControlPlane
from metis_dev.process import Process, free_port
from metis_dev.rest import KubeApiError

INDEXER_SELECTOR = "app.kubernetes.io/name=metis-indexer"
INSTANCE_LABEL = "app.kubernetes.io/instance"
"""The label naming a pod's base."""
REPLICA_LABEL = "metis.astraeus.io/replica"
"""The label naming a pod's replica, past the first."""
PORT_IN_USE = "PortInUse"
"""Why a pod waits whose Service port another base's indexer holds."""
EXITED = "IndexerExited"
"""Why a pod waits whose indexer process exited (the stand-in does not restart it)."""
LISTEN = "0A"
"""A listening socket's state in /proc/net/tcp."""


class Unmounted(Exception):
    """A configuration names a path on no volume the pod mounts."""


def hostpath_volume(name: str, folder: Path, namespace: str, claim: str) -> dict[str, Any]:
    """A PersistentVolume at `folder`, reserved for the claim `namespace/claim`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
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


def drive(
    namespace: str, name: str, folder: Path, annotations: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """A source drive: a PVC `name` bound to a hostPath PersistentVolume at `folder`
    (the volume first)."""
    pv = f"{namespace}-{name}"
    claim: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    return [hostpath_volume(pv, folder, namespace, name), claim]


@dataclasses.dataclass
class IndexerClient:
    """Where an indexer answers (a loopback port, a Service's ClusterIP)."""

    base_url: str

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.base_url}{path}", timeout=30, **kw)

    def post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return httpx.post(f"{self.base_url}{path}", json=body or {}, timeout=120)

    def status(self) -> dict[str, Any]:
        return dict(self.get("/v1/status").json())


@dataclasses.dataclass
class Indexer(IndexerClient):
    """A pod's `metis serve`: the process, and where it answers."""

    process: Process

    def start(self) -> Indexer:
        self.process.start()
        return self

    def log(self) -> str:
        return self.process.tail(60)

    def running(self) -> bool:
        return self.process.running()

    def answers_itself(self) -> bool:
        """Whether the socket listening on its port is this process's: another process
        (another base's indexer) may answer there."""
        proc = self.process.proc
        return proc is not None and listening(proc.pid, urlsplit(self.base_url).port or 80)

    def stop(self) -> None:
        self.process.stop()


def _configmap_of(pod: dict[str, Any]) -> str:
    return str(next(v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v))


def _replica_of(pod: dict[str, Any]) -> tuple[str, str | None, str]:
    """(namespace, base, replica) of an indexer pod."""
    meta = pod["metadata"]
    labels = meta.get("labels", {})
    return meta["namespace"], labels.get(INSTANCE_LABEL), labels.get(REPLICA_LABEL, "0")


def listening(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on TCP `port` (Linux: /proc)."""
    inodes = set()
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        with contextlib.suppress(FileNotFoundError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd) in inodes:
                return True
    return False


def not_running(
    pod: dict[str, Any], reason: str, message: str, exit_code: int | None = None
) -> dict[str, Any]:
    """The status of a pod whose indexer does not run: Pending and not ready, its
    containers waiting with `reason` and `message` (what the operator reads and says),
    and the exit code of the one that ran, if one did."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    last = {"terminated": {"exitCode": exit_code, "reason": "Error", "finishedAt": now}}
    containers = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}},
            "lastState": last if exit_code is not None else {},
        }
        for c in pod["spec"]["containers"]
    ]
    unready = {"status": "False", "reason": "ContainersNotReady", "message": message}
    conditions = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True"},
        {"type": "ContainersReady", **unready},
        {"type": "Ready", **unready},
    ]
    return {
        "phase": "Pending",
        "conditions": [{**c, "lastTransitionTime": now} for c in conditions],
        "containerStatuses": containers,
    }


def metis(*args: str) -> list[str]:
    """The `metis` command line of this interpreter."""
    return [sys.executable, "-m", "metis_indexer.cli", *args]


@dataclasses.dataclass
class _Pod:
    name: str
    process: Indexer
    config_path: Path
    configmap: str
    mounts: dict[str, Path]
    config_text: str
    running: bool = False
    namespace: str = ""
    port: int | None = None
    """A replica's own port, past the first."""
    service: int | None = None
    """Its base's Service port (its configuration's), held by one base at a time."""
    base: tuple[str, str | None] = ("", None)
    """(namespace, base)."""
    exited: bool = False
    """Its process exited, and its status says so."""


class Kubelet:
    """Runs the indexer pods of one namespace (or of all, `namespace=None`) as local
    `metis serve` processes.

    `hold = True` keeps newly bound pods from starting (to see a base Starting);
    the processes of pods that are deleted are stopped before new ones start, so
    a replacement takes over the index folder and the port as in a pod.

    A replica's pods share one loopback port here, so a replacement that starts beside
    the old pod (a rolling update's surge) cannot run beside it: it is reported ready
    at once, standing for a replacement that loaded the index in standby, and its
    process starts once the old pod's has stopped. The searches through that moment
    are the real node's to measure (tests/node/test_never_dark.py), not this stand-in's.
    That pretence stays within a base: a pod of another base waits for the port instead
    (see the module's doc).
    """

    def __init__(self, kube: ControlPlane, namespace: str | None, workdir: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        self.workdir = workdir
        self.hold = False
        self.late_config = False
        """Keep ConfigMap updates from the running pods, as a real kubelet does for up
        to a minute."""
        self.pods: dict[str, _Pod] = {}
        self.beside: set[str] = set()
        """Pods reported ready whose process waits for the old pod's to stop (a surge)."""
        self.refused: dict[str, str] = {}
        """Pods not started while another base holds their port: why, as reported."""
        self.errors: list[str] = []
        self.volumes: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stand-in-kubelet", daemon=True)

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        for pv in self.volumes:
            with contextlib.suppress(KubeApiError, OSError):
                self.kube.rest().delete(f"/api/v1/persistentvolumes/{pv}")

    def check(self) -> None:
        """Raise what went wrong in the loop, with the processes' logs."""
        if self.errors:
            logs = "\n".join(p.process.log() for p in self.pods.values())
            raise AssertionError("kubelet: " + "\n".join(self.errors) + "\n" + logs)

    def indexer(self) -> Indexer:
        """The one running indexer process."""
        running = [p.process for p in self.pods.values() if p.running]
        assert len(running) == 1, f"{len(running)} indexers run: {list(self.pods)}"
        return running[0]

    def _loop(self) -> None:
        """The pods' processes are started and stopped by this thread only: each dies
        with the thread that started it (PR_SET_PDEATHSIG), so this one outlives them."""
        try:
            while not self._stop.wait(0.2):
                try:
                    self._tick()
                except Exception:
                    self.errors.append(traceback.format_exc())
        finally:
            for pod in list(self.pods.values()):
                pod.process.stop()

    def _scope(self, namespace: str | None = None) -> str:
        ns = namespace or self.namespace
        return f"/api/v1/namespaces/{ns}" if ns else "/api/v1"

    def _tick(self) -> None:
        api = self.kube.rest()
        self._bind_index_claims(api.get(f"{self._scope()}/persistentvolumeclaims")["items"])
        pods = api.get(f"{self._scope()}/pods?labelSelector={INDEXER_SELECTOR}")["items"]
        live = {p["metadata"]["uid"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}
        for uid in [u for u in self.pods if u not in live]:
            self.pods.pop(uid).process.stop()
        for uid in [u for u in self.refused if u not in live]:
            del self.refused[uid]
        for uid, pod in live.items():
            known = self.pods.get(uid)
            if known is None:
                if pod["spec"].get("nodeName") and not self.hold:
                    if self._beside_another(pod, live) or self._refuse(pod):
                        continue
                    self.beside.discard(uid)
                    self.refused.pop(uid, None)
                    started = self.pods[uid] = self._start(pod)
                    # An override of `_start` (bench/operator_scale.py) may leave them out.
                    started.namespace = pod["metadata"]["namespace"]
                    started.base = _replica_of(pod)[:2]
                continue
            if not known.process.running():
                if not known.exited:
                    self._exited(known, pod)
                continue
            if not self.late_config:
                self._follow_config(known)
            if not known.running and self._ready(known.process):
                self.kube.mark_pod_running(known.namespace, known.name)
                known.running = True

    def _beside_another(self, pod: dict[str, Any], live: dict[str, dict[str, Any]]) -> bool:
        """Whether `pod` replaces a pod of its base's replica whose process still runs:
        then it is reported ready (once), and started when that process has stopped."""
        base = _replica_of(pod)
        running = any(
            _replica_of(live[u]) == base and p.process.running()
            for u, p in self.pods.items()
            if u in live
        )
        meta = pod["metadata"]
        if running and meta["uid"] not in self.beside:
            self.kube.mark_pod_running(meta["namespace"], meta["name"])
            self.beside.add(meta["uid"])
        return running

    def _refuse(self, pod: dict[str, Any]) -> bool:
        """Whether another base's running indexer holds the Service port of `pod`'s base:
        then `pod` is reported waiting, naming that indexer's pod, until the port is free."""
        meta = pod["metadata"]
        port = json.loads(self._configmap_text(_configmap_of(pod), meta["namespace"]))["port"]
        base = _replica_of(pod)[:2]
        holder = next(
            (
                p
                for p in self.pods.values()
                if p.service == port and p.base != base and p.process.running()
            ),
            None,
        )
        if holder is None:
            return False
        why = (
            f"port {port}, its Service's, is held by pod {holder.namespace}/{holder.name} "
            f"of knowledge base {holder.base[0]}/{holder.base[1]}: the stand-in kubelet's "
            "Services are loopback ports, every base's the same, so one base at a time has "
            "its indexer here; this pod starts once that port is free"
        )
        if self.refused.get(meta["uid"]) != why:
            self._report(pod, not_running(pod, PORT_IN_USE, why))
            self.refused[meta["uid"]] = why
        return True

    def _exited(self, known: _Pod, pod: dict[str, Any]) -> None:
        """Report the pod of an indexer that exited as not running, with why."""
        process = known.process.process
        code = process.proc.returncode if process.proc is not None else None
        why = (
            f"the indexer exited with code {code} and the stand-in kubelet does not restart "
            f"it (delete the pod for a new one): {process.tail(1)}"
        )
        self._report(pod, not_running(pod, EXITED, why, code))
        known.exited, known.running = True, False

    def _report(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        path = f"{self._scope(meta['namespace'])}/pods/{meta['name']}/status"
        self.kube.rest().patch(path, {"status": status})

    def _bind_index_claims(self, claims: list[dict[str, Any]]) -> None:
        for claim in claims:
            name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
            if claim["spec"].get("volumeName") or not name.startswith("metis-"):
                continue
            pv = f"{namespace}-{name}"
            if pv in self.volumes:
                continue
            folder = self.workdir / "volumes" / namespace / name
            folder.mkdir(parents=True, exist_ok=True)
            self.kube.rest().post(
                "/api/v1/persistentvolumes", hostpath_volume(pv, folder, namespace, name)
            )
            self.volumes.append(pv)

    def _host_paths(self, pod: dict[str, Any]) -> dict[str, Path]:
        """mountPath → the hostPath of the volume bound to the claim mounted there."""
        api, scope = self.kube.rest(), self._scope(pod["metadata"]["namespace"])
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        }
        out = {}
        for m in pod["spec"]["containers"][0]["volumeMounts"]:
            if m["name"] in claims:
                pvc = api.get(f"{scope}/persistentvolumeclaims/{claims[m['name']]}")
                pv = api.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
                out[m["mountPath"]] = Path(pv["spec"]["hostPath"]["path"])
        return out

    def _configmap_text(self, name: str, namespace: str | None = None) -> str:
        cm = self.kube.rest().get(f"{self._scope(namespace)}/configmaps/{name}")
        return str(cm["data"]["config.json"])

    @staticmethod
    def _localised(text: str, mounts: dict[str, Path], port: int | None = None) -> str:
        """The configuration with paths seen through the mounts, on loopback, and no
        drain: this stand-in runs one pod of a replica at a time on one port, so a
        stopping pod's drain would only hold its replacement back. A replica past the
        first answers on `port`, its peers at the Service's (replica 0's)."""

        def local(path: str) -> str:
            for mount, host in sorted(mounts.items(), key=lambda m: -len(m[0])):
                if path == mount or path.startswith(mount + "/"):
                    return str(host) + path[len(mount) :]
            raise Unmounted(f"{path} is not on a mounted volume: {sorted(mounts)}")

        config = json.loads(text)
        for source in config["sources"]:
            source["root"] = local(source["root"])
        config["index_dir"] = local(config["index_dir"])
        for store in (config.get("backup_store"), (config.get("restore") or {}).get("store")):
            if store:
                store["secret_dir"] = local(store["secret_dir"])
        config["host"] = "127.0.0.1"
        config["drain_seconds"] = 0
        if port is not None:
            config["peers"] = [f"http://127.0.0.1:{config['port']}"]
            config["port"] = port
        return json.dumps(config, indent=2)

    def _start(self, pod: dict[str, Any]) -> _Pod:
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        configmap = _configmap_of(pod)
        mounts = self._host_paths(pod)
        text = self._configmap_text(configmap, namespace)
        folder = self.workdir / "pods" / namespace / name
        folder.mkdir(parents=True, exist_ok=True)
        mounts.update(self._secret_volumes(pod, folder))
        config_path = folder / "config.json"
        own = free_port() if _replica_of(pod)[2] != "0" else None
        config_path.write_text(self._localised(text, mounts, own))
        port = own or json.loads(text)["port"]
        process = Process(
            name,
            metis("serve", "--config", str(config_path)),
            folder / "indexer.log",
            env=self._env(pod),
        )
        indexer = Indexer(f"http://127.0.0.1:{port}", process).start()
        return _Pod(
            name,
            indexer,
            config_path,
            configmap,
            mounts,
            text,
            namespace=namespace,
            port=own,
            service=json.loads(text)["port"],
        )

    def _secret_volumes(self, pod: dict[str, Any], folder: Path) -> dict[str, Path]:
        """mountPath → a folder holding the keys of the Secret volume mounted there (the
        object stores' key pairs), written as a kubelet writes them."""
        scope = self._scope(pod["metadata"]["namespace"])
        secrets = {v["name"]: v["secret"] for v in pod["spec"]["volumes"] if "secret" in v}
        out = {}
        for m in pod["spec"]["containers"][0]["volumeMounts"]:
            volume = secrets.get(m["name"])
            if volume is None:
                continue
            data = self.kube.rest().get(f"{scope}/secrets/{volume['secretName']}").get("data")
            keys = [i["key"] for i in volume.get("items") or []] or sorted(data or {})
            where = folder / "secrets" / m["name"]
            where.mkdir(parents=True, exist_ok=True)
            for key in keys:
                (where / key).write_bytes(base64.b64decode((data or {})[key]))
            out[m["mountPath"]] = where
        return out

    def _env(self, pod: dict[str, Any]) -> dict[str, str]:
        """The container's environment as a kubelet gives it: values, and keys of
        Secrets (the base's API token)."""
        env = {}
        scope = self._scope(pod["metadata"]["namespace"])
        for var in pod["spec"]["containers"][0].get("env", []):
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref is not None:
                secret = self.kube.rest().get(f"{scope}/secrets/{ref['name']}")
                env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            elif "value" in var:
                env[var["name"]] = var["value"]
        return env

    def _follow_config(self, pod: _Pod) -> None:
        """A new ConfigMap into the running pod's file, unless it names a drive the pod
        does not mount (a source added): that change comes with the pod that replaces
        this one, and it must not keep the loop from starting that pod. A ConfigMap gone
        (its base deleted, the pod not yet) leaves the file as it is, as a kubelet keeps a
        volume's last content."""
        try:
            text = self._configmap_text(pod.configmap, pod.namespace)
        except KubeApiError as e:
            if e.status == 404:
                return
            raise
        if text == pod.config_text:
            return
        try:
            pod.config_path.write_text(self._localised(text, pod.mounts, pod.port))
        except Unmounted:
            return
        pod.config_text = text

    @staticmethod
    def _ready(process: Indexer) -> bool:
        """Whether the indexer answers ready, itself: the port alone may answer from
        another process while this one dies on the port it could not take."""
        if not process.answers_itself():
            return False
        try:
            return process.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False
