"""A base that reads a Flux GitRepository (issue 44), end to end on the real control plane:
Flux's source-controller (built from its Go module) fetching a real Git repository served
by git's own http-backend on loopback, the operator following the object's artifact, and
a real indexer (the stand-in kubelet's) fetching, checking and reading it. A commit that
edits, adds and deletes files is read exactly, the base Ready only once it is (what
`kubectl wait` reads); a force-push back is read too; the object deleted fails the base,
naming it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from metis_dev.process import wait_for
from tests.kube.flux import (
    BASE,
    Reading,
    controller,
    fetch_now,
    kubelet,
    reading,
    server,
)
from tests.kube.operator_support import get_kb, state_events
from tests.support.git_server import GitServer
from tests.support.model_server import ModelServer
from tests.support.source_controller import GROUP

__all__ = ["controller", "kubelet", "reading", "server"]  # fixtures

FIRST = {
    "leave.md": "# Leave\n\nTwenty-five days of paid leave a year; ask two weeks ahead.\n",
    "security.md": "# Security\n\nLock your screen whenever you leave your desk.\n",
    "travel.md": "# Travel\n\nBook trains second class; flights only beyond six hours.\n",
}
TRAVEL = "trains second class flights"


def git_repository(url: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "GitRepository",
        "metadata": {"name": BASE},
        "spec": {"url": url, "interval": "10m", "ref": {"branch": "main"}},
    }


def test_a_git_repository_is_read_at_each_revision_and_ready_only_once_it_is(
    reading: Callable[[str], Reading],
    models: ModelServer,
    server: GitServer,
) -> None:
    repo = server.create(BASE)
    first = repo.commit(dict(FIRST), "first")
    base = reading("GitRepository").start(models)
    kube, ns = base.kube, base.ns
    s = base.wait("Failed")
    assert s["reason"].startswith(
        f"GitRepository {BASE} does not exist (no GitRepository named {BASE} in this namespace"
    )

    base.apply(git_repository(server.url(BASE)))
    s = base.indexed(f"main@sha1:{first}")
    assert s["observed"]["revisions"] == {BASE: f"main@sha1:{first}"}
    before = base.documents()
    assert set(before) == set(FIRST)

    second = repo.commit(
        {
            "leave.md": "# Leave\n\nThirty days of paid leave a year; the zebra rule applies.\n",
            "kitchen.md": "# Kitchen\n\nThe office kitchen is cleaned every Friday.\n",
            "travel.md": None,
        },
        "second",
    )
    revision = f"main@sha1:{second}"
    fetch_now(kube, ns, "gitrepositories")
    seen_stale_ready: list[dict[str, Any]] = []

    def ready_at_second() -> dict[str, Any] | None:
        status = get_kb(kube, ns, BASE).get("status") or {}
        observed = status.get("observed") or {}
        if observed.get("revisions") == {BASE: revision} and status.get("state") == "Ready":
            if observed.get("indexed_revisions") != {BASE: revision}:
                seen_stale_ready.append(observed)  # `kubectl wait` would return on it
            return status
        return None

    wait_for(ready_at_second, timeout=240, what=f"kb/{BASE} Ready at {revision}", alive=base.alive)
    assert seen_stale_ready == []
    after = base.documents()
    assert set(after) == {"leave.md", "security.md", "kitchen.md"}
    assert after["security.md"] == before["security.md"]
    assert base.top("zebra rule") == "leave.md"
    assert base.top("office kitchen cleaned Friday") == "kitchen.md"
    assert base.top(TRAVEL) is None
    assert base.last_pass() == {"read": 2, "unchanged": 0, "dropped": 1}, "what changed only"
    said = f"indexed GitRepository {BASE} at {revision} (2 files read, 1 dropped)"
    wait_for(
        lambda: ("Indexed", said) in state_events(kube, ns, BASE),
        timeout=30,
        what=f"the Event: {said}",
        alive=base.alive,
    )

    # History rewritten: the branch forced back to the first commit is read as it was.
    assert repo.reset(first) == first
    fetch_now(kube, ns, "gitrepositories")
    base.indexed(f"main@sha1:{first}")
    assert set(base.documents()) == set(FIRST)
    assert base.top(TRAVEL) == "travel.md"

    kube.kubectl("delete", "gitrepository", BASE, "-n", ns)
    s = base.wait("Failed")
    assert f"GitRepository {BASE} does not exist" in s["reason"]
    assert base.top(TRAVEL) == "travel.md", "nothing indexed is lost"
