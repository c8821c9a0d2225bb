"""The control plane's components and how each starts: etcd, kube-apiserver with
envtest's flags, and one launcher for kube-controller-manager and kube-scheduler (they
take the same flags but for their own). Each waits for its health endpoint with a
deadline and is started again when it lost a port race."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metis_dev.pki import Pki
from metis_dev.process import ControlPlaneError, Process, free_port, wait_for

# Controllers that a local cluster needs. Deliberately absent: node-lifecycle
# (it would taint and evict our kubelet-less nodes), cloud and IPAM controllers.
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "garbage-collector-controller",
    "namespace-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "endpointslice-controller",
    "clusterrole-aggregation-controller",
    "pod-garbage-collector-controller",
    "ttl-after-finished-controller",
    "cronjob-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "disruption-controller",
)
ENDPOINTS = "endpoints-controller"
"""Left out of the default set: the stand-in node's pods have no address the API server's
proxy could reach (tests write Endpoints themselves); `metis-dev cluster up` with a real
node adds it."""
SERVICE_CIDR = "10.0.0.0/16"
"""Room for a Service per base of the scale benchmark (1,000 bases; a /24 held 254)."""
SERVICE_IP = "10.0.0.1"
"""The `kubernetes` Service's address in SERVICE_CIDR, named in the serving certificate."""


def http_ok(url: str, ctx: ssl.SSLContext | None = None, body: str | None = None) -> bool:
    """Does `url` answer 200 (with `body` in its text)?"""
    try:
        with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
            text = resp.read().decode(errors="replace")
            return resp.status == 200 and (body is None or body in text)
    except (urllib.error.URLError, OSError):
        return False


def _self_signed_probe() -> ssl.SSLContext:
    """For the controllers' own /healthz: their serving certs are self-signed."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    return insecure


def has_default_route() -> bool:
    """kube-apiserver picks its advertise address from the default route when
    it binds to loopback; without one it refuses to start ("Unable to find
    suitable network address"). Same test as its own: a usable (up, not
    reject) default route on an interface other than lo."""

    def usable(flags: str) -> bool:
        return bool(int(flags, 16) & 0x1) and not int(flags, 16) & 0x200  # RTF_UP, RTF_REJECT

    with contextlib.suppress(OSError):
        for row in Path("/proc/net/route").read_text().splitlines()[1:]:
            c = row.split()  # Iface Destination Gateway Flags ...
            if len(c) > 3 and c[0] != "lo" and c[1] == "00000000" and usable(c[3]):
                return True
    with contextlib.suppress(OSError):
        for row in Path("/proc/net/ipv6_route").read_text().splitlines():
            c = row.split()  # dest plen src plen nexthop metric refcnt use flags iface
            default = len(c) == 10 and c[0] == "0" * 32 and c[1] == "00"
            if default and c[9] != "lo" and usable(c[8]):
                return True
    return False


def non_loopback_ipv4() -> str:
    """An address to advertise when there is no default route. It is only
    written into the `kubernetes` Endpoints, never bound, so a documentation
    address is an acceptable last resort."""
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            addr = str(info[4][0])
            if not ipaddress.ip_address(addr).is_loopback:
                return addr
    return "198.51.100.1"


@dataclass
class Launcher:
    """Starts components into `workdir` (one log each) and records them in `procs`,
    so that whoever owns `procs` stops them, even after a failed start."""

    bin_dir: Path
    workdir: Path
    timeout: float
    procs: dict[str, Process] = field(default_factory=dict)

    def launch(
        self,
        name: str,
        make_args: Callable[[], list[str]],
        ready: Callable[[], bool],
        what: str,
    ) -> Process:
        """Start a component and wait for `ready`; retry when it lost a port race."""
        attempt = 0
        while True:
            attempt += 1
            proc = Process(name, make_args(), self.workdir / f"{name}.log")
            self.procs[name] = proc
            proc.start()
            try:
                wait_for(ready, timeout=self.timeout, what=what, alive=proc.check_alive)
                return proc
            except ControlPlaneError:
                retry = "address already in use" in proc.tail(200) and attempt < 3
                proc.stop()
                if not retry:
                    raise
            except TimeoutError as exc:
                proc.stop()
                raise ControlPlaneError(
                    f"{exc}; last lines of {proc.log_path}:\n{proc.tail()}"
                ) from exc

    def etcd(self) -> str:
        """Start etcd; its client URL."""
        url = ""

        def args() -> list[str]:
            nonlocal url
            shutil.rmtree(self.workdir / "etcd", ignore_errors=True)  # a retry starts afresh
            url = f"http://127.0.0.1:{free_port()}"
            peer = f"http://127.0.0.1:{free_port()}"
            return [
                str(self.bin_dir / "etcd"),
                "--name=metis-test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=metis-test={peer}",
                "--unsafe-no-fsync=true",  # throw-away data; fsync only costs time
                "--log-level=warn",
            ]

        self.launch(
            "etcd", args, lambda: http_ok(f"{url}/health", body='"health":"true"'), "etcd /health"
        )
        return url

    def apiserver(
        self,
        etcd_url: str,
        pki: Pki,
        client: ssl.SSLContext,
        audit: tuple[Path, Path] | None = None,
    ) -> str:
        """Start kube-apiserver with envtest's flags; its URL. `client` (mTLS as an
        admin) probes /readyz; `audit` is (policy file, log file)."""
        server = ""

        def args() -> list[str]:
            nonlocal server
            port = free_port()
            server = f"https://127.0.0.1:{port}"
            a = [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_crt}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_crt}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={server}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--enable-priority-and-fairness=false",  # fewer moving parts, faster start
                "--profiling=false",
            ]
            if audit is not None:
                a += [
                    f"--audit-policy-file={audit[0]}",
                    f"--audit-log-path={audit[1]}",
                    "--audit-log-format=json",
                    "--audit-log-mode=blocking",
                ]
            # Loopback is refused as an advertise address; without a default
            # route, the apiserver cannot choose one itself.
            advertise = os.environ.get("METIS_KUBE_ADVERTISE_ADDRESS")
            if advertise or not has_default_route():
                a.append(f"--advertise-address={advertise or non_loopback_ipv4()}")
            return a

        self.launch(
            "kube-apiserver",
            args,
            lambda: http_ok(f"{server}/readyz", client, body="ok"),
            "kube-apiserver /readyz",
        )
        return server

    def controller(self, binary: str, kubeconfig: Path, extra: Sequence[str] = ()) -> Process:
        """Start kube-controller-manager or kube-scheduler: the flags they share,
        then `extra`. Without `--authentication-kubeconfig` (it only brings endless
        requestheader errors): their /healthz is always allowed."""
        port = 0

        def args() -> list[str]:
            nonlocal port
            port = free_port()
            return [
                str(self.bin_dir / binary),
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / f'{binary}-certs'}",
                "--leader-elect=false",
                "--profiling=false",
                *extra,
            ]

        probe = _self_signed_probe()
        return self.launch(
            binary,
            args,
            lambda: http_ok(f"https://127.0.0.1:{port}/healthz", probe, body="ok"),
            f"{binary} /healthz",
        )
