"""Rollouts of the operator's own changes, at most a few at a time; a user's change
of a base is never held."""

from __future__ import annotations

from typing import Any

from metis_operator import children, rollout
from metis_operator.api.identity import POD_INPUTS_ANNOTATION
from metis_operator.api.spec import KnowledgeBaseSpec, Placement, parse
from metis_operator.settings import IndexerSettings, Settings


def deployment(inputs: str | None, image: str) -> dict[str, Any]:
    annotations = {POD_INPUTS_ANNOTATION: inputs} if inputs else {}
    return {
        "metadata": {"annotations": annotations},
        "spec": {"template": {"spec": {"containers": [{"image": image}]}}},
    }


def test_at_most_the_limit_roll_at_once() -> None:
    rollouts = rollout.Rollouts(2)
    assert rollouts.turn(("ns", "a")) == rollouts.turn(("ns", "b")) == rollout.STARTED
    assert rollouts.turn(("ns", "a")) == rollout.STARTED, "a base rolling keeps its turn"
    assert rollouts.turn(("ns", "c")) == rollout.HELD
    assert rollouts.rolling == {("ns", "a"), ("ns", "b")}


def test_a_turn_is_given_back_once_the_rollout_is_over() -> None:
    """Over: the base settled (Ready or Failed) in a turn that did not start it; a base
    gone gives its turn back too. Then the next may start."""
    rollouts = rollout.Rollouts(1)
    assert rollouts.turn(("ns", "a")) == rollout.STARTED
    assert not rollouts.over(("ns", "a"), started=True, settled=True), "just started"
    assert not rollouts.over(("ns", "a"), started=False, settled=False), "not settled"
    assert rollouts.turn(("ns", "b")) == rollout.HELD
    assert rollouts.over(("ns", "a"), started=False, settled=True)
    assert not rollouts.over(("ns", "a"), started=False, settled=True), "no turn held"
    assert rollouts.turn(("ns", "b")) == rollout.STARTED
    assert rollouts.forget(("ns", "b")) and not rollouts.forget(("ns", "b"))
    assert rollouts.rolling == set()


def test_whose_change_it_is() -> None:
    running = deployment("3", "indexer:1")
    assert rollout.operators_change(deployment("3", "indexer:2"), running)  # a new image
    assert not rollout.operators_change(deployment("4", "indexer:2"), running)  # the user's
    assert not rollout.operators_change(deployment("3", "indexer:1"), running)  # no rollout
    assert not rollout.operators_change(deployment("3", "indexer:2"), None)  # a new base
    # A Deployment from before its pod inputs were recorded: an upgrade of the operator.
    assert rollout.operators_change(deployment("3", "indexer:2"), deployment(None, "indexer:1"))


def test_whose_change_it_is_on_real_manifests() -> None:
    """Only what of the spec makes the pod says a change is the user's: a new query
    prefix leaves the Deployment as it was (nothing to apply; the ConfigMap carries
    it), and a new image beside it is still the operator's rollout, held to the limit."""
    owner = children.Owner("handbook", "team-a", "uid-1")
    old = Settings(indexer=IndexerSettings(image="indexer:1", port=7700))
    new = Settings(indexer=IndexerSettings(image="indexer:2", port=7700))

    def spec(prefix: str = "", drives: tuple[str, ...] = ("docs",)) -> KnowledgeBaseSpec:
        sources = [{"drive": d} for d in drives]
        return parse(
            "handbook",
            {"sources": sources, "embedding": {"deployment": "minilm", "query_prefix": prefix}},
        )

    running = children.deployment(owner, spec(), old)
    assert children.deployment(owner, spec("query: "), old) == running
    assert rollout.operators_change(children.deployment(owner, spec("query: "), new), running)
    grown = spec(drives=("docs", "wiki"))
    assert not rollout.operators_change(children.deployment(owner, grown, new), running)
    moved = spec().model_copy(update={"placement": Placement(memory_gb=8)})
    assert not rollout.operators_change(children.deployment(owner, moved, new), running)
