"""One reconciliation of a base, level-based: read what is, bring the children into
shape, observe them and the indexer, derive the state, and compose the status.

It never writes the status itself and knows nothing of kopf: status_update.py writes
what changed and posts the Events. The calls to the base's indexer (its status,
the requests a user makes by annotation) are indexer_client.py's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from metis_indexer.config import IndexerConfig
from metis_indexer.schema import StatusAnswer
from metis_operator import children, index_drive, indexer_client, kube, observe, status_compose
from metis_operator.api import identity
from metis_operator.api.spec import (
    REPLICAS_MAX,
    KnowledgeBaseSpec,
    SpecError,
    parse,
    to_indexer_config,
    unknown_fields,
)
from metis_operator.api.status_types import KnowledgeBaseStatus
from metis_operator.cache import CHILD_PLURAL, CHILDREN, Deps
from metis_operator.context import Context
from metis_operator.prober import EMBEDDING_ROLE, RERANKER_ROLE
from metis_operator.state import Model, ModelCheck, Observation, State, Verdict, derive
from metis_operator.status_update import Gone, being_deleted


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one reconciliation decided (the state, the status) and did to the children."""

    verdict: Verdict
    status: KnowledgeBaseStatus
    deps: Deps
    applied: tuple[str, ...] = ()
    """What this reconciliation created or repaired: `Deployment metis-x created`."""
    rollout: str = ""
    """A rollout of the operator's own (a new image or setting): "held" while it waits
    for its turn, "started" when this reconciliation started it."""
    indexer: StatusAnswer | None = None
    """The indexer's answer this reconciliation read, if it asked."""
    observation: Observation | None = None
    """What the state was derived from."""


SEEN_BY_APPLYING = (
    "index_drive_bound",
    "pod_failure",
    "replacing",
    "change",
    "pod",
    "old",
    "indexer",
    "indexer_error",
    "others",
    "shared_machines",
    "conflicts",
    "drive_notes",
)
"""What of an `Observation` is found by applying the children and asking the indexer:
until a turn has done both, the last turn's."""


def before_applying(o: Observation, last: Observation) -> Observation:
    """What the base is known to be while a new generation of it is applied: the
    spec's own inputs now, the rest as the last turn found it."""
    return dataclasses.replace(o, **{f: getattr(last, f) for f in SEEN_BY_APPLYING})


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def rollout_allowed(key: tuple[str, str], rolling: set[tuple[str, str]], limit: int) -> bool:
    """A rollout of the operator's own starts when the base already rolls or fewer
    than `limit` do."""
    return key in rolling or len(rolling) < limit


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


def _hash(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(identity.HASH_ANNOTATION)


async def _read(ctx: Context, kind: str, manifest: Mapping[str, Any], fresh: bool) -> Any:
    meta = manifest["metadata"]
    if fresh:
        return await ctx.cluster.get(kube.manifest_path(manifest))
    return ctx.cache.child(kind, meta["namespace"], meta["name"])


class Refused(Exception):
    """The API server would not take a child (its kind and name, then its words): the base
    says so in its state rather than in the operator's log alone."""


async def _refusing(what: str, call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """`call`'s answer; its ApiError as Refused, naming `what` was refused."""
    try:
        return dict(await call)
    except kube.ApiError as e:
        raise Refused(f"{what} ({e.message})") from e


@dataclasses.dataclass
class _Alive:
    """Asks the API server, once a turn and only before a child is created, whether the
    base still is: a base deleted (or whose CRD was) lingers in the operator's loops until
    its watch says so, and a child applied for it then would be made again after each
    garbage collection. Steady turns create nothing and ask nothing."""

    ctx: Context
    owner: children.Owner
    asked: bool = False

    async def __call__(self) -> None:
        if self.asked:
            return
        path = identity.path(self.owner.namespace, self.owner.name)
        found = await self.ctx.cluster.get(path)
        if found is None or (found.get("metadata") or {}).get("uid") != self.owner.uid:
            raise Gone("it, or its kind, no longer exists")
        if being_deleted(found):
            raise Gone("it is being deleted")
        self.asked = True


@dataclasses.dataclass
class _Applied:
    """What `_apply_children` did and found: each replica's (index claim, Deployment) as
    they are now, what was done, and the operator's own rollout ("held", "started")."""

    replicas: list[tuple[dict[str, Any] | None, dict[str, Any] | None]]
    done: list[str]
    rollout: str = ""
    conflicts: list[str] = dataclasses.field(default_factory=list)
    """Children another base owns under the names this one's would take."""
    drive_notes: list[str] = dataclasses.field(default_factory=list)
    """Index claims that cannot grow to what the base's memory holds, and why."""


async def _apply_children(
    ctx: Context,
    owner: children.Owner,
    spec: KnowledgeBaseSpec,
    config: IndexerConfig,
    *,
    fresh: bool,
    may_roll: Callable[[], bool],
) -> _Applied:
    """Create what is missing and re-apply what drifted, for every replica; remove the
    replicas the spec no longer asks for."""
    applied, alive = _Applied([], []), _Alive(ctx, owner)
    token, key = children.api_secret(owner), (owner.namespace, owner.name)
    if fresh or key not in ctx.tokens:
        if await ctx.cluster.get(kube.manifest_path(token)) is None:
            await alive()
            # Once: a new token would lock the operator out.
            await _refusing(f"Secret {owner.child}", ctx.cluster.create(token))
            applied.done.append(f"Secret {owner.child} created")
        ctx.tokens.add(key)
    shared = [
        children.config_map(owner, config),
        children.service(owner, ctx.settings),
        children.network_policy(owner, ctx.settings, ctx.settings.runtime.operator_namespace),
    ]
    budget = children.disruption_budget(owner)
    if spec.replicas > 1:
        shared.append(budget)
    else:
        await _remove(ctx, owner, budget, fresh, applied.done)
    for manifest in map(children.with_hash, shared):
        found = await _read(ctx, manifest["kind"], manifest, fresh)
        await _apply(ctx, owner, manifest, found, applied.done, alive)
    pods = children.by_replica(ctx.cache.pods(owner.namespace, owner.name))
    for i in range(spec.replicas):
        mine = pods.get(i, [])
        applied.replicas.append(
            await _apply_replica(ctx, owner, spec, i, mine, fresh, may_roll, applied, alive)
        )
    for i in range(spec.replicas, REPLICAS_MAX):
        for kind in ("Deployment", "PersistentVolumeClaim"):
            await _remove(ctx, owner, _named(kind, owner, owner.replica(i)), False, applied.done)
    return applied


def _named(kind: str, owner: children.Owner, name: str) -> dict[str, Any]:
    """Enough of a child to find and delete it by (a whole Deployment's manifest for
    each replica a base does not have was a twentieth of the operator's work while 100
    bases changed)."""
    api_version = next(w.api_version for w in CHILDREN if w.kind == kind)
    meta = {"name": name, "namespace": owner.namespace}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


async def _apply_replica(
    ctx: Context,
    owner: children.Owner,
    spec: KnowledgeBaseSpec,
    i: int,
    pods: Sequence[Mapping[str, Any]],
    fresh: bool,
    may_roll: Callable[[], bool],
    applied: _Applied,
    alive: _Alive,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Replica `i`'s index drive (created once: its spec is immutable once bound) and
    Deployment, as they are now."""
    size = index_drive.size_gib(
        spec.placement.memory_gb, spec.vectors, ctx.settings.indexer.index_storage
    )
    claim = children.index_claim(owner, ctx.settings, i, size)
    actual_claim = await _read(ctx, "PersistentVolumeClaim", claim, fresh)
    wish = children.deployment(owner, spec, ctx.settings, replica=i)
    current = await _read(ctx, "Deployment", wish, fresh)
    taken = [c for c in (actual_claim, current) if c is not None and not _owned(c, owner)]
    if taken:
        applied.conflicts += [_conflict(c, i) for c in taken]
        return None, None
    if actual_claim is None:
        await alive()
        what = f"PersistentVolumeClaim {owner.replica(i)}"
        actual_claim = await _refusing(what, ctx.cluster.create(claim))
        applied.done.append(f"PersistentVolumeClaim {owner.replica(i)} created")
    elif observe.claim_bound(actual_claim):
        actual_claim = await _grow(ctx, actual_claim, size, fresh, applied)
    moving = children.must_move(spec.placement, current, observe.node(pods))
    deployment = children.deployment(owner, spec, ctx.settings, replica=i, moving=moving)
    manifest = children.with_hash(deployment)
    if children.needs_apply(manifest, current) and operators_change(manifest, current):
        if not applied.rollout:  # one turn for all the base's replicas
            applied.rollout = "started" if may_roll() else "held"
        if applied.rollout == "held":
            return actual_claim, current
    return actual_claim, await _apply(ctx, owner, manifest, current, applied.done, alive)


async def _grow(
    ctx: Context, claim: dict[str, Any], size_gib: int, fresh: bool, applied: _Applied
) -> dict[str, Any]:
    """A bound index claim asked to grow to `size_gib` when it asks less (a larger
    `memory_gb`, int8 vectors); where the API server refuses (its StorageClass does not
    allow expansion), the refusal is a warning of the base, asked again at a resync."""
    requested = (
        ((claim.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    )
    if not index_drive.grows(requested, size_gib):
        return claim
    meta = claim["metadata"]
    key, wanted = (meta["namespace"], meta["name"]), f"{size_gib}Gi"
    refused = ctx.refused_growth.get(key)
    if refused is not None and refused[0] == size_gib and not fresh:
        applied.drive_notes.append(refused[1])
        return claim
    patch = {"spec": {"resources": {"requests": {"storage": wanted}}}}
    try:
        grown = await ctx.cluster.merge_patch(kube.manifest_path(claim), patch)
    except kube.ApiError as e:
        if e.status not in (403, 422):
            raise
        note = (
            f"index drive {meta['name']} has {requested}, the base's memory holds what needs "
            f"{wanted}, and the claim cannot grow ({e.message}): use a StorageClass that "
            "allows expansion, or set METIS_INDEX_STORAGE for new drives"
        )
        ctx.refused_growth[key] = (size_gib, note)
        applied.drive_notes.append(note)
        return claim
    ctx.refused_growth.pop(key, None)
    applied.done.append(
        f"PersistentVolumeClaim {meta['name']} asked to grow {requested} → {wanted}"
    )
    return dict(grown)


def _owned(child: Mapping[str, Any], owner: children.Owner) -> bool:
    """Whether `child` is this base's, or no base's (made by hand: taken over, as
    every child is)."""
    bases = [
        r
        for r in (child.get("metadata") or {}).get("ownerReferences") or []
        if r.get("controller") and r.get("kind") == identity.KIND
    ]
    return all(r.get("uid") == owner.uid for r in bases)


def _conflict(child: Mapping[str, Any], replica: int) -> str:
    meta = child.get("metadata") or {}
    (other,) = [r.get("name") for r in meta.get("ownerReferences") or [] if r.get("controller")]
    what = f"replica {replica}'s" if replica else "its"
    return (
        f"{what} {child.get('kind', 'child')} {meta.get('name')} belongs to base {other}: "
        "two bases whose children take one name (a base named <name>-replica-<i> and the "
        "replicas of base <name>); rename one, or ask fewer replicas"
    )


async def _apply(
    ctx: Context,
    owner: children.Owner,
    manifest: dict[str, Any],
    found: dict[str, Any] | None,
    done: list[str],
    alive: _Alive,
) -> dict[str, Any] | None:
    if not children.needs_apply(manifest, found):
        return found
    if found is None:
        await alive()
    verb = "created" if found is None else "updated"
    if found is not None and _hash(found) == _hash(manifest):
        verb = "repaired"  # the wish is the same: someone changed a field
    what = f"{manifest['kind']} {manifest['metadata']['name']}"
    applied = await _refusing(what, ctx.cluster.apply(manifest))
    ctx.cache.written(CHILD_PLURAL[manifest["kind"]], applied, (owner.namespace, owner.name))
    done.append(f"{what} {verb}")
    return applied


async def _remove(
    ctx: Context, owner: children.Owner, manifest: dict[str, Any], fresh: bool, done: list[str]
) -> None:
    """Delete a child the spec no longer asks for (a replica scaled away: its drive too,
    a new replica takes its peers' vectors), when it is there (as the cache has it,
    unless `fresh`: a child missed now is deleted at the next look)."""
    found = await _read(ctx, manifest["kind"], manifest, fresh)
    if found is None or not _owned(found, owner):
        return
    await ctx.cluster.delete(kube.manifest_path(manifest))
    done.append(f"{manifest['kind']} {manifest['metadata']['name']} deleted")


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """What decides Failed, and what the indexer's configuration needs."""

    observation: Observation
    revisions: dict[str, str]
    embedding_url: str | None
    reranker_url: str | None
    deps: Deps


async def _inputs(ctx: Context, owner: children.Owner, spec: KnowledgeBaseSpec) -> _Inputs:
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
    deps = Deps(ns, frozenset(spec.drives), frozenset(services), tuple(s for s in selectors if s))
    return _Inputs(o, revisions, embedding_url, reranker_url, deps)


async def run(
    ctx: Context,
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
    *,
    fresh: bool = False,
    may_roll: Callable[[], bool] = lambda: True,
    last: Observation | None = None,
    early: Callable[[Outcome], Awaitable[Mapping[str, Any]]] | None = None,
) -> Outcome:
    """Reconcile the base `body` whose stored status is `previous`; `fresh` reads its
    children from the API server instead of the cache; `may_roll` is asked, at the
    moment it is due, whether a rollout of the operator's own may start (and takes
    the turn when it may). A generation the status has not seen yet is said at once,
    before its children are applied: `early` writes what `last` (the last turn's
    observation) and the new spec say, and returns the status then stored (a change
    told in the time of one write, not of three, while a hundred bases change at once:
    bench/results/operator-kwok.md)."""
    owner = children.Owner.of(body)
    generation = int(body["metadata"].get("generation", 0))
    try:
        spec = parse(owner.name, body.get("spec") or {})
    except SpecError as e:
        ctx.probers.release((owner.namespace, owner.name), set())
        return _outcome(
            previous,
            Observation(invalid=str(e), generation=generation),
            generation=generation,
            address=None,
            revisions={},
            with_reranker=False,
            deps=Deps(owner.namespace),
        )
    inputs = await _inputs(ctx, owner, spec)
    served = bool((previous.get("observed") or {}).get("index"))
    o = dataclasses.replace(
        inputs.observation,
        generation=generation,
        served=served,
        revisions=inputs.revisions,
        unknown_fields=tuple(unknown_fields(body.get("spec") or {})),
    )
    address = f"http://{owner.child}.{owner.namespace}.svc:{ctx.settings.indexer.port}"

    def done(observation: Observation) -> Outcome:
        return _outcome(
            previous,
            observation,
            generation=generation,
            address=address,
            revisions=inputs.revisions,
            with_reranker=spec.reranker is not None,
            deps=inputs.deps,
        )

    if derive(o).state is State.FAILED or inputs.embedding_url is None:
        return done(o)  # the children stay as they are: there is nothing right to apply
    if early is not None and last is not None and previous.get("observedGeneration") != generation:
        previous = await early(
            done(before_applying(dataclasses.replace(o, replicas=spec.replicas), last))
        )
    config = to_indexer_config(
        owner.name,
        spec,
        port=ctx.settings.indexer.port,
        embedding_url=inputs.embedding_url,
        reranker_url=inputs.reranker_url,
        revisions=inputs.revisions,
        peers=[address] if spec.replicas > 1 else [],
    ).model_copy(update={"generation": generation})
    try:
        applied = await _apply_children(ctx, owner, spec, config, fresh=fresh, may_roll=may_roll)
    except Refused as e:
        return done(dataclasses.replace(o, refused=str(e)))
    (claim, deployment), *others = applied.replicas
    everyone = ctx.cache.pods(owner.namespace, owner.name)
    replicas = children.by_replica(everyone)
    pods = replicas.get(0, [])
    seen = dt.datetime.now(dt.UTC)
    pod = observe.pod_view(pods, seen)
    old = observe.old_pod_view(pods, seen)
    indexer, error = (None, None)
    if pod is not None and pod.running and not pod.terminating:
        replaced = pod.ready and old is not None
        indexer, error = await indexer_client.status(ctx, owner, replaced=replaced)
    outcome = done(
        dataclasses.replace(
            o,
            index_drive_bound=observe.claim_bound(claim),
            pod_failure=observe.pod_failure(deployment),
            replacing=observe.replacing(deployment),
            change=observe.change(deployment, pods),
            pod=pod,
            old=old,
            indexer=indexer,
            indexer_error=error,
            replicas=spec.replicas,
            others=tuple(
                observe.replica_view(i, d, replicas.get(i, []), seen)
                for i, (_, d) in enumerate(others, start=1)
            ),
            shared_machines=observe.shared_machines(everyone),
            conflicts=tuple(applied.conflicts),
            drive_notes=tuple(applied.drive_notes),
        )
    )
    return dataclasses.replace(
        outcome, applied=tuple(applied.done), rollout=applied.rollout, indexer=indexer
    )


def _outcome(
    previous: Mapping[str, Any],
    o: Observation,
    *,
    generation: int,
    address: str | None,
    revisions: Mapping[str, str],
    with_reranker: bool,
    deps: Deps,
) -> Outcome:
    verdict = derive(o)
    status = status_compose.compose(
        previous,
        verdict,
        o,
        generation=generation,
        address=address,
        revisions=revisions,
        with_reranker=with_reranker,
        now=now(),
    )
    return Outcome(verdict, status, deps, observation=o)
