"""What every handler and every base's loop shares, built once at start-up and kept in
kopf's memo. A module of its own so that the reconciliation and the calls to the
indexer both take it without importing each other."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Generic, TypeVar

import httpx

from metis_operator import kube
from metis_operator.cache import Cache
from metis_operator.metrics import Metrics
from metis_operator.prober import Probers
from metis_operator.settings import Settings

K = TypeVar("K")
V = TypeVar("V")


@dataclasses.dataclass
class Recent(Generic[K, V]):
    """What the API server answered, by key, served `seconds` after it was read: one read
    for every base that asks meanwhile, none of them kept for ever."""

    seconds: float
    kept: dict[K, tuple[float, V]] = dataclasses.field(default_factory=dict)

    def get(self, key: K) -> V | None:
        found = self.kept.get(key)
        if found is None or time.monotonic() - found[0] >= self.seconds:
            return None
        return found[1]

    def put(self, key: K, value: V) -> V:
        self.kept[key] = (time.monotonic(), value)
        return value


PULL_SECONDS = 60.0
"""How long the operator's pull secrets, once read, serve every base: a rotated one reaches
the bases' copies within it, at one read a minute whatever the number of bases."""
MACHINES_SECONDS = 30.0
"""How long a read of the machines a pod may run on serves the looks that ask again."""


@dataclasses.dataclass
class Context:
    """The operator's settings, its clients, its metrics and what it keeps in memory."""

    settings: Settings
    cluster: kube.Cluster
    http: httpx.AsyncClient
    metrics: Metrics
    cache: Cache
    probers: Probers
    tokens: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """Bases whose token Secret this process has seen (Secrets are not watched)."""
    refused_growth: dict[tuple[str, str], tuple[int, str]] = dataclasses.field(default_factory=dict)
    """Index claims the API server would not let grow, by (namespace, name): the size asked
    (GiB) and why not; asked again only for another size or at a resync."""
    pull_sources: Recent[None, list[dict[str, Any]] | str] = dataclasses.field(
        default_factory=lambda: Recent(PULL_SECONDS)
    )
    """The operator's image pull secrets as last read: the Secrets, or why they cannot be
    copied."""
    pulls: dict[tuple[str, str], str | None] = dataclasses.field(default_factory=dict)
    """The hash of each base's pull secret copy as last applied, by (namespace, name)."""
    machines: Recent[str, list[dict[str, Any]]] = dataclasses.field(
        default_factory=lambda: Recent(MACHINES_SECONDS)
    )
    """Nodes as last read for a taint that keeps a pod off them, by node selector."""
