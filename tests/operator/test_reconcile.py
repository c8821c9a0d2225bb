"""One reconciliation, in its two calls: what `begin` answers (an outcome when there is
nothing right to apply, else the plan, with the outcome to write first for a new
generation), and what `finish` applies, asking the rollouts for a turn."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx

from metis_operator import children, kube, reconcile, rollout
from metis_operator.api.spec import parse
from metis_operator.cache import Deps
from metis_operator.look import Applied, Asked, Look, Running
from metis_operator.settings import IndexerSettings, Settings
from metis_operator.state import State
from tests.operator.answers import indexer_status
from tests.operator.contexts import URL_TEMPLATE, context

SPEC = {"embedding": {"deployment": "bge-m3"}, "sources": [{"drive": "docs"}]}
MODEL = {
    "/v1/models": {"data": [{"id": "BAAI/bge-m3", "object": "model"}]},
    "/v1/embeddings": {"data": [{"index": 0, "embedding": [0.1] * 8}]},
}
OWNER = children.Owner("handbook", "team", "u-1")


class Cluster:
    """The API server as one reconciliation writes to it: every write in order. A
    stand-in: what a step sends is the point."""

    def __init__(self, refuse: bool = False) -> None:
        self.writes: list[str] = []
        self.refuse = refuse

    async def get(self, path: str) -> dict[str, Any] | None:
        """The base itself (it still exists); no other object."""
        return body(1) if "/knowledgebases/" in path else None

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.refuse:
            raise kube.ApiError(403, "exceeded quota")
        self.writes.append(f"create {manifest['kind']}")
        return manifest

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(f"apply {manifest['kind']}")
        return manifest


def model(request: httpx.Request) -> httpx.Response:
    found = MODEL.get(request.url.path)
    return httpx.Response(200, json=found) if found else httpx.Response(404)


def body(generation: int, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"name": "handbook", "namespace": "team", "uid": "u-1", "generation": generation}
    return {"metadata": meta, "spec": copy.deepcopy(SPEC if spec is None else spec)}


def begun(
    generation: int,
    previous: dict[str, Any],
    last: Look | None,
    *,
    spec: dict[str, Any] | None = None,
    services: tuple[str, ...] = ("bge-m3",),
) -> reconcile.Outcome | reconcile.Plan:
    async def scenario() -> reconcile.Outcome | reconcile.Plan:
        async with httpx.AsyncClient(transport=httpx.MockTransport(model)) as http:
            ctx = context(http, Cluster())
            for name in services:
                ctx.cache.seen("services", {"metadata": {"name": name, "namespace": "team"}})
            ctx.cache.seen(
                "persistentvolumeclaims", {"metadata": {"name": "docs", "namespace": "team"}}
            )
            return await reconcile.begin(ctx, body(generation, spec), previous, last=last)

    return asyncio.run(scenario())


LAST = Look(
    Asked(1, Deps("team")),
    Applied(index_drive_bound=True, refused="quota"),
    Running(indexer=indexer_status(phase="ready", generation=1, documents=3)),
)


def test_an_invalid_spec_is_an_outcome_with_nothing_applied() -> None:
    outcome = begun(2, {}, LAST, spec={"sources": []})
    assert isinstance(outcome, reconcile.Outcome)
    assert outcome.verdict.state is State.FAILED
    assert outcome.verdict.reason.startswith("the spec is invalid: ")
    assert outcome.deps == Deps("team") and outcome.status.observed_generation == 2


def test_a_base_whose_model_service_is_missing_applies_nothing() -> None:
    outcome = begun(2, {}, LAST, services=())
    assert isinstance(outcome, reconcile.Outcome), "no plan: the children stay as they are"
    assert outcome.verdict.state is State.FAILED
    assert outcome.indexer is None


def test_a_new_generation_begins_with_the_outcome_to_write_before_applying() -> None:
    """Said from the spec asked now and the last turn's look; not for a generation the
    status has seen, nor without a last look (a process's first turn of the base)."""
    plan = begun(2, {"observedGeneration": 1}, LAST)
    assert isinstance(plan, reconcile.Plan) and plan.early is not None
    assert plan.early.status.observed_generation == 2
    assert plan.early.look is not None and plan.early.look.running is LAST.running
    assert plan.early.look.applied == Applied(index_drive_bound=True)
    seen = begun(2, {"observedGeneration": 2}, LAST)
    first = begun(2, {"observedGeneration": 1}, None)
    assert isinstance(seen, reconcile.Plan) and seen.early is None
    assert isinstance(first, reconcile.Plan) and first.early is None


def finished(
    cluster: Cluster, rollouts: rollout.Rollouts, running_image: str | None = None
) -> tuple[reconcile.Outcome, list[str]]:
    """`finish` over a plan for generation 1, the indexer's image now `indexer:2`; with
    `running_image`, the base's Deployment as an operator with that image applied it."""

    async def scenario() -> reconcile.Outcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(model)) as http:
            env = {**URL_TEMPLATE, "METIS_INDEXER_IMAGE": "indexer:2"}
            ctx = context(http, cluster, env)
            ctx.cache.seen("services", {"metadata": {"name": "bge-m3", "namespace": "team"}})
            ctx.cache.seen(
                "persistentvolumeclaims", {"metadata": {"name": "docs", "namespace": "team"}}
            )
            if running_image is not None:
                old = Settings(indexer=IndexerSettings(image=running_image))
                deployment = children.deployment(OWNER, parse("handbook", SPEC), old)
                ctx.cache.seen("deployments", children.with_hash(deployment))
            plan = await reconcile.begin(ctx, body(1), {}, last=None)
            assert isinstance(plan, reconcile.Plan)
            return await reconcile.finish(ctx, plan, {}, fresh=False, rollouts=rollouts)

    outcome = asyncio.run(scenario())
    return outcome, cluster.writes


def test_a_rollout_of_the_operators_own_waits_for_its_turn() -> None:
    """The Deployment made with the old image is left as it is while as many bases as
    allowed roll out; the rest of the base's children are applied all the same."""
    busy = rollout.Rollouts(1)
    busy.turn(("team", "other"))
    outcome, writes = finished(Cluster(), busy, running_image="indexer:1")
    assert outcome.rollout == rollout.HELD
    assert "apply ConfigMap" in writes and "apply Deployment" not in writes
    free = rollout.Rollouts(1)
    outcome, writes = finished(Cluster(), free, running_image="indexer:1")
    assert outcome.rollout == rollout.STARTED and "apply Deployment" in writes
    assert free.rolling == {("team", "handbook")}
    outcome, writes = finished(Cluster(), busy)
    assert outcome.rollout == "" and "apply Deployment" in writes, "a new base: no rollout"


def test_a_child_the_api_server_refuses_is_said_and_nothing_after_it_applied() -> None:
    outcome, writes = finished(Cluster(refuse=True), rollout.Rollouts(1))
    assert writes == []
    assert outcome.verdict.state is State.PENDING
    assert outcome.verdict.reason.startswith("the API server refused Secret metis-handbook")
    assert outcome.look is not None and outcome.look.applied == Applied(
        refused=f"Secret {OWNER.child} (exceeded quota)"
    )
