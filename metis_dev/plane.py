"""A real Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler as child processes on loopback, in one work folder.

Why: CRD schema and CEL validation, the status subresource, ownerReferences
and garbage collection, resourceVersion conflicts and watches only behave
truly in a real apiserver. The binaries come from build.sh (no Docker, no
downloads). Plain Python, no pytest:

    from metis_dev.plane import running

    with running() as cp:
        cp.kubectl("get", "nodes")

There is no kubelet. `add_node` and `mark_pod_running` act as one where needed,
a background reaper finishes the graceful deletion of pods bound to a node (a
kubelet's job) so that garbage collection and namespace deletion complete, and
metis_dev.kubelet runs indexer pods as local processes.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from metis_dev.build import BUILD_SCRIPT, ensure_binaries, missing_binaries
from metis_dev.components import DEFAULT_CONTROLLERS, SERVICE_CIDR, SERVICE_IP, Launcher
from metis_dev.pki import CertAuthority, Pki, kubeconfig, make_pki, write, write_kubeconfig
from metis_dev.process import ControlPlaneError, Process, wait_for
from metis_dev.rest import KubeApiError, KubeRest, run_kubectl

ADMIN_USER = "metis-admin"
WORKDIR_PREFIX = "metis-kube-"
STAND_IN_KUBELET = "v0.0.0-metis-test"
"""The kubelet version of the nodes `add_node` makes: nodes no kubelet serves."""

_LIVE: set[ControlPlane] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    """Interpreter exit without a clean stop (an error, Ctrl-C): stop anyway."""
    with _LIVE_LOCK:
        planes = list(_LIVE)
    for cp in planes:
        cp.stop()


def _remove_stale_workdirs() -> None:
    """Delete work dirs left by a run that was killed (SIGKILL skips every
    cleanup; its children died with it, but etcd's ~120 MB of WAL stayed)."""
    for d in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            pid = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler.

    Everything lives in one work folder (certs, etcd data, kubeconfigs, one log
    per component); a temporary one unless `workdir` is given. `stop()` kills
    every process group; it also runs at interpreter exit, and each child dies
    with its parent (PR_SET_PDEATHSIG). `kubeconfig` (the admin's) is written once
    the cluster is usable.
    """

    def __init__(
        self,
        bin_dir: Path,
        *,
        workdir: Path | None = None,
        keep_workdir: bool = False,
        start_timeout: float = 120.0,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        scheduler: bool = True,
        reap_terminating_pods: bool = True,
        audit_policy: Path | None = None,
        audit_log: Path | None = None,
    ) -> None:
        self.bin_dir = Path(bin_dir)
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(
                f"missing binaries in {self.bin_dir}: {missing}; run {BUILD_SCRIPT}"
            )
        self._own_workdir = workdir is None
        if workdir is None:
            _remove_stale_workdirs()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        self.keep_workdir = keep_workdir
        self.start_timeout = start_timeout
        self.controllers = tuple(controllers)
        self.with_scheduler = scheduler
        self.reap_terminating_pods = reap_terminating_pods
        self.audit_policy = audit_policy
        self.audit_log = audit_log or self.workdir / "audit.log"
        """The API server's audit log (JSON lines), written when `audit_policy` is set."""
        self.kubectl_path = self.bin_dir / "kubectl"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.server = ""
        self._launcher = Launcher(self.bin_dir, self.workdir, start_timeout)
        self.procs: dict[str, Process] = self._launcher.procs
        self._pki: Pki | None = None
        self._ca: CertAuthority | None = None
        self._ssl: ssl.SSLContext | None = None
        self._stopped = threading.Event()
        self._reaper: threading.Thread | None = None
        self.started_in: float | None = None

    # -- lifecycle ------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start all components in order and wait until each is ready."""
        t0 = time.monotonic()
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._ca, self._pki = make_pki(self.workdir / "pki", [SERVICE_IP])
            launch = self._launcher
            audit = None if self.audit_policy is None else (self.audit_policy, self.audit_log)
            self.server = launch.apiserver(launch.etcd(), self._pki, self._client_ssl(), audit)
            launch.controller(
                "kube-controller-manager",
                self._component_kubeconfig("kube-controller-manager"),
                [
                    f"--controllers={','.join(self.controllers)}",
                    f"--service-account-private-key-file={self._pki.sa_key}",
                    f"--root-ca-file={self._pki.ca_crt}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                ],
            )
            if self.with_scheduler:
                # An unschedulable pod is tried again within seconds, not 5 minutes:
                # the claims the stand-in kubelet binds a moment after the pod appeared
                # do not always requeue it, and nobody should wait minutes.
                launch.controller(
                    "kube-scheduler",
                    self._component_kubeconfig("kube-scheduler"),
                    ["--pod-max-in-unschedulable-pods-duration=5s"],
                )
            self._wait_cluster_usable()
            if self.reap_terminating_pods:
                self._reaper = threading.Thread(
                    target=self._reap_loop, name="kube-pod-reaper", daemon=True
                )
                self._reaper.start()
            self.write_kubeconfig(self.kubeconfig, ADMIN_USER)
        except BaseException as exc:
            # Keep the logs of a failed start; the next run removes the dir
            # once this process has exited.
            self.keep_workdir = self.keep_workdir or not isinstance(exc, KeyboardInterrupt)
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop everything (reverse order) and remove the work dir unless kept."""
        self._stopped.set()
        if self._reaper is not None:
            self._reaper.join(timeout=10)
            self._reaper = None
        for name in reversed(list(self.procs)):
            self.procs[name].stop()
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._own_workdir and not self.keep_workdir and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise (with the log tail) if any component has died."""
        for p in self.procs.values():
            p.check_alive()

    # -- kubeconfigs ----------------------------------------------------------

    def write_kubeconfig(
        self, path: Path, user: str, groups: Sequence[str] = ("system:masters",)
    ) -> Path:
        """A kubeconfig for `user` (client-certificate auth, certs inlined)."""
        assert self._ca is not None and self._pki is not None
        crt, key = self._ca.issue(user, groups=groups)
        config = kubeconfig(self.server, self._pki.ca_crt.read_bytes(), user, crt, key)
        return write_kubeconfig(path, config)

    def _component_kubeconfig(self, name: str) -> Path:
        return self.write_kubeconfig(self.workdir / f"{name}.kubeconfig", f"metis:{name}")

    def _client_ssl(self) -> ssl.SSLContext:
        """An mTLS context with the admin identity, for probes and `rest()`."""
        assert self._ca is not None and self._pki is not None
        if self._ssl is None:
            d = self.workdir / "pki"
            crt, key = self._ca.issue(ADMIN_USER, groups=["system:masters"])
            write(d / "admin.crt", crt)
            write(d / "admin.key", key)
            ctx = ssl.create_default_context(cafile=str(self._pki.ca_crt))
            ctx.load_cert_chain(str(d / "admin.crt"), str(d / "admin.key"))
            self._ssl = ctx
        return self._ssl

    def _wait_cluster_usable(self) -> None:
        """Ready endpoints are not enough: the `default` namespace and its `default`
        service account (the ServiceAccount admission plugin refuses pods without
        it) must exist."""
        api = self.rest()
        wait_for(
            lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default"),
            timeout=self.start_timeout,
            what="the default service account",
            alive=self.check_alive,
        )

    # -- clients --------------------------------------------------------------

    def rest(self) -> KubeRest:
        """A minimal JSON client acting as the cluster admin."""
        return KubeRest(self.server, self._client_ssl())

    def environ(self) -> dict[str, str]:
        """os.environ with KUBECONFIG pointing at this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def api_client(self) -> Any:
        """A fresh `kubernetes.client.ApiClient` for this cluster (close it, or
        use it as a context manager)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl built with the cluster against it; on failure (with
        `check`) raise with kubectl's stderr in the message."""
        # Its own discovery cache, not ~/.kube/cache: CRDs come and go per run.
        cache = f"--cache-dir={self.workdir / 'kubectl-cache'}"
        return run_kubectl(
            self.kubectl_path,
            self.kubeconfig,
            cache,
            *args,
            input=input,
            check=check,
            timeout=timeout,
        )

    # -- acting as a kubelet --------------------------------------------------

    def add_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        *,
        cpu: str = "8",
        memory: str = "32Gi",
        pods: int = 110,
        ip: str | None = None,
    ) -> dict[str, Any]:
        """Register a Ready node, as a kubelet would, so the real scheduler can
        place pods on it by nodeSelector and affinity.

        The TaintNodesByCondition admission plugin gives every new node the
        `node.kubernetes.io/not-ready` taint; the node-lifecycle controller
        (not run here: it would evict pods from kubelet-less nodes) would
        remove it once the node is Ready, so this helper does."""
        all_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        ip = ip or f"10.100.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}"
        resources = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "100Gi"}
        now = _now()
        api = self.rest()
        api.post(
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": all_labels}},
        )
        status = {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "metis test node (no kubelet)",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": STAND_IN_KUBELET,
                "containerRuntimeVersion": "none://0",
                "kernelVersion": "",
                "osImage": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }
        api.patch(f"/api/v1/nodes/{name}/status", {"status": status})
        node = api.get(f"/api/v1/nodes/{name}")
        taints = [
            t
            for t in node["spec"].get("taints") or []
            if not t["key"].startswith("node.kubernetes.io/")
        ]
        return dict(api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": taints or None}}))

    def mark_pod_running(self, namespace: str, name: str, ip: str | None = None) -> dict[str, Any]:
        """Report a scheduled pod Running and Ready with an IP, as the kubelet
        would once its containers started; ReplicaSets then count it available."""
        api = self.rest()
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        node_name = pod["spec"].get("nodeName")
        if not node_name:
            raise ControlPlaneError(f"pod {namespace}/{name} is not scheduled yet")
        node = api.get(f"/api/v1/nodes/{node_name}")
        host_ip = next(
            (
                a["address"]
                for a in node.get("status", {}).get("addresses", [])
                if a["type"] == "InternalIP"
            ),
            "10.100.0.1",
        )
        ip = ip or f"10.244.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}"
        now = _now()
        status = {
            "phase": "Running",
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "containerID": f"none://{secrets.token_hex(16)}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in pod["spec"]["containers"]
            ],
        }
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        return dict(api.patch(path, {"status": status}))

    def _reap_loop(self) -> None:
        """Finish graceful deletion of pods bound to a node without a kubelet, the
        kubelet's part: without it, pods deleted by the garbage collector, a ReplicaSet or
        the namespace controller would stay Terminating forever. A real node's kubelet
        finishes its own pods' (their drain is what a test of it measures)."""
        api = self.rest()
        while not self._stopped.wait(0.5):
            # Whatever one look meets, the next look comes: the apiserver may be stopping,
            # and urllib reads os.environ while pytest rewrites PYTEST_CURRENT_TEST in
            # another thread (a KeyError). A reaper that died would leave every pod deleted
            # afterwards Terminating for the rest of the session.
            with contextlib.suppress(Exception):
                self._reap_once(api)

    @staticmethod
    def _reap_once(api: KubeRest) -> None:
        pods = api.get("/api/v1/pods")["items"]
        nodes = api.get("/api/v1/nodes")["items"]
        kubelets = {
            n["metadata"]["name"]
            for n in nodes
            if ((n.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
            not in (None, "", STAND_IN_KUBELET)
        }
        for pod in pods:
            meta = pod["metadata"]
            bound = pod["spec"].get("nodeName")
            if meta.get("deletionTimestamp") and bound and bound not in kubelets:
                path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
                with contextlib.suppress(KubeApiError, OSError):
                    api.delete(path, body)


@contextlib.contextmanager
def running(bin_dir: Path | None = None, **kwargs: Any) -> Iterator[ControlPlane]:
    """Build if needed, start a control plane, and stop it afterwards."""
    cp = ControlPlane(bin_dir or ensure_binaries(), **kwargs)
    with cp:
        yield cp


def gone(kube: ControlPlane, path: str) -> bool:
    """True once GET `path` answers 404."""
    return kube.rest().gone(path)
