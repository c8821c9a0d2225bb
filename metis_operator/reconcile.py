"""One reconciliation of a base, level-based: read what is, bring the children into
shape, observe them and the indexer, derive the state, and compose the status.

A list of named steps over one look at the base (look.py), in two calls. `begin`: the
spec parsed, what it asks read (its drives, its model Services); the outcome when there
is nothing right to apply, else the `Plan`, with the outcome to write before applying it
when the generation is new to the status (`Plan.early`). `finish`: the children applied
(apply.py), what runs observed (the pods, the indexer), the outcome.

It never writes the status itself and knows nothing of kopf: the base's loop (runner.py)
writes the early outcome between the two calls, and the outcome after them, through
status/. The calls to the base's indexer (its status, the requests a user makes by
annotation) are indexer_client.py's; whether a rollout of the operator's own may start
is asked of the `rollout.Rollouts` passed in.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from metis_indexer.config import IndexerConfig
from metis_indexer.schema import StatusAnswer
from metis_operator import apply, children, indexer_client, kube, observe, rollout
from metis_operator.api.spec import (
    KnowledgeBaseSpec,
    SpecError,
    parse,
    to_indexer_config,
    unknown_fields,
)
from metis_operator.api.status_types import KnowledgeBaseStatus
from metis_operator.cache import Deps
from metis_operator.context import Context
from metis_operator.look import Applied, Asked, Look, Running, before_applying
from metis_operator.prober import EMBEDDING_ROLE, RERANKER_ROLE
from metis_operator.state import Model, ModelCheck, State, Verdict, derive
from metis_operator.status import compose


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one reconciliation decided (the state, the status) and did to the children."""

    verdict: Verdict
    status: KnowledgeBaseStatus
    deps: Deps
    applied: tuple[str, ...] = ()
    """What this reconciliation created or repaired: `Deployment metis-x created`."""
    rollout: str = ""
    """A rollout of the operator's own (a new image or setting): rollout.HELD while it
    waits for its turn, rollout.STARTED when this reconciliation started it."""
    look: Look | None = None
    """What the state was derived from."""

    @property
    def indexer(self) -> StatusAnswer | None:
        """The indexer's answer this reconciliation read, if it asked."""
        return self.look.running.indexer if self.look is not None else None


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `begin` read and `finish` applies: the base, its spec, what it asks, and the
    indexer's configuration; the outcome to write before applying, if any."""

    owner: children.Owner
    spec: KnowledgeBaseSpec
    asked: Asked
    config: IndexerConfig
    early: Outcome | None = None
    """A generation the status has not seen yet is said at once, before its children are
    applied (a change told in the time of one write, not of three, while a hundred bases
    change at once: bench/results/operator-kwok.md)."""


async def begin(
    ctx: Context, body: Mapping[str, Any], previous: Mapping[str, Any], *, last: Look | None
) -> Outcome | Plan:
    """The first steps of reconciling the base `body`, whose stored status is
    `previous`: its spec parsed and what it asks read. Its outcome when there is nothing
    right to apply (an invalid spec, a Failed base, no embedding model); else the plan
    for `finish`, early outcome included when `last` (the last turn's look) is known and
    the generation is new to the status."""
    owner = children.Owner.of(body)
    try:
        spec = parse(owner.name, body.get("spec") or {})
    except SpecError as e:
        return _invalid(ctx, owner, body, previous, str(e))
    asked, embedding_url, reranker_url = await _asked(ctx, owner, spec, body, previous)
    if (
        embedding_url is None
        or asked.unlisted_fluxes  # no revision of it to name in the configuration yet
        or derive(Look(asked).observation()).state is State.FAILED
    ):
        return _outcome(previous, Look(asked))  # the children stay as they are
    config = _config(ctx, owner, spec, asked, embedding_url, reranker_url)
    plan = Plan(owner, spec, asked, config)
    if last is not None and previous.get("observedGeneration") != asked.generation:
        early = _outcome(previous, before_applying(asked, spec.replicas, last))
        plan = dataclasses.replace(plan, early=early)
    return plan


async def finish(
    ctx: Context,
    plan: Plan,
    previous: Mapping[str, Any],
    *,
    fresh: bool,
    rollouts: rollout.Rollouts,
) -> Outcome:
    """The last steps: the children applied (read from the API server rather than the
    cache when `fresh`; a rollout of the operator's own applied when `rollouts` gives
    the base its turn), what runs observed, and the outcome against `previous`, the
    status as stored now."""
    try:
        applying = await apply.children_of(
            ctx, plan.owner, plan.spec, plan.config, fresh=fresh, rollouts=rollouts
        )
    except apply.Refused as e:
        return _outcome(previous, Look(plan.asked, Applied(refused=str(e))))
    running = await _running(ctx, plan.owner, applying.replicas)
    outcome = _outcome(previous, Look(plan.asked, applying.found(), running))
    return dataclasses.replace(outcome, applied=tuple(applying.done), rollout=applying.rollout)


def _invalid(
    ctx: Context,
    owner: children.Owner,
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
    why: str,
) -> Outcome:
    """A spec that does not parse: Failed, saying why; its model probers let go."""
    ctx.probers.release((owner.namespace, owner.name), set())
    asked = Asked(_generation(body), Deps(owner.namespace), invalid=why)
    return _outcome(previous, Look(asked))


def _generation(body: Mapping[str, Any]) -> int:
    return int(body["metadata"].get("generation", 0))


async def _asked(
    ctx: Context,
    owner: children.Owner,
    spec: KnowledgeBaseSpec,
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
) -> tuple[Asked, str | None, str | None]:
    """What the spec asks and what of it there is (the probers of models it no longer
    names let go), and its models' URLs (None: no such Service)."""
    ns = owner.namespace
    claims = [ctx.cache.claim(ns, d) for d in spec.drives]
    embedding, embedding_url, selector = await _check_model(
        ctx, owner, spec.embedding.deployment, EMBEDDING_ROLE
    )
    selectors = [selector]
    reranker, reranker_url = (None, None)
    services = {spec.embedding.deployment}
    if spec.reranker is not None:
        reranker, reranker_url, rr_selector = await _check_model(
            ctx, owner, spec.reranker.deployment, RERANKER_ROLE
        )
        selectors.append(rr_selector)
        services.add(spec.reranker.deployment)
    keep = {(ns, spec.embedding.deployment, EMBEDDING_ROLE)}
    if spec.reranker is not None:
        keep.add((ns, spec.reranker.deployment, RERANKER_ROLE))
    ctx.probers.release((ns, owner.name), keep)
    found = {d: c for d, c in zip(spec.drives, claims, strict=True) if c is not None}
    fluxes = {f: ctx.cache.flux(ns, f.kind, f.name) for f in spec.fluxes}
    artifacts = {f.name: a for f, o in fluxes.items() if o and (a := observe.artifact(o))}
    asked = Asked(
        generation=_generation(body),
        deps=Deps(
            ns,
            frozenset(spec.drives),
            frozenset(services),
            tuple(s for s in selectors if s),
            frozenset((kube.RESOURCE[f.kind].plural, f.name) for f in fluxes),
        ),
        address=f"http://{owner.child}.{ns}.svc:{ctx.settings.indexer.port}",
        with_reranker=spec.reranker is not None,
        placement=spec.placement,
        missing_drives=tuple(d for d in spec.drives if d not in found),
        unlisted_drives=tuple(
            d for d, c in found.items() if observe.from_data_source(c) and not observe.revision(c)
        ),
        unbound_drives=tuple(d for d, c in found.items() if not observe.claim_bound(c)),
        missing_fluxes=tuple(f.said for f, o in fluxes.items() if o is None),
        unlisted_fluxes=tuple(
            f.said + (f": {why}" if (why := observe.flux_trouble(o)) else "")
            for f, o in fluxes.items()
            if o is not None and f.name not in artifacts
        ),
        artifacts=artifacts,
        embedding=embedding,
        reranker=reranker,
        index_drive=owner.child,
        revisions={
            **{d: observe.revision(c) for d, c in found.items() if observe.revision(c)},
            **{name: a["revision"] for name, a in artifacts.items()},
        },
        served=bool((previous.get("observed") or {}).get("index")),
        unknown_fields=tuple(unknown_fields(body.get("spec") or {})),
        restore_from=spec.restore.backup if spec.restore is not None else None,
    )
    return asked, embedding_url, reranker_url


async def _check_model(
    ctx: Context, owner: children.Owner, name: str, role: str
) -> tuple[ModelCheck, str | None, Mapping[str, str]]:
    """The model Service `name`: whether it exists and serves `role`, its URL and its
    selector; the answer is its shared prober's."""
    namespace = owner.namespace
    svc = ctx.cache.service(namespace, name)
    if svc is None:
        return ModelCheck(role, name, Model.NOT_FOUND), None, {}
    url = ctx.settings.url(name, namespace, observe.service_port(svc))
    prober = ctx.probers.get((namespace, name, role), url, (namespace, owner.name))
    result, detail = await prober.result()
    selector = (svc.get("spec") or {}).get("selector") or {}
    idle = observe.scaled_to_zero(selector, ctx.cache.workloads(namespace) if selector else [])
    warnings = tuple(
        f"{role} {name}: {w} is scaled to zero; the base does not wake it (keep one replica)"
        for w in idle
    )
    return ModelCheck(role, name, result, detail, warnings), url, selector


def _config(
    ctx: Context,
    owner: children.Owner,
    spec: KnowledgeBaseSpec,
    asked: Asked,
    embedding_url: str,
    reranker_url: str | None,
) -> IndexerConfig:
    """The indexer's configuration (its ConfigMap): with replicas, the base's Service as
    where a replica's first pass takes vectors already made."""
    return to_indexer_config(
        owner.name,
        spec,
        port=ctx.settings.indexer.port,
        embedding_url=embedding_url,
        reranker_url=reranker_url,
        revisions=asked.revisions,
        peers=[asked.address] if spec.replicas > 1 else [],
        artifacts=asked.artifacts,
    ).model_copy(update={"generation": asked.generation})


async def _machines(ctx: Context, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The nodes pod spec `pod`'s node selector picks (at most 500), read only for a pod the
    scheduler keeps off them for a taint, and kept `context.MACHINES_SECONDS`; none where
    the operator may not read nodes (a namespaced install): the scheduler's words then."""
    selector = ",".join(f"{k}={v}" for k, v in sorted((pod.get("nodeSelector") or {}).items()))
    kept = ctx.machines.get(selector)
    if kept is not None:
        return kept
    try:
        found = await ctx.cluster.call(
            "GET", "/api/v1/nodes", query={"labelSelector": selector, "limit": 500}
        )
    except kube.ApiError:
        found = {}
    return ctx.machines.put(selector, list((found or {}).get("items") or []))


async def _running(
    ctx: Context, owner: children.Owner, replicas: Sequence[apply.Replica]
) -> Running:
    """What runs, as the replicas' Deployments (applied) and the pods in the cache show
    it; replica 0's indexer asked for its status when its pod runs."""
    (_, deployment), *others = replicas
    everyone = ctx.cache.pods(owner.namespace, owner.name)
    by_replica = children.by_replica(everyone)
    pods = by_replica.get(0, [])
    seen = dt.datetime.now(dt.UTC)
    pod = observe.pod_view(pods, seen)
    if pod is not None and observe.UNTOLERATED in (pod.unschedulable or "") and deployment:
        template = deployment["spec"]["template"]["spec"]
        taints = observe.untolerated(await _machines(ctx, template), template)
        pod = dataclasses.replace(pod, taints=taints)
    old = observe.old_pod_view(pods, seen)
    indexer, error = (None, None)
    if pod is not None and pod.running and not pod.terminating:
        replaced = pod.ready and old is not None
        indexer, error = await indexer_client.status(ctx, owner, replaced=replaced)
    return Running(
        pod_failure=observe.pod_failure(deployment),
        replacing=observe.replacing(deployment),
        change=observe.change(deployment, pods),
        pod=pod,
        old=old,
        indexer=indexer,
        indexer_error=error,
        others=tuple(
            observe.replica_view(i, d, by_replica.get(i, []), seen)
            for i, (_, d) in enumerate(others, start=1)
        ),
        shared_machines=observe.shared_machines(everyone),
    )


def _outcome(previous: Mapping[str, Any], look: Look) -> Outcome:
    """The state derived from the look, and the status composed from `previous`."""
    o = look.observation()
    verdict = derive(o)
    status = compose.compose(
        previous,
        verdict,
        o,
        generation=look.asked.generation,
        address=look.asked.address,
        revisions=look.asked.revisions,
        with_reranker=look.asked.with_reranker,
        now=compose.now(),
    )
    return Outcome(verdict, status, look.asked.deps, look=look)
