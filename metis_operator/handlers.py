"""The kopf handlers: the operator's wiring to kopf, and nothing of a base's work.

`configure` (at startup) sets kopf's records, builds the shared context and the bases'
loops (runner.py), fills the cache and starts the loops that follow the cache and the
kind (watching.py). `register` names every handler with its policy: one event handler
per watched kind (the cache takes the change; the bases it concerns wake), one for the
bases (a base's loop starts, wakes or stops), and field handlers for the user's requests
(reindex, evaluate annotations): run at once through the base's loop, or, on a paused
base, recorded on it in an annotation of the operator's (`DEFERRED`, written in kopf's
own PATCH) for its loop to run when the pause ends. The backup kinds have one event
handler each: their tasks (backups.py) start and stop with their objects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import httpx
import kopf

from metis_operator import backups, cache, indexer_client, kube, report, watching
from metis_operator.api import identity
from metis_operator.cache import Cache, Key
from metis_operator.context import Context
from metis_operator.metrics import Metrics
from metis_operator.prober import Probers
from metis_operator.runner import DEFERRED, REQUEST_TIMEOUT, Runner, paused, request_what
from metis_operator.settings import Settings
from metis_operator.status import write
from metis_operator.status.write import Event

T = TypeVar("T")
log = logging.getLogger("metis_operator")
UNHANDLED = (identity.PAUSED, *DEFERRED.values())
"""Annotations kopf's record of what it handled leaves out: no handler of kopf's reads
them, and each change of one was a write of that record (pausing, resuming, deferring)."""


def _key(body: Mapping[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf's records in annotations (the status is ours alone), and the shared context.
    What kopf records as handled leaves out the spec: kopf's handlers (creation, the
    request annotations) never read it, and a record of it was one more write of the base
    at every change of its spec.

    Nothing is closed at exit: the loops end with the process. No handler needs a
    finalizer; naming the one earlier versions added lets kopf remove it from them."""
    keep_records(settings)
    settings.posting.enabled = False  # Events are ours, from metis-operator
    watching.narrow_watches(settings)
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
    memo.context = ctx = Context(ours, cluster, http, Metrics.create(), Cache(), probers)
    memo.runner = runner = Runner(ctx)
    memo.backups = backups.Follower(ctx)
    await watching.prime(ctx, runner)
    memo.following_kind = asyncio.create_task(watching.follow_kind(ctx, runner), name="the kind")
    memo.following_drift = asyncio.create_task(watching.follow_drift(ctx, runner), name="drift")
    ctx.metrics.serve(ours.runtime.metrics_port)


def keep_records(settings: kopf.OperatorSettings) -> None:
    """kopf's records in annotations under `identity.KOPF_PREFIX`; what it records as handled
    leaves out the spec and the `UNHANDLED` annotations."""
    settings.persistence.finalizer = identity.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=identity.KOPF_PREFIX
    )
    ignored: list[str | tuple[str, ...]] = [
        "spec",
        *(("metadata", "annotations", a) for a in UNHANDLED),
    ]
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=identity.KOPF_PREFIX, key="last-handled-configuration", ignored_fields=ignored
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
    await write.post_event(memo.context, body, deferred)


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
        await write.post_event(memo.context, body, refused)
        raise kopf.PermanentError(str(e)) from None


def _backups_follower(plural: str) -> Any:
    async def changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        """A backup or a schedule appeared, changed or went: its task starts or stops."""
        memo.backups.seen(plural, body, deleted=event.get("type") == "DELETED")

    return changed


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
    for plural in (identity.BACKUP_PLURAL, identity.SCHEDULE_PLURAL):
        kopf.on.event(identity.GROUP, identity.VERSION, plural, registry=registry, id=plural)(
            _backups_follower(plural)
        )
