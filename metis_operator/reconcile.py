"""One reconciliation of a base, level-based: read what is, bring the children into
shape, observe them and the indexer, derive the state, and compose the status.

It never writes the status itself and knows nothing of kopf: handlers.py writes
what changed and posts the Events. The requests a user makes by annotation
(reindex, evaluate) are here too, as calls to the base's indexer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
from collections.abc import Mapping
from typing import Any

import httpx

from metis_indexer import clients
from metis_indexer.config import IndexerConfig
from metis_operator import children, kube, observe, probes
from metis_operator import spec as spec_mod
from metis_operator import status as status_mod
from metis_operator.metrics import Metrics
from metis_operator.settings import Settings
from metis_operator.state import (
    IndexerStatus,
    Model,
    ModelCheck,
    Observation,
    State,
    Verdict,
    derive,
)

EMBEDDING = "embedding model"
RERANKER = "reranker"


@dataclasses.dataclass
class Context:
    """What every handler shares: built once at start-up, kept in kopf's memo."""

    settings: Settings
    cluster: kube.Cluster
    http: httpx.AsyncClient
    metrics: Metrics


@dataclasses.dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    status: dict[str, Any]


class IndexerError(Exception):
    """The indexer did not do what was asked; `temporary` says whether asking again helps."""

    def __init__(self, message: str, *, temporary: bool) -> None:
        super().__init__(message)
        self.temporary = temporary


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kb_path(owner: children.Owner) -> str:
    return kube.path(children.API_VERSION, children.PLURAL, owner.namespace, owner.name)


def indexer_url(ctx: Context, owner: children.Owner) -> str:
    return ctx.settings.url(owner.child, owner.namespace, ctx.settings.indexer.port)


async def _check_model(
    ctx: Context, namespace: str, name: str, role: str
) -> tuple[ModelCheck, str | None]:
    """The model Service `name`: whether it exists and serves `role`, and its URL."""
    svc = await ctx.cluster.get(kube.path("v1", "services", namespace, name))
    if svc is None:
        return ModelCheck(role, name, Model.NOT_FOUND), None
    url = ctx.settings.url(name, namespace, observe.service_port(svc))
    probe = probes.embedding if role == EMBEDDING else probes.reranker
    (result, detail), workloads = await asyncio.gather(
        probe(ctx.http, url), _workloads(ctx, namespace, svc)
    )
    idle = observe.scaled_to_zero((svc.get("spec") or {}).get("selector") or {}, workloads)
    warnings = tuple(
        f"{role} {name}: {w} is scaled to zero; the base does not wake it (keep one replica)"
        for w in idle
    )
    return ModelCheck(role, name, result, detail, warnings), url


async def _workloads(ctx: Context, namespace: str, svc: Mapping[str, Any]) -> list[dict[str, Any]]:
    if not (svc.get("spec") or {}).get("selector"):
        return []
    found = []
    for kind, plural in (("Deployment", "deployments"), ("StatefulSet", "statefulsets")):
        items = await ctx.cluster.list(kube.path("apps/v1", plural, namespace))
        found += [{**item, "kind": kind} for item in items]
    return found


async def _apply_children(
    ctx: Context, owner: children.Owner, spec: spec_mod.KnowledgeBaseSpec, config: IndexerConfig
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create what is missing and re-apply what drifted; (index claim, Deployment) as
    they are now."""
    claim = children.index_claim(owner, ctx.settings)
    actual_claim = await ctx.cluster.get(kube.manifest_path(claim))
    if actual_claim is None:  # its spec is immutable once bound: created, never re-applied
        actual_claim = await ctx.cluster.create(claim)
    desired = [
        children.config_map(owner, config),
        children.service(owner, ctx.settings),
        children.deployment(owner, spec, ctx.settings),
    ]
    actual: dict[str, dict[str, Any]] = {}
    for manifest in map(children.with_hash, desired):
        found = await ctx.cluster.get(kube.manifest_path(manifest))
        if children.needs_apply(manifest, found):
            found = await ctx.cluster.apply(manifest, ctx.settings.runtime.field_manager)
        actual[manifest["kind"]] = found or {}
    return actual_claim, actual["Deployment"]


async def _indexer_status(
    ctx: Context, owner: children.Owner
) -> tuple[IndexerStatus | None, str | None]:
    try:
        answer = await ctx.http.get(f"{indexer_url(ctx, owner)}/v1/status")
        answer.raise_for_status()
        return IndexerStatus.model_validate(answer.json()), None
    except httpx.HTTPStatusError as e:
        return None, f"GET /v1/status answered HTTP {e.response.status_code}"
    except (httpx.HTTPError, ValueError) as e:
        return None, clients.describe(e)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """What decides Failed, and what the indexer's configuration needs."""

    observation: Observation
    revisions: dict[str, str]
    embedding_url: str | None
    reranker_url: str | None


async def _inputs(ctx: Context, owner: children.Owner, spec: spec_mod.KnowledgeBaseSpec) -> _Inputs:
    ns = owner.namespace
    claims = await asyncio.gather(
        *(ctx.cluster.get(kube.path("v1", "persistentvolumeclaims", ns, d)) for d in spec.drives)
    )
    embedding, embedding_url = await _check_model(ctx, ns, spec.embedding.deployment, EMBEDDING)
    reranker, reranker_url = (None, None)
    if spec.reranker is not None:
        reranker, reranker_url = await _check_model(ctx, ns, spec.reranker.deployment, RERANKER)
    found = {d: c for d, c in zip(spec.drives, claims, strict=True) if c is not None}
    o = Observation(
        placement=spec.placement,
        missing_drives=tuple(d for d in spec.drives if d not in found),
        unlisted_drives=tuple(
            d for d, c in found.items() if observe.from_data_source(c) and not observe.revision(c)
        ),
        unbound_drives=tuple(d for d, c in found.items() if not observe.claim_bound(c)),
        embedding=embedding,
        reranker=reranker,
        index_drive=owner.child,
    )
    revisions = {d: observe.revision(c) for d, c in found.items() if observe.revision(c)}
    return _Inputs(o, revisions, embedding_url, reranker_url)


async def run(ctx: Context, body: Mapping[str, Any], previous: Mapping[str, Any]) -> Outcome:
    """Reconcile the base `body` whose stored status is `previous`."""
    owner = children.Owner.of(body)
    generation = int(body["metadata"].get("generation", 0))
    try:
        spec = spec_mod.parse(owner.name, body.get("spec") or {})
    except spec_mod.SpecError as e:
        return _outcome(
            previous,
            Observation(invalid=str(e), generation=generation),
            generation=generation,
            address=None,
            revisions={},
            with_reranker=False,
        )
    inputs = await _inputs(ctx, owner, spec)
    served = bool((previous.get("observed") or {}).get("index"))
    o = dataclasses.replace(inputs.observation, generation=generation, served=served)
    address = f"http://{owner.child}.{owner.namespace}.svc:{ctx.settings.indexer.port}"
    done = functools.partial(
        _outcome, previous, generation=generation, address=address, revisions=inputs.revisions,
        with_reranker=spec.reranker is not None,
    )  # fmt: skip
    if derive(o).state is State.FAILED or inputs.embedding_url is None:
        return done(o)  # the children stay as they are: there is nothing right to apply
    config = spec_mod.to_indexer_config(
        owner.name, spec, port=ctx.settings.indexer.port, embedding_url=inputs.embedding_url,
        reranker_url=inputs.reranker_url, revisions=inputs.revisions,
    ).model_copy(update={"generation": generation})  # fmt: skip
    claim, deployment = await _apply_children(ctx, owner, spec, config)
    pods = await ctx.cluster.list(
        kube.path("v1", "pods", owner.namespace),
        ",".join(f"{k}={v}" for k, v in children.selector(owner.name).items()),
    )
    pod = observe.pod_view(pods)
    indexer, error = (None, None)
    if pod is not None and pod.running and not pod.terminating:
        indexer, error = await _indexer_status(ctx, owner)
    return done(
        dataclasses.replace(
            o,
            index_drive_bound=observe.claim_bound(claim),
            pod_failure=observe.pod_failure(deployment),
            replacing=observe.replacing(deployment, pods),
            pod=pod,
            indexer=indexer,
            indexer_error=error,
        )
    )


def _outcome(
    previous: Mapping[str, Any],
    o: Observation,
    *,
    generation: int,
    address: str | None,
    revisions: Mapping[str, str],
    with_reranker: bool,
) -> Outcome:
    verdict = derive(o)
    status = status_mod.compose(
        previous, verdict, o, generation=generation, address=address, revisions=revisions,
        with_reranker=with_reranker, now=now(),
    )  # fmt: skip
    return Outcome(verdict, status)


async def _ask(
    ctx: Context, owner: children.Owner, route: str, body: Mapping[str, Any], timeout: float
) -> Any:
    url = f"{indexer_url(ctx, owner)}{route}"
    try:
        answer = await ctx.http.post(url, json=dict(body), timeout=timeout)
    except httpx.HTTPError as e:
        raise IndexerError(
            f"its indexer does not answer: {clients.describe(e)}", temporary=True
        ) from None
    if answer.is_success:
        return answer.json()
    try:
        error = answer.json()["error"]
        message = f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {answer.status_code}"
    # 409: a replacement is taking over (STANDBY); 5xx: not serving yet. Else: never.
    raise IndexerError(message, temporary=answer.status_code == 409 or answer.status_code >= 500)


async def reindex(ctx: Context, owner: children.Owner, *, full: bool) -> None:
    """Ask the indexer for a pass now (`full`: read every document again)."""
    await _ask(ctx, owner, "/v1/reindex", {"full": full}, ctx.settings.reach.timeout_seconds)


async def evaluate(ctx: Context, owner: children.Owner, *, k: int) -> dict[str, Any]:
    """Run the evaluation set; the figures the status keeps (never a miss: misses
    name documents)."""
    result = await _ask(
        ctx, owner, "/v1/evaluate", {"k": k}, ctx.settings.reach.evaluate_timeout_seconds
    )
    return {key: result[key] for key in ("k", "cases", "recall_at_k", "mrr", "at")}
