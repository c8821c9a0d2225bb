"""A base that reads a Flux GitRepository (issue 44), end to end on the real control plane:
Flux's source-controller (built from its Go module) fetching a real Git repository served
by git's own http-backend on loopback, the operator following the object's artifact, and
a real indexer (the stand-in kubelet's) fetching, checking and reading it. A commit that
edits, adds and deletes files is read exactly, the base Ready only once it is (what
`kubectl wait` reads); a force-push back is read too; the object deleted fails the base,
naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from metis_dev.process import wait_for
from tests.kube.operator_support import (
    Operator,
    get_kb,
    kb,
    model_service,
    state_events,
    wait_state,
)
from tests.support.git_server import GitServer, git_server
from tests.support.model_server import ModelServer
from tests.support.source_controller import GROUP, SourceController, running_source_controller

BASE = "handbook"
FIRST = {
    "leave.md": "# Leave\n\nTwenty-five days of paid leave a year; ask two weeks ahead.\n",
    "security.md": "# Security\n\nLock your screen whenever you leave your desk.\n",
    "travel.md": "# Travel\n\nBook trains second class; flights only beyond six hours.\n",
}


@pytest.fixture(scope="module")
def controller(
    kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SourceController]:
    """Started before the operator (module scope): its CRDs must be served when the
    operator starts, or it does not watch their kinds until it restarts."""
    with running_source_controller(kube, tmp_path_factory.mktemp("source-controller")) as c:
        yield c


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GitServer]:
    with git_server(tmp_path / "git-server") as s:
        yield s


@pytest.fixture
def kubelet(kube: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Kubelet]:
    with Kubelet(kube, namespace, tmp_path / "kubelet") as k:
        yield k


def git_repository(ns: str, url: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "GitRepository",
        "metadata": {"name": BASE, "namespace": ns},
        "spec": {"url": url, "interval": "10m", "ref": {"branch": "main"}},
    }


def fetch_now(kube: ControlPlane, ns: str, plural: str = "gitrepositories") -> None:
    """What `flux reconcile source git` asks: a fetch now, not at the interval's end."""
    path = f"/apis/{GROUP}/v1/namespaces/{ns}/{plural}/{BASE}"
    stamp = datetime.now(UTC).isoformat()
    kube.rest().patch(
        path, {"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": stamp}}}
    )


def documents(kubelet: Kubelet) -> dict[str, int]:
    rows = kubelet.indexer().get("/v1/documents", params={"page_size": 100}).json()["documents"]
    return {r["document"]: r["chunks"] for r in rows if r["source"] == BASE}


def top(kubelet: Kubelet, question: str) -> str | None:
    answer = kubelet.indexer().post("/v1/search", {"query": question, "mode": "keyword"}).json()
    return answer["results"][0]["citation"]["document"] if answer["results"] else None


def test_a_git_repository_is_read_at_each_revision_and_ready_only_once_it_is(
    kube: ControlPlane,
    controller: SourceController,
    operator: Operator,
    kubelet: Kubelet,
    namespace: str,
    models: ModelServer,
    server: GitServer,
) -> None:
    ns = namespace

    def alive() -> None:
        operator.check_alive()
        controller.check_alive()

    kube.add_node(f"cpu-{ns}")
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    repo = server.create(BASE)
    first = repo.commit(dict(FIRST), "first")
    spec = {
        "sources": [{"flux": {"kind": "GitRepository", "name": BASE}}],
        "embedding": {"deployment": "minilm"},
        "rescan_seconds": 0,
    }
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(kb(BASE, spec)))
    s = wait_state(kube, ns, BASE, "Failed", alive=alive)
    assert s["reason"].startswith(
        f"GitRepository {BASE} does not exist (no GitRepository named {BASE} in this namespace"
    )

    kube.kubectl("apply", "-f", "-", input=json.dumps(git_repository(ns, server.url(BASE))))
    revision = f"main@sha1:{first}"
    s = wait_state(
        kube,
        ns,
        BASE,
        "Ready",
        alive=alive,
        timeout=240,
        check=lambda s: s["observed"].get("indexed_revisions") == {BASE: revision},
    )
    assert s["observed"]["revisions"] == {BASE: revision}
    assert set(documents(kubelet)) == set(FIRST)
    before = documents(kubelet)

    second = repo.commit(
        {
            "leave.md": "# Leave\n\nThirty days of paid leave a year; the zebra rule applies.\n",
            "kitchen.md": "# Kitchen\n\nThe office kitchen is cleaned every Friday.\n",
            "travel.md": None,
        },
        "second",
    )
    revision = f"main@sha1:{second}"
    fetch_now(kube, ns)
    seen_stale_ready: list[dict[str, Any]] = []

    def indexed() -> dict[str, Any] | None:
        status = get_kb(kube, ns, BASE).get("status") or {}
        observed = status.get("observed") or {}
        if observed.get("revisions") == {BASE: revision} and status.get("state") == "Ready":
            if observed.get("indexed_revisions") != {BASE: revision}:
                seen_stale_ready.append(observed)  # `kubectl wait` would return on it
            return status
        return None

    wait_for(indexed, timeout=240, what=f"kb/{BASE} Ready at {revision}", alive=alive)
    assert seen_stale_ready == []
    after = documents(kubelet)
    assert set(after) == {"leave.md", "security.md", "kitchen.md"}
    assert after["security.md"] == before["security.md"]
    assert top(kubelet, "zebra rule") == "leave.md"
    assert top(kubelet, "office kitchen cleaned Friday") == "kitchen.md"
    assert top(kubelet, "trains second class flights") is None
    last = kubelet.indexer().status()["last_pass"]
    assert last == {"read": 2, "unchanged": 0, "dropped": 1}, "only what the commit changed"
    said = f"indexed GitRepository {BASE} at {revision} (2 files read, 1 dropped)"
    wait_for(
        lambda: ("Indexed", said) in state_events(kube, ns, BASE),
        timeout=30,
        what=f"the Event: {said}",
        alive=alive,
    )

    # History rewritten: the branch forced back to the first commit is read as it was.
    assert repo.reset(first) == first
    fetch_now(kube, ns)
    revision = f"main@sha1:{first}"
    wait_state(
        kube,
        ns,
        BASE,
        "Ready",
        alive=alive,
        timeout=240,
        check=lambda s: s["observed"].get("indexed_revisions") == {BASE: revision},
    )
    assert set(documents(kubelet)) == set(FIRST)
    assert top(kubelet, "trains second class flights") == "travel.md"

    kube.kubectl("delete", "gitrepository", BASE, "-n", ns)
    s = wait_state(kube, ns, BASE, "Failed", alive=alive)
    assert f"GitRepository {BASE} does not exist" in s["reason"]
    assert top(kubelet, "trains second class flights") == "travel.md", "nothing indexed is lost"
