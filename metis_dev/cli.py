"""`metis-dev`: the local cluster anyone can run.

    metis-dev cluster up --dir DIR [--audit-log FILE]
    metis-dev build

`cluster up` builds or reuses the cached binaries, starts etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and the stand-in kubelet, writes DIR/kubeconfig
once the cluster is usable, and runs until SIGINT or SIGTERM, then stops every process it
started. Pods run as local processes: there is no container runtime here.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from metis_dev.build import assets_dir, ensure_binaries, missing_binaries
from metis_dev.kubelet import Kubelet
from metis_dev.pki import write
from metis_dev.plane import ControlPlane
from metis_dev.process import ControlPlaneError

NODE = "metis-local"
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""
LOCAL_PODS = (
    "Pods run as local processes: there is no container runtime here. The stand-in kubelet\n"
    "starts each Metis indexer pod as a local `metis serve` (its volumes are hostPath\n"
    "folders); other pods are scheduled but never run. A Service is reached at 127.0.0.1\n"
    "on its port: run the operator with METIS_URL_TEMPLATE='http://127.0.0.1:{port}'."
)


def say(line: str) -> None:
    print(line, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metis-dev", description="Metis' developer tools")
    sub = p.add_subparsers(dest="command", required=True)
    cluster = sub.add_parser("cluster", help="a local Kubernetes control plane")
    actions = cluster.add_subparsers(dest="action", required=True)
    up = actions.add_parser(
        "up",
        help="start a local cluster and run until interrupted",
        description="Builds or reuses the binaries, starts the control plane and a stand-in "
        "kubelet, writes DIR/kubeconfig once the cluster is usable, and runs until SIGINT or "
        "SIGTERM, then stops every process it started. " + LOCAL_PODS,
    )
    up.add_argument("--dir", type=Path, required=True,
                    help="work folder: kubeconfig, certificates, etcd data, logs")  # fmt: skip
    up.add_argument("--audit-log", type=Path, metavar="FILE",
                    help="write the API server's audit log (JSON lines, every request's "
                         "metadata) to FILE")  # fmt: skip
    sub.add_parser("build", help="build the Kubernetes binaries if missing; print their folder")
    return p


def _binaries() -> Path:
    started, cached = time.monotonic(), not missing_binaries(assets_dir())
    bin_dir = ensure_binaries(echo=say)
    how = "cached" if cached else "built"
    say(f"Kubernetes binaries {how} in {bin_dir} ({time.monotonic() - started:.1f} s)")
    return bin_dir


def cluster_up(workdir: Path, audit_log: Path | None) -> int:
    """Start everything, announce it, wait for a signal, stop everything."""
    stop = threading.Event()

    def interrupted(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    bin_dir = _binaries()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    announced = workdir / "kubeconfig"
    announced.unlink(missing_ok=True)  # a former run's must not announce this one
    policy = None
    if audit_log is not None:
        policy = workdir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        audit_log = audit_log.resolve()
    say(f"starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler in {workdir}")
    cp = ControlPlane(bin_dir, workdir=workdir, keep_workdir=True, audit_policy=policy,
                      audit_log=audit_log)  # fmt: skip
    with cp:
        cp.add_node(NODE)
        with Kubelet(cp, None, workdir / "kubelet") as kubelet:
            say(f"cluster up in {cp.started_in:.1f} s at {cp.server}: node {NODE} with a "
                "stand-in kubelet")  # fmt: skip
            say(LOCAL_PODS)
            say(f"logs: {workdir}/*.log; pods' logs: {workdir}/kubelet/pods/")
            if audit_log is not None:
                say(f"audit log: {audit_log}")
            say(f"export KUBECONFIG={announced}")
            say(f"export PATH={bin_dir}:$PATH  # kubectl")
            say("running; Ctrl-C (SIGINT) or SIGTERM stops every process it started")
            write(announced, cp.kubeconfig.read_bytes())  # last: it says "ready"
            failed = _watch(cp, kubelet, stop)
            announced.unlink()
        say("stopping indexer pods, kube-scheduler, kube-controller-manager, kube-apiserver, "
            "etcd")  # fmt: skip
    say("stopped")
    return 1 if failed else 0


def _watch(cp: ControlPlane, kubelet: Kubelet, stop: threading.Event) -> bool:
    """Until `stop`: report what the kubelet's loop could not do; True when a
    component died (the cluster is of no use then)."""
    reported = 0
    while not stop.wait(1.0):
        for error in kubelet.errors[reported:]:
            print(f"stand-in kubelet: {error}", file=sys.stderr, flush=True)
        reported = len(kubelet.errors)
        try:
            cp.check_alive()
        except ControlPlaneError as e:
            print(f"metis-dev: {e}", file=sys.stderr, flush=True)
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            _binaries()
            return 0
        return cluster_up(args.dir, args.audit_log)
    except ControlPlaneError as e:
        print(f"metis-dev: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
