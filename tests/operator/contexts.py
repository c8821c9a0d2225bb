"""The operator's Context as its unit tests build it: settings from an environment, a
stand-in for the cluster or the HTTP client where the test is not about them."""

from __future__ import annotations

from typing import Any

import httpx

from metis_operator.cache import Cache
from metis_operator.context import Context
from metis_operator.metrics import Metrics
from metis_operator.prober import Probers
from metis_operator.settings import load

URL_TEMPLATE = {"METIS_URL_TEMPLATE": "http://{name}.{namespace}:{port}"}
"""Indexers reached by name, as a mock transport sees them."""


def context(
    http: httpx.AsyncClient | None = None,
    cluster: Any = None,
    env: dict[str, str] | None = None,
) -> Context:
    return Context(
        load(URL_TEMPLATE if env is None else env),
        cluster,
        http,  # type: ignore[arg-type]
        Metrics.create(),
        Cache(),
        Probers(http, interval=60, grace=20),  # type: ignore[arg-type]
    )
