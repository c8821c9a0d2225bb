"""A base's loop (runner.py): when it turns (a change of the base, its timer, a poll
that finds its indexer unchanged), what a turn writes and in what order, and what it
does with the requests made while the base was paused."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx
import pytest

from metis_operator import runner
from metis_operator.api import identity
from tests.operator.answers import STARTED, indexer_status
from tests.operator.contexts import context

READY = {**STARTED, "phase": "ready", "generation": 1, "documents": 3}


BODY = {"metadata": {"name": "handbook", "namespace": "team", "uid": "u-1"}}


def turn(answers: list[dict[str, Any]], *, ready: bool, wake_after: float | None = None) -> Any:
    """`next_turn` of a base whose last turn read READY, against an indexer answering
    `answers` in order (the last repeated); a mock transport: the point is what the
    loop does with an answer, not how it travels."""
    asked: list[httpx.Request] = []

    def indexer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json=answers[min(len(asked), len(answers)) - 1])

    async def scenario() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(indexer)) as http:
            ctx = context(http)
            loops = runner.Runner(ctx)
            base = runner.Base(("team", "handbook"), BODY, ready=ready)
            base.answer = indexer_status(**READY)
            if wake_after is not None:
                asyncio.get_running_loop().call_later(wake_after, base.wake.set)
            trigger = await loops.next_turn(base, interval=0.01)
            polls = {
                s.labels["changed"]: s.value
                for s in ctx.metrics.polls.collect()[0].samples
                if s.name.endswith("_total")
            }
            return trigger, polls, len(asked)

    return asyncio.run(scenario())


def test_a_ready_base_whose_indexer_answers_as_before_waits_again() -> None:
    trigger, polls, asked = turn([READY, READY, {**READY, "documents": 4}], ready=True)
    assert (trigger, asked) == ("timer", 3)
    assert polls == {"false": 2.0, "true": 1.0}


def test_an_indexer_that_stops_answering_is_a_turn() -> None:
    trigger, polls, _ = turn([READY, {"error": "no"}], ready=True)
    assert trigger == "timer" and polls == {"false": 1.0, "true": 1.0}


def test_a_base_not_ready_turns_at_its_timer_without_a_poll_of_its_own() -> None:
    assert turn([READY], ready=False)[::2] == ("timer", 0)


def test_a_change_wakes_a_ready_base_between_polls() -> None:
    trigger, polls, asked = turn([READY], ready=True, wake_after=0.1)
    assert trigger == "change" and asked >= 1 and polls == {"false": float(asked)}


def test_the_drive_counts_to_the_whole_percent_as_the_status_shows_it() -> None:
    used = {**READY, "drive": {"used_bytes": 50_000, "size_bytes": 1_000_000}}
    answer = indexer_status(**used)
    for bytes_used, same in ((50_000, True), (59_999, True), (60_000, False)):
        other = indexer_status(**{**used, "drive": {"used_bytes": bytes_used, "size_bytes": 10**6}})
        assert runner.same_answer(answer, other) is same, bytes_used


def test_a_paused_base_has_no_timer_turn_once_its_pause_is_written() -> None:
    for ready in (True, False):
        assert runner.timer_seconds(True, ready, 10.0) is None
    assert runner.timer_seconds(False, True, 10.0) == 10.0 * runner.READY_POLLS
    assert runner.timer_seconds(False, False, 10.0) == 10.0


# A new generation of a base is said in its status before its children are applied:
# while a hundred bases change at once, each change shows in the time of one write, not
# of three (bench/results/operator-kwok.md).


SPEC = {"embedding": {"deployment": "bge-m3"}, "sources": [{"drive": "docs"}]}


MODEL = {
    "/v1/models": {"data": [{"id": "BAAI/bge-m3", "object": "model"}]},
    "/v1/embeddings": {"data": [{"index": 0, "embedding": [0.1] * 8}]},
}


class Writes:
    """The API server as far as one base's turn writes: every write in order. A
    stand-in: the order of a turn's writes is the point, and a real API server's
    watches do not order writes to two kinds against each other."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        """The base itself (it still exists); no other object (a Secret is created)."""
        return body(1, "") if "/knowledgebases/" in path else None

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((f"create {manifest['kind']}", manifest))
        return manifest

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((f"apply {manifest['kind']}", manifest))
        return manifest

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("status" if path.endswith("/status") else f"patch {path}", patch))
        return patch

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("event", body))
        return body


def answer(request: httpx.Request) -> httpx.Response:
    found = MODEL.get(request.url.path)
    return httpx.Response(200, json=found) if found else httpx.Response(404)


def body(generation: int, prefix: str) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec["embedding"]["query_prefix"] = prefix
    meta = {"name": "handbook", "namespace": "team", "uid": "u-1", "generation": generation}
    return {"metadata": meta, "spec": spec}


def test_a_new_generation_is_written_before_its_children_and_once() -> None:
    cluster = Writes()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            ctx = context(http, cluster)
            ctx.cache.seen("services", {"metadata": {"name": "bge-m3", "namespace": "team"}})
            ctx.cache.seen(
                "persistentvolumeclaims", {"metadata": {"name": "docs", "namespace": "team"}}
            )
            loops = runner.Runner(ctx)
            base = runner.Base(("team", "handbook"), body(1, "a: "))
            await loops.reconcile(base, "change")
            cluster.writes.clear()
            base.body = body(2, "b: ")
            await loops.reconcile(base, "change")

    asyncio.run(scenario())
    kinds = [kind for kind, _ in cluster.writes]
    statuses = [w for kind, w in cluster.writes if kind == "status"]
    assert statuses and statuses[0]["status"]["observedGeneration"] == 2, kinds
    assert kinds.index("status") < kinds.index("apply ConfigMap"), kinds
    assert len(statuses) == 1, "the turn's status after applying is what it said before"


def test_a_drifted_base_reads_afresh_once_and_a_full_resync_comes_in_its_time() -> None:
    r = runner.Runner(context(env={"METIS_FULL_RESYNC_SECONDS": "3600"}))
    base = runner.Base(("team", "a"), {})
    assert not r.resync_due(base)
    base.drifted = True
    assert r.resync_due(base) and not r.resync_due(base)
    base.resynced -= 3600
    assert r.resync_due(base) and not r.resync_due(base)


def test_the_same_version_of_a_base_again_does_not_wake_it() -> None:
    """kopf's listing brings again every base the startup LIST started: at 1,000 bases,
    a second turn for each while the new leader derives them."""

    async def scenario() -> list[bool]:
        loops = runner.Runner(context(env={}))
        woken = []
        for body in (base_body("1"), base_body("1"), base_body("2", metadata__generation=2)):
            loops.seen(body, deleted=False)
            base = loops.bases[("team", "a")]
            woken.append(base.wake.is_set())
            base.wake.clear()
        loops.forget(("team", "a"))
        return woken

    assert asyncio.run(scenario()) == [True, False, True]


def base_body(version: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": "a",
            "namespace": "team",
            "resourceVersion": version,
            "generation": 1,
            "annotations": {"team": "search"},
        },
        "spec": {"drives": ["docs"]},
        "status": {"state": "Ready"},
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = body
        for p in parents:
            node = node[p]
        node[last] = value
    return body


@pytest.mark.parametrize(
    ("changes", "wakes"),
    [
        ({"status": {"state": "Starting"}}, False),
        ({"metadata__managedFields": [{"manager": "metis-operator"}]}, False),
        (
            {
                "metadata__annotations": {
                    "team": "search",
                    f"{identity.KOPF_PREFIX}/last-handled-configuration": "{}",
                }
            },
            False,
        ),
        ({"spec": {"drives": ["docs", "wiki"]}, "metadata__generation": 2}, True),
        ({"metadata__annotations": {"team": "search", "metis.astraeus.io/paused": "true"}}, True),
        ({"metadata__labels": {"tier": "gold"}}, True),
        ({"metadata__deletionTimestamp": "2026-12-06T00:00:00Z"}, True),
    ],
)
def test_what_in_a_base_tells_its_loop_news(changes: dict[str, Any], wakes: bool) -> None:
    assert runner.tells_news(base_body("1"), base_body("2", **changes)) is wakes


def test_a_base_is_not_woken_by_its_own_status_write() -> None:
    """Each status write comes back as a watch event: no turn for it."""

    async def scenario() -> list[bool]:
        loops = runner.Runner(context(env={}))
        woken = []
        bodies = [
            base_body("1"),
            base_body("2", status={"state": "Starting"}),
            base_body("3", spec={"drives": ["wiki"]}, metadata__generation=2),
        ]
        for body in bodies:
            loops.seen(body, deleted=False)
            base = loops.bases[("team", "a")]
            woken.append(base.wake.is_set())
            base.wake.clear()
        assert base.body["metadata"]["resourceVersion"] == "3"
        loops.forget(("team", "a"))
        return woken

    assert asyncio.run(scenario()) == [True, False, True]


def test_the_pause_annotation() -> None:
    def body(value: str | None) -> dict[str, object]:
        annotations = {identity.PAUSED: value} if value is not None else {}
        return {"metadata": {"annotations": annotations}}

    assert runner.paused(body("true")) and runner.paused(body("True"))
    assert not runner.paused(body("false")) and not runner.paused(body(None))


@pytest.mark.parametrize(
    ("annotations", "ran", "run", "clear"),
    [
        ({}, {}, {}, ()),
        ({identity.REINDEX: "a"}, {}, {}, ()),
        (
            {identity.REINDEX: "a", identity.DEFERRED_REINDEX: "a"},
            {},
            {identity.REINDEX: "a"},
            (),
        ),
        (
            {identity.REINDEX: "a", identity.DEFERRED_REINDEX: "a"},
            {identity.DEFERRED_REINDEX: "a"},
            {},
            (identity.DEFERRED_REINDEX,),
        ),
        (
            {identity.REINDEX: "b", identity.DEFERRED_REINDEX: "b"},
            {identity.DEFERRED_REINDEX: "a"},
            {identity.REINDEX: "b"},
            (),
        ),
        ({identity.DEFERRED_EVALUATE: "a"}, {}, {}, (identity.DEFERRED_EVALUATE,)),
        (
            {identity.EVALUATE: "b", identity.DEFERRED_EVALUATE: "a"},
            {},
            {},
            (identity.DEFERRED_EVALUATE,),
        ),
    ],
    ids=[
        "nothing-deferred",
        "a-request-kopf-ran",
        "deferred-runs",
        "ran-by-this-process-is-not-run-twice",
        "a-new-value-runs-again",
        "withdrawn-is-cleared",
        "superseded-is-cleared",
    ],
)
def test_which_deferred_requests_run(
    annotations: dict[str, str],
    ran: dict[str, str],
    run: dict[str, str],
    clear: tuple[str, ...],
) -> None:
    assert runner.deferred_requests(annotations, ran) == runner.Due(run, clear)


def test_a_deferred_request_the_indexer_does_not_take_is_dropped_after_the_requests_timeout() -> (
    None
):
    assert runner.given_up("a pass", 0) is None
    assert runner.given_up("a pass", runner.REQUEST_TIMEOUT - 1) is None
    dropped = runner.given_up("an evaluation", runner.REQUEST_TIMEOUT)
    assert dropped is not None and (dropped.kind, dropped.reason) == ("Warning", "RequestDropped")
    assert dropped.message.startswith("an evaluation not run: its indexer did not take it")
