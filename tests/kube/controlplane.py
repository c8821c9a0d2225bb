"""A real Kubernetes control plane for tests: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler as child processes on loopback.

Why: CRD schema and CEL validation, the status subresource, ownerReferences
and garbage collection, resourceVersion conflicts and watches only behave
truly in a real apiserver. The binaries are built from Go modules by
tests/kube/build.sh (no Docker, no downloads). This module is plain Python (no
pytest) so a script or a REPL can start the same cluster:

    from tests.kube.controlplane import running

    with running() as cp:
        cp.kubectl("get", "nodes")

There is no kubelet. The helpers `add_node` and `mark_pod_running` act as one
where a test needs it, and a small background reaper finishes the graceful
deletion of pods bound to a node (a kubelet's job), so that garbage
collection and namespace deletion complete.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kstatus",
)
"""`kstatus` is not Kubernetes: sigs.k8s.io/cli-utils' status computation (what Flux
reads) as a small checker, built by build.sh beside the others."""

# Controllers that a test cluster needs. Deliberately absent: node-lifecycle
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
)
SERVICE_CIDR = "10.0.0.0/24"
ADMIN_USER = "metis-admin"

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A component failed to build, start or become ready."""


# --------------------------------------------------------------------------- assets


def assets_dir() -> Path:
    """Where build.sh keeps the binaries (METIS_KUBE_ASSETS or the per-version cache)."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def missing_binaries(bin_dir: Path) -> list[str]:
    """Binaries that are not built yet in `bin_dir`."""
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def ensure_binaries(timeout: float = 3600.0, echo: Callable[[str], None] | None = None) -> Path:
    """Build whatever is missing (only the first run on a machine pays) and
    return the asset directory. build.sh is idempotent and locks its cache.
    Its progress goes to `echo` (default: stderr) as it comes, since a cold
    build takes minutes."""
    bin_dir = assets_dir()
    if not missing_binaries(bin_dir):
        return bin_dir
    say = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    say(f"building the Kubernetes test binaries into {bin_dir} (first run on this machine)")
    tail: deque[str] = deque(maxlen=80)
    proc = subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    watchdog = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            if not line.startswith("go: downloading"):
                say(line.rstrip())
        code = proc.wait()
    finally:
        watchdog.cancel()
    if code != 0 or missing_binaries(bin_dir):
        raise ControlPlaneError(
            f"{BUILD_SCRIPT} failed (exit {code}); last output:\n" + "\n".join(tail)
        )
    return bin_dir


# --------------------------------------------------------------------------- polling


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    alive: Callable[[], None] | None = None,
) -> T:
    """Poll `check` until it returns something truthy, or fail after `timeout`.

    Why: state in Kubernetes converges asynchronously; sleeping a fixed time is
    either flaky or slow. `check` may raise: the last exception is reported.
    `alive` is called every round to fail fast when a process died.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if alive is not None:
            alive()
        try:
            result = check()
            if result:
                return result
            last = None
        except Exception as exc:  # reported if the deadline passes
            last = exc
        if time.monotonic() >= deadline:
            detail = f"; last error: {last!r}" if last is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class _Pki:
    """Paths of the throw-away PKI: one CA signs the serving and client certs."""

    ca_crt: Path
    ca_key: Path
    serving_crt: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path


def _pem_key(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


class _CertAuthority:
    """A one-week CA, like envtest's TinyCA; EC P-256 keys are fast to make."""

    def __init__(self, common_name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        common_name: str,
        *,
        groups: Sequence[str] = (),
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
        server: bool = False,
    ) -> tuple[bytes, bytes]:
        """A leaf cert (PEM cert, PEM key). Client certs carry the user as CN and
        the groups as O, which is how kube-apiserver's x509 authenticator reads them."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return _pem_cert(cert), _pem_key(key)


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A port the kernel says is free on loopback now (a tiny race remains;
    a component that loses it fails to start and is retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the parent dies, so that
    not even a SIGKILLed pytest leaves an apiserver behind (Linux only)."""
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclass
class _Process:
    """One component: its command line, log file and process group."""

    name: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"$ {' '.join(self.args)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: killpg() reaches everything
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise with the log tail if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {self.proc.returncode}; "
                f"last lines of {self.log_path}:\n{self.tail()}"
            )

    def tail(self, lines: int = 40) -> str:
        try:
            data = self.log_path.read_bytes()[-64 * 1024 :]
        except OSError:
            return "(no log)"
        return _tail_text(data.decode(errors="replace"), lines)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds. Only
        once: a second call must not signal a group id the kernel reused."""
        proc = self.proc
        if proc is not None and not self._stopped:
            self._stopped = True
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                if proc.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(wait)
            # A child of the group could outlive the leader; make sure it does not.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None


_LIVE: set[ControlPlane] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    """Interpreter exit without a clean stop (an error, Ctrl-C): stop anyway."""
    with _LIVE_LOCK:
        planes = list(_LIVE)
    for cp in planes:
        cp.stop()


WORKDIR_PREFIX = "metis-kube-"


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


def _has_default_route() -> bool:
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


def _non_loopback_ipv4() -> str:
    """An address to advertise when there is no default route. It is only
    written into the `kubernetes` Endpoints, never bound, so a documentation
    address is an acceptable last resort."""
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            addr = str(info[4][0])
            if not ipaddress.ip_address(addr).is_loopback:
                return addr
    return "198.51.100.1"


# --------------------------------------------------------------------------- the cluster


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler.

    Everything lives in a temporary directory (certs, etcd data, kubeconfigs,
    one log per component). `stop()` kills every process group; it also runs
    at interpreter exit, and each child dies with its parent (PR_SET_PDEATHSIG).
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
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        self.keep_workdir = keep_workdir
        self.start_timeout = start_timeout
        self.controllers = tuple(controllers)
        self.with_scheduler = scheduler
        self.reap_terminating_pods = reap_terminating_pods
        self.audit_policy = audit_policy
        self.audit_log = self.workdir / "audit.log"
        """The API server's audit log (JSON lines), written when `audit_policy` is set."""
        self.kubectl_path = self.bin_dir / "kubectl"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.server = ""
        self.procs: dict[str, _Process] = {}
        self._pki: _Pki | None = None
        self._ca: _CertAuthority | None = None
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
            self._make_pki()
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            self._start_controller_manager()
            if self.with_scheduler:
                self._start_scheduler()
            self._wait_cluster_usable()
            if self.reap_terminating_pods:
                self._reaper = threading.Thread(
                    target=self._reap_loop, name="kube-pod-reaper", daemon=True
                )
                self._reaper.start()
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

    def log_tail(self, component: str, lines: int = 40) -> str:
        """The last lines of a component's log, for error messages."""
        return self.procs[component].tail(lines)

    # -- PKI and kubeconfigs --------------------------------------------------

    def _make_pki(self) -> None:
        d = self.workdir / "pki"
        d.mkdir(parents=True, exist_ok=True)
        ca = _CertAuthority("metis-test-ca")
        self._ca = ca
        ca_crt = _write(d / "ca.crt", _pem_cert(ca.cert), 0o644)
        ca_key = _write(d / "ca.key", _pem_key(ca.key))
        crt, key = ca.issue(
            "kube-apiserver",
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ips=["127.0.0.1", "10.0.0.1"],
            server=True,
        )
        serving_crt = _write(d / "apiserver.crt", crt, 0o644)
        serving_key = _write(d / "apiserver.key", key)
        # Service-account tokens: RSA, the algorithm every client expects (RS256).
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        sa_key = _write(d / "sa.key", _pem_key(sa))
        sa_pub = _write(
            d / "sa.pub",
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            0o644,
        )
        self._pki = _Pki(ca_crt, ca_key, serving_crt, serving_key, sa_key, sa_pub)

    def write_kubeconfig(
        self, path: Path, user: str, groups: Sequence[str] = ("system:masters",)
    ) -> Path:
        """A kubeconfig for `user` (client-certificate auth, certs inlined)."""
        assert self._ca is not None and self._pki is not None
        crt, key = self._ca.issue(user, groups=groups)

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "metis-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(self._pki.ca_crt.read_bytes()),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)},
                }
            ],
            "contexts": [
                {"name": "metis-test", "context": {"cluster": "metis-test", "user": user}}
            ],
            "current-context": "metis-test",
        }
        _write(path, yaml.safe_dump(cfg, sort_keys=False).encode())
        return path

    def _client_ssl(self) -> ssl.SSLContext:
        """An mTLS context with the admin identity, for probes and `rest()`."""
        assert self._ca is not None and self._pki is not None
        if self._ssl is None:
            d = self.workdir / "pki"
            crt, key = self._ca.issue(ADMIN_USER, groups=["system:masters"])
            _write(d / "admin.crt", crt)
            _write(d / "admin.key", key)
            ctx = ssl.create_default_context(cafile=str(self._pki.ca_crt))
            ctx.load_cert_chain(str(d / "admin.crt"), str(d / "admin.key"))
            self._ssl = ctx
        return self._ssl

    # -- components -----------------------------------------------------------

    def _launch(
        self,
        name: str,
        make_args: Callable[[], list[str]],
        ready: Callable[[], bool],
        what: str,
    ) -> None:
        """Start a component and wait for `ready`; retry when it lost a port race."""
        for attempt in range(3):
            proc = _Process(name, make_args(), self.workdir / f"{name}.log")
            self.procs[name] = proc
            proc.start()
            try:
                wait_for(ready, timeout=self.start_timeout, what=what, alive=proc.check_alive)
                return
            except ControlPlaneError:
                retry = "address already in use" in proc.tail(200) and attempt < 2
                proc.stop()
                if not retry:
                    raise
            except TimeoutError as exc:
                proc.stop()
                raise ControlPlaneError(
                    f"{exc}; last lines of {proc.log_path}:\n{proc.tail()}"
                ) from exc

    @staticmethod
    def _http_ok(url: str, ctx: ssl.SSLContext | None = None, body: str | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                text = resp.read().decode(errors="replace")
                return resp.status == 200 and (body is None or body in text)
        except (urllib.error.URLError, OSError):
            return False

    def _start_etcd(self) -> str:
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

        self._launch(
            "etcd",
            args,
            lambda: self._http_ok(f"{url}/health", body='"health":"true"'),
            "etcd /health",
        )
        return url

    def _start_apiserver(self, etcd_url: str) -> None:
        pki = self._pki
        assert pki is not None

        def args() -> list[str]:
            port = free_port()
            self.server = f"https://127.0.0.1:{port}"
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
                f"--service-account-issuer={self.server}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--enable-priority-and-fairness=false",  # fewer moving parts, faster start
                "--profiling=false",
            ]
            # Loopback is refused as an advertise address; without a default
            # route, the apiserver cannot choose one itself.
            if self.audit_policy is not None:
                a += [
                    f"--audit-policy-file={self.audit_policy}",
                    f"--audit-log-path={self.audit_log}",
                    "--audit-log-format=json",
                    "--audit-log-mode=blocking",
                ]
            advertise = os.environ.get("METIS_KUBE_ADVERTISE_ADDRESS")
            if advertise or not _has_default_route():
                a.append(f"--advertise-address={advertise or _non_loopback_ipv4()}")
            return a

        self._launch(
            "kube-apiserver",
            args,
            lambda: self._http_ok(f"{self.server}/readyz", self._client_ssl(), body="ok"),
            "kube-apiserver /readyz",
        )
        self.write_kubeconfig(self.kubeconfig, ADMIN_USER)

    def _start_controller_manager(self) -> None:
        pki = self._pki
        assert pki is not None
        kubeconfig = self.write_kubeconfig(
            self.workdir / "kube-controller-manager.kubeconfig", "metis:kube-controller-manager"
        )
        port = 0

        def args() -> list[str]:
            nonlocal port
            port = free_port()
            return [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                "--leader-elect=false",
                f"--controllers={','.join(self.controllers)}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_crt}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--profiling=false",
            ]

        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving cert; probe only
        self._launch(
            "kube-controller-manager",
            args,
            lambda: self._http_ok(f"https://127.0.0.1:{port}/healthz", insecure, body="ok"),
            "kube-controller-manager /healthz",
        )

    def _start_scheduler(self) -> None:
        kubeconfig = self.write_kubeconfig(
            self.workdir / "kube-scheduler.kubeconfig", "metis:kube-scheduler"
        )
        port = 0

        def args() -> list[str]:
            nonlocal port
            port = free_port()
            return [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--leader-elect=false",
                # An unschedulable pod is tried again within seconds, not 5 minutes:
                # the claims the test kubelet binds a moment after the pod appeared
                # do not always requeue it, and a test should not wait minutes.
                "--pod-max-in-unschedulable-pods-duration=5s",
                "--profiling=false",
            ]

        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        self._launch(
            "kube-scheduler",
            args,
            lambda: self._http_ok(f"https://127.0.0.1:{port}/healthz", insecure, body="ok"),
            "kube-scheduler /healthz",
        )

    def _wait_cluster_usable(self) -> None:
        """Ready endpoints are not enough for tests: the `default` namespace and
        its `default` service account (the ServiceAccount admission plugin
        refuses pods without it) must exist, and the scheduler must be running."""
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
            self.kubectl_path, self.kubeconfig, cache, *args, input=input, check=check,
            timeout=timeout,
        )  # fmt: skip

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
                "kubeletVersion": "v0.0.0-metis-test",
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
        return api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": taints or None}})

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
        return api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status})

    def _reap_loop(self) -> None:
        """Finish graceful deletion of pods bound to a node, the kubelet's part:
        without it, pods deleted by the garbage collector, a ReplicaSet or the
        namespace controller would stay Terminating forever."""
        api = self.rest()
        while not self._stopped.wait(0.5):
            try:
                pods = api.get("/api/v1/pods")["items"]
            except (KubeApiError, OSError):  # the apiserver may be stopping
                continue
            for pod in pods:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp") and pod["spec"].get("nodeName"):
                    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                    body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
                    with contextlib.suppress(KubeApiError, OSError):
                        api.delete(path, body)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeApiError(RuntimeError):
    """A non-2xx answer from kube-apiserver (status code and Status body)."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"HTTP {status}: {message}")


class KubeRest:
    """A tiny JSON client for kube-apiserver with the admin client certificate.

    Why not the `kubernetes` package here: the helpers must not depend on the
    generated client's model and content-type quirks, which change between
    its major versions; plain JSON over mTLS does not."""

    def __init__(self, server: str, ctx: ssl.SSLContext, timeout: float = 15.0) -> None:
        self.server = server
        self.ctx = ctx
        self.timeout = timeout

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.ctx) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise KubeApiError(exc.code, exc.read().decode(errors="replace")) from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        """A JSON merge patch (lists are replaced, null deletes a field)."""
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)


def run_kubectl(
    kubectl: Path | str,
    kubeconfig: Path | str,
    *args: str,
    input: str | None = None,
    check: bool = True,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run kubectl with an explicit kubeconfig (never the user's own)."""
    cmd = [str(kubectl), f"--kubeconfig={kubeconfig}", *args]
    proc = subprocess.run(
        cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise ControlPlaneError(
            f"kubectl {' '.join(args)} failed (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()}\n{proc.stdout.strip()}".rstrip()
        )
    return proc


def kubectl_json(cp: ControlPlane, *args: str) -> Any:
    """`kubectl ... -o json`, parsed."""
    return json.loads(cp.kubectl(*args, "-o", "json").stdout)


@contextlib.contextmanager
def running(bin_dir: Path | None = None, **kwargs: Any) -> Iterator[ControlPlane]:
    """Build if needed, start a control plane, and stop it afterwards."""
    cp = ControlPlane(bin_dir or ensure_binaries(), **kwargs)
    with cp:
        yield cp


def gone(kube: ControlPlane, path: str) -> bool:
    """True once GET `path` answers 404."""
    try:
        kube.rest().get(path)
    except KubeApiError as exc:
        if exc.status == 404:
            return True
        raise
    return False
