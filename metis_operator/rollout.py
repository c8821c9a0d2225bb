"""Rollouts of the operator's own changes (a new indexer image or setting): which change
is the operator's rather than the user's (`operators_change`), and how many bases replace
their indexer at once (`Rollouts`, at most `runtime.max_rollouts`, each until it is
settled again). A user's change of a base is never held.

A reconciliation that would replace a running indexer for a change of the operator's asks
`Rollouts.turn` once, and applies the change when the answer is STARTED, leaves it for a
later turn when HELD; the base's loop gives the turn back (`Rollouts.over`) once the
base is Ready or Failed again, and wakes the bases waiting for one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metis_operator import children
from metis_operator.api import identity

Key = tuple[str, str]

STARTED = "started"
"""The base rolls out now (it holds a turn)."""
HELD = "held"
"""The base waits for a turn: as many as allowed roll out already."""


def operators_change(desired: Mapping[str, Any], actual: Mapping[str, Any] | None) -> bool:
    """Whether applying `desired` over `actual` replaces a running indexer for a
    reason of the operator's (image, settings), not the user's: the Deployment was
    last applied for the same pod inputs of the base's spec (or before they were
    recorded), and its pod template would change."""
    if actual is None:
        return False
    want = (desired["metadata"].get("annotations") or {}).get(identity.POD_INPUTS_ANNOTATION)
    have = ((actual.get("metadata") or {}).get("annotations") or {}).get(
        identity.POD_INPUTS_ANNOTATION
    )
    template = desired["spec"]["template"]
    return (have is None or have == want) and not children.is_subset(
        template, (actual.get("spec") or {}).get("template")
    )


class Rollouts:
    """The bases rolling out a change of the operator's, at most `limit` at once. The
    loops share one thread: no await comes between a check and the taking of a turn."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rolling: set[Key] = set()

    def turn(self, key: Key) -> str:
        """STARTED when `key` may roll out now (it rolls already, or fewer than `limit`
        do): it then holds a turn. HELD when it waits."""
        if key not in self.rolling and len(self.rolling) >= self.limit:
            return HELD
        self.rolling.add(key)
        return STARTED

    def over(self, key: Key, *, started: bool, settled: bool) -> bool:
        """A base whose rollout is over (settled, and not just started this turn) gives
        its turn back; whether it held one (the next may start)."""
        if key not in self.rolling or started or not settled:
            return False
        self.rolling.discard(key)
        return True

    def forget(self, key: Key) -> bool:
        """A base gone gives its turn back; whether it held one."""
        if key not in self.rolling:
            return False
        self.rolling.discard(key)
        return True
