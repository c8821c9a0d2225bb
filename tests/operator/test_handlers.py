"""What the operator registers with kopf: nothing that needs a finalizer (so deleting
a base, or the CRD with bases present, never waits for the operator), a watch and
an index for each kind that decides a base."""

from __future__ import annotations

import kopf

from metis_operator import cache, crd, handlers
from metis_operator import settings as settings_mod


def registered() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings_mod.load({}))
    return registry


def test_no_handler_needs_a_finalizer() -> None:
    r = registered()
    assert not r._spawning.get_all_handlers()  # no timers, no daemons
    assert not any(h.requires_finalizer for h in r._changing.get_all_handlers())


def test_every_kind_that_decides_a_base_is_watched_and_indexed() -> None:
    r = registered()
    indexed = {h.id for h in r._indexing.get_all_handlers()}
    assert indexed == {w.index for w in cache.WATCHED}
    watched = {h.id for h in r._watching.get_all_handlers()}
    assert watched == {f"{w.index}_changed" for w in cache.WATCHED} | {"base"}


def test_the_pause_annotation() -> None:
    def body(value: str | None) -> dict[str, object]:
        annotations = {crd.PAUSED: value} if value is not None else {}
        return {"metadata": {"annotations": annotations}}

    assert handlers.paused(body("true")) and handlers.paused(body("True"))
    assert not handlers.paused(body("false")) and not handlers.paused(body(None))
