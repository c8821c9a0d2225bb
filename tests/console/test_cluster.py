"""What the console keeps of the cluster, fed as the watches feed it (no API server):
a list replaces, a change updates, a deletion removes, each bumps the version the
live pages wait on; Events are kept per base, newest first, at most EVENTS_KEPT."""

from __future__ import annotations

import asyncio
from typing import Any

from metis_operator.console.cluster import EVENTS_KEPT, Cluster


def base(name: str, state: str = "Ready", namespace: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "status": {"state": state}}


def event(uid: str, about: str, last: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "team-a"},
        "message": uid,
        "lastTimestamp": last,
        "involvedObject": {"kind": "KnowledgeBase", "name": about, "namespace": "team-a"},
    }


def test_a_list_then_changes_keep_the_bases_as_the_api_server_has_them() -> None:
    cluster = Cluster()
    cluster.listed_bases([base("b"), base("a", "Indexing")])
    assert [(v.key, v.state) for v in cluster.views()] == [
        ("team-a/a", "Indexing"),
        ("team-a/b", "Ready"),
    ]
    seen = cluster.version
    cluster.base_event("MODIFIED", base("a", "Ready"))
    cluster.base_event("DELETED", base("b"))
    assert [(v.key, v.state) for v in cluster.views()] == [("team-a/a", "Ready")]
    assert cluster.version == seen + 2


def test_the_same_list_again_wakes_no_page() -> None:
    cluster = Cluster()
    cluster.listed_bases([base("a")])
    seen = cluster.version
    cluster.listed_bases([base("a")])
    assert cluster.version == seen


def test_events_are_kept_per_base_newest_first_and_few() -> None:
    cluster = Cluster()
    cluster.listed_events(
        [event(f"e{i:02}", "a", f"2026-11-30T21:{i:02}:00Z") for i in range(EVENTS_KEPT + 5)]
        + [event("x", "b", "t")]
    )
    shown = cluster.recent_events("team-a/a")
    assert len(shown) == EVENTS_KEPT
    assert shown[0].message == f"e{EVENTS_KEPT + 4:02}"
    cluster.event_event("DELETED", event(f"e{EVENTS_KEPT + 4:02}", "a", ""))
    assert cluster.recent_events("team-a/a")[0].message == f"e{EVENTS_KEPT + 3:02}"
    assert [e.message for e in cluster.recent_events("team-a/b")] == ["x"]


def test_a_watch_that_cannot_see_says_why_until_it_can() -> None:
    cluster = Cluster()
    cluster.problem("knowledgebases", "cannot watch knowledgebases: 403 Forbidden")
    assert cluster.trouble() == "cannot watch knowledgebases: 403 Forbidden"
    cluster.problem("knowledgebases", None)
    assert cluster.trouble() is None


def test_a_page_waiting_for_a_change_wakes_when_one_comes() -> None:
    async def scenario() -> bool:
        cluster = Cluster()
        seen = cluster.version
        waiting = asyncio.create_task(cluster.wait(seen, timeout=30))
        await asyncio.sleep(0)  # let the waiter start waiting
        cluster.base_event("ADDED", base("a"))
        await asyncio.wait_for(waiting, timeout=5)
        return cluster.version == seen + 1

    assert asyncio.run(scenario())


def backup(name: str, of: str, created: str, namespace: str = "team-a", **status: Any) -> Any:
    return {
        "metadata": {"namespace": namespace, "name": name, "creationTimestamp": created},
        "spec": {"knowledge_base": of, "method": "object_store"},
        "status": status,
    }


def test_a_bases_page_lists_its_own_backups_newest_first() -> None:
    cluster = Cluster()
    cluster.listed_bases([base("handbook"), base("runbooks"), base("handbook", namespace="b")])
    cluster.listed_backups(
        [
            backup("h-1", "handbook", "2026-12-07T20:00:00Z", phase="Completed", chunks=9),
            backup("h-2", "handbook", "2026-12-07T21:00:00Z", phase="Running"),
            backup("r-1", "runbooks", "2026-12-07T21:30:00Z"),
            backup("other-ns", "handbook", "2026-12-07T22:00:00Z", namespace="b"),
        ]
    )
    view = cluster.view("team-a/handbook")
    assert view is not None
    assert [(b.name, b.phase, b.chunks) for b in view.backups] == [
        ("h-2", "Running", None),
        ("h-1", "Completed", 9),
    ]
    seen = cluster.version
    cluster.backup_event("DELETED", backup("h-1", "handbook", "2026-12-07T20:00:00Z"))
    assert cluster.version == seen + 1
    view = cluster.view("team-a/handbook")
    assert view is not None and [b.name for b in view.backups] == ["h-2"]
    runbooks = cluster.view("team-a/runbooks")
    assert runbooks is not None and [(b.name, b.phase) for b in runbooks.backups] == [
        ("r-1", "Pending")
    ]
