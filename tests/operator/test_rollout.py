"""Rollouts of the operator's own changes, at most a few at a time; a user's change
of a base is never held."""

from __future__ import annotations

from typing import Any

from metis_operator import reconcile
from metis_operator.api.identity import GENERATION_ANNOTATION


def deployment(generation: str | None, image: str) -> dict[str, Any]:
    annotations = {GENERATION_ANNOTATION: generation} if generation else {}
    return {
        "metadata": {"annotations": annotations},
        "spec": {"template": {"spec": {"containers": [{"image": image}]}}},
    }


def test_at_most_the_limit_roll_at_once() -> None:
    rolling = {("ns", "a"), ("ns", "b")}
    assert reconcile.rollout_allowed(("ns", "a"), rolling, 2)
    assert not reconcile.rollout_allowed(("ns", "c"), rolling, 2)
    assert reconcile.rollout_allowed(("ns", "c"), {("ns", "a")}, 2)


def test_whose_change_it_is() -> None:
    running = deployment("3", "indexer:1")
    assert reconcile.operators_change(deployment("3", "indexer:2"), running)  # a new image
    assert not reconcile.operators_change(deployment("4", "indexer:2"), running)  # the user's
    assert not reconcile.operators_change(deployment("3", "indexer:1"), running)  # no rollout
    assert not reconcile.operators_change(deployment("3", "indexer:2"), None)  # a new base
    # A Deployment from before generations were recorded: an upgrade of the operator.
    assert reconcile.operators_change(deployment("3", "indexer:2"), deployment(None, "indexer:1"))
