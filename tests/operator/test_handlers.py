"""What the operator registers with kopf: nothing that needs a finalizer (so deleting
a base, or the CRD with bases present, never waits for the operator), a watch for
each kind that decides a base, and what a child's event wakes."""

from __future__ import annotations

import asyncio

import kopf

from metis_operator import cache, children, handlers, runner
from metis_operator.api import identity
from metis_operator.settings import load
from tests.operator.contexts import context
from tests.operator.test_drift import child


def registered() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, load({}))
    return registry


def test_no_handler_needs_a_finalizer() -> None:
    r = registered()
    assert not r._spawning.get_all_handlers()  # no timers, no daemons
    assert not any(h.requires_finalizer for h in r._changing.get_all_handlers())


def test_every_kind_that_decides_a_base_is_watched_and_none_is_left_to_kopfs_indices() -> None:
    """kopf's indices hold every handler back until each object is indexed (a new
    leader at 1,000 bases derived its first base 100 s after the old one died)."""
    r = registered()
    assert not r._indexing.get_all_handlers()
    watched = {h.id for h in r._watching.get_all_handlers()}
    backups = {identity.BACKUP_PLURAL, identity.SCHEDULE_PLURAL}
    assert watched == {w.plural for w in cache.WATCHED} | {"base"} | backups


def test_a_childs_event_wakes_the_bases_it_concerns_but_the_one_whose_apply_it_brings_back() -> (
    None
):
    """The turn that applied a child saw the apply's answer: its watch event is no news to
    that base (a turn that found nothing, two a change), though still to a base reading it
    by name."""

    async def scenario() -> list[set[tuple[str, str]]]:
        ctx = context(env={})
        loops = runner.Runner(ctx)
        mine, reader = ("team", "a"), ("team", "b")
        loops.dependents.set(mine, cache.Deps("team"))
        loops.dependents.set(reader, cache.Deps("team", services=frozenset({"metis-a"})))
        woken: list[set[tuple[str, str]]] = []
        loops.wake = lambda keys: woken.append(set(keys))  # type: ignore[method-assign]
        memo = kopf.Memo(context=ctx, runner=loops)
        follow = handlers._follower("services")
        labels = {"app.kubernetes.io/name": children.APP}
        service = child("metis-a", "a", "7", **labels)
        ctx.cache.written("services", service, mine)
        await follow(event={"type": "MODIFIED"}, body=service, memo=memo)
        later = child("metis-a", "a", "8", **labels)
        await follow(event={"type": "MODIFIED"}, body=later, memo=memo)
        return woken

    assert asyncio.run(scenario()) == [{("team", "b")}, {("team", "a"), ("team", "b")}]
