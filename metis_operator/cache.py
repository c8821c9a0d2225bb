"""What the operator reads from the API server, kept in memory.

One LIST per watched kind fills the cache before kopf's watches start, so no base is
derived from a half-filled cache; then kopf's watch events (one watch per kind, not one
request per base) keep it. Not kopf's own indices: they hold every handler back until
each object has been indexed, and their readiness bookkeeping grew with the square of
the objects (a new leader at 1,000 bases derived its first base 100 s after the old one
died, bench/results/operator-kwok.md). This module says what is kept of each object
(`slim`: children and drives whole, other workloads only what the scaled-to-zero warning
needs), reads it back by name (`Cache`), and decides which bases an object's change
concerns (`affected`), a pure function over plain data.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from metis_operator import children, kube
from metis_operator.api import identity
from metis_operator.api.spec import FLUX_KINDS

Key = tuple[str, str]
"""(namespace, name)."""

MANAGED = {"app.kubernetes.io/managed-by": children.MANAGER}
INDEXER_PODS = {"app.kubernetes.io/name": children.APP}
TOKEN_KEY = "token"
INSTANCE_LABEL = "app.kubernetes.io/instance"
"""The label naming an indexer pod's base."""


@dataclasses.dataclass(frozen=True)
class Watched(kube.Resource):
    """One kind the operator watches: what kopf and a LIST need."""

    labels: Mapping[str, str] | None = None
    child: bool = False
    """The operator applies it for a base (the drift check lists it): not the base's
    Secret, which the operator may not list; each base reads its own by name."""


def _watched(kind: str, labels: Mapping[str, str] | None = None, child: bool = False) -> Watched:
    return Watched(**dataclasses.asdict(kube.RESOURCE[kind]), labels=labels, child=child)


WATCHED = (
    _watched("PersistentVolumeClaim", child=True),
    _watched("Service", child=True),
    _watched("Deployment", child=True),
    _watched("StatefulSet"),
    _watched("ConfigMap", MANAGED, child=True),
    _watched("NetworkPolicy", MANAGED, child=True),
    _watched("PodDisruptionBudget", MANAGED, child=True),
    _watched("Pod", INDEXER_PODS),
    *(_watched(kind) for kind in FLUX_KINDS),
)
"""Drives and model Services by name (any in the namespace may be named by a base),
workloads (a child, or behind a model Service), and the operator's own ConfigMaps,
NetworkPolicies, PodDisruptionBudgets and indexer pods by label. Not Secrets: a watch
would bring every Secret of the cluster into the operator; a base's token is read by
name when a request needs it."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def selector(labels: Mapping[str, str]) -> str:
    """Labels as an API server's `labelSelector`."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def ours(obj: Mapping[str, Any]) -> bool:
    labels = _meta(obj).get("labels") or {}
    return all(labels.get(k) == v for k, v in MANAGED.items())


def slim(plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the cache keeps of `obj`: never managedFields; of a workload that is not a
    child, only its kind, name, replicas and pod labels."""
    meta = {k: v for k, v in _meta(obj).items() if k != "managedFields"}
    kind = {"deployments": "Deployment", "statefulsets": "StatefulSet"}.get(plural)
    if kind and not ours(obj):
        spec = obj.get("spec") or {}
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        return {
            "kind": kind,
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
            "spec": {
                "replicas": spec.get("replicas", 1),
                "template": {"metadata": {"labels": dict(labels)}},
            },
        }
    out = {k: v for k, v in obj.items() if k != "metadata"}
    if kind:
        out["kind"] = kind
    return {**out, "metadata": meta}


def token(secret: Mapping[str, Any]) -> str | None:
    """The base64-decoded `token` of a Secret, None when absent or not base64."""
    raw = (secret.get("data") or {}).get(TOKEN_KEY)
    if not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True).decode().strip() or None
    except (binascii.Error, UnicodeDecodeError):
        return None


@dataclasses.dataclass(frozen=True)
class Deps:
    """What one base's last reconciliation read besides its own children: the names of
    drives and model Services in its namespace, and the model Services' selectors."""

    namespace: str
    claims: frozenset[str] = frozenset()
    services: frozenset[str] = frozenset()
    selectors: tuple[Mapping[str, str], ...] = ()
    fluxes: frozenset[tuple[str, str]] = frozenset()
    """Flux source objects, as (plural, name)."""

    def named(self) -> list[tuple[str, str]]:
        """(plural, name) of everything it reads by name."""
        return [
            *(("persistentvolumeclaims", n) for n in self.claims),
            *(("services", n) for n in self.services),
            *self.fluxes,
        ]


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


class Dependents:
    """Which bases read what, inverted from each base's `Deps`: a watch event finds the
    bases it concerns by name, not by a look at every base (at 1,000 bases, one event
    looked at 1,000)."""

    def __init__(self) -> None:
        self._deps: dict[Key, Deps] = {}
        self._named: dict[tuple[str, str, str], set[Key]] = {}
        """(plural, namespace, name) → the bases that read it by name."""
        self._selecting: dict[str, dict[Key, tuple[Mapping[str, str], ...]]] = {}
        """namespace → each base's model Services' selectors there."""

    @classmethod
    def of(cls, bases: Mapping[Key, Deps]) -> Dependents:
        out = cls()
        for key, deps in bases.items():
            out.set(key, deps)
        return out

    def __contains__(self, key: object) -> bool:
        return key in self._deps

    def set(self, key: Key, deps: Deps) -> None:
        """What `key` reads now (its last reconciliation's `Deps`)."""
        if self._deps.get(key) == deps:
            return
        self.drop(key)
        self._deps[key] = deps
        for plural, name in deps.named():
            self._named.setdefault((plural, deps.namespace, name), set()).add(key)
        if deps.selectors:
            self._selecting.setdefault(deps.namespace, {})[key] = deps.selectors

    def drop(self, key: Key) -> None:
        deps = self._deps.pop(key, None)
        if deps is None:
            return
        for plural, name in deps.named():
            readers = self._named.get((plural, deps.namespace, name), set())
            readers.discard(key)
            if not readers:
                self._named.pop((plural, deps.namespace, name), None)
        self._selecting.get(deps.namespace, {}).pop(key, None)

    def named(self, plural: str, namespace: str, name: str) -> builtins.set[Key]:
        return set(self._named.get((plural, namespace, name), ()))

    def selecting(self, namespace: str, labels: Mapping[str, str]) -> builtins.set[Key]:
        """The bases with a model Service whose selector picks these pod labels."""
        return {
            key
            for key, selectors in self._selecting.get(namespace, {}).items()
            if any(_matches(s, labels) for s in selectors)
        }


def affected(bases: Dependents, plural: str, obj: Mapping[str, Any]) -> set[Key]:
    """The bases whose state `obj` (of kind `plural`) may change: its owner or
    instance, and every base that reads it by name or selects it as a model's workload."""
    meta = _meta(obj)
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    out: set[Key] = set()
    labels = meta.get("labels") or {}
    if labels.get("app.kubernetes.io/name") == children.APP:
        instance = labels.get("app.kubernetes.io/instance")
        if instance:
            out.add((ns, instance))
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == identity.KIND and ref.get("apiVersion", "").startswith(
            identity.GROUP + "/"
        ):
            out.add((ns, ref.get("name", "")))
    out |= bases.named(plural, ns, name)
    if plural in ("deployments", "statefulsets"):
        template = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
        out |= bases.selecting(ns, template.get("labels") or {})
    return {k for k in out if k in bases}


CHILDREN = tuple(w for w in WATCHED if w.child)
CHILD_PLURAL = {w.kind: w.plural for w in CHILDREN}


def _key(obj: Mapping[str, Any]) -> Key:
    meta = _meta(obj)
    return meta.get("namespace", ""), meta.get("name", "")


def group(plural: str, obj: Mapping[str, Any]) -> Any:
    """The second key `obj` is read by, None for none: a pod by its base (a base's pods
    at once: a scan of the namespace's was a tenth of the operator's work at 1,000 bases),
    a workload by its namespace (a model Service's workload found without a request)."""
    ns, _ = _key(obj)
    if plural == "pods":
        return ns, (_meta(obj).get("labels") or {}).get(INSTANCE_LABEL, "")
    if plural in ("deployments", "statefulsets"):
        return ns
    return None


class Cache:
    """Each watched kind's objects (slim) by (namespace, name), and by `group`."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[Key, dict[str, Any]]] = {w.plural: {} for w in WATCHED}
        self._groups: dict[str, dict[Any, dict[Key, dict[str, Any]]]] = {
            w.plural: {} for w in WATCHED
        }
        self._unconfirmed: set[tuple[str, Key]] = set()
        """What the priming LISTs brought and no watch event has brought since."""
        self._written: dict[tuple[str, Key], tuple[str, Key]] = {}
        """A child's version as the operator's own apply left it, and the base that applied
        it (`written`)."""

    def written(self, plural: str, obj: Mapping[str, Any], base: Key) -> None:
        """`obj` as `base`'s apply of it answered: its watch event tells that base nothing
        new (the turn that applied it saw the answer). Each apply's event woke its base
        for a turn that found nothing: two a change while 100 bases changed at once
        (bench/results/operator-kwok.md)."""
        self._written[(plural, _key(obj))] = (_meta(obj).get("resourceVersion", ""), base)

    def seen(self, plural: str, obj: Mapping[str, Any], deleted: bool = False) -> Key | None:
        """A watch event: it always wins over what a LIST brought before it. The base that
        wrote this very version of it, if one did (`written`)."""
        key = _key(obj)
        self._unconfirmed.discard((plural, key))
        version, writer = self._written.pop((plural, key), ("", None))
        mine = writer if not deleted and version == _meta(obj).get("resourceVersion") else None
        old = self._objects[plural].pop(key, None)
        if old is not None and (was := group(plural, old)) is not None:
            members = self._groups[plural][was]
            members.pop(key, None)
            if not members:
                del self._groups[plural][was]
        if deleted:
            return None
        value = slim(plural, obj)
        self._objects[plural][key] = value
        if (g := group(plural, value)) is not None:
            self._groups[plural].setdefault(g, {})[key] = value
        return mine

    def prime(self, kind: Watched, items: Iterable[Mapping[str, Any]]) -> None:
        """One LIST's items (which carry no kind of their own), taken before kopf's watch
        of the kind starts: its events then bring each again, or newer."""
        for item in items:
            self.seen(kind.plural, {"apiVersion": kind.api_version, "kind": kind.kind, **item})
            self._unconfirmed.add((kind.plural, _key(item)))

    def drop_unconfirmed(self) -> int:
        """Forget what a priming LIST brought and no watch event has since: an object
        deleted between that LIST and the watch's own listing, which sends no deletion.
        Called once the watches have surely listed (at the first drift check)."""
        ghosts = list(self._unconfirmed)
        for plural, key in ghosts:
            self.seen(plural, {"metadata": {"namespace": key[0], "name": key[1]}}, deleted=True)
        return len(ghosts)

    def _one(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects[plural].get((namespace, name))

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("persistentvolumeclaims", namespace, name)

    def service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("services", namespace, name)

    def flux(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """A Flux source object (None too where Flux is not installed)."""
        return self._one(kube.RESOURCE[kind].plural, namespace, name)

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("configmaps", namespace, name)

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("deployments", namespace, name)

    def child(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one(CHILD_PLURAL[kind], namespace, name)

    def every(self, kind: str) -> list[dict[str, Any]]:
        """Every object of a child's kind the cache holds, the operator's and others'."""
        return list(self._objects[CHILD_PLURAL[kind]].values())

    def pods(self, namespace: str, instance: str) -> list[dict[str, Any]]:
        return list(self._groups["pods"].get((namespace, instance), {}).values())

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        return [
            *self._groups["deployments"].get(namespace, {}).values(),
            *self._groups["statefulsets"].get(namespace, {}).values(),
        ]
