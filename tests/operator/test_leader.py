"""Leader election's policy as a table, and one replica against a fake Lease API."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest

from metis_operator import kube, leader
from metis_operator.leader import Action, Seen
from tests.support.processes import free_port


def lease(holder: str, renew: str = "t1", duration: int = 15) -> dict[str, Any]:
    return {
        "metadata": {"resourceVersion": "7"},
        "spec": {
            "holderIdentity": holder,
            "renewTime": renew,
            "leaseDurationSeconds": duration,
            "leaseTransitions": 2,
        },
    }


@pytest.mark.parametrize(
    ("current", "changed_at", "now", "action"),
    [
        (None, 0.0, 0.0, Action.CREATE),
        (lease("me"), 0.0, 100.0, Action.RENEW),
        (lease("other"), 90.0, 100.0, Action.WAIT),
        (lease("other"), 85.0, 100.0, Action.TAKE),
        (lease(""), 99.0, 100.0, Action.TAKE),
    ],
    ids=["no-lease", "mine", "held-and-renewed", "expired-as-observed-here", "released"],
)
def test_the_policy(current: Any, changed_at: float, now: float, action: Action) -> None:
    seen = Seen(leader.record(current), changed_at)
    assert leader.decide(current, seen, "me", now) is action


def test_expiry_is_measured_on_this_replicas_clock_from_the_last_change() -> None:
    first = leader.observe(None, lease("other", "t1"), 10.0)
    assert leader.observe(first, lease("other", "t1"), 30.0) is first  # unchanged: kept
    renewed = leader.observe(first, lease("other", "t2"), 30.0)
    assert renewed.changed_at == 30.0
    assert leader.decide(lease("other", "t2"), renewed, "me", 40.0) is Action.WAIT


def test_what_is_written() -> None:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    taken = leader.written(lease("other"), Action.TAKE, "me", "metis-system", at)
    assert taken["spec"] == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 3,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:00.000000Z",
    }
    assert taken["metadata"]["resourceVersion"] == "7"
    renewed = leader.written(lease("me"), Action.RENEW, "me", "metis-system", at)
    assert renewed["spec"]["leaseTransitions"] == 2 and "acquireTime" not in renewed["spec"]
    created = leader.written(None, Action.CREATE, "me", "ns", at)
    assert created["spec"]["leaseTransitions"] == 0 and "resourceVersion" not in created["metadata"]


class FakeApi:
    """The Lease as the API server keeps it: a write with a stale resourceVersion is a 409."""

    manager = "metis-operator"

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "GET":
            if self.lease is None:
                raise kube.ApiError(404, "not found")
            return self.lease
        if self.lease is not None and (
            method == "POST" or body["metadata"].get("resourceVersion") != str(self.version)
        ):
            raise kube.ApiError(409, "conflict")
        self.version += 1
        meta = {**body["metadata"], "resourceVersion": str(self.version)}
        self.lease = {**body, "metadata": meta}
        return self.lease


def test_two_replicas_one_leader_until_it_releases() -> None:
    api = FakeApi()
    a = leader.Elector(api, "metis-system", "a")  # type: ignore[arg-type]
    b = leader.Elector(api, "metis-system", "b")  # type: ignore[arg-type]
    assert a.try_once() is True
    assert b.try_once() is False
    assert a.try_once() is True  # renews
    assert b.try_once() is False
    a.release()
    assert b.try_once() is True
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "b"
    assert a.try_once() is False


def test_a_standby_answers_its_liveness_probe() -> None:
    port = free_port()
    health = leader.StandbyHealth(port)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        health.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz")
