"""What the operator watches, and how it keeps its cache true to the API server.

kopf watches the bases and what decides them (drives, model Services, workloads, the
operator's ConfigMaps and indexer pods: cache.py), kept in memory from one LIST per kind
made at startup, before the watches start (`prime`), and the watches' events; the kinds
watched by label are narrowed by the API server (`narrow_watches`). Two loops follow for
every base at once: whether the KnowledgeBase kind is still served (`follow_kind`), and,
every `poll.resync_seconds`, one LIST per kind of child against the cache
(`follow_drift`; drift.py decides): a base whose children differ reads them afresh at
once. Each base also reads them by name every `poll.full_resync_seconds`, spread over
that time (runner.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from metis_operator import cache, drift, kube, report
from metis_operator.api import identity
from metis_operator.cache import Key
from metis_operator.context import Context
from metis_operator.runner import Runner

log = logging.getLogger("metis_operator")

KIND_LOOKS = 3
"""Poll intervals between two looks whether the KnowledgeBase kind is still served (30 s
at the default interval)."""
PRIME_RETRY_SECONDS = 2.0
"""How soon a LIST that fills the cache at startup is tried again."""
DRIFT_SETTLE_SECONDS = 2.0
"""How long the drift check lets the watches catch up with its LISTs."""


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


async def follow_kind(ctx: Context, runner: Runner) -> None:
    """Forget every base once their kind is no longer served (the CRD deleted): the
    API server sends no event for each base then, and their loops would look on at
    children no one owns. One discovery request every `KIND_LOOKS` poll intervals,
    for all bases; an answer other than 404 keeps them."""
    path = f"/apis/{identity.API_VERSION}"
    while True:
        await asyncio.sleep(KIND_LOOKS * ctx.settings.poll.interval_seconds)
        if not runner.bases:
            continue
        try:
            served = await ctx.cluster.get(path) is not None
        except Exception as e:  # the next look asks again; this loop must not end
            log.warning("cannot tell whether %s is served: %s", identity.API_VERSION, e)
            continue
        if not served:
            log.warning(
                "%s is no longer served (its CRD was deleted): forgetting %d base(s)",
                identity.API_VERSION,
                len(runner.bases),
            )
            for key in list(runner.bases):
                runner.forget(key)


async def follow_drift(ctx: Context, runner: Runner) -> None:
    """Every `poll.resync_seconds`, list each kind of child (one request per kind for
    every base, narrowed to the operator's label) and wake, to read theirs afresh,
    the bases whose children differ from the cache. A failed look is tried at the
    next; this loop must not end."""
    while True:
        await asyncio.sleep(ctx.settings.poll.resync_seconds)
        if ghosts := ctx.cache.drop_unconfirmed():
            log.info("%d object(s) listed at startup were gone before the watches began", ghosts)
        if not runner.bases:
            continue
        try:
            found = await drifted(ctx)
        except Exception as e:
            log.warning("cannot check the cache against the API server: %s", e)
            continue
        for key in found & set(runner.bases):
            runner.bases[key].drifted = True
            report.say(key, "its children differ from the watch cache: read afresh")
        runner.wake(found)


async def drifted(ctx: Context) -> set[Key]:
    """The bases whose children the API server holds otherwise than the cache, and
    which no watch event changed in the cache while the LISTs ran or in the
    `DRIFT_SETTLE_SECONDS` after (a watch a moment behind the LIST is no miss)."""
    namespaces = ctx.settings.runtime.namespaces or (None,)
    before = _cached(ctx)
    listed: drift.Seen = {}
    for kind in cache.CHILDREN:
        for namespace in namespaces:
            answer = await ctx.cluster.call(
                "GET", drift.list_path(kind, namespace), query={"labelSelector": drift.SELECTOR}
            )
            listed |= drift.seen(kind.kind, (answer or {}).get("items") or [])
    await asyncio.sleep(DRIFT_SETTLE_SECONDS)
    return drift.drifted(listed, _cached(ctx), before)


def _cached(ctx: Context) -> drift.Seen:
    out: drift.Seen = {}
    for kind in cache.CHILDREN:
        out |= drift.seen(kind.kind, ctx.cache.every(kind.kind))
    return out
