"""A Ready base's timer poll: an indexer that answers as before ends the turn there."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from metis_operator import handlers
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
            runner = handlers.Runner(ctx)
            base = handlers.Base(("team", "handbook"), BODY, ready=ready)
            base.answer = indexer_status(**READY)
            if wake_after is not None:
                asyncio.get_running_loop().call_later(wake_after, base.wake.set)
            trigger = await runner.next_turn(base, interval=0.01)
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
        assert handlers.same_answer(answer, other) is same, bytes_used
