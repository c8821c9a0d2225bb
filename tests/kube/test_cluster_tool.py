"""`metis-dev cluster up` as users run it: a process that announces a kubeconfig,
answers kubectl, writes the audit log it was asked for, and on SIGINT stops every
process it started; and how it chooses its node. (The real node under `cluster up` is
exercised by tests/kube/test_demo.py where the machine allows one.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from metis_dev.cli import NodeInfo, choose_node
from metis_dev.process import ControlPlaneError, wait_for
from metis_dev.rest import run_kubectl

NO_ROOT = "a real node needs root (containerd, network namespaces, iptables)"


@pytest.mark.parametrize(
    ("requested", "unusable", "kind", "says"),
    [
        ("auto", None, "real", "a real one"),
        (
            "auto",
            NO_ROOT,
            "stand-in",
            f"the stand-in kubelet (no real node on this machine: {NO_ROOT})",
        ),
        ("stand-in", None, "stand-in", "asked for with --node stand-in"),
        ("stand-in", NO_ROOT, "stand-in", "asked for with --node stand-in"),
        ("real", None, "real", "a real one"),
    ],
)
def test_the_node_is_real_where_the_machine_allows_and_the_choice_is_said(
    requested: str, unusable: str | None, kind: str, says: str
) -> None:
    chosen, line = choose_node(requested, unusable)
    assert chosen == kind
    assert says in line


def test_a_real_node_the_machine_cannot_run_is_refused_with_the_reason() -> None:
    with pytest.raises(ControlPlaneError, match=r"--node real: .*needs root"):
        choose_node("real", NO_ROOT)


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie counts as gone)."""
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def test_cluster_up_serves_kubectl_and_stops_everything_on_sigint(
    kube_binaries: Path, tmp_path: Path
) -> None:
    work, audit = tmp_path / "cluster", tmp_path / "audit.log"
    log = (tmp_path / "cluster-up.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "metis_dev.cli",
            "cluster",
            "up",
            "--dir",
            str(work),
            "--audit-log",
            str(audit),
            "--node",
            "stand-in",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def started() -> bool:
            assert proc.poll() is None, (tmp_path / "cluster-up.log").read_text()
            return (work / "kubeconfig").exists()

        wait_for(started, timeout=600, what="DIR/kubeconfig")  # a cold build is minutes
        output = (tmp_path / "cluster-up.log").read_text()
        assert f"export KUBECONFIG={work / 'kubeconfig'}" in output
        assert "Pods run as local processes: there is no container runtime here" in output
        info = NodeInfo.model_validate_json((work / "node.json").read_text())
        assert (info.kind, info.name) == ("stand-in", "metis-local")

        kubectl = kube_binaries / "kubectl"
        nodes = json.loads(
            run_kubectl(kubectl, work / "kubeconfig", "get", "nodes", "-o", "json").stdout
        )
        [node] = nodes["items"]
        assert node["metadata"]["name"] == "metis-local"
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert ready["Ready"] == "True"
        run_kubectl(kubectl, work / "kubeconfig", "create", "namespace", "probe")
        assert '"resource":"namespaces"' in audit.read_text().replace(" ", "")

        children = descendants(proc.pid)
        names = {Path(f"/proc/{pid}/exe").resolve().name for pid in alive(children)}
        assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} <= names

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, (tmp_path / "cluster-up.log").read_text()
        wait_for(lambda: not alive(children), timeout=30, what="every child to exit")
        assert (tmp_path / "cluster-up.log").read_text().rstrip().endswith("stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
