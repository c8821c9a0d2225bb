"""The children of a base, built as plain manifests by pure functions:
ConfigMap, PersistentVolumeClaim, Deployment and Service, and the edge that lets only
the workspace in (a NetworkPolicy, and a Secret holding the token of the routes
that cost model time), all named `metis-<name>`, owned by the base (the garbage
collector deletes them with it) and labelled with the `app.kubernetes.io/*` labels.
Each replica past the first has a Deployment and an index drive of its own,
`metis-<name>-replica-<i>`; with two or more a PodDisruptionBudget lets one be down.

`needs_apply` decides whether a child as it is in the cluster must be applied
again: the manifest's hash (an annotation) tells when the operator's wish
changed, and a subset comparison tells when someone changed a field it owns.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from metis_indexer.config import IndexerConfig
from metis_operator.api import identity
from metis_operator.api.spec import (
    DRIVES_ROOT,
    INDEX_DIR,
    OWN_LABELS,
    STORE_SECRET_KEYS,
    KnowledgeBaseSpec,
    Placement,
    Pod,
    stores,
)
from metis_operator.settings import Settings

APP = "metis-indexer"
MANAGER = "metis-operator"
CONFIG_DIR = "/etc/metis"
CONFIG_FILE = "config.json"
RUN_AS = 10001
"""The indexer image's non-root user and group (indexer_image/Dockerfile)."""
TOKEN_KEY = "token"
TOKEN_ENV = "METIS_API_TOKEN"
"""The variable the indexer reads its API token from: the token `POST /v1/reindex`
and `POST /v1/evaluate` ask for (only the operator starts costly work)."""
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""The label the API server puts on every namespace, with its name."""
HOSTNAME = "kubernetes.io/hostname"
"""The label every node carries with its name: the topology of one machine."""
REPLICA_LABEL = "metis.astraeus.io/replica"
"""On the pods of replica 1 and on: which replica they are. Replica 0's pods carry
none: they are those of a base made before replicas, whose Deployment's selector (the
base's, immutable) picks every replica's pods; a label on its template would replace
its pod for nothing."""
CLOSE_SECONDS = 25
"""What a stopping indexer may take, past its drain, to end its passes and close the
index."""
GRACE_SECONDS = math.ceil(IndexerConfig.model_fields["drain_seconds"].default) + CLOSE_SECONDS
"""The pod's termination grace period: the indexer's drain (it answers searches that
long after SIGTERM, its writing handed over) and its closing, so the kubelet never
kills it mid-drain."""


@dataclasses.dataclass(frozen=True)
class Owner:
    """The base the children belong to."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Owner:
        meta = body["metadata"]
        return cls(meta["name"], meta["namespace"], meta["uid"])

    @property
    def child(self) -> str:
        return child_name(self.name)

    def replica(self, i: int) -> str:
        """The name of replica `i`'s Deployment and index drive."""
        return replica_name(self.name, i)


def child_name(name: str) -> str:
    return f"metis-{name}"


def replica_name(name: str, i: int) -> str:
    return child_name(name) if i == 0 else f"{child_name(name)}-replica-{i}"


def replica_of(pod: Mapping[str, Any]) -> int:
    """Which replica a pod of the base is (0 where it carries no replica label)."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(REPLICA_LABEL, "0")
    return int(value) if value.isdigit() else -1


def by_replica(pods: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    """A base's pods by the replica they are (`replica_of`)."""
    out: dict[int, list[Mapping[str, Any]]] = {}
    for p in pods:
        out.setdefault(replica_of(p), []).append(p)
    return out


def selector(name: str) -> dict[str, str]:
    """The labels that pick a base's indexer pods (a Deployment's immutable selector)."""
    return dict(zip(OWN_LABELS[:2], (APP, name), strict=True))


def replica_selector(name: str, i: int) -> dict[str, Any]:
    """A label selector for the pods of replica `i` alone."""
    key = {"key": REPLICA_LABEL}
    only = [
        {**key, "operator": "DoesNotExist"}
        if i == 0
        else {**key, "operator": "In", "values": [str(i)]}
    ]
    return {"matchLabels": selector(name), "matchExpressions": only}


def others_selector(name: str, i: int) -> dict[str, Any]:
    """A label selector for the pods of every replica but `i`."""
    key = {"key": REPLICA_LABEL}
    rest = [
        {**key, "operator": "Exists"}
        if i == 0
        else {**key, "operator": "NotIn", "values": [str(i)]}
    ]
    return {"matchLabels": selector(name), "matchExpressions": rest}


def labels(name: str, component: str, replica: int = 0) -> dict[str, str]:
    out = dict(zip(OWN_LABELS, (APP, name, component, "metis", MANAGER), strict=True))
    if replica:
        out[REPLICA_LABEL] = str(replica)
    return out


def _meta(owner: Owner, component: str, replica: int = 0) -> dict[str, Any]:
    return {
        "name": owner.replica(replica),
        "namespace": owner.namespace,
        "labels": labels(owner.name, component, replica),
        "ownerReferences": [
            {
                "apiVersion": identity.API_VERSION,
                "kind": identity.KIND,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def config_map(owner: Owner, config: IndexerConfig) -> dict[str, Any]:
    """The indexer's configuration; the pod mounts it whole (not with subPath), so an
    update reaches the running indexer, which re-reads it and starts a pass."""
    text = config.model_dump_json(indent=2, exclude_none=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, "config"),
        "data": {CONFIG_FILE: text + "\n"},
    }


def storage_class(spec: KnowledgeBaseSpec, settings: Settings) -> str | None:
    """The StorageClass a new index drive of the base asks: the base's, else the
    operator's; None: the cluster's default."""
    own = spec.index_drive.storage_class if spec.index_drive else None
    return own or settings.indexer.storage_class or None


def index_claim(
    owner: Owner,
    settings: Settings,
    replica: int = 0,
    size_gib: int | None = None,
    storage_class: str | None = None,
) -> dict[str, Any]:
    """A replica's own drive (one indexer writes it at a time: the indexer locks it), of
    `size_gib` (`index_drive.size_gib`), else of the operator's least size; of
    `storage_class` (`storage_class`), else the cluster's default."""
    size = f"{size_gib}Gi" if size_gib is not None else settings.indexer.index_storage
    spec: dict[str, Any] = {
        "accessModes": [settings.indexer.index_access_mode],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(owner, "index", replica),
        "spec": spec,
    }


def volume_name(drive: str) -> str:
    """A volume name (a DNS label) for any drive name, stable when sources are reordered."""
    return "drive-" + hashlib.sha256(drive.encode()).hexdigest()[:12]


SPREAD_WEIGHT = 100
"""The weight of keeping replicas on machines of their own: the most the scheduler
takes, so that only a machine no other can stand in for puts two replicas together."""


def node_terms(placement: Placement) -> list[dict[str, Any]]:
    """The required node affinity's terms: the user's (any one matches), each with the
    machines rule added (both must hold); the machines rule alone without terms."""
    machines = (
        [{"key": HOSTNAME, "operator": "In", "values": list(placement.machines)}]
        if placement.machines
        else []
    )
    terms = [t.manifest() for t in placement.node_affinity]
    if not terms:
        return [{"matchExpressions": machines}] if machines else []
    return [{"matchExpressions": t["matchExpressions"] + machines} for t in terms]


def _affinity(
    name: str, placement: Placement, settings: Settings, replica: int, replicas: int
) -> dict[str, Any]:
    """The machines a pod may run on, and for a ReadWriteOnce index drive (mountable by
    the pods of one machine) the machine of the pod it replaces: a required affinity to
    the pods of its own replica. The scheduler lets a pod that matches its own term go
    anywhere when no other pod matches, so a first pod (or one after its machine was
    drained and the old pod is gone) goes wherever the placement allows.
    Replicas keep away from each other's machines, preferred rather than required: a
    cluster of fewer machines than replicas still runs them all, and the status warns
    of two on one machine (`observe.shared_machines`)."""
    out: dict[str, Any] = {}
    if terms := node_terms(placement):
        out["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    if settings.indexer.index_access_mode == "ReadWriteOnce":
        own = replica_selector(name, replica) if replicas > 1 or replica else None
        out["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": own or {"matchLabels": selector(name)},
                    "topologyKey": HOSTNAME,
                }
            ]
        }
    if replicas > 1:
        apart = {"labelSelector": others_selector(name, replica), "topologyKey": HOSTNAME}
        out["podAntiAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": SPREAD_WEIGHT, "podAffinityTerm": apart}
            ]
        }
    return out


def _strategy(settings: Settings, moving: bool) -> dict[str, Any]:
    """A replacement starts beside the old pod and takes over when it is ready (the old
    one answers searches meanwhile), except where two pods cannot mount the index drive:
    ReadWriteOncePod never lets a second pod mount it, and a ReadWriteOnce drive that
    must move to another machine is mountable there only once the old pod let go of it
    (`moving`): the old pod stops first (Recreate)."""
    mode = settings.indexer.index_access_mode
    if mode == "ReadWriteOncePod" or (mode == "ReadWriteOnce" and moving):
        return {"type": "Recreate"}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def must_move(placement: Placement, actual: Mapping[str, Any] | None, node: str | None) -> bool:
    """Whether a ReadWriteOnce index drive may have to move to another machine for a pod
    of `placement` to replace those of the Deployment `actual`, whose pod runs on
    `node`: the placement names machines without `node`, or labels `actual` did not ask
    (the operator reads no node's labels: they may exclude it); or `actual` is being
    recreated for such a move and has not created its new pod yet (a replacement started
    beside the old pod now would follow it to a machine the placement excludes)."""
    if actual is None:
        return False
    have = actual.get("spec") or {}
    status = actual.get("status") or {}
    if (have.get("strategy") or {}).get("type") == "Recreate" and (
        status.get("observedGeneration", 0) < (actual.get("metadata") or {}).get("generation", 0)
        or status.get("updatedReplicas", 0) < have.get("replicas", 1)
    ):
        return True
    if node is None:
        return False
    pod = (have.get("template") or {}).get("spec") or {}
    asked = pod.get("nodeSelector") or {}
    fits = placement.labels.items() <= asked.items() and (
        not placement.machines or node in placement.machines
    )
    return not fits or _may_exclude(placement, pod)


def _may_exclude(placement: Placement, pod: Mapping[str, Any]) -> bool:
    """Whether `placement` may exclude the machine a pod of template `pod` runs on, past
    its labels and machines (the operator reads no node): node affinity terms it did
    not ask, or a toleration it no longer has."""
    if placement.node_affinity:
        required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        if required.get("nodeSelectorTerms") != node_terms(placement):
            return True
    kept = [t.manifest() for t in placement.tolerations]
    return any(t not in kept for t in pod.get("tolerations") or [])


class PodInputs(NamedTuple):
    """What of a base's spec its indexer pod is made from: a change to anything else
    reaches the running indexer through its ConfigMap, with no apply of the Deployment."""

    drives: list[str]
    placement: Placement
    replicas: int
    pod: Pod | None = None
    stores: tuple[tuple[str, str], ...] = ()
    """The object stores' Secrets the pod mounts: (folder, Secret name)."""

    def digest(self) -> str:
        """Tells a user's change of the pod from the operator's (`rollout.operators_change`).
        Settings a spec leaves unset are left out, so a base made before they existed
        keeps its digest."""
        place = self.placement.model_dump(mode="json", by_alias=True)
        for later in ("tolerations", "node_affinity"):
            if not place[later]:
                del place[later]
        plain: list[Any] = [self.drives, place, self.replicas]
        if self.pod is not None:
            plain.append(self.pod.model_dump(mode="json"))
        if self.stores:
            plain.append({"stores": [list(s) for s in self.stores]})
        return _digest(plain)


def pod_inputs(spec: KnowledgeBaseSpec) -> PodInputs:
    kept = tuple(sorted(stores(spec).items()))
    return PodInputs(spec.drives, spec.placement, spec.replicas, spec.pod, kept)


def store_volume(folder: str) -> str:
    """The volume name of an object store's Secret mounted at `folder`."""
    return folder.rsplit("/", 1)[-1] + "-store"


def store_mounts(inputs: PodInputs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The object stores' Secrets (spec.backup's, spec.restore's) as the pod's volumes and
    the container's read-only mounts: the files accesskey and secretkey in each folder,
    readable by the pod's group alone (fsGroup)."""
    volumes = [
        {
            "name": store_volume(folder),
            "secret": {
                "secretName": secret,
                "defaultMode": 0o440,
                "items": [{"key": k, "path": k} for k in STORE_SECRET_KEYS],
            },
        }
        for folder, secret in inputs.stores
    ]
    mounts = [
        {"name": store_volume(folder), "mountPath": folder, "readOnly": True}
        for folder, _ in inputs.stores
    ]
    return volumes, mounts


def pull_secret_name(owner: Owner) -> str:
    return f"{owner.child}-pull"


class PullProblem(ValueError):
    """A pull secret the operator is told to copy cannot be: the message names it."""


def pull_secret(owner: Owner, sources: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The credentials of the operator's pull secrets (`METIS_INDEXER_IMAGE_PULL_SECRETS`)
    as one Secret of the base's namespace, for its indexer pods: a pod may name only
    Secrets of its own namespace, and one Secret owned by the base goes with it. Of two
    secrets naming one registry, the first named wins."""
    auths: dict[str, Any] = {}
    for secret in sources:
        name = (secret.get("metadata") or {}).get("name", "?")
        data = secret.get("data") or {}
        if ".dockerconfigjson" not in data and ".dockercfg" not in data:
            raise PullProblem(
                f"Secret {name} holds no .dockerconfigjson: make it with `kubectl create "
                "secret docker-registry`"
            )
        try:
            if ".dockerconfigjson" in data:
                found = json.loads(base64.b64decode(data[".dockerconfigjson"]))["auths"]
            else:
                found = json.loads(base64.b64decode(data[".dockercfg"]))
        except (ValueError, KeyError, TypeError) as e:
            raise PullProblem(f"Secret {name} holds no registry credentials ({e})") from None
        if not isinstance(found, dict):
            raise PullProblem(f"Secret {name} holds no registry credentials")
        for registry, entry in found.items():
            auths.setdefault(registry, entry)
    config = json.dumps({"auths": auths}, sort_keys=True).encode()
    meta = _meta(owner, "image-pull")
    meta["name"] = pull_secret_name(owner)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    }


def deployment(
    owner: Owner,
    spec: KnowledgeBaseSpec,
    settings: Settings,
    *,
    replica: int = 0,
    moving: bool = False,
) -> dict[str, Any]:
    """One indexer pod. A replacement (a new source, placement or image, a deleted or
    evicted pod) starts beside the old one, on its machine for a ReadWriteOnce drive; it
    loads the index, answers searches in standby once ready, and takes over the writing
    when the old one, told to stop, lets go of it and drains (`GRACE_SECONDS`). Where
    two pods cannot mount the drive (`moving`: `must_move`; ReadWriteOncePod) the old
    pod stops first.
    The pod template holds no configuration hash: configuration changes reach the
    running indexer through the ConfigMap mount; only new mounts or placement
    replace the pod. Replica `replica` has its own index drive; every replica reads the
    one ConfigMap."""
    ix = settings.indexer
    inputs = pod_inputs(spec)
    drives, place = inputs.drives, inputs.placement
    memory = f"{place.memory_gb}Gi"
    volumes: list[dict[str, Any]] = [
        {"name": volume_name(d), "persistentVolumeClaim": {"claimName": d, "readOnly": True}}
        for d in drives
    ]
    mounts: list[dict[str, Any]] = [
        {"name": volume_name(d), "mountPath": f"{DRIVES_ROOT}/{d}", "readOnly": True}
        for d in drives
    ]
    volumes += [
        {"name": "index", "persistentVolumeClaim": {"claimName": owner.replica(replica)}},
        {"name": "config", "configMap": {"name": owner.child}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts += [
        {"name": "index", "mountPath": INDEX_DIR},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    store_volumes, store_mounted = store_mounts(inputs)
    volumes += store_volumes
    mounts += store_mounted
    probe = {"path": "/healthz", "port": "http"}
    container = {
        "name": "indexer",
        "image": ix.image,
        "imagePullPolicy": ix.image_pull_policy,
        "command": ["metis", "serve", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        "ports": [{"name": "http", "containerPort": ix.port, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": str(place.cpu_cores), "memory": memory},
            "limits": {"memory": memory},
        },
        "env": [
            {
                "name": TOKEN_ENV,
                "valueFrom": {"secretKeyRef": {"name": owner.child, "key": TOKEN_KEY}},
            }
        ],
        "livenessProbe": {"httpGet": probe, "periodSeconds": 10, "failureThreshold": 6},
        "readinessProbe": {"httpGet": {**probe, "path": "/readyz"}, "periodSeconds": 5},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if place.labels:
        pod["nodeSelector"] = dict(sorted(place.labels.items()))
    if affinity := _affinity(owner.name, place, settings, replica, inputs.replicas):
        pod["affinity"] = affinity
    if place.tolerations:
        pod["tolerations"] = [t.manifest() for t in place.tolerations]
    if inputs.pod and inputs.pod.priority_class:
        pod["priorityClassName"] = inputs.pod.priority_class
    if ix.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": pull_secret_name(owner)}]
    picks = selector(owner.name)
    if replica:
        picks[REPLICA_LABEL] = str(replica)
    meta = _meta(owner, "indexer", replica)
    meta["annotations"] = {identity.POD_INPUTS_ANNOTATION: inputs.digest()}
    template: dict[str, Any] = {
        "labels": {
            **(inputs.pod.labels if inputs.pod else {}),
            **labels(owner.name, "indexer", replica),
        }
    }
    if inputs.pod and inputs.pod.annotations:
        template["annotations"] = dict(sorted(inputs.pod.annotations.items()))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": _strategy(settings, moving),
            "selector": {"matchLabels": picks},
            "template": {"metadata": template, "spec": pod},
        },
    }


def disruption_budget(owner: Owner) -> dict[str, Any]:
    """With two replicas or more, a drain or any eviction takes one indexer pod at a time
    (the others answer meanwhile); a replacement starting beside its old pod counts as
    the one down."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, "disruption-budget"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(owner.name)}},
    }


def service(owner: Owner, settings: Settings) -> dict[str, Any]:
    """`http://metis-<name>:7700/v1/search` for the namespace's workloads."""
    port = settings.indexer.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, "search"),
        "spec": {
            "selector": selector(owner.name),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def api_secret(owner: Owner) -> dict[str, Any]:
    """A fresh random token for the indexer's costly routes. Created once when missing,
    like the index drive, and never applied again: a new token on every
    reconciliation would lock the operator out of the indexer it runs."""
    token = secrets.token_urlsafe(32)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(owner, "api-token"),
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def network_policy(owner: Owner, settings: Settings, operator_namespace: str) -> dict[str, Any]:
    """Only the workspace reaches the indexer: every pod of the base's own namespace
    (the workspace: its runs search the base) and the operator's namespace, where
    the operator and the console run; besides, the namespaces and IP ranges the operator
    is told (`NetworkSettings`: a monitoring namespace, the API server's proxy). Nothing
    else may connect, on any port."""
    peers: list[dict[str, Any]] = [{"podSelector": {}}]
    for ns in (operator_namespace, *settings.network.allow_namespaces):
        peers.append({"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: ns}}})
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in settings.network.allow_cidrs]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(owner, "network-policy"),
        "spec": {
            "podSelector": {"matchLabels": selector(owner.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": peers,
                    "ports": [{"protocol": "TCP", "port": settings.indexer.port}],
                }
            ],
        },
    }


def _digest(plain: Any) -> str:
    """A short hash of JSON-able data, the same for the same data in any key order."""
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


def with_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest, annotated with a hash of itself (without the annotation)."""
    meta = manifest["metadata"]
    annotations = {**meta.get("annotations", {}), identity.HASH_ANNOTATION: _digest(manifest)}
    return {**manifest, "metadata": {**meta, "annotations": annotations}}


def is_subset(want: Any, have: Any) -> bool:
    """Whether every field of `want` is in `have` with the same value (lists item by
    item); fields the server added (defaults, status) do not count."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            k in have and is_subset(v, have[k]) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(is_subset(w, h) for w, h in zip(want, have, strict=True))
        )
    return bool(want == have)


def needs_apply(desired: Mapping[str, Any], actual: Mapping[str, Any] | None) -> bool:
    """Apply when the child is missing, the wish changed (hash), or a field drifted.

    `desired` carries its hash (`with_hash`). The hash catches what a subset test
    cannot: a field the operator no longer sets (a placement label removed)."""
    if actual is None:
        return True
    want_hash = desired["metadata"]["annotations"][identity.HASH_ANNOTATION]
    have_hash = (actual.get("metadata", {}).get("annotations") or {}).get(identity.HASH_ANNOTATION)
    return want_hash != have_hash or not is_subset(desired, actual)
