"""One prober per model Service: cheap calls, the real one only when needed, and
failures count only once they span the grace period."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable

import httpx
import pytest

from metis_operator import prober
from metis_operator.prober import History, Prober
from metis_operator.state import Model

GOOD = (Model.AVAILABLE, "serves m (3 dimensions)")


@pytest.mark.parametrize(
    ("history", "now", "expected"),
    [
        (History(), 0.0, None),
        (History(good=GOOD, model_id="m"), 100.0, GOOD),
        (History(good=GOOD, failing_since=90.0, failure="timed out"), 100.0, GOOD),
        (
            History(good=GOOD, failing_since=80.0, failure="timed out"),
            100.0,
            (Model.NOT_ANSWERING, "timed out"),
        ),
        (
            History(failing_since=99.0, failure="connection refused"),
            100.0,
            (Model.NOT_ANSWERING, "connection refused"),
        ),
    ],
    ids=["nothing-yet", "answers", "failing-within-grace", "failing-past-grace", "never-answered"],
)
def test_what_bases_see(history: History, now: float, expected: object) -> None:
    assert prober.verdict(history, now, grace=20.0) == expected


def test_the_real_call_only_for_a_new_model_or_after_a_failure() -> None:
    h = History(good=GOOD, model_id="m")
    assert not prober.needs_real_call(h, "m")
    assert prober.needs_real_call(h, "m2")
    assert prober.needs_real_call(prober.after_failure(h, "x", 1.0), "m")
    assert prober.needs_real_call(History(), "m")


def test_failures_keep_their_first_time() -> None:
    h = prober.after_failure(History(good=GOOD), "a", 5.0)
    h = prober.after_failure(h, "b", 9.0)
    assert (h.failing_since, h.failure, h.good) == (5.0, "b", GOOD)
    assert prober.after_success(h, GOOD, "m") == History(good=GOOD, model_id="m")


class Model_:
    """A model server: counts calls, answers slowly (a timeout) when told."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.slow = 0
        self.model = "m"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        if self.slow:
            self.slow -= 1
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": self.model}]})
        if request.url.path == "/v1/embeddings":
            assert json.loads(request.content)["model"] == self.model
            return httpx.Response(200, json={"data": [{"embedding": [0.1, 0.2, 0.3]}]})
        return httpx.Response(404)


def model_prober(
    http: httpx.AsyncClient, *, interval: float, grace: float, on_change: Callable[[], None]
) -> Prober:
    """A prober of the embedding model Service team/m at http://m."""
    return Prober(
        http,
        "http://m",
        "embedding model",
        interval=interval,
        grace=grace,
        on_change=on_change,
        name="team/m",
    )


def test_a_slow_answer_does_not_flip_and_idle_probes_are_cheap() -> None:
    async def scenario() -> None:
        server = Model_()
        async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
            p = model_prober(http, interval=60, grace=20, on_change=lambda: None)
            await p.probe_once()
            assert prober.verdict(p.history, 0, 20) == (Model.AVAILABLE, "serves m (3 dimensions)")
            first = len(server.calls)
            assert server.calls == ["GET /v1/models", "GET /v1/models", "POST /v1/embeddings"]
            await p.probe_once()
            assert server.calls[first:] == ["GET /v1/models"]  # idle: the cheap call only
            server.slow = 4  # one slow round: every call of it times out
            await p.probe_once()
            seen = prober.verdict(p.history, p.history.failing_since + 1, 20)  # type: ignore[operator]
            assert seen is not None and seen[0] is Model.AVAILABLE
            late = prober.verdict(p.history, p.history.failing_since + 20, 20)  # type: ignore[operator]
            assert late is not None and late[0] is Model.NOT_ANSWERING
            server.slow = 0
            calls = len(server.calls)
            await p.probe_once()  # after a failure: the real call again
            assert "POST /v1/embeddings" in server.calls[calls:]
            assert p.history.failing_since is None
            server.model = "m2"
            calls = len(server.calls)
            await p.probe_once()  # a new model: the real call again
            assert "POST /v1/embeddings" in server.calls[calls:]

    asyncio.run(scenario())


def test_one_odd_answer_does_not_fail_a_base() -> None:
    """A new Service's address may lead for a moment to whatever had it before (a reused
    cluster IP, kube-proxy's rules not yet rewritten): a web server that serves no model
    is believed only once that spans the grace; meanwhile the base waits, saying why."""

    def web(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404 if request.url.path != "/" else 200, headers={"server": "wiki"})

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(web)) as http:
            p = model_prober(http, interval=60, grace=20, on_change=lambda: None)
            await p.probe_once()
            odd = "answers HTTP (wiki) but serves no model API"
            now = p.history.odd_since
            assert now is not None
            seen = prober.verdict(p.history, now, 20)
            assert seen is not None and seen[0] is Model.NOT_ANSWERING and odd in seen[1]
            p.history = dataclasses.replace(p.history, odd_since=now - 21)
            await p.probe_once()
            seen = prober.verdict(p.history, now, 20)
            assert seen is not None and seen[0] is Model.SERVES_ELSE and odd in seen[1]

    asyncio.run(scenario())


def test_one_prober_per_service_shared_by_bases() -> None:
    async def scenario() -> None:
        server = Model_()
        async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
            probers = prober.Probers(http, interval=60, grace=20)
            key = ("team", "m", "embedding model")
            a = probers.get(key, "http://m", ("team", "a"))
            b = probers.get(key, "http://m", ("team", "b"))
            assert a is b
            assert await a.result() == GOOD
            probers.release(("team", "a"), set())
            assert probers.get(key, "http://m", ("team", "b")) is a
            probers.release(("team", "b"), set())
            assert probers.calls() == {}
            await asyncio.sleep(0)

    asyncio.run(scenario())


def test_a_model_that_stops_wakes_its_bases_once_the_grace_is_over() -> None:
    """The grace ends while the prober sleeps between two probes: its bases are woken
    then all the same (a Ready base is otherwise not looked at again unless its indexer's
    answer changes)."""

    async def scenario() -> list[object]:
        server = Model_()
        woken: list[object] = []
        async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
            p = model_prober(
                http,
                interval=0.05,
                grace=0.12,
                on_change=lambda: woken.append(prober.verdict(p.history, 1e12, 0.12)),
            )
            p.start()
            try:
                async with asyncio.timeout(5):
                    while not woken:
                        await asyncio.sleep(0.01)
                    server.slow = 10**9  # it stops answering for good
                    while len(woken) < 2:
                        await asyncio.sleep(0.01)
            finally:
                p.stop()
        return [w[0] for w in woken]  # type: ignore[index]

    assert asyncio.run(scenario()) == [Model.AVAILABLE, Model.NOT_ANSWERING]
