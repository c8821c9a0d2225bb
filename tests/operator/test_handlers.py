"""What the operator registers with kopf: nothing that needs a finalizer (so deleting
a base, or the CRD with bases present, never waits for the operator), a watch for
each kind that decides a base; and what a reconciliation says, in order."""

from __future__ import annotations

import dataclasses

import kopf
from kopf import Resource

from metis_operator import cache, handlers
from metis_operator.api import identity
from metis_operator.api.status_types import KnowledgeBaseStatus
from metis_operator.cache import Deps
from metis_operator.reconcile import Outcome
from metis_operator.settings import load
from metis_operator.state import State, Verdict


def registered() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, load({}))
    return registry


def test_no_handler_needs_a_finalizer() -> None:
    r = registered()
    assert not r._spawning.get_all_handlers()  # no timers, no daemons
    assert not any(h.requires_finalizer for h in r._changing.get_all_handlers())


def test_every_kind_that_decides_a_base_is_watched_and_none_is_left_to_kopfs_indices() -> None:
    """kopf's indices hold every handler back until each object is indexed (a new
    leader at 1,000 bases derived its first base 100 s after the old one died)."""
    r = registered()
    assert not r._indexing.get_all_handlers()
    watched = {h.id for h in r._watching.get_all_handlers()}
    assert watched == {w.plural for w in cache.WATCHED} | {"base"}


def test_the_pause_annotation() -> None:
    def body(value: str | None) -> dict[str, object]:
        annotations = {identity.PAUSED: value} if value is not None else {}
        return {"metadata": {"annotations": annotations}}

    assert handlers.paused(body("true")) and handlers.paused(body("True"))
    assert not handlers.paused(body("false")) and not handlers.paused(body(None))


def test_a_reconciliation_says_what_it_did_then_its_new_state() -> None:
    body = {"metadata": {"name": "handbook", "namespace": "team"}}
    outcome = Outcome(
        Verdict(State.WAITING, "waiting for bge-m3"),
        KnowledgeBaseStatus(state="Waiting", reason="waiting for bge-m3"),
        Deps("team"),
        applied=("ConfigMap metis-handbook updated", "Deployment metis-handbook repaired"),
        rollout="started",
    )
    update = handlers.announce_state(body, {"state": "Ready"}, outcome)
    assert update.status is outcome.status
    assert [line.message for line in update.lines] == [
        "rolling out the operator's change (an image or setting)",
        "ConfigMap metis-handbook updated",
        "Deployment metis-handbook repaired",
        "Waiting: waiting for bge-m3",
    ]
    assert [(e.kind, e.reason) for e in update.events] == [
        ("Normal", "Repaired"),
        ("Warning", "Waiting"),
    ]
    again = handlers.announce_state(
        body, {"state": "Waiting"}, dataclasses.replace(outcome, applied=())
    )
    assert again.events == []
    assert [line.message for line in again.lines] == [
        "rolling out the operator's change (an image or setting)"
    ]


def test_the_kinds_watched_by_label_are_narrowed_by_the_api_server() -> None:
    settings = kopf.OperatorSettings()
    handlers.narrow_watches(settings)
    selectors = settings.watching.label_selectors

    def asked(group: str, plural: str, kind: str) -> list[str]:
        resource = Resource(group, "v1", plural, kind=kind, namespaced=True)
        return list(selectors.collect(resource))

    assert asked("", "pods", "Pod") == ["app.kubernetes.io/name=metis-indexer"]
    assert asked("", "configmaps", "ConfigMap") == ["app.kubernetes.io/managed-by=metis-operator"]
    assert asked("policy", "poddisruptionbudgets", "PodDisruptionBudget") == [
        "app.kubernetes.io/managed-by=metis-operator"
    ]
    # Drives, model Services and their workloads are read by name: never narrowed.
    assert asked("", "services", "Service") == asked("apps", "deployments", "Deployment") == []
