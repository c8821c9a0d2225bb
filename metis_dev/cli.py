"""`metis-dev`: the local cluster anyone can run.

    metis-dev cluster up --dir DIR [--audit-log FILE] [--node real|stand-in|auto]
    metis-dev build

`cluster up` builds or reuses the cached binaries, starts etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and a node, writes DIR/node.json (which node) and
then DIR/kubeconfig once the cluster is usable, and runs until SIGINT or SIGTERM, then
stops every process it started. The node is real where the machine allows it (root and
the Debian packages of `make node-packages`): containerd, kubelet and kube-proxy running
the project's images (metis_dev/node.py); elsewhere a stand-in kubelet runs indexer pods
as local processes, and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from metis_dev import images, node
from metis_dev.build import assets_dir, ensure_binaries, missing_binaries
from metis_dev.components import DEFAULT_CONTROLLERS, ENDPOINTS
from metis_dev.kubelet import Kubelet
from metis_dev.pki import write
from metis_dev.plane import ControlPlane
from metis_dev.process import ControlPlaneError

NODE = "metis-local"
"""The stand-in kubelet's node; the real one is node.NODE_NAME."""
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
NodeKind = Literal["real", "stand-in"]


class NodeInfo(BaseModel):
    """DIR/node.json: the node `cluster up` runs, for the programs that use the cluster."""

    kind: NodeKind
    name: str
    indexer_image: str | None = None
    """The indexer image loaded into the real node's containerd (METIS_INDEXER_IMAGE)."""
    resolv_conf: str | None = None
    """The real node's DNS: `node.host_command` runs a host process resolving by it."""


def choose_node(requested: str, unusable: str | None) -> tuple[NodeKind, str]:
    """Which node to run and the line that says why: `unusable` is why this machine
    cannot run a real node (None: it can). Asking for `real` where it cannot fails."""
    if requested == "stand-in":
        return "stand-in", "node: the stand-in kubelet (asked for with --node stand-in)"
    if unusable is None:
        return "real", "node: a real one (containerd, kubelet, kube-proxy; this machine allows it)"
    if requested == "real":
        raise ControlPlaneError(f"--node real: this machine cannot run a real node: {unusable}")
    return "stand-in", f"node: the stand-in kubelet (no real node on this machine: {unusable})"


def real_node_lines(info: NodeInfo) -> list[str]:
    """What a user of the real node needs to know."""
    return [
        f"Pods run in containers on node {info.name}: containerd, a kubelet and kube-proxy, "
        "the project's images.",
        f"The indexer image, already in the node's containerd: {info.indexer_image} "
        "(run the operator with METIS_INDEXER_IMAGE set to it).",
        "Services route by kube-proxy: a ClusterIP answers from this machine too. Pods resolve "
        f"<svc>.<ns>.svc by the node's DNS at {node.GATEWAY}; a process here does under "
        f"`unshare --mount sh -c 'mount --bind {info.resolv_conf} /etc/resolv.conf && exec ...'`.",
        f"A model server on this machine listening on {node.GATEWAY} is reached by pods "
        "through a Service without selector and an EndpointSlice naming that address.",
    ]


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
        description="Builds or reuses the binaries, starts the control plane and a node, "
        "writes DIR/node.json and DIR/kubeconfig once the cluster is usable, and runs until "
        "SIGINT or SIGTERM, then stops every process it started. With the stand-in: " + LOCAL_PODS,
    )
    up.add_argument(
        "--dir",
        type=Path,
        required=True,
        help="work folder: kubeconfig, certificates, etcd data, logs",
    )
    up.add_argument(
        "--audit-log",
        type=Path,
        metavar="FILE",
        help="write the API server's audit log (JSON lines, every request's metadata) to FILE",
    )
    up.add_argument(
        "--node",
        choices=("real", "stand-in", "auto"),
        default="auto",
        help="real: containerd, kubelet and kube-proxy running the project's "
        "images (root and `make node-packages`); stand-in: indexer pods "
        "as local processes; auto (default): real where the machine "
        "allows",
    )
    sub.add_parser("build", help="build the Kubernetes binaries if missing; print their folder")
    return p


def _binaries() -> Path:
    started, cached = time.monotonic(), not missing_binaries(assets_dir())
    bin_dir = ensure_binaries(echo=say)
    how = "cached" if cached else "built"
    say(f"Kubernetes binaries {how} in {bin_dir} ({time.monotonic() - started:.1f} s)")
    return bin_dir


def _node_parts() -> tuple[Path, images.Built]:
    """The real node's binaries and the project's images, built or cached (each timed)."""
    started, assets = time.monotonic(), node.ASSETS
    cached = all((assets / b).exists() for b in node.BINARIES)
    if not cached:
        say("building kubelet, kube-proxy and pause from Go modules (minutes on two cores)")
    assets = node.ensure_binaries()
    how = "cached" if cached else "built"
    say(f"kubelet, kube-proxy, pause {how} in {assets} ({time.monotonic() - started:.1f} s)")
    say(
        "the images: found in the cache by their inputs, or built (a base by debootstrap, "
        "then the Dockerfile's two targets: minutes)"
    )
    started, built = time.monotonic(), images.build()
    for what, ref in built.refs.items():
        how = "cached" if built.cached[what] else "built"
        say(f"image {ref}: {how}, {built.sizes[what] / 1e6:.0f} MB")
    say(f"images ready in {time.monotonic() - started:.1f} s")
    return assets, built


def cluster_up(workdir: Path, audit_log: Path | None, requested: str = "auto") -> int:
    """Start everything, announce it, wait for a signal, stop everything."""
    stop = threading.Event()

    def interrupted(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    claimed, unusable = (None, None) if requested == "stand-in" else node.claim_or_why()
    kind, why = choose_node(requested, unusable)
    say(why)
    bin_dir = _binaries()
    parts = _node_parts() if kind == "real" else None
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    announced, info_file = workdir / "kubeconfig", workdir / "node.json"
    announced.unlink(missing_ok=True)  # a former run's must not announce this one
    info_file.unlink(missing_ok=True)
    policy = None
    if audit_log is not None:
        policy = workdir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        audit_log = audit_log.resolve()
    say(f"starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler in {workdir}")
    # With a real node, the endpoints controller too: the API server's service proxy
    # (`kubectl metis search`) routes by Endpoints objects, and the node's pods are reachable.
    controllers = DEFAULT_CONTROLLERS if parts is None else (*DEFAULT_CONTROLLERS, ENDPOINTS)
    cp = ControlPlane(
        bin_dir,
        workdir=workdir,
        keep_workdir=True,
        audit_policy=policy,
        audit_log=audit_log,
        controllers=controllers,
    )
    with cp, contextlib.ExitStack() as stack:
        if parts is None:
            cp.add_node(NODE)
            kubelet = stack.enter_context(Kubelet(cp, None, workdir / "kubelet"))
            info = NodeInfo(kind="stand-in", name=NODE)
            alive = kubelet_alive(kubelet)
            say(
                f"cluster up in {cp.started_in:.1f} s at {cp.server}: node {NODE} with a "
                "stand-in kubelet"
            )
            say(LOCAL_PODS)
            say(f"logs: {workdir}/*.log; pods' logs: {workdir}/kubelet/pods/")
        else:
            assets, built = parts
            say(f"starting containerd, kubelet, kube-proxy and the node's DNS in {workdir}/node")
            real = stack.enter_context(
                node.Node(cp.kubeconfig, workdir / "node", assets, claimed=claimed)
            )
            real.load(images.Podman(), built.refs[images.INDEXER.name])
            info = NodeInfo(
                kind="real",
                name=node.NODE_NAME,
                indexer_image=built.refs[images.INDEXER.name],
                resolv_conf=str(real.resolv_conf),
            )
            alive = real.check
            say(
                f"cluster up at {cp.server}: control plane in {cp.started_in:.1f} s, node "
                f"{node.NODE_NAME} Ready in {real.started_in:.1f} s"
            )
            for line in real_node_lines(info):
                say(line)
            say(
                f"logs: {workdir}/*.log; the node's: {workdir}/node/*.log, pods': "
                f"{workdir}/node/pod-logs/"
            )
        if audit_log is not None:
            say(f"audit log: {audit_log}")
        say(f"export KUBECONFIG={announced}")
        say(f"export PATH={bin_dir}:$PATH  # kubectl")
        say("running; Ctrl-C (SIGINT) or SIGTERM stops every process it started")
        info_file.write_text(info.model_dump_json())
        write(announced, cp.kubeconfig.read_bytes())  # last: it says "ready"
        failed = _watch(cp, alive, stop)
        announced.unlink()
        info_file.unlink()
        say("stopping the node, kube-scheduler, kube-controller-manager, kube-apiserver, etcd")
    say("stopped")
    return 1 if failed else 0


def kubelet_alive(kubelet: Kubelet) -> Callable[[], None]:
    """A check that prints what the stand-in kubelet's loop could not do, once each."""
    reported = 0

    def check() -> None:
        nonlocal reported
        for error in kubelet.errors[reported:]:
            print(f"stand-in kubelet: {error}", file=sys.stderr, flush=True)
        reported = len(kubelet.errors)

    return check


def _watch(cp: ControlPlane, node_alive: Callable[[], None], stop: threading.Event) -> bool:
    """Until `stop`: check the control plane and the node; True when a component died
    (the cluster is of no use then)."""
    while not stop.wait(1.0):
        try:
            node_alive()
            cp.check_alive()
        except (ControlPlaneError, node.NodeError) as e:
            print(f"metis-dev: {e}", file=sys.stderr, flush=True)
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            _binaries()
            return 0
        return cluster_up(args.dir, args.audit_log, args.node)
    except (ControlPlaneError, node.NodeError, images.ImageError) as e:
        print(f"metis-dev: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
