"""A base's children brought into shape: what is missing created, what drifted
applied again, an index claim grown to what the base's memory holds, the replicas the
spec no longer asks for removed. A change of the operator's own (a new image or setting)
replaces a running indexer only when `rollout.Rollouts` gives the base its turn.

`children_of` answers what it did and found (`Applying`; `Applying.found` is the part
of the look it makes); a child the API server would not take is `Refused`, naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from metis_indexer.config import IndexerConfig
from metis_operator import children, index_drive, kube, observe, rollout
from metis_operator.api import identity
from metis_operator.api.spec import REPLICAS_MAX, KnowledgeBaseSpec
from metis_operator.context import Context
from metis_operator.look import Applied
from metis_operator.status.write import Gone, being_deleted


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


Replica = tuple[dict[str, Any] | None, dict[str, Any] | None]
"""A replica's index claim and Deployment, as they are after applying them."""


@dataclasses.dataclass
class Applying:
    """What `_apply_children` did and found: each replica's (index claim, Deployment) as
    they are now, what was done, and the operator's own rollout (rollout.HELD, STARTED)."""

    replicas: list[Replica]
    done: list[str]
    rollout: str = ""
    conflicts: list[str] = dataclasses.field(default_factory=list)
    """Children another base owns under the names this one's would take."""
    child_notes: list[str] = dataclasses.field(default_factory=list)
    """What keeps a child from being what the spec asks, and why: an index claim that cannot
    grow, or that has another StorageClass; a pull secret the operator cannot copy."""

    def found(self) -> Applied:
        """The part of the look it makes: replica 0's index drive bound or not, what
        keeps the base's children from being its own."""
        (claim, _), *_ = self.replicas
        return Applied(
            replicas=len(self.replicas),
            index_drive_bound=observe.claim_bound(claim),
            conflicts=tuple(self.conflicts),
            child_notes=tuple(self.child_notes),
        )


async def children_of(
    ctx: Context,
    owner: children.Owner,
    spec: KnowledgeBaseSpec,
    config: IndexerConfig,
    *,
    fresh: bool,
    rollouts: rollout.Rollouts,
) -> Applying:
    """Create what is missing and re-apply what drifted, for every replica; remove the
    replicas the spec no longer asks for. `fresh` reads the children from the API server
    rather than the cache."""
    applied, alive = Applying([], []), _Alive(ctx, owner)
    token, key = children.api_secret(owner), (owner.namespace, owner.name)
    if fresh or key not in ctx.tokens:
        if await ctx.cluster.get(kube.manifest_path(token)) is None:
            await alive()
            # Once: a new token would lock the operator out.
            await _refusing(f"Secret {owner.child}", ctx.cluster.create(token))
            applied.done.append(f"Secret {owner.child} created")
        ctx.tokens.add(key)
    if ctx.settings.indexer.image_pull_secrets:
        await _pull_secret(ctx, owner, fresh, applied, alive)
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
            await _apply_replica(ctx, owner, spec, i, mine, fresh, rollouts, applied, alive)
        )
    for i in range(spec.replicas, REPLICAS_MAX):
        for kind in ("Deployment", "PersistentVolumeClaim"):
            await _remove(ctx, owner, _named(kind, owner, owner.replica(i)), False, applied.done)
    return applied


async def _pull_sources(ctx: Context) -> list[dict[str, Any]] | str:
    """The operator's pull secrets (`METIS_INDEXER_IMAGE_PULL_SECRETS`), as read in the
    last `context.PULL_SECONDS`; or what keeps them from being copied."""
    kept = ctx.pull_sources.get(None)
    if kept is not None:
        return kept
    ns, found = ctx.settings.runtime.operator_namespace, []
    for name in ctx.settings.indexer.image_pull_secrets:
        secret = await ctx.cluster.get(kube.path("v1", "secrets", ns, name))
        if secret is None:
            return ctx.pull_sources.put(None, f"Secret {name} does not exist in namespace {ns}")
        found.append(dict(secret))
    return ctx.pull_sources.put(None, found)


async def _pull_secret(
    ctx: Context, owner: children.Owner, fresh: bool, applied: Applying, alive: _Alive
) -> None:
    """The copy of the operator's pull secrets the base's indexer pods name, applied when
    its credentials changed (remembered, not read: Secrets are not watched); what keeps
    it from being made is a warning of the base."""
    sources = await _pull_sources(ctx)
    try:
        if isinstance(sources, str):
            raise children.PullProblem(sources)
        manifest = children.with_hash(children.pull_secret(owner, sources))
    except children.PullProblem as e:
        applied.child_notes.append(
            f"cannot copy the image pull secrets (METIS_INDEXER_IMAGE_PULL_SECRETS): {e}; the "
            "node pulls the indexer image without them"
        )
        return
    key = (owner.namespace, owner.name)
    if not fresh and ctx.pulls.get(key) == _hash(manifest):
        return
    found = await ctx.cluster.get(kube.manifest_path(manifest))
    if found is None or _hash(found) != _hash(manifest):
        if found is None:
            await alive()
        what = f"Secret {manifest['metadata']['name']}"
        await _refusing(what, ctx.cluster.apply(manifest))
        applied.done.append(f"{what} {'created' if found is None else 'updated'}")
    ctx.pulls[key] = _hash(manifest)


def _named(kind: str, owner: children.Owner, name: str) -> dict[str, Any]:
    """Enough of a child to find and delete it by (a whole Deployment's manifest for
    each replica a base does not have was a twentieth of the operator's work while 100
    bases changed)."""
    api_version = kube.RESOURCE[kind].api_version
    meta = {"name": name, "namespace": owner.namespace}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


async def _apply_replica(
    ctx: Context,
    owner: children.Owner,
    spec: KnowledgeBaseSpec,
    i: int,
    pods: Sequence[Mapping[str, Any]],
    fresh: bool,
    rollouts: rollout.Rollouts,
    applied: Applying,
    alive: _Alive,
) -> Replica:
    """Replica `i`'s index drive (created once: its spec is immutable once bound) and
    Deployment, as they are now."""
    least = spec.index_drive.size_gb if spec.index_drive else None
    size = index_drive.size_gib(
        spec.placement.memory_gb, spec.vectors, ctx.settings.indexer.index_storage, least
    )
    klass = children.storage_class(spec, ctx.settings)
    claim = children.index_claim(owner, ctx.settings, i, size, klass)
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
    else:
        if spec.index_drive and (note := index_drive.class_note(actual_claim, klass)):
            applied.child_notes.append(note)
        if observe.claim_bound(actual_claim):
            actual_claim = await _grow(ctx, actual_claim, size, fresh, applied)
    moving = children.must_move(spec.placement, current, observe.node(pods))
    deployment = children.deployment(owner, spec, ctx.settings, replica=i, moving=moving)
    manifest = children.with_hash(deployment)
    if children.needs_apply(manifest, current) and rollout.operators_change(manifest, current):
        if not applied.rollout:  # one turn for all the base's replicas
            applied.rollout = rollouts.turn((owner.namespace, owner.name))
        if applied.rollout == rollout.HELD:
            return actual_claim, current
    return actual_claim, await _apply(ctx, owner, manifest, current, applied.done, alive)


async def _grow(
    ctx: Context, claim: dict[str, Any], size_gib: int, fresh: bool, applied: Applying
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
        applied.child_notes.append(refused[1])
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
        applied.child_notes.append(note)
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
    plural = kube.RESOURCE[manifest["kind"]].plural
    ctx.cache.written(plural, applied, (owner.namespace, owner.name))
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
