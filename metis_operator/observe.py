"""Readings of Kubernetes objects as the state derivation needs them; pure functions
over the API server's JSON, so each reading is table-tested without a cluster."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from metis_operator import children
from metis_operator.api import identity
from metis_operator.api.conditions import ConditionType
from metis_operator.state import PodView, ReplicaView

"""On a source PVC: the revision of its data source that the base must read."""
DEPLOYMENT_REVISION = "deployment.kubernetes.io/revision"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def claim_bound(claim: Mapping[str, Any] | None) -> bool:
    return claim is not None and (claim.get("status") or {}).get("phase") == "Bound"


def from_data_source(claim: Mapping[str, Any]) -> bool:
    """A drive from a data source carries the revision annotation, empty until listed."""
    return identity.REVISION in _annotations(claim)


def revision(claim: Mapping[str, Any]) -> str:
    return _annotations(claim).get(identity.REVISION, "").strip()


def artifact(source: Mapping[str, Any]) -> dict[str, str] | None:
    """A Flux source object's artifact as the indexer fetches it (url, digest, revision);
    None until it has one."""
    found = (source.get("status") or {}).get("artifact") or {}
    picked = {k: found.get(k) for k in ("url", "digest", "revision")}
    if not all(isinstance(v, str) and v for v in picked.values()):
        return None
    return {k: str(v) for k, v in picked.items()}


def flux_trouble(source: Mapping[str, Any]) -> str | None:
    """What its source-controller says keeps a Flux source object from being ready (its
    Ready condition's message while False), None otherwise."""
    for c in (source.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "False":
            return str(c.get("message") or c.get("reason") or "not ready")
    return None


def _waiting(status: Mapping[str, Any]) -> str | None:
    if status.get("phase") == "Failed":
        detail = " ".join(s for s in (status.get("reason"), status.get("message")) if s)
        return f"the pod failed: {detail}" if detail else "the pod failed"
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting:
            text = waiting.get("reason") or "waiting"
            return f"{text}: {waiting['message']}" if waiting.get("message") else text
    return None


TEMPLATE_HASH = "pod-template-hash"
"""The label a ReplicaSet gives its pods: the hash of their template."""


def _gone(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is going away (deleted, its containers stopping)."""
    return bool(_meta(pod).get("deletionTimestamp"))


def _ordered(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods not going away, newest first, then those going away, newest first. A creation
    time is to the second: of pods made in the same second (a change right after the base
    was made), one placed on a machine counts as the newer, since a pod that cannot be
    placed is never the replacement of one that was (the replacement waits for the old
    pod to be available, so an unplaced old pod stays beside it)."""
    newest = sorted(
        pods,
        key=lambda p: (_meta(p).get("creationTimestamp", ""), _placed(p)),
        reverse=True,
    )
    return sorted(newest, key=_gone)


def _placed(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def pod_view(pods: Sequence[Mapping[str, Any]], now: dt.datetime | None = None) -> PodView | None:
    """The newest pod that is not going away; else the newest going away. `now` dates
    how long ago it turned ready."""
    ordered = _ordered(pods)
    return _view(ordered[0], now) if ordered else None


def old_pod_view(
    pods: Sequence[Mapping[str, Any]], now: dt.datetime | None = None
) -> PodView | None:
    """The pod `pod_view`'s replaces, when there are two: the next one in its order (the
    old pod running beside a replacement, or going away while one starts)."""
    ordered = _ordered(pods)
    return _view(ordered[1], now) if len(ordered) > 1 else None


def _view(pod: Mapping[str, Any], now: dt.datetime | None) -> PodView:
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled") or {}
    unschedulable = None
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = scheduled.get("message") or "no machine can run it"
    ready = conditions.get(ConditionType.READY) or {}
    return PodView(
        name=_meta(pod).get("name", ""),
        node=(pod.get("spec") or {}).get("nodeName"),
        unschedulable=unschedulable,
        running=status.get("phase") == "Running",
        ready=ready.get("status") == "True",
        waiting=_waiting(status),
        terminating=_gone(pod),
        ready_seconds=_since(ready.get("lastTransitionTime"), now)
        if ready.get("status") == "True"
        else None,
        template=(_meta(pod).get("labels") or {}).get(TEMPLATE_HASH, ""),
    )


def replica_view(
    replica: int,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    now: dt.datetime | None = None,
) -> ReplicaView:
    """Replica `replica` from its Deployment and its own pods."""
    return ReplicaView(
        replica=replica,
        pod=pod_view(pods, now),
        replacing=replacing(deployment) or len([p for p in pods if not _gone(p)]) > 1,
        failure=pod_failure(deployment),
    )


def shared_machines(pods: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The machines that run pods of two replicas or more (a pod beside the one it
    replaces is one replica): losing one of them stops several at once."""
    on: dict[str, set[int]] = {}
    for p in pods:
        machine = (p.get("spec") or {}).get("nodeName")
        if machine and not _gone(p):
            on.setdefault(machine, set()).add(children.replica_of(p))
    return tuple(sorted(m for m, replicas in on.items() if len(replicas) > 1))


def node(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The machine the base's pods run on (one, for a ReadWriteOnce index drive)."""
    placed = [p for p in _ordered(pods) if (p.get("spec") or {}).get("nodeName")]
    return str(placed[0]["spec"]["nodeName"]) if placed else None


def change(deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> str:
    """What the Deployment's pod template changes in its oldest pod (the one a rollout
    replaces), as a person reads it: `indexer image x:2, drive wiki added`; "" when
    nothing it names differs (a pod made again from the same template)."""
    if deployment is None or not pods:
        return ""
    oldest = min(pods, key=lambda p: _meta(p).get("creationTimestamp", ""))
    have = oldest.get("spec") or {}
    want = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    out = []
    image = _container(want).get("image")
    if image and image != _container(have).get("image"):
        out.append(f"indexer image {image}")
    before, after = _claims(have), _claims(want)
    out += [f"drive {d} added" for d in sorted(after - before)]
    out += [f"drive {d} removed" for d in sorted(before - after)]
    if have.get("nodeSelector") != want.get("nodeSelector") or _machines(have) != _machines(want):
        out.append("placement")
    if _container(have).get("resources") != _container(want).get("resources"):
        out.append("cpu or memory")
    return ", ".join(out)


def _machines(pod: Mapping[str, Any]) -> Any:
    """Its node affinity: the machines of the placement (the pod affinity is the
    operator's own)."""
    return (pod.get("affinity") or {}).get("nodeAffinity")


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(iter(pod.get("containers") or []), {})


def _claims(pod: Mapping[str, Any]) -> set[str]:
    """The claims a pod mounts read-only: its source drives."""
    return {
        c["claimName"]
        for v in pod.get("volumes") or []
        if (c := v.get("persistentVolumeClaim")) and c.get("readOnly")
    }


def _since(stamp: str | None, now: dt.datetime | None) -> float | None:
    """Seconds from an API server timestamp to `now`; None when either is missing."""
    if not stamp or now is None:
        return None
    try:
        then = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (now - then).total_seconds())


def replacing(deployment: Mapping[str, Any] | None) -> bool:
    """A changed template (revision 2 and on) whose pod is not made yet, as the
    Deployment controller counts it. Its generation alone does not tell: the operator's
    annotations and a strategy bump it with no new template. A replacement beside the
    old pod, or a pod going away with no change (deleted, evicted), the pods show."""
    if deployment is None:
        return False
    try:
        rollout = int(_annotations(deployment).get(DEPLOYMENT_REVISION, "0"))
    except ValueError:
        rollout = 0
    status = deployment.get("status") or {}
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    return rollout > 1 and status.get("updatedReplicas", 0) < wanted


def pod_failure(deployment: Mapping[str, Any] | None) -> str | None:
    """Why the Deployment cannot create its pod (a quota, an admission policy)."""
    for c in (deployment or {}).get("status", {}).get("conditions") or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return str(c.get("message") or c.get("reason") or "ReplicaFailure")
    return None


def scaled_to_zero(
    selector: Mapping[str, str], workloads: Sequence[Mapping[str, Any]]
) -> list[str]:
    """`Deployment bge-m3` for each workload behind a Service's selector with 0 replicas."""
    if not selector:
        return []
    out = []
    for w in workloads:
        labels = ((w.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels")
        matches = all((labels or {}).get(k) == v for k, v in selector.items())
        if matches and (w.get("spec") or {}).get("replicas", 1) == 0:
            out.append(f"{w.get('kind', 'workload')} {_meta(w).get('name')}")
    return out


def service_port(svc: Mapping[str, Any]) -> int:
    """The port to call a model Service on: the one named http, else the first."""
    ports = (svc.get("spec") or {}).get("ports") or []
    named = [p for p in ports if p.get("name") == "http"]
    return int((named or ports or [{"port": 80}])[0]["port"])


UNTOLERATED = "untolerated taint"
"""The scheduler's words for a machine whose taint the pod does not tolerate; newer
schedulers do not say which taint, so the operator reads the machines (`untolerated`)."""
REPELLING = ("NoSchedule", "NoExecute")


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule: the effect (when given) and the key (when given) match, and
    the value with Equal (the default operator), anything with Exists."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(toleration.get("key")) and toleration.get("value", "") == taint.get("value", "")


def untolerated(nodes: Sequence[Mapping[str, Any]], pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The taints that keep pod spec `pod` off the machines its node selector picks, as
    `key=value:Effect`, each once."""
    wanted = pod.get("nodeSelector") or {}
    tolerations = pod.get("tolerations") or []
    out: set[str] = set()
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if not wanted.items() <= labels.items():
            continue
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") not in REPELLING:
                continue
            if not any(_tolerates(t, taint) for t in tolerations):
                value = f"={taint['value']}" if taint.get("value") else ""
                out.add(f"{taint.get('key')}{value}:{taint['effect']}")
    return tuple(sorted(out))
