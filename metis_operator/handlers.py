"""The kopf handlers: each a few lines over `reconcile`; the policy (interval,
backoff, which field) is in `register`, the one place that lists them all.

A base is reconciled on a timer (every `poll.interval_seconds`, at once when it
appears or the operator starts) and when its spec changes. The two may overlap,
so each base's reconciliations take turns on a lock in its own kopf memo, which
also remembers the last status written: the status is written only when it
changed, and an Event is posted only when the state changed.
"""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import httpx
import kopf

from metis_operator import children, kube, reconcile
from metis_operator.metrics import Metrics
from metis_operator.reconcile import Context
from metis_operator.settings import Settings
from metis_operator.state import State
from metis_operator.status import merge_patch

RESOURCE = {"group": children.GROUP, "version": children.VERSION, "plural": children.PLURAL}
REINDEX = f"{children.GROUP}/reindex"
"""Annotation: a new value asks for a pass; a value starting with `full` reads everything."""
EVALUATE = f"{children.GROUP}/evaluate"
"""Annotation: a new value runs the evaluation set (`k=5` in it sets k; 10 by default)."""
DEFAULT_K = 10
_K = re.compile(r"(?:^|[^a-z])k=(\d+)")
_WARNING_STATES = (State.FAILED, State.WAITING)
T = TypeVar("T")
KOPF_PREFIX = f"kopf.{children.GROUP}"
"""kopf's own annotations. Not the group itself: kopf leaves every annotation under its
prefix out of the changes it reacts to, and the user's requests (reindex, evaluate)
are annotations under the group."""


async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf's records in annotations (the status is ours alone), and the shared context.

    Nothing is closed at exit: kopf leaves running timers orphaned then, and a
    client closed under them would only turn their last round into errors."""
    settings.persistence.finalizer = f"{children.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    ours: Settings = memo.config
    cluster = await asyncio.to_thread(kube.Cluster.connect)
    http = httpx.AsyncClient(timeout=ours.reach.timeout_seconds)
    memo.context = Context(ours, cluster, http, Metrics.create())
    memo.context.metrics.serve(ours.runtime.metrics_port)


def _previous(body: Mapping[str, Any], memo: kopf.Memo) -> dict[str, Any]:
    """The status last written by this process, else the stored one."""
    return memo.get("status") or copy.deepcopy(dict(body.get("status") or {}))


async def _write(ctx: Context, body: Mapping[str, Any], memo: kopf.Memo, new: dict) -> None:
    patch = merge_patch(_previous(body, memo), new)
    if patch:
        owner = children.Owner.of(body)
        await ctx.cluster.merge_patch(reconcile.kb_path(owner) + "/status", {"status": patch})
    memo["status"] = new


async def _reconcile(body: kopf.Body, memo: kopf.Memo, trigger: str) -> None:
    ctx: Context = memo.context
    ctx.metrics.reconciliations.labels(trigger=trigger).inc()
    snapshot = copy.deepcopy(dict(body))
    async with memo.setdefault("lock", asyncio.Lock()):
        previous = _previous(snapshot, memo)
        with ctx.metrics.errors.labels(trigger=trigger).count_exceptions():
            with ctx.metrics.seconds.time():
                outcome = await reconcile.run(ctx, snapshot, previous)
            await _write(ctx, snapshot, memo, outcome.status)
    state, reason = outcome.verdict.state, outcome.verdict.reason
    meta = snapshot["metadata"]
    ctx.metrics.record((meta["namespace"], meta["name"]), state)
    if state.value != previous.get("state"):
        kind = "Warning" if state in _WARNING_STATES else "Normal"
        kopf.event(body, type=kind, reason=state.value, message=reason)


async def poll(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(body, memo, "timer")


async def spec_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(body, memo, "change")


def _created(reason: kopf.Reason) -> bool:
    """A new base runs its first pass anyway: an annotation it was created with is moot."""
    return reason == kopf.Reason.CREATE


async def reindex(
    new: str, body: kopf.Body, memo: kopf.Memo, reason: kopf.Reason, **_: Any
) -> None:
    if _created(reason):
        return
    full = str(new).startswith("full")
    await _ask(body, memo, reconcile.reindex(memo.context, children.Owner.of(body), full=full))
    kopf.info(
        body, reason="Reindex", message="a full reindex started" if full else "a pass started"
    )


async def evaluate(
    new: str, body: kopf.Body, memo: kopf.Memo, reason: kopf.Reason, **_: Any
) -> None:
    if _created(reason):
        return
    found = _K.search(str(new))
    k = int(found[1]) if found else DEFAULT_K
    ctx: Context = memo.context
    figures = await _ask(body, memo, reconcile.evaluate(ctx, children.Owner.of(body), k=k))
    async with memo.setdefault("lock", asyncio.Lock()):
        previous = _previous(body, memo)
        await _write(ctx, body, memo, {**previous, "evaluation": figures})
    kopf.info(body, reason="Evaluated", message=(
        f"recall@{figures['k']} {figures['recall_at_k']:.3f}, MRR {figures['mrr']:.3f} over "
        f"{figures['cases']} questions"
    ))  # fmt: skip


async def _ask(body: kopf.Body, memo: kopf.Memo, request: Awaitable[T]) -> T:
    """One boundary for the indexer's answers: not now → retry; never → a Warning."""
    try:
        return await request
    except reconcile.IndexerError as e:
        if e.temporary:
            delay = memo.context.settings.poll.interval_seconds
            raise kopf.TemporaryError(str(e), delay=delay) from None
        kopf.warn(body, reason="RequestRefused", message=str(e))
        raise kopf.PermanentError(str(e)) from None


def forget(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    meta = body["metadata"]
    memo.context.metrics.forget((meta["namespace"], meta["name"]))


def register(registry: kopf.OperatorRegistry, settings: Settings) -> None:
    """Every handler, with its policy."""
    interval = settings.poll.interval_seconds
    on = {"registry": registry, **RESOURCE}
    # A registry of our own has no login handlers: log in as the kubernetes client does.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(configure)
    kopf.timer(**on, interval=interval, backoff=interval)(poll)
    kopf.on.update(**on, field="spec", backoff=interval)(spec_changed)
    for annotation, fn in ((REINDEX, reindex), (EVALUATE, evaluate)):
        kopf.on.field(
            **on, field=("metadata", "annotations", annotation), new=kopf.PRESENT,
            backoff=interval, timeout=3600,
        )(fn)  # fmt: skip
    kopf.on.delete(**on, optional=True)(forget)
