"""Flux's source-controller as a local process against a test control plane, for tests of
documents taken from Git (issue 44): it fetches what a GitRepository names and serves each
revision as a tarball, the way a cluster with Flux does.

The binary and its CRDs come from tools/source-controller/build.sh (built once a machine,
minutes; then cached, the CRDs in crds/ beside the binary). It runs as the cluster admin, its
artifact server on loopback: status.artifact.url then names 127.0.0.1, which the test reaches.

    with running_source_controller(kube, tmp_path) as controller:
        ...  # create GitRepositories; wait with controller.check_alive as `alive`
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from metis_dev.plane import ControlPlane
from metis_dev.process import Process, free_port, wait_for
from tests.support import go_tools

GROUP = "source.toolkit.fluxcd.io"


def binary() -> Path:
    """source-controller, built first where it is missing (about 6 minutes on 2 cores)."""
    return go_tools.built("source-controller")


def crds(built: Path) -> Path:
    """The folder of the CRDs of the same module version as `built`."""
    return built.parent / "crds"


def install_crds(kube: ControlPlane, built: Path) -> None:
    """Apply all of source-controller's CRDs: its manager caches every kind it serves
    (GitRepository, Bucket, OCIRepository, HelmRepository, HelmChart) and exits at start when
    one is missing ("unable to start manager … no matches for kind")."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds(built)))
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds(built)))


@dataclass
class SourceController:
    """The running controller: its process, where it keeps artifacts, its artifact server."""

    process: Process
    storage: Path
    artifacts_url: str

    def check_alive(self) -> None:
        """Raise with the log's tail if the controller has exited (for wait_for's `alive`)."""
        self.process.check_alive()

    def log(self) -> str:
        return self.process.tail(80)


@contextlib.contextmanager
def running_source_controller(kube: ControlPlane, workdir: Path) -> Iterator[SourceController]:
    """source-controller watching all namespaces of `kube`, ready (its readyz answers);
    stopped afterwards. Its log is workdir/source-controller.log."""
    built = binary()
    install_crds(kube, built)
    storage = workdir / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    artifacts, metrics, health = (f"127.0.0.1:{free_port()}" for _ in range(3))
    process = Process(
        "source-controller",
        [
            str(built),
            # No --kubeconfig flag: controller-runtime registers it on Go's flag set, which
            # source-controller's pflag parsing never sees; KUBECONFIG (below) is read instead.
            f"--storage-path={storage}",
            f"--storage-addr={artifacts}",
            # The host in status.artifact.url; by default the pod's hostname, unreachable here.
            f"--storage-adv-addr={artifacts}",
            f"--metrics-addr={metrics}",
            f"--health-addr={health}",
            "--watch-all-namespaces=true",
            "--enable-leader-election=false",
            # Events go to the API server only: no notification-controller to post them to.
            "--events-addr=",
            "--log-encoding=console",
            "--log-level=debug",
        ],
        workdir / "source-controller.log",
        env={"KUBECONFIG": str(kube.kubeconfig)},
    ).start()
    controller = SourceController(process, storage, f"http://{artifacts}")
    try:
        wait_for(
            lambda: _answers(f"http://{health}/readyz"),
            timeout=60,
            what=f"source-controller's readyz ({process.log_path})",
            alive=controller.check_alive,
        )
        yield controller
    finally:
        process.stop()


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bool(resp.status == 200)
