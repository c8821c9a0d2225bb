"""The control plane's binaries: built once per machine by build.sh from the pinned Go
modules in go/, into ~/.cache/metis/kube/<version> (or $METIS_KUBE_ASSETS)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from metis_dev.process import ControlPlaneError

BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"
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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_binaries(timeout: float = 3600.0, echo: Callable[[str], None] | None = None) -> Path:
    """Build whatever is missing (only the first run on a machine pays) and
    return the asset directory. build.sh is idempotent and locks its cache.
    Its progress goes to `echo` (default: stderr) as it comes, since a cold
    build takes minutes."""
    bin_dir = assets_dir()
    if not missing_binaries(bin_dir):
        return bin_dir
    say = echo or _stderr
    say(
        f"building the Kubernetes binaries into {bin_dir} from Go modules: the first run on "
        "this machine pays it (about 5 minutes on 2 idle cores, more under load)"
    )
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
