"""Replicas as pure decisions: each one's children, how they keep apart, what a
disruption may take, and what the state and status say of them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from metis_operator import apply, children, kube, observe
from metis_operator.api.spec import SpecError, parse, to_indexer_config
from metis_operator.settings import IndexerSettings, Settings
from metis_operator.state import (
    PodView,
    ReplicaView,
    State,
    Verdict,
    derive,
)
from metis_operator.status import compose
from tests.operator.test_children import OWNER, SETTINGS, spec_with
from tests.operator.test_state import HEALTHY

SHARED = Settings(
    indexer=IndexerSettings(
        image="registry.example/metis-indexer:1", port=7700, index_access_mode="ReadWriteMany"
    )
)


def pod(name: str, replica: int, node: str | None = "node-a", **kw: Any) -> dict[str, Any]:
    labels = children.labels("handbook", "indexer", replica)
    meta: dict[str, Any] = {"name": name, "labels": labels, "creationTimestamp": kw.pop("at", "")}
    if kw.pop("gone", False):
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    ready = kw.pop("ready", True)
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector as the API server reads it (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        has, value = e["key"] in labels, labels.get(e["key"])
        held = {
            "In": has and value in e.get("values", []),
            "NotIn": not has or value not in e.get("values", []),
            "Exists": has,
            "DoesNotExist": not has,
        }[e["operator"]]
        if not held:
            return False
    return True


def test_replicas_are_one_to_ten_and_one_when_not_set() -> None:
    assert spec_with().replicas == 1
    assert spec_with(replicas=10).replicas == 10
    for wrong in (0, 11):
        with pytest.raises(SpecError, match=r"spec\.replicas"):
            spec_with(replicas=wrong)


def test_each_replica_has_its_own_deployment_drive_and_pods() -> None:
    spec = spec_with(replicas=3)
    names = [children.deployment(OWNER, spec, SETTINGS, replica=i) for i in range(3)]
    assert [d["metadata"]["name"] for d in names] == [
        "metis-handbook",
        "metis-handbook-replica-1",
        "metis-handbook-replica-2",
    ]
    claims = [children.index_claim(OWNER, SETTINGS, i)["metadata"]["name"] for i in range(3)]
    assert claims == [d["metadata"]["name"] for d in names]
    for i, d in enumerate(names):
        volumes = d["spec"]["template"]["spec"]["volumes"]
        (index,) = [v for v in volumes if v["name"] == "index"]
        assert index["persistentVolumeClaim"]["claimName"] == claims[i]
        own = d["spec"]["template"]["metadata"]["labels"]
        assert matches(d["spec"]["selector"], own)
        # Only replica 0's Deployment selects the others' pods: its selector is the
        # base's, immutable since before replicas.
        for j, other in enumerate(names):
            theirs = other["spec"]["template"]["metadata"]["labels"]
            assert matches(d["spec"]["selector"], theirs) == (i == j or i == 0)
            assert (children.replica_of({"metadata": {"labels": theirs}}) == i) == (i == j)


def test_one_replica_keeps_the_pod_template_of_before() -> None:
    """A base made before replicas gets the same pod: no rollout for the upgrade."""
    pod_spec = children.deployment(OWNER, spec_with(), SETTINGS)["spec"]["template"]
    assert "podAntiAffinity" not in pod_spec["spec"]["affinity"]
    assert pod_spec["spec"]["affinity"]["podAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": children.selector("handbook")},
                "topologyKey": children.HOSTNAME,
            }
        ]
    }
    assert children.REPLICA_LABEL not in pod_spec["metadata"]["labels"]


def test_replicas_keep_apart_and_a_replacement_follows_its_own_drive() -> None:
    spec = spec_with(replicas=3)
    labels = [children.labels("handbook", "indexer", i) for i in range(3)]
    for i in range(3):
        affinity = children.deployment(OWNER, spec, SETTINGS, replica=i)["spec"]["template"][
            "spec"
        ]["affinity"]
        (together,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        (apart,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert apart["weight"] == children.SPREAD_WEIGHT
        assert (
            together["topologyKey"] == apart["podAffinityTerm"]["topologyKey"] == children.HOSTNAME
        )
        for j in range(3):
            assert matches(together["labelSelector"], labels[j]) == (i == j)
            assert matches(apart["podAffinityTerm"]["labelSelector"], labels[j]) == (i != j)


def test_a_shared_drive_has_no_affinity_but_replicas_still_keep_apart() -> None:
    affinity = children.deployment(OWNER, spec_with(replicas=2), SHARED, replica=1)["spec"][
        "template"
    ]["spec"]["affinity"]
    assert set(affinity) == {"podAntiAffinity"}


def test_the_disruption_budget_lets_one_replica_down() -> None:
    budget = children.disruption_budget(OWNER)
    assert budget["kind"] == "PodDisruptionBudget"
    assert budget["spec"]["maxUnavailable"] == 1
    every = [children.labels("handbook", "indexer", i) for i in range(3)]
    assert all(matches(budget["spec"]["selector"], labels) for labels in every)
    path = "/apis/policy/v1/namespaces/team-a/poddisruptionbudgets/metis-handbook"
    assert kube.manifest_path(budget) == path


def test_replicas_have_the_base_service_as_peer() -> None:
    config = to_indexer_config(
        "handbook",
        spec_with(replicas=2),
        port=7700,
        embedding_url="http://bge-m3.team-a.svc:80",
        reranker_url=None,
        revisions={},
        peers=["http://metis-handbook.team-a.svc:7700"],
    )
    assert config.peers == ["http://metis-handbook.team-a.svc:7700"]


def test_a_replica_is_seen_from_its_own_pods() -> None:
    pods = [
        pod("a", 1, at="2026-01-01T00:00:00Z", gone=True),
        pod("b", 1, at="2026-01-01T00:01:00Z", ready=False),
    ]
    view = observe.replica_view(1, None, pods)
    assert view.pod is not None and view.pod.name == "b" and not view.answers
    assert not view.replacing  # one going away, one coming: a pod made again
    both = observe.replica_view(1, None, [pod("a", 1), pod("b", 1, ready=False)])
    assert both.replacing and both.pod is not None


def test_machines_running_two_replicas_are_named() -> None:
    pods = [
        pod("a", 0, "node-a"),
        pod("b", 1, "node-a"),
        pod("c", 2, "node-b"),
        pod("d", 2, "node-b"),  # a replacement beside its old pod: one replica
        pod("e", 3, "node-c", gone=True),
        pod("f", 4, None),
    ]
    assert observe.shared_machines(pods) == ("node-a",)


READY_POD = PodView("p", node="node-b", running=True, ready=True)


@pytest.mark.parametrize(
    ("replica", "reason"),
    [
        (ReplicaView(1), "replica 1: its pod is not created yet"),
        (
            ReplicaView(
                1, PodView("p", unschedulable="0/3 nodes are available: Insufficient cpu.")
            ),
            "replica 1 waits for a machine: no machine has 1 CPU cores free",
        ),
        (
            ReplicaView(1, PodView("p", node="node-b")),
            "replica 1 is starting on machine node-b",
        ),
        (
            ReplicaView(1, PodView("p", node="node-b", running=True)),
            "replica 1 builds its index on machine node-b (vectors from its peers first)",
        ),
        (
            ReplicaView(1, READY_POD, replacing=True),
            "replica 1: a change is rolling out",
        ),
    ],
)
def test_ready_needs_every_replica(replica: ReplicaView, reason: str) -> None:
    o = dataclasses.replace(HEALTHY, replicas=2, others=(replica,))
    verdict = derive(o)
    assert verdict.state is State.STARTING
    assert verdict.reason.startswith(reason)
    assert verdict.reason.endswith(f"; {o.answering} of 2 replicas answer searches")
    assert o.answering == 1 + replica.answers


def test_every_replica_answering_is_ready() -> None:
    o = dataclasses.replace(HEALTHY, replicas=2, others=(ReplicaView(1, READY_POD),))
    assert derive(o).state is State.READY and o.answering == 2


def test_the_status_counts_replicas_and_warns_of_a_shared_machine() -> None:
    o = dataclasses.replace(
        HEALTHY, replicas=2, others=(ReplicaView(1, READY_POD),), shared_machines=("node-a",)
    )
    s = compose.compose(
        {},
        Verdict(State.READY, "everything is indexed"),
        o,
        generation=2,
        address=None,
        revisions={},
        with_reranker=False,
        now="2026-01-01T00:00:00Z",
    ).dump()
    assert s["replicas"] == "2/2"
    assert s["observed"]["replicas"] == {"wanted": 2, "answering": 2}
    (warning,) = s["observed"]["warnings"]
    assert warning.startswith("2 replicas but machine(s) node-a run several of them")
    alone = dataclasses.replace(o, replicas=1, others=())
    assert (
        "warnings"
        not in compose.compose(
            {},
            Verdict(State.READY, "everything is indexed"),
            dataclasses.replace(alone, shared_machines=()),
            generation=2,
            address=None,
            revisions={},
            with_reranker=False,
            now="2026-01-01T00:00:00Z",
        ).dump()["observed"]
    )


def test_a_base_named_like_another_s_replica_takes_nothing_of_it() -> None:
    """`metis-<name>-replica-<i>` is also base `<name>-replica-<i>`'s `metis-<name>`: the
    names are the users' (both are valid), so whichever base came first keeps the
    objects, and the other is Failed, saying why, rather than taking them over."""
    assert spec_with().replicas and parse(
        "handbook-replica-1", {"sources": [{"drive": "d"}], "embedding": {"deployment": "m"}}
    )
    assert children.replica_name("handbook", 1) == children.child_name("handbook-replica-1")
    theirs = children.deployment(
        children.Owner("handbook-replica-1", "team-a", "uid-2"), spec_with(), SETTINGS
    )
    assert not apply._owned(theirs, OWNER)
    assert apply._owned(children.deployment(OWNER, spec_with(), SETTINGS, replica=1), OWNER)
    assert apply._owned({"kind": "Deployment", "metadata": {"name": "by-hand"}}, OWNER)
    said = apply._conflict(theirs, 1)
    assert said.startswith(
        "replica 1's Deployment metis-handbook-replica-1 belongs to base handbook-replica-1"
    )
    verdict = derive(dataclasses.replace(HEALTHY, conflicts=(said,)))
    assert verdict == Verdict(State.FAILED, said)
