"""Readings of the API server's JSON: the newest pod, a rollout, a failed replica set,
workloads scaled to zero, a model Service's port."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from metis_operator import observe
from metis_operator.api import identity
from metis_operator.state import PodView


def pod(
    name: str,
    created: str,
    *,
    node: str | None = None,
    phase: str = "Pending",
    conditions: list[dict[str, Any]] | None = None,
    deleting: bool = False,
    containers: list[dict[str, Any]] | None = None,
    template: str = "",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if template:
        meta["labels"] = {"pod-template-hash": template}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:10:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if containers:
        status["containerStatuses"] = containers
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


READY = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]


@pytest.mark.parametrize(
    ("pods", "view"),
    [
        ([], None),
        (
            [pod("a", "1", node="n", phase="Running", conditions=READY)],
            PodView("a", node="n", running=True, ready=True),
        ),
        (
            [
                pod(
                    "a",
                    "1",
                    conditions=[
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/1 nodes",
                        }
                    ],
                )
            ],
            PodView("a", unschedulable="0/1 nodes"),
        ),
        (
            [pod("old", "1", node="n", phase="Running", deleting=True), pod("new", "2", node="m")],
            PodView("new", node="m"),
        ),
        (
            [pod("old", "1", node="n", phase="Running", deleting=True)],
            PodView("old", node="n", running=True, terminating=True),
        ),
        (
            [
                pod(
                    "a",
                    "1",
                    node="n",
                    containers=[
                        {
                            "state": {
                                "waiting": {"reason": "ImagePullBackOff", "message": "not found"}
                            }
                        }
                    ],
                )
            ],
            PodView("a", node="n", waiting="ImagePullBackOff: not found"),
        ),
        (
            [pod("a", "1", node="n", phase="Failed")],
            PodView("a", node="n", waiting="the pod failed"),
        ),
    ],
    ids=["none", "running", "unschedulable", "newest-live", "only-going", "image-pull", "failed"],
)
def test_pod_view(pods: list[dict[str, Any]], view: PodView | None) -> None:
    assert observe.pod_view(pods) == view


NOW = dt.datetime(2026, 12, 1, 2, 0, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("ready", "seconds"),
    [
        ({"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T02:00:18Z"}, 12.0),
        ({"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T02:00:31Z"}, 0.0),
        ({"type": "Ready", "status": "True", "lastTransitionTime": "yesterday"}, None),
        ({"type": "Ready", "status": "True"}, None),
        ({"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-01T02:00:18Z"}, None),
    ],
    ids=["ready-12-s-ago", "clock-behind", "unreadable", "no-time", "not-ready"],
)
def test_how_long_ago_the_pod_turned_ready(ready: dict[str, Any], seconds: float | None) -> None:
    view = observe.pod_view([pod("a", "1", node="n", phase="Running", conditions=[ready])], NOW)
    assert view is not None and view.ready_seconds == seconds


def deployment(revision: str, generation: int, observed: int, updated: int) -> dict[str, Any]:
    return {
        "metadata": {
            "generation": generation,
            "annotations": {"deployment.kubernetes.io/revision": revision},
        },
        "spec": {"replicas": 1},
        "status": {"observedGeneration": observed, "updatedReplicas": updated},
    }


@pytest.mark.parametrize(
    ("dep", "expected"),
    [
        (None, False),
        (deployment("1", 1, 0, 0), False),  # the first rollout is not a replacement
        (deployment("2", 2, 2, 0), True),
        # A bumped generation with no new pod made: an annotation or the strategy changed.
        (deployment("2", 3, 2, 1), False),
        (deployment("2", 2, 2, 1), False),
    ],
    ids=["no-deployment", "first", "old-pod-gone-new-not-made", "not-observed", "done"],
)
def test_replacing(dep: dict[str, Any] | None, expected: bool) -> None:
    assert observe.replacing(dep) is expected


def test_a_pod_going_away_with_no_change_is_no_rollout() -> None:
    """A `kubectl delete pod` or an eviction changes no template: the pods show it (the
    old going away, a new one of the same template), not the Deployment."""
    assert not observe.replacing(deployment("1", 1, 1, 1))
    going = [pod("a", "1", deleting=True, template="h1"), pod("b", "2", template="h1")]
    old = observe.old_pod_view(going)
    assert old is not None and old.terminating and old.template == "h1"


def with_spec(p: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {**p, "spec": {**p["spec"], **spec}}


@pytest.mark.parametrize(
    ("pods", "new", "old"),
    [
        ([], None, None),
        ([pod("a", "1", node="n", phase="Running", conditions=READY)], "a", None),
        # A rollout's surge: the new pod starts beside the old one, which answers.
        (
            [
                pod("old", "1", node="n", phase="Running", conditions=READY, template="h1"),
                pod("new", "2", node="n", template="h2"),
            ],
            "new",
            "old",
        ),
        # Deleted: the old pod goes away while the one made again starts.
        (
            [
                pod("new", "2", node="n", template="h1"),
                pod("old", "1", node="n", phase="Running", deleting=True, template="h1"),
            ],
            "new",
            "old",
        ),
        ([pod("old", "1", node="n", deleting=True)], "old", None),
        # Made in the same second (the base made, then placed elsewhere at once): the old
        # pod cannot be placed, the new one is; listed in either order.
        ([pod("a-old", "1"), pod("b-new", "1", node="n", template="h2")], "b-new", "a-old"),
        ([pod("b-old", "1"), pod("a-new", "1", node="n", template="h2")], "a-new", "b-old"),
        (
            [
                pod("older", "1", deleting=True),
                pod("old", "2", deleting=True),
                pod("new", "3", node="n"),
            ],
            "new",
            "old",
        ),
    ],
    ids=[
        "none",
        "one",
        "surge",
        "deleted",
        "only-going",
        "same-second-old-first",
        "same-second-new-first",
        "two-going",
    ],
)
def test_the_pod_and_the_one_it_replaces(
    pods: list[dict[str, Any]], new: str | None, old: str | None
) -> None:
    got_new, got_old = observe.pod_view(pods), observe.old_pod_view(pods)
    assert (got_new.name if got_new else None, got_old.name if got_old else None) == (new, old)


def template(image: str, drives: list[str], **pod: Any) -> dict[str, Any]:
    volumes = [
        {"name": d, "persistentVolumeClaim": {"claimName": d, "readOnly": True}} for d in drives
    ]
    volumes.append({"name": "index", "persistentVolumeClaim": {"claimName": "metis-hb"}})
    container = {"name": "indexer", "image": image, "resources": pod.pop("resources", {})}
    return {"containers": [container], "volumes": volumes, **pod}


@pytest.mark.parametrize(
    ("before", "after", "said"),
    [
        (template("ix:1", ["docs"]), template("ix:1", ["docs"]), ""),
        (template("ix:1", ["docs"]), template("ix:2", ["docs"]), "indexer image ix:2"),
        (
            template("ix:1", ["docs", "wiki"]),
            template("ix:1", ["docs", "runbooks"]),
            "drive runbooks added, drive wiki removed",
        ),
        (
            template("ix:1", ["docs"]),
            template("ix:1", ["docs"], nodeSelector={"pool": "gpu"}),
            "placement",
        ),
        (
            template("ix:1", ["docs"], resources={"limits": {"memory": "2Gi"}}),
            template("ix:2", ["docs"], resources={"limits": {"memory": "4Gi"}}),
            "indexer image ix:2, cpu or memory",
        ),
        # The operator's own pod affinity (added by an upgrade) is no placement of the user's.
        (
            template("ix:1", ["docs"]),
            template("ix:1", ["docs"], affinity={"podAffinity": {"x": 1}}),
            "",
        ),
    ],
    ids=["same", "image", "drives", "placement", "image-and-memory", "pod-affinity"],
)
def test_what_a_rollout_changes(before: dict[str, Any], after: dict[str, Any], said: str) -> None:
    old = with_spec(pod("old", "1", node="n"), **before)
    new = with_spec(pod("new", "2"), **after)
    dep = {"spec": {"template": {"spec": after}}}
    assert observe.change(dep, [new, old]) == said
    assert observe.change(None, [old]) == "" and observe.change(dep, []) == ""


def test_the_machine_of_the_bases_pods() -> None:
    assert observe.node([]) is None
    assert observe.node([pod("new", "2"), pod("old", "1", node="n1", deleting=True)]) == "n1"
    assert observe.node([pod("a", "2", node="n2"), pod("b", "1", node="n1")]) == "n2"


def test_pod_failure() -> None:
    dep = {
        "status": {
            "conditions": [
                {"type": "ReplicaFailure", "status": "True", "message": "exceeded quota"}
            ]
        }
    }
    assert observe.pod_failure(dep) == "exceeded quota"
    assert observe.pod_failure({"status": {}}) is None and observe.pod_failure(None) is None


def test_scaled_to_zero_behind_a_selector() -> None:
    def workload(kind: str, name: str, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "kind": kind,
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": labels}}},
        }

    workloads = [
        workload("Deployment", "bge", 0, {"app": "bge", "tier": "model"}),
        workload("StatefulSet", "bge-sts", 0, {"app": "bge"}),
        workload("Deployment", "bge-live", 1, {"app": "bge"}),
        workload("Deployment", "other", 0, {"app": "other"}),
    ]
    assert observe.scaled_to_zero({"app": "bge"}, workloads) == [
        "Deployment bge",
        "StatefulSet bge-sts",
    ]
    assert observe.scaled_to_zero({}, workloads) == []


def test_claims_and_revisions() -> None:
    claim = {"metadata": {"annotations": {identity.REVISION: " r2 "}}, "status": {"phase": "Bound"}}
    assert observe.claim_bound(claim) and observe.revision(claim) == "r2"
    unlisted = {"metadata": {"annotations": {identity.REVISION: ""}}, "status": {"phase": "Bound"}}
    assert observe.from_data_source(unlisted) and not observe.revision(unlisted)
    assert not observe.from_data_source({"metadata": {}})
    assert not observe.claim_bound({"status": {"phase": "Pending"}})
    assert not observe.claim_bound(None)


@pytest.mark.parametrize(
    ("ports", "port"),
    [
        ([{"port": 8080}], 8080),
        ([{"name": "grpc", "port": 9000}, {"name": "http", "port": 80}], 80),
        ([], 80),
    ],
    ids=["first", "named-http", "none"],
)
def test_service_port(ports: list[dict[str, Any]], port: int) -> None:
    assert observe.service_port({"spec": {"ports": ports}}) == port
