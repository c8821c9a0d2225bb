"""A paused base costs nothing: no call to its indexer or its models, no write after the
one that records the pause, however many poll intervals it stays paused. A request made
meanwhile is recorded on the base (no retry of kopf's) and run once when the pause ends,
by whichever operator process then looks after the base."""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
from typing import Any

import httpx
import kopf
import pytest

from metis_operator import handlers, runner
from metis_operator.api import identity
from metis_operator.status import compose
from tests.operator.answers import STARTED, indexer_status
from tests.operator.contexts import URL_TEMPLATE, context

KEY = ("team", "handbook")
INTERVAL = 0.01
"""The poll interval the loop runs under here (METIS_POLL_SECONDS): ten ms, not ten s."""
SPEC = {"embedding": {"deployment": "bge-m3"}, "sources": [{"drive": "docs"}]}
READY = {**STARTED, "phase": "ready", "generation": 1, "documents": 3}
READY_STATUS = {"state": "Ready", "reason": "3 documents", "observedGeneration": 1}
FIGURES = {"k": 10, "cases": 4, "recall_at_k": 0.75, "mrr": 0.5, "at": "2025-01-01T00:00:00Z"}
MODEL = {
    "/v1/models": {"data": [{"id": "BAAI/bge-m3", "object": "model"}]},
    "/v1/embeddings": {"data": [{"index": 0, "embedding": [0.1] * 8}]},
}


def body(annotations: dict[str, str], status: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"name": "handbook", "namespace": "team", "uid": "u-1", "generation": 1}
    return {
        "apiVersion": identity.API_VERSION,
        "kind": identity.KIND,
        "metadata": {**meta, "annotations": dict(annotations)},
        "spec": copy.deepcopy(SPEC),
        "status": copy.deepcopy(status if status is not None else READY_STATUS),
    }


class Cluster:
    """The API server as a base's loop and its request handlers use it: every write in
    order, and how many reads. A stand-in: what is counted is the point."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []
        self.reads = 0

    async def get(self, path: str) -> dict[str, Any] | None:
        """The base itself (it still exists); no other object (no Secret: the requests go
        without a token)."""
        self.reads += 1
        return body({}) if "/knowledgebases/" in path else None

    async def call(self, method: str, path: str, **_: Any) -> Any:
        self.reads += method == "GET"
        return None

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("create", manifest["kind"], manifest))
        return manifest

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("apply", manifest["kind"], manifest))
        return manifest

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("status" if path.endswith("/status") else "patch", path, patch))
        return patch

    async def post(self, path: str, event: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("event", event["reason"], event))
        return event

    def events(self) -> list[tuple[str, str]]:
        return [(e["reason"], e["message"]) for kind, _, e in self.writes if kind == "event"]


class Servers:
    """The base's indexer and its model Service, behind one mock transport: every
    request, by path."""

    def __init__(self, requests: int = 200) -> None:
        self.asked: list[str] = []
        self.sent: dict[str, Any] = {}
        self.requests = requests
        """How the indexer answers a request (503: not serving yet)."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(f"{request.method} {request.url.path}")
        if request.content:
            self.sent[request.url.path] = json.loads(request.content)
        if request.url.host.startswith("metis-handbook"):
            answers = {
                "/v1/status": (200, READY),
                "/v1/reindex": (202, {"accepted": True}),
                "/v1/evaluate": (200, FIGURES),
            }
            code, answer = answers.get(request.url.path, (404, {}))
            if request.method == "POST" and self.requests != 200:
                code, answer = self.requests, {"error": {"code": "starting", "message": "not yet"}}
            return httpx.Response(code, json=answer)
        found = MODEL.get(request.url.path)
        return httpx.Response(200, json=found) if found else httpx.Response(404)

    def indexer(self) -> list[str]:
        return [a for a in self.asked if not a.endswith(("/models", "/embeddings"))]


def setting(http: httpx.AsyncClient, cluster: Cluster) -> Any:
    ctx = context(http, cluster, {**URL_TEMPLATE, "METIS_POLL_SECONDS": str(INTERVAL)})
    ctx.cache.seen("services", {"metadata": {"name": "bge-m3", "namespace": "team"}})
    ctx.cache.seen("persistentvolumeclaims", {"metadata": {"name": "docs", "namespace": "team"}})
    return ctx


def test_a_paused_base_costs_no_call_and_no_write_over_many_polls() -> None:
    """A Ready base (its indexer asked every READY_POLLS intervals until now) paused:
    its loop writes the Paused condition once, then nothing and asks no one, over ten of
    a Ready base's poll periods."""
    cluster, servers = Cluster(), Servers()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(servers)) as http:
            loops = runner.Runner(setting(http, cluster))
            base = runner.Base(KEY, body({identity.PAUSED: "true"}), ready=True)
            base.answer = indexer_status(**READY)
            loops.bases[KEY] = base
            loop = asyncio.create_task(loops._loop(base))
            await asyncio.sleep(10 * runner.READY_POLLS * INTERVAL)  # the window counted
            loop.cancel()

    asyncio.run(scenario())
    assert servers.asked == []
    ((kind, _, patch),) = cluster.writes
    assert kind == "status" and compose.is_paused(patch["status"])


def test_a_paused_base_lets_go_of_its_model_probers() -> None:
    """The prober of a model Service no other base names stops: no call to the model on
    a paused base's behalf."""
    cluster, servers = Cluster(), Servers()

    async def scenario() -> dict[str, int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(servers)) as http:
            ctx = setting(http, cluster)
            loops = runner.Runner(ctx)
            ctx.probers.get(("team", "bge-m3", "embedding model"), "http://bge-m3.team", KEY)
            base = runner.Base(KEY, body({identity.PAUSED: "true"}))
            await loops.reconcile(base, "change")
            return ctx.probers.calls()

    assert asyncio.run(scenario()) == {}


def ask(fn: Any, new: str, annotations: dict[str, str]) -> tuple[kopf.Patch, Cluster, Servers]:
    """A request handler as kopf calls it on a base with these annotations: the patch
    it leaves for kopf's own write, and what it called."""
    cluster, servers = Cluster(), Servers()
    patch = kopf.Patch()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(servers)) as http:
            memo = kopf.Memo()
            memo.context = setting(http, cluster)
            memo.runner = runner.Runner(memo.context)
            await fn(
                new=new,
                body=kopf.Body(body(annotations)),
                patch=patch,
                memo=memo,
                reason=kopf.Reason.UPDATE,
                retry=0,
                runtime=datetime.timedelta(0),
            )

    asyncio.run(scenario())
    return patch, cluster, servers


@pytest.mark.parametrize(
    ("fn", "request_", "what", "route"),
    [
        (handlers.reindex, identity.REINDEX, "a pass", "/v1/reindex"),
        (handlers.evaluate, identity.EVALUATE, "an evaluation", "/v1/evaluate"),
    ],
    ids=["reindex", "evaluate"],
)
def test_a_request_on_a_paused_base_is_recorded_not_retried(
    fn: Any, request_: str, what: str, route: str
) -> None:
    """No kopf.TemporaryError (each retry of kopf's was a write of its progress record,
    every 30 s): the handler returns, its marker rides on kopf's own write."""
    patch, cluster, servers = ask(fn, "now", {identity.PAUSED: "true", request_: "now"})
    assert dict(patch) == {"metadata": {"annotations": {runner.DEFERRED[request_]: "now"}}}
    assert cluster.events() == [("Deferred", f"{what} runs when the pause ends")]
    assert servers.asked == []
    # Not paused: run at once, nothing recorded.
    patch, cluster, servers = ask(fn, "full 1", {request_: "full 1"})
    assert dict(patch) == {} and servers.indexer() == [f"POST {route}"]


def resumed(
    annotations: dict[str, str],
    turns: int,
    *,
    stale: dict[str, str] | None = None,
    paused_turns: int = 0,
    requests: int = 200,
) -> tuple[Cluster, Servers]:
    """A fresh process's loop (nothing in memory: a restart meanwhile) over a paused base
    carrying these annotations: `paused_turns` turns, then its pause ends and `turns`
    turns follow, the watch bringing back after the first an older body (`stale`
    annotations) than the loop's own removal of the markers."""
    cluster, servers = Cluster(), Servers(requests)

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(servers)) as http:
            loops = runner.Runner(setting(http, cluster))
            paused_before = compose.paused(READY_STATUS, "2025-01-01T00:00:00Z").dump()
            base = runner.Base(KEY, body({**annotations, identity.PAUSED: "true"}, paused_before))
            loops.bases[KEY] = base
            for _ in range(paused_turns):
                await loops.reconcile(base, "change")
            assert (servers.asked, cluster.writes) == ([], []), "a paused base costs nothing"
            loops.seen(body(annotations, paused_before), deleted=False)  # the pause ends
            for turn in range(turns):
                if turn == 1 and stale is not None:
                    older = body(stale, paused_before)
                    older["metadata"]["resourceVersion"] = "older"
                    loops.seen(older, deleted=False)
                await loops.reconcile(base, "change")
            for task in (loops.bases[KEY].task, loops.bases[KEY].judging):
                if task is not None:
                    task.cancel()

    asyncio.run(scenario())
    return cluster, servers


REQUESTED_WHILE_PAUSED = {
    identity.REINDEX: "now",
    identity.DEFERRED_REINDEX: "now",
    identity.EVALUATE: "k=5 1",
    identity.DEFERRED_EVALUATE: "k=5 1",
}


def test_requests_made_while_paused_run_once_when_the_pause_ends() -> None:
    """Three turns while still paused run nothing; three after the pause ends: each
    request ran once, at the first, and the markers were removed in one write."""
    cluster, servers = resumed(REQUESTED_WHILE_PAUSED, 3, paused_turns=3)
    assert servers.indexer().count("POST /v1/reindex") == 1
    assert servers.indexer().count("POST /v1/evaluate") == 1
    markers = [w for w in cluster.writes if w[0] == "patch"]
    assert markers == [
        (
            "patch",
            identity.path(*KEY),
            {"metadata": {"annotations": dict.fromkeys(runner.DEFERRED.values())}},
        )
    ]
    said = [reason for reason, _ in cluster.events()]
    assert said.count("Reindex") == 1 and said.count("Evaluated") == 1
    assert servers.sent["/v1/evaluate"] == {"k": 5}
    statuses = [w[2]["status"] for w in cluster.writes if w[0] == "status"]
    assert any((s.get("evaluation") or {}).get("mrr") == FIGURES["mrr"] for s in statuses)


def test_a_body_older_than_the_markers_removal_runs_nothing_twice() -> None:
    """The watch brings back, after the turn that ran the requests, a body older than
    that turn's removal of their markers: the next turns run nothing again."""
    _, servers = resumed(REQUESTED_WHILE_PAUSED, 3, stale=REQUESTED_WHILE_PAUSED)
    assert [a for a in servers.indexer() if a.startswith("POST")] == [
        "POST /v1/reindex",
        "POST /v1/evaluate",
    ]


@pytest.mark.parametrize(
    ("code", "tries", "marker_removed", "events"),
    [(503, 2, False, []), (400, 1, True, ["RequestRefused"])],
    ids=["not-serving-yet-is-tried-again", "refused-is-dropped-aloud"],
)
def test_a_deferred_request_the_indexer_does_not_take(
    code: int, tries: int, marker_removed: bool, events: list[str]
) -> None:
    cluster, servers = resumed(
        {identity.REINDEX: "a", identity.DEFERRED_REINDEX: "a"}, 2, requests=code
    )
    assert servers.indexer().count("POST /v1/reindex") == tries
    assert bool([w for w in cluster.writes if w[0] == "patch"]) is marker_removed
    said = [reason for reason, _ in cluster.events()]
    assert [r for r in said if r.startswith("Request") or r == "Reindex"] == events


def test_a_request_withdrawn_while_paused_is_not_run() -> None:
    """The request annotation removed, or changed since (kopf ran the new value): the
    marker goes, nothing runs."""
    annotations = {identity.DEFERRED_REINDEX: "now", identity.EVALUATE: "later"}
    annotations[identity.DEFERRED_EVALUATE] = "earlier"
    cluster, servers = resumed(annotations, 1)
    assert not [a for a in servers.indexer() if a.startswith("POST")]
    (patch,) = [w[2] for w in cluster.writes if w[0] == "patch"]
    assert patch == {"metadata": {"annotations": dict.fromkeys(runner.DEFERRED.values())}}


def test_pausing_resuming_and_deferring_are_no_write_of_kopfs() -> None:
    """kopf writes its record of what it handled at every change of the base's essence:
    the pause annotation and the markers are left out of it."""
    settings = kopf.OperatorSettings()
    handlers.keep_records(settings)
    storage = settings.persistence.diffbase_storage
    plain = body({identity.REINDEX: "now"})
    for extra in (
        {identity.PAUSED: "true"},
        {identity.DEFERRED_REINDEX: "now", identity.DEFERRED_EVALUATE: "k=5"},
    ):
        other = body({identity.REINDEX: "now", **extra})
        assert storage.build(body=kopf.Body(other)) == storage.build(body=kopf.Body(plain))
    changed = body({identity.REINDEX: "again"})
    assert storage.build(body=kopf.Body(changed)) != storage.build(body=kopf.Body(plain))
    assert "spec" not in json.dumps(storage.build(body=kopf.Body(plain)))
