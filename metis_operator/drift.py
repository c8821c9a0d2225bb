"""Whether the watch cache still holds what the API server holds of the operator's
children, checked with one LIST per kind for every base at once.

A watch can miss a change (a broken stream re-listed late, an object edited while the
operator was away): reading every base's children by name at an interval did catch
that, at 7 GETs per base, and at 1,000 bases that was 1.6 API requests a minute per
base while nothing changed (bench/results/operator-kwok.md). A LIST of each kind,
narrowed to the operator's label by the API server, costs six requests for all of
them; only the bases whose children differ from the cache read theirs afresh.
`drifted` decides, without I/O; `watching.follow_drift` lists and wakes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from metis_operator import cache, kube

Key = tuple[str, str]
Seen = dict[tuple[str, str, str], tuple[str, Key]]
"""(kind, namespace, name) → (resourceVersion, the base it is a child of)."""

SELECTOR = cache.selector(cache.MANAGED)


def list_path(kind: cache.Watched, namespace: str | None) -> str:
    """The collection to list: cluster-wide, or one namespace the operator serves."""
    return kube.path(kind.api_version, kind.plural, namespace)


def seen(kind: str, objects: Iterable[Mapping[str, Any]]) -> Seen:
    """What of `objects` the comparison needs: the operator's children of a base only
    (a drive or a model Service in the cache is not the operator's)."""
    out: Seen = {}
    for obj in objects:
        meta = obj.get("metadata") or {}
        base = (meta.get("labels") or {}).get(cache.INSTANCE_LABEL)
        if not cache.ours(obj) or not base:
            continue
        ns = meta.get("namespace", "")
        out[(kind, ns, meta.get("name", ""))] = (str(meta.get("resourceVersion", "")), (ns, base))
    return out


def drifted(listed: Seen, cached: Seen, before: Seen | None = None) -> set[Key]:
    """The bases with a child the API server holds and the cache does not, holds in
    another version, or the cache holds and the API server does not; with `before` (the
    cache as it was before the LISTs), only such children as no watch event changed in
    the cache since. A child the watch brings while the LISTs run is no missed change:
    while 100 bases changed at once, 57 of them read their children afresh for it."""
    out: set[Key] = set()
    for child in listed.keys() | cached.keys():
        either = (listed.get(child), cached.get(child))
        if before is not None and before.get(child) != either[1]:
            continue  # the watch is bringing it
        if either[0] != either[1]:  # one is missing, or their versions differ
            out.add(next(e for e in either if e is not None)[1])
    return out
