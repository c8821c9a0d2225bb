"""Each base's loop: it reconciles the base when woken (a change of the base or of what
decides it: cache.affected), else every `poll.interval_seconds`, and runs what follows
from the new state (the rollout turns, the metrics, the quality check after a change of
retrieval settings, the requests made while the base was paused).

Each turn takes the base's lock; the status is written once (status/write.py), with what
is said of it, after the reconciliation (reconcile.py), and once before it applies the
children when the generation is new to the status (its early outcome). The loops are the
operator's own tasks, not kopf timers, so a base carries no finalizer: deleting it, or
the CRD with bases present, completes at once, and the garbage collector removes the
children by their owner references.

A base annotated `metis.astraeus.io/paused: "true"` is left alone: its children are not
touched and a Paused condition says so (its one write); its loop then waits for a change
without a timer (no poll of its indexer), and lets go of its model probers. A request
made meanwhile is recorded on the base in an annotation of the operator's
(`metis.astraeus.io/deferred-reindex`, `-evaluate`: handlers.py writes it with kopf's own
record of the request) and run by the base's loop when the pause ends.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import random
import re
import time
from collections.abc import Mapping
from typing import Any

from metis_indexer.schema import StatusAnswer
from metis_operator import (
    backups,
    cache,
    children,
    indexer_client,
    kube,
    reconcile,
    report,
    rollout,
)
from metis_operator.api import identity
from metis_operator.cache import Deps, Key
from metis_operator.context import Context
from metis_operator.look import Look
from metis_operator.reconcile import Outcome
from metis_operator.state import State
from metis_operator.status import announce, compose, quality, write
from metis_operator.status.write import Event

log = logging.getLogger("metis_operator")

DEFAULT_K = 10
_K = re.compile(r"(?:^|[^a-z])k=(\d+)")
REQUEST_TIMEOUT = 3600
"""Seconds kopf keeps trying a request (reindex, evaluate) before it gives it up."""
READY_POLLS = 6
"""A Ready base's indexer is asked every sixth poll interval (60 s at the default): what
changes a Ready base (its spec, a drive's revision, its pods, its model's probe) wakes its
loop at once; only a change the indexer finds by itself (a rescan that reads) shows this
much later. At 1,000 bases the polls were the operator's main idle work (1.6 ms of CPU
each); such a poll that finds the indexer's answer unchanged is all of that turn
(`Runner.unchanged`)."""
DEFERRED = {
    identity.REINDEX: identity.DEFERRED_REINDEX,
    identity.EVALUATE: identity.DEFERRED_EVALUATE,
}
"""Each request annotation, and the operator's annotation that records its value when it
was made while the base was paused."""


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
    """The evaluation after a change of retrieval settings, while it runs (status/quality.py)."""
    ready: bool = False
    """Whether its last turn found it Ready: its indexer is then asked less often."""
    answer: StatusAnswer | None = None
    """Its indexer's answer as its last turn read it."""
    look: Look | None = None
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
        self.rollouts = rollout.Rollouts(ctx.settings.runtime.max_rollouts)
        self.dependents = cache.Dependents()
        ctx.probers.wake = self.wake

    def seen(self, body: Mapping[str, Any], deleted: bool) -> None:
        """A base's new body: its loop starts or wakes; one deleted, or being deleted (held
        by another's finalizer), is forgotten: never written to again."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if deleted or write.being_deleted(body):
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

    def forget(self, key: Key) -> None:
        base = self.bases.pop(key, None)
        self.dependents.drop(key)
        for task in (base.task, base.judging) if base is not None else ():
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self.rollouts.forget(key):
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
            except write.Gone as e:
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
                at_rest = paused(base.body) and compose.is_paused(base.previous())
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
            if compose.is_paused(previous):
                report.say(base.key, "resumed")
            with ctx.metrics.errors.labels(trigger=trigger).count_exceptions():
                with ctx.metrics.seconds.time():
                    outcome = await self.run(base, body, previous, fresh)
                # After an early write, what this turn says is against what that wrote.
                await write.apply(ctx, base, announce.reconciled(body, base.previous(), outcome))
        if self.bases.get(base.key) is base:
            self.dependents.set(base.key, outcome.deps)
        base.ready = outcome.verdict.state is State.READY
        base.answer = outcome.indexer
        base.look = outcome.look
        self.follow_rollout(base.key, outcome)
        self.record_metrics(base.key, outcome)
        self.ctx.metrics.backups_expected(base.key, backups.expected_since(body))
        self.start_quality_check(base, body, outcome)
        await self.run_deferred(base)

    async def run(
        self, base: Base, body: Mapping[str, Any], previous: Mapping[str, Any], fresh: bool
    ) -> Outcome:
        """One reconciliation: begun (what the spec asks read), its early outcome written
        when it has one (a new generation said before its children are applied), then
        finished against the status as stored now. The caller holds the base's lock."""
        begun = await reconcile.begin(self.ctx, body, previous, last=base.look)
        if isinstance(begun, Outcome):
            return begun  # nothing to apply
        if begun.early is not None:
            await write.apply(self.ctx, base, announce.reconciled(body, previous, begun.early))
        return await reconcile.finish(
            self.ctx, begun, base.previous(), fresh=fresh, rollouts=self.rollouts
        )

    async def pause(self, base: Base, body: Mapping[str, Any], previous: Mapping[str, Any]) -> None:
        """A paused base's turn: the Paused condition written (once: then the status is
        what it was), its model probers let go (another base naming them keeps them) and
        a quality check under way stopped; no call to its indexer, no other write. The
        caller holds the base's lock."""
        await write.apply(self.ctx, base, announce.paused(body, previous))
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
                await write.post_event(self.ctx, body, said)
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
                raise write.Gone(f"its annotations cannot be written: {e}") from None
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
            await write.post_event(ctx, body, Event("Normal", "Reindex", "Reindex", started))
            return
        found = _K.search(value)
        figures = await indexer_client.evaluate(ctx, owner, k=int(found[1]) if found else DEFAULT_K)
        figures[quality.RETRIEVAL] = quality.retrieval(body.get("spec") or {})
        base = self.bases.get(_key(body)) or Base(_key(body), copy.deepcopy(dict(body)))
        async with base.lock:
            await write.apply(ctx, base, announce.evaluated(body, base.previous(), figures))

    def resync_due(self, base: Base) -> bool:
        """Whether this turn reads the children from the API server rather than the
        cache: the drift check found them changed, or its full resync is due; the clock
        restarts when it does."""
        full = time.monotonic() - base.resynced >= self.ctx.settings.poll.full_resync_seconds
        if not (full or base.drifted):
            return False
        base.resynced, base.drifted = time.monotonic(), False
        return True

    def follow_rollout(self, key: Key, outcome: Outcome) -> None:
        """A base whose rollout is over (settled, and not just started) gives its turn
        to the next."""
        if outcome.rollout == rollout.HELD:
            log.debug("%s/%s waits for its turn to roll out", *key)
        settled = outcome.verdict.state in (State.READY, State.FAILED)
        started = outcome.rollout == rollout.STARTED
        if self.rollouts.over(key, started=started, settled=settled):
            self.wake(set(self.bases) - self.rollouts.rolling)  # the next may start

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
                update = announce.judged(base.body, base.previous(), before, current, tolerance)
                await write.apply(ctx, base, update)
            ctx.metrics.evaluated(base.key, current["recall_at_k"], current["mrr"])
        except write.Gone:
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
    return compose.drive(a) == compose.drive(b) and a.model_copy(update=unread) == b.model_copy(
        update=unread
    )


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
            if not k.startswith(f"{identity.KOPF_PREFIX}/")
        }
        return {**{k: v for k, v in body.items() if k != "status"}, "metadata": meta}

    return essence(old) != essence(new)


def _version(body: Mapping[str, Any]) -> str | None:
    return (body.get("metadata") or {}).get("resourceVersion")


def _key(body: Mapping[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


def _annotations(body: Mapping[str, Any]) -> dict[str, str]:
    return dict((body.get("metadata") or {}).get("annotations") or {})
