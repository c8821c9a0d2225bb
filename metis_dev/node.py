"""A real node for the local cluster: containerd, the CNI bridge, kubelet and kube-proxy.

Everything runs under one work folder: containerd with its own configuration, state and
socket; a CNI configuration that only this containerd reads; the kubelet's root folder.
Nothing of the machine's global configuration is written (no /etc file, no system
service): the node is registered against a running API server given its kubeconfig, and
leaves with its processes.

What the cluster lacks besides a kubelet, the node brings as one small loop (`_Keeper`):
- DNS: pods (and processes started through `host_command`) resolve `<svc>.<ns>.svc` by
  dnsmasq on the bridge's address, fed a hosts file of every Service's ClusterIP;
- volumes: a claim that names no volume gets a hostPath PersistentVolume on a folder of
  the work dir, bound to it (what local-path provisioners do);
- readiness: the test control plane runs no node-lifecycle controller, so the node's
  `not-ready` taint is removed here once the kubelet reports Ready.

kubelet and kube-proxy are built from the same k8s.io/kubernetes as the control plane
(go/node-bin) into the same cache, with stamps, by `ensure_binaries`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

from metis_dev import images, progress
from metis_dev.process import _die_with_parent as die_with_parent

HERE = Path(__file__).resolve().parent
NODE_MODULE = HERE / "go" / "node-bin"
KUBE_VERSION = re.search(
    r"^\s*k8s\.io/kubernetes (v\S+)", (NODE_MODULE / "go.mod").read_text(), re.MULTILINE
)[1]
"""The module's pin, the single source of truth (the control plane's is the same)."""
ASSETS = Path(
    os.environ.get("METIS_KUBE_ASSETS", Path.home() / ".cache" / "metis" / "kube" / KUBE_VERSION)
)
BINARIES = ("kubelet", "kube-proxy", "pause")
CONTAINERD_ROOT = (
    Path(os.environ.get("METIS_NODE_CACHE", Path.home() / ".cache" / "metis" / "node"))
    / "containerd"
)
"""containerd's content and snapshots, kept between nodes: an imported image is unpacked
once (1.1 GB, 23,000 files: deleting them with each work folder took 60 s here)."""
LOCK = CONTAINERD_ROOT.parent / "node.lock"
"""Held by the running node: one bridge, one set of kube-proxy chains and one containerd
root per machine, so a second node waits its turn or runs elsewhere."""

NODE_NAME = "metis-node"
BRIDGE = "metis0"
POD_CIDR = "10.244.0.0/24"
GATEWAY = "10.244.0.1"
"""The host's address on the pods' bridge: DNS answers there, and model servers on the
host listen there for the pods."""
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "localhost/metis-pause:1"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
T = TypeVar("T")

REQUIRED_COMMANDS = (
    "containerd",
    "runc",
    "ctr",
    "podman",
    "debootstrap",
    "dnsmasq",
    "iptables",
    "ip",
    "unshare",
)
CNI_PLUGINS = Path("/usr/lib/cni")


class NodeError(RuntimeError):
    """The node could not start; the message says which part and its log."""


def unusable() -> str | None:
    """Why this machine cannot run a real node, or None when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, network namespaces, iptables)"
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if not (CNI_PLUGINS / "bridge").exists():
        missing.append(f"{CNI_PLUGINS}/bridge (containernetworking-plugins)")
    if missing:
        return f"missing {', '.join(missing)}: `make node-packages` installs them"
    return None


def in_use(lock: Path = LOCK) -> str | None:
    """Why the machine's one real node cannot start now (another process runs it), or
    None when it is free."""
    try:
        held = _take(lock)
    except BlockingIOError:
        return _busy(lock)
    os.close(held)
    return None


def claim(lock: Path = LOCK) -> int | None:
    """The machine's one real node claimed for this process (the lock's descriptor, its
    pid written in it), or None when another process holds it. Claimed before anything
    is started, so two runs that both saw it free cannot both go on to start one."""
    try:
        fd = _take(lock)
    except BlockingIOError:
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def claim_or_why(lock: Path = LOCK) -> tuple[int | None, str | None]:
    """The machine's real node claimed for this process, or why not: the machine cannot
    run one (`unusable`), or another process holds it."""
    why = unusable()
    if why:
        return None, why
    fd = claim(lock)
    return (fd, None) if fd is not None else (None, _busy(lock))


def _busy(lock: Path) -> str:
    """Who holds the lock, as its holder wrote it."""
    holder = _read(lock).strip() or "?"
    return f"its one real node is in use by process {holder} (a test run or a cluster up)"


def _take(lock: Path) -> int:
    """The lock's descriptor, locked; BlockingIOError when another process holds it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return fd


# --------------------------------------------------------------------------- binaries


def stamp() -> str:
    """What the binaries are built from: the Kubernetes version and the module's pins."""
    parts = [(NODE_MODULE / f).read_bytes() for f in ("go.sum", "pause/main.go")]
    return f"{KUBE_VERSION} {images.digest(parts)}"


def ensure_binaries(assets: Path = ASSETS) -> Path:
    """Build kubelet, kube-proxy and pause into `assets` unless their stamps match.
    A cold build of kubelet and kube-proxy takes many minutes on two cores."""
    want = stamp()
    missing = [
        b for b in BINARIES if not (assets / b).exists() or _read(assets / f".stamp-{b}") != want
    ]
    if not missing:
        return assets
    assets.mkdir(parents=True, exist_ok=True)
    minor = KUBE_VERSION.split(".")[1]
    ld = ["-s", "-w"]
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        ld += [
            f"-X {pkg}.gitVersion={KUBE_VERSION}",
            f"-X {pkg}.gitMajor=1",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    pkgs = {
        "kubelet": "k8s.io/kubernetes/cmd/kubelet",
        "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        "pause": "./pause",
    }
    env = {
        **os.environ,
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "GOFLAGS": "-mod=readonly -buildvcs=false",
    }
    with tempfile.TemporaryDirectory(dir=assets) as tmp:
        cmd = [
            "go",
            "build",
            "-trimpath",
            "-ldflags",
            " ".join(ld),
            "-o",
            tmp + "/",
            *(pkgs[b] for b in missing),
        ]
        with progress.step(
            f"building {', '.join(missing)} for the real node (once per machine: minutes)",
            done=f"in {assets}",
        ):
            proc = subprocess.run(cmd, cwd=NODE_MODULE, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise NodeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
        for b in missing:
            os.replace(Path(tmp) / b, assets / b)
            (assets / f".stamp-{b}").write_text(want)
    return assets


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# --------------------------------------------------------------------------- configuration


def containerd_config(work: Path, root: Path) -> str:
    """containerd's configuration: its persistent `root` (images) and every other path
    under `work`; the CRI plugin with the local pause image, the Debian CNI plugins and
    this node's CNI folder. OOM score adjustments are only ever raised (root here lacks
    CAP_SYS_RESOURCE)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}"
state = "{work}/containerd/state"
[grpc]
  address = "{work}/containerd.sock"
[ttrpc]
  address = "{work}/containerd-ttrpc.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{work}/containerd/opt"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [{cri}.cni]
    bin_dir = "{CNI_PLUGINS}"
    conf_dir = "{work}/cni"
  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""


def cni_config(work: Path) -> dict[str, Any]:
    """The bridge network of the pods, addresses from POD_CIDR kept under `work`."""
    return {
        "cniVersion": "0.4.0",
        "name": "metis",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(work / "cni-ipam"),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
        ],
    }


def kubelet_config(work: Path, port: int, healthz_port: int) -> dict[str, Any]:
    """The kubelet's settings for a node on a shared machine: cgroupfs without QoS
    cgroups, no eviction of a busy disk, pod DNS at the bridge.

    In-place pod resizing is off: nothing here resizes a pod, and without QoS cgroups the
    kubelet's resize path reads a pod cgroup that its no-op manager never made (nil) and
    panics (kubernetes/kubernetes#137999). It did, once, at a starting indexer pod whose
    resources it had no record of ("Missing actuated resource record"), taking the node
    down for the rest of a test run."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "containerRuntimeEndpoint": f"unix://{work}/containerd.sock",
        "failSwapOn": False,
        "clusterDNS": [GATEWAY],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(work / "resolv.conf"),
        "podLogsDir": str(work / "pod-logs"),
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "localStorageCapacityIsolation": False,
        "serializeImagePulls": False,
        "featureGates": {"InPlacePodVerticalScaling": False},
    }


def kube_proxy_config(kubeconfig: Path, healthz_port: int, metrics_port: int) -> dict[str, Any]:
    """kube-proxy in iptables mode; conntrack left as the machine has it (no sysctl)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def service_hosts(services: Sequence[dict[str, Any]]) -> str:
    """A hosts file naming each Service with a ClusterIP by its short and full names."""
    lines = []
    for svc in services:
        ip = svc.get("spec", {}).get("clusterIP")
        if not ip or ip == "None":
            continue
        meta = svc["metadata"]
        short = f"{meta['name']}.{meta['namespace']}.svc"
        lines.append(f"{ip} {short} {short}.{CLUSTER_DOMAIN}")
    return "".join(f"{line}\n" for line in sorted(lines))


def claim_volume(claim: dict[str, Any], folder: Path) -> dict[str, Any] | None:
    """The hostPath PersistentVolume that serves `claim` from `folder`, or None when
    the claim is not waiting for one (it names a volume, or asks a storage class)."""
    spec = claim.get("spec", {})
    if spec.get("volumeName") or spec.get("storageClassName") not in (None, ""):
        return None
    meta = claim["metadata"]
    return {
        "metadata": {
            "name": volume_name(meta["namespace"], meta["name"]),
            "labels": {"metis.astraeus.io/node-provisioned": "true"},
        },
        "spec": {
            "capacity": {
                "storage": spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")
            },
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
            "claimRef": {
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta.get("uid"),
            },
        },
    }


def volume_name(namespace: str, claim: str) -> str:
    h = hashlib.sha256(f"{namespace}/{claim}".encode()).hexdigest()[:8]
    return f"node-{namespace}-{claim}"[:54] + f"-{h}"


def node_rules(saved: str, network: str = "metis") -> tuple[list[list[str]], list[str]]:
    """From one table of `iptables-save`: the node's own chains (kube-proxy's and the
    kubelet's `KUBE-*`, the CNI plugin's per-pod `CNI-*` of `network`) and the rules of
    other chains that lead into them or carry `network`'s tag (each as the arguments
    of `iptables -D`). A pod the kubelet never stopped leaves them behind."""
    tag = f'name: "{network}"'
    rules: list[list[str]] = []
    chains = [line[1:].split()[0] for line in saved.splitlines() if line.startswith(":KUBE-")]
    parsed = [shlex.split(line)[1:] for line in saved.splitlines() if line.startswith("-A ")]
    for args in parsed:
        if any(tag in a for a in args) and args[0].startswith("CNI-") and args[0] not in chains:
            chains.append(args[0])
    for args in parsed:
        target = args[args.index("-j") + 1] if "-j" in args else ""
        if args[0] not in chains and (target in chains or any(tag in a for a in args)):
            rules.append(args)
    return rules, chains


def model_service(namespace: str, name: str, port: int) -> list[dict[str, Any]]:
    """Service `name` without a selector, port 80, and the EndpointSlice that names the
    host's address on the pods' bridge at `port`: pods and the operator reach a model
    server of the host (listening on GATEWAY) through it, as through any Service."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-host",
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": name},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        },
    ]


def host_command(resolv_conf: Path, argv: Sequence[str]) -> list[str]:
    """`argv` run in its own mount namespace whose /etc/resolv.conf is `resolv_conf` (the
    node's DNS): a process on the host (the operator) then reaches `<svc>.<ns>.svc` as
    pods do, and the machine's own resolv.conf is left alone."""
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(resolv_conf),
        *argv,
    ]


def ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def without_not_ready_taint(node: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The node's taints without `not-ready`, or None when there is nothing to remove."""
    taints = node.get("spec", {}).get("taints") or []
    kept = [t for t in taints if t["key"] != NOT_READY_TAINT]
    return kept if len(kept) != len(taints) else None


# --------------------------------------------------------------------------- processes


@dataclasses.dataclass
class _Proc:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # A killed owner (a SIGKILLed `metis-dev`) takes its node processes along.
                preexec_fn=die_with_parent,
            )

    def tail(self, chars: int = 4000) -> str:
        return _read(self.log)[-chars:]

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise NodeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    alive: Callable[[], None] = lambda: None,
) -> T:
    """Poll `check` until it returns something truthy, or fail naming `what` and the
    last error `check` raised (state converges asynchronously: no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        alive()
        try:
            value = check()
            if value:
                return value
            last = None
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            detail = f"; last error: {last!r}" if last is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(0.2)


def _sh(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")


class _Keeper(threading.Thread):
    """The node's housekeeping loop: the DNS hosts file, PersistentVolumes for claims
    without one, the not-ready taint. Polls the API server every half second."""

    def __init__(self, kubeconfig: Path, work: Path) -> None:
        super().__init__(name="metis-node-keeper", daemon=True)
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        self.work = work
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            try:
                self.tick()
            except client.ApiException as e:
                self.error = e  # the API server refused once: the next tick tries again
            except Exception as e:
                self.error = e
                raise

    def tick(self) -> None:
        sanitize = self.api.api_client.sanitize_for_serialization
        services = sanitize(self.api.list_service_for_all_namespaces().items)
        hosts = self.work / "dns" / "services"
        text = service_hosts(services)
        if _read(hosts) != text:
            tmp = hosts.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, hosts)
        for claim in sanitize(self.api.list_persistent_volume_claim_for_all_namespaces().items):
            if claim.get("status", {}).get("phase") != "Pending":
                continue
            meta = claim["metadata"]
            folder = self.work / "volumes" / volume_name(meta["namespace"], meta["name"])
            pv = claim_volume(claim, folder)
            if pv is None:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o777)  # as local-path does: the pod's user owns nothing here
            with contextlib.suppress(client.ApiException):  # made on an earlier tick
                self.api.create_persistent_volume(pv)
        with contextlib.suppress(client.ApiException):
            node = sanitize(self.api.read_node(NODE_NAME))
            taints = without_not_ready_taint(node)
            if ready(node) and taints is not None:
                self.api.patch_node(NODE_NAME, {"spec": {"taints": taints}})


class Node:
    """containerd + CNI bridge + dnsmasq + kubelet + kube-proxy under `work`.

    `kubeconfig` names a user the API server lets register and run a node (the test
    cluster's admin). Images are handed to containerd by `load`."""

    def __init__(
        self,
        kubeconfig: Path,
        work: Path,
        assets: Path = ASSETS,
        containerd_root: Path = CONTAINERD_ROOT,
        claimed: int | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.work = work
        self.assets = assets
        self.containerd_root = containerd_root
        self.socket = work / "containerd.sock"
        self.resolv_conf = work / "resolv.conf"
        self.procs: list[_Proc] = []
        self.keeper: _Keeper | None = None
        self.started_in = 0.0
        self._lock = claimed
        """The machine's node lock (`claim`), held from the start to the stop."""

    def __enter__(self) -> Node:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> _Proc:
        p = _Proc(name, argv, self.work / f"{name}.log")
        p.start()
        self.procs.append(p)
        return p

    def check(self) -> None:
        """Raise with a component's log if one exited, or if the housekeeping loop died."""
        for p in self.procs:
            p.check()
        if self.keeper is not None and not self.keeper.is_alive():
            raise NodeError(f"the node's housekeeping loop stopped: {self.keeper.error!r}")

    def start(self) -> Node:
        t0 = time.monotonic()
        if self._lock is None:
            self._lock = claim()
        if self._lock is None:
            raise NodeError(_busy(LOCK))
        w = self.work
        for sub in ("cni", "dns", "volumes", "pod-logs", "kubelet", "containerd"):
            (w / sub).mkdir(parents=True, exist_ok=True)
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        (w / "containerd.toml").write_text(containerd_config(w, self.containerd_root))
        (w / "cni" / "10-metis.conflist").write_text(json.dumps(cni_config(w)))
        self.resolv_conf.write_text(f"nameserver {GATEWAY}\n")
        (w / "dns" / "services").write_text("")
        # The API server's own ServiceCIDR object says where ClusterIPs come from.
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self._bridge(client.NetworkingV1Api(api).read_service_cidr("kubernetes").spec.cidrs)
        self._spawn(
            "dnsmasq",
            [
                "dnsmasq",
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                f"--listen-address={GATEWAY}",
                "--bind-interfaces",
                f"--hostsdir={w / 'dns'}",
                f"--local=/{CLUSTER_DOMAIN}/",
                "--local=/svc/",
                f"--pid-file={w / 'dnsmasq.pid'}",
                "--log-facility=-",
                # as root: it reads the hosts folder of a work dir only root may enter
                "--user=root",
            ],
        )
        containerd = self._spawn(
            "containerd", ["containerd", "--config", str(w / "containerd.toml")]
        )
        wait_for(self.socket.exists, timeout=60, what="containerd's socket", alive=containerd.check)
        podman = images.Podman()
        images.make_pause(podman, self.assets / "pause", PAUSE_IMAGE)
        self.load(podman, PAUSE_IMAGE)
        kport, kh, ph, pm = (free_port() for _ in range(4))
        (w / "kubelet.yaml").write_text(json.dumps(kubelet_config(w, kport, kh)))
        (w / "kube-proxy.yaml").write_text(json.dumps(kube_proxy_config(self.kubeconfig, ph, pm)))
        self._spawn(
            "kubelet",
            [
                str(self.assets / "kubelet"),
                f"--config={w / 'kubelet.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={w / 'kubelet'}",
                f"--cert-dir={w / 'kubelet' / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-proxy",
            [str(self.assets / "kube-proxy"), f"--config={w / 'kube-proxy.yaml'}", "--v=1"],
        )
        self.keeper = _Keeper(self.kubeconfig, w)
        self.keeper.start()
        api = self.keeper.api
        sanitize = api.api_client.sanitize_for_serialization

        def node_ready() -> bool:
            try:
                node = sanitize(api.read_node(NODE_NAME))
            except client.ApiException:
                return False
            return ready(node) and without_not_ready_taint(node) is None

        wait_for(node_ready, timeout=180, what=f"node {NODE_NAME} Ready", alive=self.check)
        self.started_in = time.monotonic() - t0
        return self

    def _bridge(self, service_cidrs: Sequence[str]) -> None:
        """The pods' bridge with the host's address on it, made before dnsmasq binds
        there (the CNI plugin takes a bridge that exists)."""
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
            _sh("ip", "link", "add", BRIDGE, "type", "bridge")
        addrs = subprocess.run(
            ["ip", "-4", "addr", "show", BRIDGE], capture_output=True, text=True
        ).stdout
        if f"{GATEWAY}/" not in addrs:
            _sh("ip", "addr", "add", f"{GATEWAY}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
        _sh("ip", "link", "set", BRIDGE, "up")
        # ClusterIPs go to the bridge, never out of the machine: a connection opened
        # before kube-proxy wrote a Service's rules would otherwise leave by the default
        # route (here to an egress proxy answering 404), and keep-alive keeps it there.
        for cidr in service_cidrs:
            if ":" not in cidr:
                _sh("ip", "route", "replace", cidr, "dev", BRIDGE)

    def load(self, podman: images.Podman, ref: str) -> None:
        """Hand image `ref` (built by podman) to this node's containerd."""
        images.import_into(podman, ref, self.socket)

    def ctr(self, *args: str) -> str:
        """`ctr` against this node's containerd, in the kubelet's namespace."""
        proc = subprocess.run(
            ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def host_command(self, argv: Sequence[str]) -> list[str]:
        """`argv` resolving names by the node's DNS (`host_command`)."""
        return host_command(self.resolv_conf, argv)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The kubelet stopped (SIGSTOP) for a while: a pod bound meanwhile does not
        start, a changed ConfigMap does not reach its pod; running containers go on.
        A node's kubelet that stalls, as a busy or swapping machine's does."""
        (kubelet,) = (p for p in self.procs if p.name == "kubelet")
        assert kubelet.proc is not None
        kubelet.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            kubelet.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the pods' containers, every process, remove the bridge and the Node
        object (the scheduler would otherwise still place pods on it)."""
        if self.keeper is not None:
            self.keeper.stopping.set()
        for p in reversed(self.procs):
            if p.name == "containerd":
                self._remove_containers()
            p.stop()
        if self.keeper is not None:
            with contextlib.suppress(client.ApiException, OSError):
                self.keeper.api.delete_node(NODE_NAME)
        self._unmount()
        with contextlib.suppress(NodeError):
            _sh("ip", "link", "del", BRIDGE)
        release_rules()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _unmount(self) -> None:
        """The kubelet's and containerd's mounts under the work dir (volumes, shm,
        network namespaces, root filesystems), deepest first: nothing stays busy."""
        prefix = str(self.work.resolve()) + "/"
        points = [line.split()[1] for line in _read(Path("/proc/self/mounts")).splitlines()]
        for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)

    def _remove_containers(self) -> None:
        """What the kubelet started lives in runc shims outside containerd's process
        group: kill the tasks so none outlives the node; then remove the containers and
        their snapshots from the root the next node reuses (its images stay)."""
        with contextlib.suppress(NodeError):
            for task in self.ctr("tasks", "ls", "-q").split():
                with contextlib.suppress(NodeError):
                    self.ctr("tasks", "kill", "-s", "SIGKILL", task)
            for task in self.ctr("tasks", "ls", "-q").split():
                with contextlib.suppress(NodeError):
                    self.ctr("tasks", "delete", "-f", task)
            for container in self.ctr("containers", "ls", "-q").split():
                with contextlib.suppress(NodeError):
                    self.ctr("containers", "rm", container)


def release_rules(tables: Sequence[str] = ("nat", "filter", "mangle")) -> None:
    """Remove the node's iptables rules and chains (`node_rules`) from `tables`."""
    for table in tables:
        saved = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True)
        rules, chains = node_rules(saved.stdout)
        for rule in rules:
            subprocess.run(["iptables", "-t", table, "-D", *rule], capture_output=True)
        for flag in ("-F", "-X"):
            for chain in chains:
                subprocess.run(["iptables", "-t", table, flag, chain], capture_output=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
