"""One look at a base in three parts, and the one place they make an `Observation`."""

from __future__ import annotations

import dataclasses

from metis_operator.api.spec import Placement
from metis_operator.cache import Deps
from metis_operator.look import Applied, Asked, Look, Running, before_applying
from metis_operator.state import Model, ModelCheck, Observation, PodView, ReplicaView
from tests.operator.answers import indexer_status

ASKED = Asked(
    generation=3,
    deps=Deps("team", frozenset({"docs"})),
    address="http://metis-handbook.team.svc:7700",
    with_reranker=True,
    invalid="no",
    placement=Placement(memory_gb=8),
    missing_drives=("a",),
    unlisted_drives=("b",),
    missing_fluxes=("GitRepository gone",),
    unlisted_fluxes=("GitRepository new",),
    unbound_drives=("c",),
    embedding=ModelCheck("embedding model", "bge-m3", Model.AVAILABLE),
    reranker=ModelCheck("reranker", "rr", Model.NOT_ANSWERING),
    index_drive="metis-handbook",
    revisions={"docs": "r1"},
    served=True,
    unknown_fields=("spec.shiny",),
    restore_from="nightly",
)
APPLIED = Applied(
    replicas=2,
    index_drive_bound=True,
    conflicts=("taken",),
    child_notes=("cannot grow",),
    refused="quota",
)
RUNNING = Running(
    pod_failure="quota exceeded",
    replacing=True,
    change="indexer image x:2",
    pod=PodView("p-new", node="node-a"),
    old=PodView("p-old", node="node-b"),
    indexer=indexer_status(documents=3),
    indexer_error="refused",
    others=(ReplicaView(1),),
    shared_machines=("node-a",),
)


def test_every_field_of_an_observation_comes_from_one_part() -> None:
    """No field is left at its default by the assembly: each is the value of the part that
    holds it (a field added to `Observation` and to no part fails here)."""
    o = Look(ASKED, APPLIED, RUNNING).observation()
    for field in dataclasses.fields(Observation):
        holders = [p for p in (ASKED, APPLIED, RUNNING) if hasattr(p, field.name)]
        assert len(holders) == 1, field.name
        assert getattr(o, field.name) == getattr(holders[0], field.name), field.name
        assert getattr(o, field.name) != getattr(Observation(), field.name), field.name


def test_a_look_before_applying_is_the_last_ones_children_for_the_replicas_asked_now() -> None:
    """A new generation's early outcome: what its spec asks now, the children and what
    runs as the last turn found them, no refusal yet (the new spec may mend it)."""
    last = Look(dataclasses.replace(ASKED, generation=2), APPLIED, RUNNING)
    early = before_applying(ASKED, 3, last)
    assert early.asked is ASKED and early.running is RUNNING
    assert early.applied == dataclasses.replace(APPLIED, replicas=3, refused=None)


def test_a_part_not_seen_yet_is_its_defaults() -> None:
    """A turn that applies nothing (an invalid spec, a Failed base): one replica, nothing
    bound, nothing running."""
    o = Look(Asked(1, Deps("team"), invalid="bad")).observation()
    assert o == Observation(invalid="bad", generation=1)
