"""What every handler and every base's loop shares, built once at start-up and kept in
kopf's memo. A module of its own so that the reconciliation and the calls to the
indexer both take it without importing each other."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from metis_operator import kube
from metis_operator.cache import Cache
from metis_operator.metrics import Metrics
from metis_operator.prober import Probers
from metis_operator.settings import Settings


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
    pull_sources: tuple[float, list[dict[str, Any]] | str] | None = None
    """The operator's image pull secrets as last read: a monotonic time, and the Secrets or
    why they cannot be copied."""
    pulls: dict[tuple[str, str], str | None] = dataclasses.field(default_factory=dict)
    """The hash of each base's pull secret copy as last applied, by (namespace, name)."""
    machines: dict[str, tuple[float, list[dict[str, Any]]]] = dataclasses.field(
        default_factory=dict
    )
    """Nodes as last read for a taint that keeps a pod off them, by node selector: a
    monotonic time and the nodes."""
