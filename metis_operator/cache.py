"""What the operator reads from the API server, kept in memory by kopf's watches.

kopf indexes every watched kind (one watch per kind, not one request per base) and
holds the operator's handlers back until each kind's first listing is in, so a
reconciliation never sees a half-filled cache. This module says what is kept of each
object (`slim`: children and drives whole, other workloads only what the scaled-to-zero
warning needs), reads it back by name (`Cache`), and decides which bases an object's
change concerns (`affected`), a pure function over plain data.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from metis_operator import children
from metis_operator.api import identity

Key = tuple[str, str]
"""(namespace, name)."""

MANAGED = {"app.kubernetes.io/managed-by": children.MANAGER}
INDEXER_PODS = {"app.kubernetes.io/name": children.APP}
TOKEN_KEY = "token"
INSTANCE_LABEL = "app.kubernetes.io/instance"
"""The label naming an indexer pod's base."""
INSTANCE = "instance"
"""The middle of a pod's index key, (namespace, INSTANCE, base): apart from the
(namespace, name) keys of the other kinds."""


@dataclasses.dataclass(frozen=True)
class Watched:
    """One kind the operator watches: what kopf needs, and the index's kwarg name."""

    index: str
    kind: str
    group: str
    version: str
    plural: str
    labels: Mapping[str, str] | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


WATCHED = (
    Watched("metis_claims", "PersistentVolumeClaim", "", "v1", "persistentvolumeclaims"),
    Watched("metis_services", "Service", "", "v1", "services"),
    Watched("metis_deployments", "Deployment", "apps", "v1", "deployments"),
    Watched("metis_statefulsets", "StatefulSet", "apps", "v1", "statefulsets"),
    Watched("metis_configmaps", "ConfigMap", "", "v1", "configmaps", MANAGED),
    Watched(
        "metis_networkpolicies",
        "NetworkPolicy",
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        MANAGED,
    ),
    Watched(
        "metis_disruptionbudgets",
        "PodDisruptionBudget",
        "policy",
        "v1",
        "poddisruptionbudgets",
        MANAGED,
    ),
    Watched("metis_pods", "Pod", "", "v1", "pods", INDEXER_PODS),
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
        for plural, names in (("persistentvolumeclaims", deps.claims), ("services", deps.services)):
            for name in names:
                self._named.setdefault((plural, deps.namespace, name), set()).add(key)
        if deps.selectors:
            self._selecting.setdefault(deps.namespace, {})[key] = deps.selectors

    def drop(self, key: Key) -> None:
        deps = self._deps.pop(key, None)
        if deps is None:
            return
        for plural, names in (("persistentvolumeclaims", deps.claims), ("services", deps.services)):
            for name in names:
                readers = self._named.get((plural, deps.namespace, name), set())
                readers.discard(key)
                if not readers:
                    self._named.pop((plural, deps.namespace, name), None)
        self._selecting.get(deps.namespace, {}).pop(key, None)

    def named(self, plural: str, namespace: str, name: str) -> set[Key]:
        return set(self._named.get((plural, namespace, name), ()))

    def selecting(self, namespace: str, labels: Mapping[str, str]) -> set[Key]:
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


CHILD_KINDS = (
    "ConfigMap",
    "Service",
    "PersistentVolumeClaim",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "Deployment",
)
CHILDREN = tuple(w for kind in CHILD_KINDS for w in WATCHED if w.kind == kind)
"""The children the operator applies and the cache holds: not the base's Secret (the
operator may not list Secrets; each base reads its own by name at a full resync)."""
CHILD_INDEX = {w.kind: w.index for w in CHILDREN}
"""The index that holds each kind of child."""


class Cache:
    """Reads from kopf's indices (bound once the first handler call brings them)."""

    def __init__(self) -> None:
        self._indices: Mapping[str, Any] = {}

    @property
    def bound(self) -> bool:
        return bool(self._indices)

    def bind(self, kwargs: Mapping[str, Any]) -> None:
        """Keep the live indices that kopf passes to every handler."""
        self._indices = {w.index: kwargs[w.index] for w in WATCHED if w.index in kwargs}

    def _all(self, index: str, key: Any) -> Iterable[dict[str, Any]]:
        store = self._indices[index].get(key)
        return list(store) if store is not None else []

    def _one(self, index: str, namespace: str, name: str) -> dict[str, Any] | None:
        return next(iter(self._all(index, (namespace, name))), None)

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("metis_claims", namespace, name)

    def service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("metis_services", namespace, name)

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("metis_configmaps", namespace, name)

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("metis_deployments", namespace, name)

    def child(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one(CHILD_INDEX[kind], namespace, name)

    def every(self, kind: str) -> list[dict[str, Any]]:
        """Every object of a child's kind the cache holds (a workload twice: by name and
        by namespace), the operator's and others'."""
        return [obj for store in self._indices[CHILD_INDEX[kind]].values() for obj in store]

    def pods(self, namespace: str, instance: str) -> list[dict[str, Any]]:
        return list(self._all("metis_pods", (namespace, INSTANCE, instance)))

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        return [
            *self._all("metis_deployments", ("*", namespace)),
            *self._all("metis_statefulsets", ("*", namespace)),
        ]


def index_keys(plural: str, obj: Mapping[str, Any]) -> dict[Any, dict[str, Any]]:
    """The index entries of `obj`: by (namespace, name); pods by their base instead (a
    base's pods at once: a scan of the namespace's was a tenth of the operator's work at
    1,000 bases), and workloads also by ("*", namespace), to list a namespace's without a
    request."""
    meta = _meta(obj)
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    value = slim(plural, obj)
    keys: dict[Any, dict[str, Any]] = {(ns, name): value}
    if plural == "pods":
        keys = {(ns, INSTANCE, (meta.get("labels") or {}).get(INSTANCE_LABEL, "")): value}
    if plural in ("deployments", "statefulsets"):
        keys[("*", ns)] = value
    return keys
