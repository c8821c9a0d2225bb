"""A standby operator in a container stops at SIGTERM.

In a pod the operator is the container's first process, PID 1 of its PID namespace: the
kernel gives PID 1 no default action for SIGTERM, so only a handler stops it. kopf installs
one once the operator leads; a standby waiting for the Lease had none, so a drain, a
rollout or an uninstall waited out the pod's whole grace period, and a standby being
deleted could still take the Lease and be killed holding it (seen on the real node). Here
the operator runs as PID 1 of a PID namespace of its own (`unshare`), as in a container."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
from pathlib import Path

import pytest

from metis_dev.plane import ControlPlane
from metis_dev.process import free_port, wait_for
from tests.kube.operator_support import Operator

LEASES = "/apis/coordination.k8s.io/v1/namespaces/metis-system/leases"


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a PID namespace of its own needs root and unshare",
)
def test_a_standby_that_is_pid_1_stops_at_sigterm(
    kube: ControlPlane, installed: None, tmp_path: Path
) -> None:
    api = kube.rest()
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "metis-operator", "namespace": "metis-system"},
        "spec": {
            "holderIdentity": "someone-else",
            "leaseDurationSeconds": 3600,
            "acquireTime": now,
            "renewTime": now,
        },
    }
    if not api.gone(f"{LEASES}/metis-operator"):  # another test's
        api.delete(f"{LEASES}/metis-operator")
    api.post(LEASES, lease)
    (tmp_path / "operator").mkdir()
    op = Operator(
        kube,
        tmp_path / "operator",
        free_port(),
        env={"METIS_LEADER_ELECTION": "true"},
        identity="standby",
        wrap=lambda argv: ["unshare", "--pid", "--fork", "--kill-child", *argv],
    )
    try:
        op.start().wait_healthy()  # standing by: its /healthz answers
        assert op.proc is not None
        (first,) = wait_for(
            lambda: children_of(op.proc.pid) if op.proc else None,
            timeout=10,
            what="the operator, PID 1 of its namespace",
        )
        os.kill(first, signal.SIGTERM)
        wait_for(
            lambda: op.proc is not None and op.proc.poll() is not None,
            timeout=10,
            what="the standby to stop at SIGTERM",
        )
        holder = api.get(f"{LEASES}/metis-operator")["spec"]["holderIdentity"]
        assert holder == "someone-else"
    finally:
        op.stop(signal.SIGKILL)
        api.delete(f"{LEASES}/metis-operator")
