"""`make demo` end to end: a local cluster, the operator, the handbook example through
its states to Ready, three cited answers; then nothing of it left running.

On a real node where the machine allows one (tests/node's conditions: root, the Debian
packages), else with the stand-in kubelet; each run checks what its node promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.cluster_demo import excerpt
from metis_dev import images, node

ROOT = Path(__file__).resolve().parents[2]
STATES = ["Pending", "Starting", "Indexing", "Ready"]


def running_with(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in text:
            found.append(text)
    return found


@pytest.fixture(scope="module")
def node_built() -> None:
    """Where the machine can run a real node, its binaries and images are built first
    (a cold build is many minutes: not the demo's)."""
    if node.unusable() is None:
        node.ensure_binaries()
        images.build()


def test_make_demo_shows_the_main_job_and_stops_everything(
    kube_binaries: Path, node_built: None
) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "cluster_demo.py")],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    text = out.stdout
    # The demo says which node it ran: the real one wherever the machine allows and no
    # other run holds it.
    real = "node: a real one" in text
    if node.unusable() is None and not real:
        assert "its one real node is in use by process" in text, text[:2000]
    if real:
        assert (
            f"On a real node ({node.NODE_NAME}): the indexer runs in a container from "
            "localhost/metis-indexer:" in text
        )
        assert f"without selector, endpoints {node.GATEWAY}:" in text
        # The answers came through the base's Service, by name, as a pod asks it.
        assert "--url http://metis-handbook.demo.svc:7700 --top-k 2" in text
    else:
        assert "node: the stand-in kubelet (no real node on this machine: " in text
        assert "Pods run as local processes: there is no container runtime here" in text

    # Each state once, in the lifecycle's order, from Pending to Ready (a pass of six
    # documents may end between two looks, so Indexing alone may go unseen).
    seen = re.findall(r"^  handbook   (\w+) ", text.split("--watch")[1], re.MULTILINE)
    seen = seen[: seen.index("Ready") + 1]
    if real:
        # Measured on the real node: the operator may look between the container's start
        # and its listening, and calls an unreachable indexer Waiting (docs/local-cluster.md,
        # "Real node").
        watched = text.split("--watch")[1]
        waiting = re.findall(r"^  handbook   Waiting +(.*)$", watched, re.MULTILINE)
        assert all("the operator cannot reach its indexer" in w for w in waiting), waiting
        seen = [s for s in seen if s != "Waiting"]
    assert seen == [s for s in STATES if s in seen] and seen[0] == "Pending", seen
    assert "Starting" in seen

    assert "State:                Ready" in text  # the describe excerpt
    assert re.search(r"Normal +Ready ", text)  # its Events (wider with a Warning)
    for citation in (
        "docs/handbook/policies/leave.md, line 12",
        "runbooks/gpu-errors.txt, line 1",
        "docs/handbook/travel.pdf, page 2",
    ):
        assert citation in text, text[-3000:]
    assert re.search(r"meaning [\d.]+ \(#1\) · words [\d.]+ \(#\d+\) · fused", text)

    assert re.search(r"^console: http://127\.0\.0\.1:\d+/$", text, re.MULTILINE), text[-2000:]

    work = re.search(r"cluster up --dir (/\S+)/cluster", text)
    assert work is not None
    assert text.rstrip().splitlines()[-1].startswith("stopped")
    assert running_with(work.group(1)) == []
    assert not Path(work.group(1)).exists()
    if real:
        bridge = subprocess.run(["ip", "link", "show", node.BRIDGE], capture_output=True)
        assert bridge.returncode != 0, "the node's bridge outlived the demo"


def test_the_describe_excerpt_drops_spec_and_conditions() -> None:
    described = "\n".join(
        [
            "Name:         handbook",
            "Spec:",
            "  Sources:",
            "    Drive:  docs",
            "Status:",
            "  Conditions:",
            "    Type:   Ready",
            "  Observed:",
            "    Machine:  metis-local",
            "  State:  Ready",
            "Events:",
            "  Normal  Ready  0s  metis-operator  everything is indexed",
        ]
    )
    assert excerpt(described) == [
        "Name:         handbook",
        "Status:",
        "  Observed:",
        "    Machine:  metis-local",
        "  State:  Ready",
        "Events:",
        "  Normal  Ready  0s  metis-operator  everything is indexed",
    ]
