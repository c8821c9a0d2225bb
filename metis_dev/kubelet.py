"""A stand-in kubelet for Metis indexer pods: there is no container runtime here, so when
the real scheduler binds an indexer pod, this starts a real `metis serve` as a local
process with the pod's ConfigMap, its paths rewritten through the pod's volume mounts to
the hostPath folders of the PersistentVolumes bound to its claims, and reports the pod
Running once the indexer is ready. It also binds the operator's index claims to hostPath
volumes (no provisioner here) and follows ConfigMap updates into the config file, as a
ConfigMap volume does. Other pods are scheduled but never run.

Services are loopback ports: an indexer listens on 127.0.0.1 at the port of its
configuration, so the operator reaches Services with the URL template
`http://127.0.0.1:{port}`. A replica past the first listens on a port of its own, with
its peer (the base's Service) at that port: the Service here is replica 0.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import httpx

from metis_dev.plane import ControlPlane
from metis_dev.process import Process, free_port
from metis_dev.rest import KubeApiError

INDEXER_SELECTOR = "app.kubernetes.io/name=metis-indexer"
INSTANCE_LABEL = "app.kubernetes.io/instance"
"""The label naming a pod's base."""
REPLICA_LABEL = "metis.astraeus.io/replica"
"""The label naming a pod's replica, past the first."""


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

    def stop(self) -> None:
        self.process.stop()


def _replica_of(pod: dict[str, Any]) -> tuple[str, str | None, str]:
    """(namespace, base, replica) of an indexer pod."""
    meta = pod["metadata"]
    labels = meta.get("labels", {})
    return meta["namespace"], labels.get(INSTANCE_LABEL), labels.get(REPLICA_LABEL, "0")


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
        for uid, pod in live.items():
            known = self.pods.get(uid)
            if known is None:
                if pod["spec"].get("nodeName") and not self.hold:
                    if self._beside_another(pod, live):
                        continue
                    self.beside.discard(uid)
                    started = self.pods[uid] = self._start(pod)
                    # An override of `_start` (bench/operator_scale.py) may leave it out.
                    started.namespace = pod["metadata"]["namespace"]
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
        running = any(_replica_of(live[u]) == base for u in self.pods if u in live)
        meta = pod["metadata"]
        if running and meta["uid"] not in self.beside:
            self.kube.mark_pod_running(meta["namespace"], meta["name"])
            self.beside.add(meta["uid"])
        return running

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
        config["host"] = "127.0.0.1"
        config["drain_seconds"] = 0
        if port is not None:
            config["peers"] = [f"http://127.0.0.1:{config['port']}"]
            config["port"] = port
        return json.dumps(config, indent=2)

    def _start(self, pod: dict[str, Any]) -> _Pod:
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        configmap = next(v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v)
        mounts = self._host_paths(pod)
        text = self._configmap_text(configmap, namespace)
        folder = self.workdir / "pods" / namespace / name
        folder.mkdir(parents=True, exist_ok=True)
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
            name, indexer, config_path, configmap, mounts, text, namespace=namespace, port=own
        )

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
        this one, and it must not keep the loop from starting that pod."""
        text = self._configmap_text(pod.configmap, pod.namespace)
        if text == pod.config_text:
            return
        try:
            pod.config_path.write_text(self._localised(text, pod.mounts, pod.port))
        except Unmounted:
            return
        pod.config_text = text

    @staticmethod
    def _ready(process: Indexer) -> bool:
        try:
            return process.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False
