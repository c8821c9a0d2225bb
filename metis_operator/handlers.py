"""The kopf handlers, and the loop that looks after each base.

kopf watches the bases and what decides them (drives, model Services, workloads,
the operator's ConfigMaps and indexer pods: cache.py), kept in memory from one LIST per
kind made at startup, before the watches start (`prime`), and the watches' events. A
change of any of them wakes the bases it concerns (`cache.affected`); each base has
one loop of its own (`Runner`), which reconciles it when woken, else every
`poll.interval_seconds` (the indexer's `GET /v1/status` over HTTP, everything else
from the cache). Every `poll.resync_seconds` one LIST per kind of child checks the
cache against the API server (drift.py): a base whose children differ reads them
afresh at once; each base reads them by name every `poll.full_resync_seconds` too,
spread over that time. The loops are the operator's own tasks, not kopf timers, so a
base carries no finalizer: deleting it, or the CRD with bases present, completes at
once, and the garbage collector removes the children by their owner references.

Each step of a base's loop collects the status it wants and what it says of it in a
`StatusUpdate`, which status_update.py applies: the status written only when it
changed, then the lines and the Events (one when the state changed). The user's
requests (reindex, evaluate annotations) are kopf field handlers. A base annotated
`metis.astraeus.io/paused: "true"` is left alone: its children are not touched and a
Paused condition says so (its one write); its loop then waits for a change without a
timer (no poll of its indexer), and lets go of its model probers. A request made
meanwhile is recorded on the base in an annotation of the operator's
(`metis.astraeus.io/deferred-reindex`, `-evaluate`: written with kopf's own record of
the request, in the same PATCH) and run by the base's loop when the pause ends.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import random
import re
import time
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import httpx
import kopf

from metis_indexer.schema import StatusAnswer
from metis_operator import (
    cache,
    children,
    drift,
    indexer_client,
    kube,
    quality,
    reconcile,
    report,
    status_compose,
    status_update,
)
from metis_operator.api import identity
from metis_operator.cache import Cache, Deps, Key
from metis_operator.context import Context
from metis_operator.metrics import Metrics
from metis_operator.prober import Probers
from metis_operator.reconcile import Outcome
from metis_operator.settings import Settings
from metis_operator.state import Observation, State
from metis_operator.status_update import Event, StatusUpdate

DEFAULT_K = 10
_K = re.compile(r"(?:^|[^a-z])k=(\d+)")
_WARNING_STATES = (State.FAILED, State.WAITING)
T = TypeVar("T")
KOPF_PREFIX = f"kopf.{identity.GROUP}"
"""kopf's own annotations. Not the group itself: kopf leaves every annotation under its
prefix out of the changes it reacts to, and the user's requests (reindex, evaluate)
are annotations under the group."""
log = logging.getLogger("metis_operator")
REQUEST_TIMEOUT = 3600
"""Seconds kopf keeps trying a request (reindex, evaluate) before it gives it up."""
READY_POLLS = 6
"""A Ready base's indexer is asked every sixth poll interval (60 s at the default): what
changes a Ready base (its spec, a drive's revision, its pods, its model's probe) wakes its
loop at once; only a change the indexer finds by itself (a rescan that reads) shows this
much later. At 1,000 bases the polls were the operator's main idle work (1.6 ms of CPU
each); such a poll that finds the indexer's answer unchanged is all of that turn
(`Runner.unchanged`)."""
KIND_LOOKS = 3
"""Poll intervals between two looks whether the KnowledgeBase kind is still served (30 s
at the default interval)."""
PRIME_RETRY_SECONDS = 2.0
"""How soon a LIST that fills the cache at startup is tried again."""
DRIFT_SETTLE_SECONDS = 2.0
"""How long the drift check lets the watches catch up with its LISTs."""
DEFERRED = {
    identity.REINDEX: identity.DEFERRED_REINDEX,
    identity.EVALUATE: identity.DEFERRED_EVALUATE,
}
"""Each request annotation, and the operator's annotation that records its value when it
was made while the base was paused."""
UNHANDLED = (identity.PAUSED, *DEFERRED.values())
"""Annotations kopf's record of what it handled leaves out: no handler of kopf's reads
them, and each change of one was a write of that record (pausing, resuming, deferring)."""


def paused(body: Mapping[str, Any]) -> bool:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(identity.PAUSED, "")).strip().lower() == "true"


@dataclasses.dataclass
class Base:
    """One base's loop: its latest body, what it depends on, what it last wrote."""

    key: Key
    body: dict[str, Any]
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    status: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None
    resynced: float = dataclasses.field(default_factory=time.monotonic)
    """When it last read its children from the API server (a start spreads it back)."""
    drifted: bool = False
    """The drift check found its children other than the cache holds them."""
    judging: asyncio.Task[None] | None = None
    """The evaluation after a change of retrieval settings, while it runs (quality.py)."""
    ready: bool = False
    """Whether its last turn found it Ready: its indexer is then asked less often."""
    answer: StatusAnswer | None = None
    """Its indexer's answer as its last turn read it."""
    observation: Observation | None = None
    """What its last turn derived its state from."""
    unevaluable: str | None = None
    """Retrieval settings whose evaluation the indexer refused (no evaluation set)."""
    ran: dict[str, str] = dataclasses.field(default_factory=dict)
    """The deferred requests its loop ran or dropped (marker annotation → value), until
    a body without that marker shows the removal arrived: an older body still carrying
    it never runs it twice."""
    trying: dict[str, float] = dataclasses.field(default_factory=dict)
    """Since when (monotonic) a deferred request's indexer does not answer it."""

    def previous(self) -> dict[str, Any]:
        """The status last written by this process, else the stored one."""
        if self.status is not None:
            return self.status
        return copy.deepcopy(dict(self.body.get("status") or {}))


class Runner:
    """Every base's loop, and which bases are rolling out a change of the operator's."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.bases: dict[Key, Base] = {}
        self.rolling: set[Key] = set()
        self.dependents = cache.Dependents()
        ctx.probers.wake = self.wake

    def seen(self, body: Mapping[str, Any], deleted: bool) -> None:
        """A base's new body: its loop starts or wakes; one deleted, or being deleted (held
        by another's finalizer), is forgotten: never written to again."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if deleted or status_update.being_deleted(body):
            self.forget(key)
            return
        base = self.bases.get(key)
        if base is None:
            # The bases' full resyncs spread over the period, not made together.
            spread = random.uniform(0, self.ctx.settings.poll.full_resync_seconds)
            base = self.bases[key] = Base(
                key, copy.deepcopy(dict(body)), resynced=time.monotonic() - spread
            )
            self.dependents.set(key, Deps(key[0]))  # only its own children before its first look
            base.task = asyncio.create_task(self._loop(base), name=f"base {key[0]}/{key[1]}")
        elif _version(body) and _version(body) == _version(base.body):
            return  # the same object again (a watch's listing after the startup LIST's)
        else:
            news = tells_news(base.body, body)
            base.body = copy.deepcopy(dict(body))
            annotations = _annotations(body)
            base.ran = {m: v for m, v in base.ran.items() if annotations.get(m) == v}
            if not news:
                return
        base.wake.set()

    async def follow_kind(self) -> None:
        """Forget every base once their kind is no longer served (the CRD deleted): the
        API server sends no event for each base then, and their loops would look on at
        children no one owns. One discovery request every `KIND_LOOKS` poll intervals,
        for all bases; an answer other than 404 keeps them."""
        path = f"/apis/{identity.API_VERSION}"
        while True:
            await asyncio.sleep(KIND_LOOKS * self.ctx.settings.poll.interval_seconds)
            if not self.bases:
                continue
            try:
                served = await self.ctx.cluster.get(path) is not None
            except Exception as e:  # the next look asks again; this loop must not end
                log.warning("cannot tell whether %s is served: %s", identity.API_VERSION, e)
                continue
            if not served:
                log.warning(
                    "%s is no longer served (its CRD was deleted): forgetting %d base(s)",
                    identity.API_VERSION,
                    len(self.bases),
                )
                for key in list(self.bases):
                    self.forget(key)

    async def follow_drift(self) -> None:
        """Every `poll.resync_seconds`, list each kind of child (one request per kind for
        every base, narrowed to the operator's label) and wake, to read theirs afresh,
        the bases whose children differ from the cache. A failed look is tried at the
        next; this loop must not end."""
        while True:
            await asyncio.sleep(self.ctx.settings.poll.resync_seconds)
            if ghosts := self.ctx.cache.drop_unconfirmed():
                log.info(
                    "%d object(s) listed at startup were gone before the watches began", ghosts
                )
            if not self.bases:
                continue
            try:
                found = await self.drifted()
            except Exception as e:
                log.warning("cannot check the cache against the API server: %s", e)
                continue
            for key in found & set(self.bases):
                self.bases[key].drifted = True
                report.say(key, "its children differ from the watch cache: read afresh")
            self.wake(found)

    async def drifted(self) -> set[Key]:
        """The bases whose children the API server holds otherwise than the cache, and
        which no watch event changed in the cache while the LISTs ran or in the
        `DRIFT_SETTLE_SECONDS` after (a watch a moment behind the LIST is no miss)."""
        namespaces = self.ctx.settings.runtime.namespaces or (None,)
        before = self.cached()
        listed: drift.Seen = {}
        for kind in cache.CHILDREN:
            for namespace in namespaces:
                answer = await self.ctx.cluster.call(
                    "GET", drift.list_path(kind, namespace), query={"labelSelector": drift.SELECTOR}
                )
                listed |= drift.seen(kind.kind, (answer or {}).get("items") or [])
        await asyncio.sleep(DRIFT_SETTLE_SECONDS)
        return drift.drifted(listed, self.cached(), before)

    def cached(self) -> drift.Seen:
        out: drift.Seen = {}
        for kind in cache.CHILDREN:
            out |= drift.seen(kind.kind, self.ctx.cache.every(kind.kind))
        return out

    def forget(self, key: Key) -> None:
        base = self.bases.pop(key, None)
        self.dependents.drop(key)
        for task in (base.task, base.judging) if base is not None else ():
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if key in self.rolling:
            self.rolling.discard(key)
            self.wake(set(self.bases))  # the next may roll out
        self.ctx.probers.release(key, set())
        self.ctx.metrics.forget(key)
        self.ctx.tokens.discard(key)  # its Secret goes with it; a new base needs one

    def wake(self, keys: set[Key]) -> None:
        for key in keys:
            base = self.bases.get(key)
            if base is not None:
                base.wake.set()

    async def _loop(self, base: Base) -> None:
        interval = self.ctx.settings.poll.interval_seconds
        trigger = "change"
        while True:
            base.wake.clear()
            try:
                await self.reconcile(base, trigger)
            except asyncio.CancelledError:
                raise
            except status_update.Gone as e:
                report.say(base.key, f"forgotten: {e}")
                if self.bases.get(base.key) is base:
                    self.forget(base.key)
                return
            except Exception:
                log.exception("reconciling %s/%s failed", *base.key, extra=report.about(base.key))
            trigger = await self.next_turn(base, interval)

    async def next_turn(self, base: Base, interval: float) -> str:
        """Wait for the base's next turn: a change wakes it; else its timer, past which a
        Ready base whose indexer answers as before waits again (nothing else changes a
        Ready base unwoken). A paused base whose pause is written has no timer: only a
        change wakes it, the end of its pause among them."""
        while True:
            try:
                at_rest = paused(base.body) and status_compose.is_paused(base.previous())
                wait = timer_seconds(at_rest, base.ready, interval)
                await asyncio.wait_for(base.wake.wait(), timeout=wait)
                return "change"
            except TimeoutError:
                if not (base.ready and await self.unchanged(base)):
                    return "timer"

    async def unchanged(self, base: Base) -> bool:
        """Whether the indexer answers as it did at the base's last turn (one request)."""
        if base.answer is None:
            return False
        answer, _ = await indexer_client.status(self.ctx, children.Owner.of(base.body))
        same = answer is not None and same_answer(answer, base.answer)
        self.ctx.metrics.polls.labels(changed=str(not same).lower()).inc()
        return same

    async def reconcile(self, base: Base, trigger: str) -> None:
        """One turn of the loop: the status written once with what is said of it, then
        what follows from the new state (rollout turns, metrics, a quality check)."""
        ctx = self.ctx
        async with base.lock:
            body, previous = copy.deepcopy(base.body), base.previous()
            if paused(body):
                ctx.metrics.reconciliations.labels(trigger=trigger).inc()
                await self.pause(base, body, previous)
                return
            fresh = self.resync_due(base)
            trigger = "resync" if fresh else trigger
            ctx.metrics.reconciliations.labels(trigger=trigger).inc()
            if status_compose.is_paused(previous):
                report.say(base.key, "resumed")

            async def early(outcome: Outcome) -> dict[str, Any]:
                await status_update.apply(ctx, base, announce_state(body, previous, outcome))
                return base.previous()

            with ctx.metrics.errors.labels(trigger=trigger).count_exceptions():
                with ctx.metrics.seconds.time():
                    outcome = await reconcile.run(
                        ctx,
                        body,
                        previous,
                        fresh=fresh,
                        may_roll=lambda: self.turn(base.key),
                        last=base.observation,
                        early=early,
                    )
                # After an early write, what this turn says is against what that wrote.
                await status_update.apply(ctx, base, announce_state(body, base.previous(), outcome))
        if self.bases.get(base.key) is base:
            self.dependents.set(base.key, outcome.deps)
        base.ready = outcome.verdict.state is State.READY
        base.answer = outcome.indexer
        base.observation = outcome.observation
        self.follow_rollout(base.key, outcome)
        self.record_metrics(base.key, outcome)
        self.start_quality_check(base, body, outcome)
        await self.run_deferred(base)

    async def pause(self, base: Base, body: Mapping[str, Any], previous: Mapping[str, Any]) -> None:
        """A paused base's turn: the Paused condition written (once: then the status is
        what it was), its model probers let go (another base naming them keeps them) and
        a quality check under way stopped; no call to its indexer, no other write. The
        caller holds the base's lock."""
        await status_update.apply(self.ctx, base, reconcile_paused(body, previous))
        self.ctx.probers.release(base.key, set())
        if base.judging is not None:
            base.judging.cancel()

    async def run_deferred(self, base: Base) -> None:
        """Run the requests made while the base was paused (`deferred_requests`), once its
        pause has ended, then remove their markers in one write. A request its indexer
        does not answer yet stays for the next turn, one poll interval later, until
        `given_up` drops it."""
        body = copy.deepcopy(base.body)
        if paused(body):
            return
        annotations = _annotations(body)
        due = deferred_requests(annotations, base.ran)
        done = {marker: annotations[marker] for marker in due.clear}
        for request, value in due.run.items():
            marker, what = DEFERRED[request], request_what(request, value)
            report.say(base.key, f"{what} asked while paused: run now", request="deferred")
            try:
                await self.run_request(body, request, value)
            except indexer_client.IndexerError as e:
                since = base.trying.setdefault(marker, time.monotonic())
                dropped = None if not e.temporary else given_up(what, time.monotonic() - since)
                if e.temporary and dropped is None:
                    report.say(base.key, f"{what} not run yet: {e}", request="deferred")
                    base.ready = False  # its next turn comes at the next interval
                    continue
                said = dropped or Event("Warning", "RequestRefused", "Request", str(e))
                log.warning("%s/%s: %s", *base.key, said.message, extra=report.about(base.key))
                await status_update.post_event(self.ctx, body, said)
            base.trying.pop(marker, None)
            base.ran[marker] = value
            done[marker] = value
        await self.unmark(base, done)

    async def unmark(self, base: Base, done: Mapping[str, str]) -> None:
        """Remove the markers of deferred requests done (marker → value) from the base, in
        one merge patch; a marker that took another value meanwhile (a new request made
        during a new pause) stays for the next turn."""
        current = _annotations(base.body)
        markers = [m for m, value in done.items() if current.get(m) == value]
        if not markers:
            return
        patch = {"metadata": {"annotations": dict.fromkeys(markers)}}
        try:
            await self.ctx.cluster.merge_patch(identity.path(*base.key), patch)
        except kube.ApiError as e:
            if e.status == 404:
                raise status_update.Gone(f"its annotations cannot be written: {e}") from None
            raise
        kept = {k: v for k, v in _annotations(base.body).items() if k not in markers}
        base.body = {**base.body, "metadata": {**base.body["metadata"], "annotations": kept}}

    async def run_request(self, body: Mapping[str, Any], request: str, value: str) -> None:
        """Run the request `request` (an annotation: reindex or evaluate) of value
        `value` on the base `body`: the indexer asked, the figures of an evaluation
        written to the status, an Event posted. An IndexerError says why it did not run."""
        ctx, owner = self.ctx, children.Owner.of(body)
        if request == identity.REINDEX:
            await indexer_client.reindex(ctx, owner, full=value.startswith("full"))
            started = f"{request_what(request, value)} started"
            await status_update.post_event(
                ctx, body, Event("Normal", "Reindex", "Reindex", started)
            )
            return
        found = _K.search(value)
        figures = await indexer_client.evaluate(ctx, owner, k=int(found[1]) if found else DEFAULT_K)
        figures[quality.RETRIEVAL] = quality.retrieval(body.get("spec") or {})
        base = self.bases.get(_key(body)) or Base(_key(body), copy.deepcopy(dict(body)))
        async with base.lock:
            await status_update.apply(ctx, base, evaluated(body, base.previous(), figures))

    def resync_due(self, base: Base) -> bool:
        """Whether this turn reads the children from the API server rather than the
        cache: the drift check found them changed, or its full resync is due; the clock
        restarts when it does."""
        full = time.monotonic() - base.resynced >= self.ctx.settings.poll.full_resync_seconds
        if not (full or base.drifted):
            return False
        base.resynced, base.drifted = time.monotonic(), False
        return True

    def turn(self, key: Key) -> bool:
        """Whether `key` may roll out now; if so it holds a turn (no await between the
        check and the taking: the loops share one thread)."""
        if not reconcile.rollout_allowed(key, self.rolling, self.ctx.settings.runtime.max_rollouts):
            return False
        self.rolling.add(key)
        return True

    def follow_rollout(self, key: Key, outcome: Outcome) -> None:
        """A base whose rollout is over (settled, and not just started) gives its turn
        to the next."""
        if outcome.rollout == "held":
            log.debug("%s/%s waits for its turn to roll out", *key)
        settled = outcome.verdict.state in (State.READY, State.FAILED)
        if key in self.rolling and outcome.rollout != "started" and settled:
            self.rolling.discard(key)
            self.wake(set(self.bases) - self.rolling)  # the next may start

    def record_metrics(self, key: Key, outcome: Outcome) -> None:
        """The base's state, and the figures of its last evaluation when it has them."""
        self.ctx.metrics.record(key, outcome.verdict.state)
        evaluation = outcome.status.evaluation
        if (
            evaluation is not None
            and evaluation.recall_at_k is not None
            and evaluation.mrr is not None
        ):
            self.ctx.metrics.evaluated(key, evaluation.recall_at_k, evaluation.mrr)

    def start_quality_check(self, base: Base, body: Mapping[str, Any], outcome: Outcome) -> None:
        """Evaluate a Ready base again when its retrieval settings changed since its
        last evaluation (`quality.due`), one evaluation at a time."""
        settings = quality.retrieval(body.get("spec") or {})
        if (
            outcome.verdict.state is State.READY
            and base.judging is None
            and quality.due(settings, outcome.status.evaluation, base.unevaluable)
        ):
            base.judging = asyncio.create_task(self.judge(base, settings))

    async def judge(self, base: Base, settings: str) -> None:
        """Evaluate a Ready base whose last evaluation was made under other retrieval
        settings (with the same k), then set QualityRegressed and post the Event
        quality.judge decides."""
        ctx = self.ctx
        try:
            before = base.previous()["evaluation"]
            try:
                figures = await indexer_client.evaluate(
                    ctx, children.Owner.of(base.body), k=int(before["k"])
                )
            except indexer_client.IndexerError as e:
                if not e.temporary:  # no evaluation set, or one the indexer refuses
                    base.unevaluable = settings
                    report.say(base.key, f"not evaluated under {settings}: {e}", request="quality")
                return
            current = {**figures, quality.RETRIEVAL: settings}
            tolerance = ctx.settings.quality.tolerance
            async with base.lock:
                update = judged(base.body, base.previous(), before, current, tolerance)
                await status_update.apply(ctx, base, update)
            ctx.metrics.evaluated(base.key, current["recall_at_k"], current["mrr"])
        except status_update.Gone:
            return  # its loop finds it gone too
        except Exception:
            log.exception(
                "evaluating %s/%s after a change failed", *base.key, extra=report.about(base.key)
            )
        finally:
            base.judging = None


def same_answer(a: StatusAnswer, b: StatusAnswer) -> bool:
    """Whether two answers of an indexer say the same to the status: its drive's use as
    the status shows it, to the whole percent (a drive a node shares with others,
    local-path's, changes by some bytes at every look)."""
    unread = {"drive": None}
    return status_compose.drive(a) == status_compose.drive(b) and a.model_copy(
        update=unread
    ) == b.model_copy(update=unread)


def timer_seconds(at_rest: bool, ready: bool, interval: float) -> float | None:
    """How long a base's loop waits for a change before its timer turn: a Ready base
    `READY_POLLS` intervals (then its indexer is asked whether anything changed), any
    other one interval, a base at rest (paused, and its Paused condition written) for
    ever (None: nothing but a change wakes it; its turn would write nothing and ask no
    one). A paused base whose Paused write failed tries it again at the next interval."""
    if at_rest:
        return None
    return interval * (READY_POLLS if ready else 1)


@dataclasses.dataclass(frozen=True)
class Due:
    """What a base's loop does with the requests made while it was paused."""

    run: dict[str, str]
    """Request annotation → value: to run now."""
    clear: tuple[str, ...]
    """Markers to remove without running them: withdrawn (the request annotation removed
    or changed since: kopf's handler ran the new value) or already run by this process."""


def deferred_requests(annotations: Mapping[str, str], ran: Mapping[str, str]) -> Due:
    """The requests recorded as made while the base was paused (`DEFERRED`'s markers),
    as its annotations and what this process already ran (`Base.ran`) say. The caller
    runs them only once the pause has ended."""
    run: dict[str, str] = {}
    clear: list[str] = []
    for request, marker in DEFERRED.items():
        value = annotations.get(marker)
        if value is None:
            continue
        if annotations.get(request) == value and ran.get(marker) != value:
            run[request] = value
        else:
            clear.append(marker)
    return Due(run, tuple(clear))


def given_up(what: str, trying_seconds: float) -> Event | None:
    """A request deferred by a pause whose indexer has not answered it (not serving yet,
    a replacement taking over) for `trying_seconds` since the pause ended: None while it
    is tried again at each turn, the Warning that drops it after `REQUEST_TIMEOUT`, as
    kopf gives up a request made outside a pause."""
    if trying_seconds < REQUEST_TIMEOUT:
        return None
    message = (
        f"{what} not run: its indexer did not take it in the {REQUEST_TIMEOUT // 60} minutes "
        "after the pause ended; annotate it again"
    )
    return Event("Warning", "RequestDropped", "Request", message)


def request_what(request: str, value: str) -> str:
    """A request as the Events and lines name it."""
    if request == identity.EVALUATE:
        return "an evaluation"
    return "a full reindex" if value.startswith("full") else "a pass"


def reconcile_paused(body: Mapping[str, Any], previous: Mapping[str, Any]) -> StatusUpdate:
    """A paused base: its status as it was with a Paused condition, and a line when
    it was not paused yet."""
    update = StatusUpdate(body, status_compose.paused(previous, reconcile.now()))
    if not status_compose.is_paused(previous):
        update.say("paused: the base and its children are left as they are")
    return update


def announce_state(
    body: Mapping[str, Any], previous: Mapping[str, Any], outcome: Outcome
) -> StatusUpdate:
    """The reconciled status, and what is said of it: a rollout started, each child
    created, updated or repaired (someone changed what the operator owns: a Repaired
    Event), and a new state (a line and an Event, a Warning for Failed and Waiting)."""
    update = StatusUpdate(body, outcome.status)
    if outcome.rollout == "started":
        update.say("rolling out the operator's change (an image or setting)")
    for done in outcome.applied:
        update.say(done, child=done.split(" ")[0])
        if done.endswith(" repaired"):
            update.post("Normal", "Repaired", "Apply", done)
    state, reason = outcome.verdict.state, outcome.verdict.reason
    if state.value != previous.get("state"):
        update.say(f"{state.value}: {reason}", state=state.value)
        kind = "Warning" if state in _WARNING_STATES else "Normal"
        update.post(kind, state.value, "Reconcile", reason)
    return update


def judged(
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
    before: Mapping[str, Any],
    current: Mapping[str, Any],
    tolerance: float,
) -> StatusUpdate:
    """The evaluation `current`, made after a change of retrieval settings, compared
    with the evaluation `before` it: QualityRegressed set and the Event posted."""
    generation = int(body["metadata"].get("generation", 0))
    verdict = quality.judge(before, current, tolerance, generation)
    status = status_compose.with_judgement(previous, current, verdict.condition, reconcile.now())
    update = StatusUpdate(body, status)
    update.say(verdict.message, request="quality")
    update.post(verdict.event_type, verdict.event_reason, "Evaluate", verdict.message)
    return update


def evaluated(
    body: Mapping[str, Any], previous: Mapping[str, Any], figures: Mapping[str, Any]
) -> StatusUpdate:
    """The figures of an evaluation a user asked for, and the Evaluated Event."""
    message = (
        f"recall@{figures['k']} {figures['recall_at_k']:.3f}, MRR {figures['mrr']:.3f} over "
        f"{figures['cases']} questions"
    )
    update = StatusUpdate(body, status_compose.with_evaluation(previous, figures))
    update.say(f"evaluated: {message}", request="evaluate")
    update.post("Normal", "Evaluated", "Evaluate", message)
    return update


_BOOKKEEPING = frozenset({"resourceVersion", "managedFields"})


def tells_news(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a base's new body differs from the old in more than what its own loop and
    kopf write (the status, kopf's annotations) and the API server's bookkeeping. Each
    status write comes back as a watch event: woken by it, a base took a turn that found
    nothing new, two such turns for each change (bench/results/operator-kwok.md)."""

    def essence(body: Mapping[str, Any]) -> dict[str, Any]:
        meta = dict(body.get("metadata") or {})
        for field in _BOOKKEEPING:
            meta.pop(field, None)
        meta["annotations"] = {
            k: v
            for k, v in (meta.get("annotations") or {}).items()
            if not k.startswith(f"{KOPF_PREFIX}/")
        }
        return {**{k: v for k, v in body.items() if k != "status"}, "metadata": meta}

    return essence(old) != essence(new)


def _version(body: Mapping[str, Any]) -> str | None:
    return (body.get("metadata") or {}).get("resourceVersion")


def _key(body: Mapping[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


def _annotations(body: Mapping[str, Any]) -> dict[str, str]:
    return dict((body.get("metadata") or {}).get("annotations") or {})


async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf's records in annotations (the status is ours alone), and the shared context.
    What kopf records as handled leaves out the spec: kopf's handlers (creation, the
    request annotations) never read it, and a record of it was one more write of the base
    at every change of its spec.

    Nothing is closed at exit: the loops end with the process. No handler needs a
    finalizer; naming the one earlier versions added lets kopf remove it from them."""
    keep_records(settings)
    settings.posting.enabled = False  # Events are ours, from metis-operator
    narrow_watches(settings)
    ours: Settings = memo.config
    cluster = await asyncio.to_thread(kube.Cluster.connect, ours.runtime.field_manager)
    # Indexers: a connection per poll, none kept (a base is asked again after the pool
    # would have closed it), and none waiting for a free one: at 1,000 bases, httpx's pool
    # of 100 kept the polls queued and spent most of the loop's time matching them to
    # connections (bench/results/operator-kwok.md).
    polls = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    http = httpx.AsyncClient(timeout=ours.reach.timeout_seconds, limits=polls)
    # The model probes have a client of their own: polls never queue ahead of them, which
    # read a busy operator as a model that does not answer.
    probing = httpx.AsyncClient(timeout=ours.reach.timeout_seconds)
    probers = Probers(
        probing, interval=ours.poll.probe_seconds, grace=ours.poll.model_grace_seconds
    )
    memo.context = Context(ours, cluster, http, Metrics.create(), Cache(), probers)
    memo.runner = Runner(memo.context)
    await prime(memo.context, memo.runner)
    memo.following_kind = asyncio.create_task(memo.runner.follow_kind(), name="the kind")
    memo.following_drift = asyncio.create_task(memo.runner.follow_drift(), name="drift")
    memo.context.metrics.serve(ours.runtime.metrics_port)


def keep_records(settings: kopf.OperatorSettings) -> None:
    """kopf's records in annotations under `KOPF_PREFIX`; what it records as handled
    leaves out the spec and the `UNHANDLED` annotations."""
    settings.persistence.finalizer = identity.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    ignored: list[str | tuple[str, ...]] = [
        "spec",
        *(("metadata", "annotations", a) for a in UNHANDLED),
    ]
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration", ignored_fields=ignored
    )


async def prime(ctx: Context, runner: Runner) -> None:
    """One LIST per watched kind (per namespace served) into the cache, then one of the
    bases, whose loops start at once: a new leader derives its bases without waiting for
    kopf to pass every watched object through its watches (7,000 at 1,000 bases). kopf
    starts its watches only once the startup handlers are done, so every watch event
    comes after these LISTs and overrides what they brought; a base listed here and
    deleted before kopf's own listing finds itself gone at its first write."""
    namespaces = ctx.settings.runtime.namespaces or (None,)
    started = time.monotonic()
    for kind in cache.WATCHED:
        query = {"labelSelector": cache.selector(kind.labels)} if kind.labels else {}
        for namespace in namespaces:
            items = await _listed(ctx, drift.list_path(kind, namespace), query)
            ctx.cache.prime(kind, items)
    bases = 0
    for namespace in namespaces:
        path = kube.path(identity.API_VERSION, identity.PLURAL, namespace)
        for item in await _listed(ctx, path, {}):
            runner.seen({"apiVersion": identity.API_VERSION, "kind": identity.KIND, **item}, False)
            bases += 1
    log.info("cache filled and %d base(s) started in %.1f s", bases, time.monotonic() - started)


async def _listed(ctx: Context, path: str, query: Mapping[str, str]) -> list[dict[str, Any]]:
    """A LIST's items, tried until it succeeds: nothing runs before the cache is whole.
    None of a kind not served (the CRD not installed yet: kopf's watch finds the bases
    once it is)."""
    while True:
        try:
            answer = await ctx.cluster.call("GET", path, query=dict(query))
            return list((answer or {}).get("items") or [])
        except Exception as e:
            if isinstance(e, kube.ApiError) and e.status == 404:
                return []
            log.warning("cannot list %s yet: %s", path, e)
            await asyncio.sleep(PRIME_RETRY_SECONDS)


def narrow_watches(settings: kopf.OperatorSettings) -> None:
    """The kinds watched by label are narrowed by the API server, not by kopf once each
    object has arrived: another app's 10,000 pods and ConfigMaps cost the operator
    nothing (kopf filtered them itself, but made a worker for each: a new leader beside
    them derived no base in minutes, bench/results/operator-kwok.md)."""
    for w in cache.WATCHED:
        if w.labels:
            settings.watching.label_selectors[w.group, w.version, w.plural] = cache.selector(
                w.labels
            )


async def base_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A base appeared, changed or went: its loop starts, wakes or stops."""
    memo.runner.seen(body, deleted=event.get("type") == "DELETED")


def _follower(plural: str) -> Any:
    async def changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        """The cache takes the change, then the bases it concerns wake (but the one whose
        own apply it only brings back)."""
        writer = memo.context.cache.seen(plural, body, deleted=event.get("type") == "DELETED")
        runner: Runner = memo.runner
        runner.wake(cache.affected(runner.dependents, plural, body) - {writer})

    return changed


async def created(body: kopf.Body, **_: Any) -> None:
    """A new base, said once. It also makes kopf record the base as handled (its
    diff base), so that the first reindex annotation reads as a change, not a creation."""
    report.say(_key(body), "created")


async def _defer(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, request: str, value: str
) -> None:
    """A request on a paused base, recorded on it for its loop to run when the pause
    ends: its marker goes into kopf's own PATCH (its record of the request as handled),
    no retry of kopf's meanwhile; an Event says so."""
    what = request_what(request, value)
    patch.metadata.annotations[DEFERRED[request]] = value
    deferred = Event("Normal", "Deferred", "Request", f"{what} runs when the pause ends")
    await status_update.post_event(memo.context, body, deferred)


def _created(reason: kopf.Reason) -> bool:
    """A new base runs its first pass anyway: an annotation it was created with is moot."""
    return reason == kopf.Reason.CREATE


async def reindex(
    new: str,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    reason: kopf.Reason,
    retry: int,
    **_: Any,
) -> None:
    await _request(identity.REINDEX, str(new), body, patch, memo, reason, retry)


async def evaluate(
    new: str,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    reason: kopf.Reason,
    retry: int,
    **_: Any,
) -> None:
    await _request(identity.EVALUATE, str(new), body, patch, memo, reason, retry)


async def _request(
    request: str,
    value: str,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    reason: kopf.Reason,
    retry: int,
) -> None:
    """A request annotation's new value: run now, or deferred while the base is paused."""
    if _created(reason):
        return
    if not retry:
        what = request_what(request, value)
        report.say(_key(body), f"{what} asked ({request}={value})", request=request.split("/")[1])
    if paused(body):
        await _defer(body, patch, memo, request, value)
        return
    runner: Runner = memo.runner
    await _ask(body, memo, runner.run_request(body, request, value))


async def _ask(body: kopf.Body, memo: kopf.Memo, request: Awaitable[T]) -> T:
    """One boundary for the indexer's answers: not now → retry; never → a Warning."""
    try:
        return await request
    except indexer_client.IndexerError as e:
        if e.temporary:
            delay = memo.context.settings.poll.interval_seconds
            raise kopf.TemporaryError(str(e), delay=delay) from None
        log.warning("%s/%s: request refused: %s", *_key(body), e, extra=report.about(_key(body)))
        refused = Event("Warning", "RequestRefused", "Request", str(e))
        await status_update.post_event(memo.context, body, refused)
        raise kopf.PermanentError(str(e)) from None


def register(registry: kopf.OperatorRegistry, settings: Settings) -> None:
    """Every handler, with its policy."""
    interval = settings.poll.interval_seconds
    on = {"registry": registry, **identity.RESOURCE}
    # A registry of our own has no login handlers: log in as the kubernetes client does.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(configure)
    for w in cache.WATCHED:
        kind = {"group": w.group, "version": w.version, "plural": w.plural}
        kopf.on.event(**kind, registry=registry, id=w.plural, labels=w.labels)(_follower(w.plural))
    kopf.on.event(**on, id="base")(base_event)
    kopf.on.create(**on)(created)
    for annotation, fn in ((identity.REINDEX, reindex), (identity.EVALUATE, evaluate)):
        kopf.on.field(
            **on,
            field=("metadata", "annotations", annotation),
            new=kopf.PRESENT,
            backoff=interval,
            timeout=REQUEST_TIMEOUT,
        )(fn)
