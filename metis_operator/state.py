"""A base's state, derived from what the operator observed by a pure function.

`derive` walks the state table in its priority order (Failed, Pending, Starting,
Waiting, Indexing, Ready) with early returns; the first row that holds wins and
says why in a sentence a person can act on. No I/O here: `reconcile` gathers an
`Observation`, this module decides (tests/operator/test_state.py is the table).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping, Sequence

from metis_indexer.schema import Searches, StatusAnswer
from metis_operator.api.spec import Placement


class State(enum.StrEnum):
    """A base's states, in the priority order `derive` tries them."""

    FAILED = "Failed"
    """It cannot run as asked: the spec, a drive or a model Service is wrong."""
    PENDING = "Pending"
    """Waiting for a machine, a drive's volume, or a data source's first listing."""
    STARTING = "Starting"
    """Its pod starts, its index loads, or a replacement takes over (after a change, or
    its pod was deleted or evicted)."""
    WAITING = "Waiting"
    """Its index waits for something, its embedding model most often."""
    INDEXING = "Indexing"
    """Reading documents; searches are answered from what is indexed."""
    READY = "Ready"
    """Everything indexed; watching its sources."""


class Model(enum.StrEnum):
    """What a probe of a model Service found."""

    AVAILABLE = "Available"
    NOT_FOUND = "ServiceNotFound"
    NOT_ANSWERING = "NotAnswering"
    SERVES_ELSE = "ServesSomethingElse"


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    """One model Service: `role` is "embedding model" or "reranker"."""

    role: str
    service: str
    result: Model
    detail: str = ""
    """Why it is not available, or what it serves when it is."""
    warnings: tuple[str, ...] = ()
    """What a user should know even when it answers (scaled to zero)."""


@dataclasses.dataclass(frozen=True)
class PodView:
    """One indexer pod of the base, as far as state goes."""

    name: str
    node: str | None = None
    unschedulable: str | None = None
    """The scheduler's message when it cannot place the pod."""
    taints: tuple[str, ...] = ()
    """The taints of the machines it may run on that it does not tolerate, when the
    scheduler says of one and the operator may read the machines."""
    running: bool = False
    ready: bool = False
    waiting: str | None = None
    """Why a container waits (`ImagePullBackOff: ...`), when it does."""
    terminating: bool = False
    ready_seconds: float | None = None
    """How long ago the pod turned ready (its Ready condition's transition), if known."""
    template: str = ""
    """Its pod template's hash (the ReplicaSet's pod-template-hash label): two pods of two
    templates are a change rolling out, two of one a pod deleted and made again."""

    @property
    def answers(self) -> bool:
        """Whether the Service sends it searches: ready and not going away."""
        return self.ready and not self.terminating


@dataclasses.dataclass(frozen=True)
class ReplicaView:
    """A replica past the first, as far as state goes: it answers once its pod is ready
    (an indexer with peers is ready only from a complete index) and its Deployment's
    change has rolled out."""

    replica: int
    pod: PodView | None = None
    replacing: bool = False
    failure: str | None = None
    """Why its Deployment cannot create its pod."""

    @property
    def answers(self) -> bool:
        return self.pod is not None and self.pod.answers


ROUTING_GRACE_SECONDS = 30.0
"""How long after a pod turns ready an indexer the operator cannot reach through its
Service still counts as starting: the kubelet reports the pod ready before kube-proxy
routes the Service to it (a second or two on a small cluster, more on a busy one)."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """Everything `derive` looks at; defaults describe a base that has just appeared."""

    invalid: str | None = None
    placement: Placement = dataclasses.field(default_factory=Placement)
    missing_drives: tuple[str, ...] = ()
    unlisted_drives: tuple[str, ...] = ()
    missing_fluxes: tuple[str, ...] = ()
    """Flux source objects named and not found, as "GitRepository docs"."""
    unlisted_fluxes: tuple[str, ...] = ()
    """Flux source objects with no artifact yet, each with what their controller says."""
    """Drives from a data source (revision annotation present) with no revision yet."""
    unbound_drives: tuple[str, ...] = ()
    embedding: ModelCheck | None = None
    reranker: ModelCheck | None = None
    index_drive: str = ""
    index_drive_bound: bool = False
    pod_failure: str | None = None
    """Why the Deployment cannot create its pod (its ReplicaFailure condition)."""
    replacing: bool = False
    """A changed pod template is rolling out (not every pod is of it yet)."""
    change: str = ""
    """What the rollout changes in the pod, as far as it shows (`indexer image x:2`)."""
    pod: PodView | None = None
    """The newest pod that is not going away, else the newest going away."""
    old: PodView | None = None
    """The pod `pod` replaces, when there are two: running beside it or going away."""
    indexer: StatusAnswer | None = None
    """The indexer's `GET /v1/status`, as its own model."""
    indexer_error: str | None = None
    """Why `GET /v1/status` did not answer, when the pod runs."""
    generation: int = 0
    """The base's metadata.generation: Ready only once the indexer has indexed it."""
    revisions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Each data-source drive's revision, as its claim says now: Ready only once the
    indexer has indexed it (a kubelet delivers the new configuration up to a minute or
    two after the operator writes it)."""
    served: bool = False
    """An indexer of this base has answered before (its status holds index totals): only
    then is a second pod, or one going away, a replacement taking over, rather than a
    first pod that never ran being replaced before it started."""
    replicas: int = 1
    """The replicas the spec asks for."""
    others: tuple[ReplicaView, ...] = ()
    """Replicas 1 and on (replica 0 is `pod`, `old` and `indexer`)."""
    shared_machines: tuple[str, ...] = ()
    """Machines that run two replicas or more (`observe.shared_machines`)."""
    conflicts: tuple[str, ...] = ()
    """Children of this base's names that another base owns."""
    refused: str | None = None
    """A child the API server would not take (a quota, a full Service range, a webhook),
    and its words: nothing after it was applied this turn."""
    child_notes: tuple[str, ...] = ()
    """What keeps a child from being what the spec asks, and why (`apply.Applying`)."""
    unknown_fields: tuple[str, ...] = ()
    """Spec fields this operator does not know (a newer CRD's): kept, and without effect."""
    restore_from: str | None = None
    """The backup spec.restore names, if it names one."""

    @property
    def answering(self) -> int:
        """The replicas whose indexer answers searches."""
        first = self.pod is not None and self.pod.answers
        return int(first) + sum(r.answers for r in self.others)


@dataclasses.dataclass(frozen=True)
class Verdict:
    state: State
    reason: str
    cause: str = ""
    """The conditions' reason where it is not the state's name (`Restoring`)."""


RESTORING = "Restoring"
RESTORE_FAILED = "RestoreFailed"


def _restore(o: Observation) -> Verdict | None:
    """A restore from a backup, as the indexer says it (it restores an empty index before
    its first pass, and tries a failed one again): Pending while it reads, Failed with the
    indexer's reason when it cannot."""
    r = o.indexer.restore if o.indexer is not None else None
    if r is None:
        return None
    if r.phase == "Failed":
        why = f"restoring backup {r.backup} failed: {r.error or 'the indexer gave no reason'}"
        return Verdict(State.FAILED, f"{why} (it is tried again)", RESTORE_FAILED)
    if r.phase == "Restoring":
        read = f"{r.chunks} chunks and {r.notes} notes read so far" if r.chunks else ""
        return Verdict(
            State.PENDING,
            _join(f"restoring backup {r.backup} from its object store", read),
            RESTORING,
        )
    return None


def _failures(o: Observation) -> list[str]:
    out = []
    if o.invalid:
        out.append(f"the spec is invalid: {o.invalid}")
    out += [
        f"drive {d} does not exist (no PersistentVolumeClaim {d} in this namespace)"
        for d in o.missing_drives
    ]
    out += [
        f"{f} does not exist (no {f.replace(' ', ' named ', 1)} in this namespace; "
        "is Flux's source-controller installed?)"
        for f in o.missing_fluxes
    ]
    out += o.conflicts
    for m in (o.embedding, o.reranker):
        if m is None:
            continue
        if m.result is Model.NOT_FOUND:
            out.append(
                f"{m.role} {m.service} does not exist (no Service {m.service} in this namespace)"
            )
        elif m.result is Model.SERVES_ELSE:
            out.append(f"{m.role} Service {m.service} {m.detail}")
    return out


def _placement(p: Placement) -> str:
    parts = []
    if p.labels:
        parts.append("labels " + ", ".join(f"{k}={v}" for k, v in sorted(p.labels.items())))
    if p.machines:
        parts.append("machines " + ", ".join(p.machines))
    return " and ".join(parts) or "(none set)"


TAINT = re.compile(r"untolerated taint\(?s?\)?[: ]*\{([^}]*)\}")
"""The scheduler's words for a taint no toleration matches: `had untolerated taint
{dedicated: search}` (the taint's key and value)."""


def unschedulable(message: str, placement: Placement, taints: Sequence[str] = ()) -> str:
    """The scheduler's message as what to do about it, followed by the message itself;
    `taints`: those the machines have that the pod does not tolerate, when known."""
    said = message.split(" preemption:")[0].strip()
    why = []
    if "didn't match pod affinity" in said:  # a replacement of a ReadWriteOnce drive's pod
        why.append(
            "it waits for the machine of the pod it replaces, where its index drive is mounted"
        )
    if "didn't match Pod's node" in said or "didn't match the requested node" in said:
        why.append(f"no machine matches placement {_placement(placement)}")
    if "Insufficient memory" in said:
        why.append(f"no machine has {placement.memory_gb} GiB of memory free (placement.memory_gb)")
    if "Insufficient cpu" in said:
        why.append(f"no machine has {placement.cpu_cores} CPU cores free (placement.cpu_cores)")
    if "ReadWriteOncePod" in said:
        why.append("its index drive is still mounted by the pod it replaces")
    elif "PersistentVolumeClaim" in said:
        why.append("its drives are not bound to volumes yet")
    named = taints or sorted({t.strip().removesuffix(":") for t in TAINT.findall(said)})
    if named or "untolerated taint" in said:
        which = f" ({', '.join(named)})" if named else ""
        why.append(
            f"machines have taints it does not tolerate{which}: add them to "
            "placement.tolerations, or place it elsewhere"
        )
    if "no nodes available" in said:
        why.append("the cluster has no machine to run it")
    head = "; ".join(why) or "no machine can run it"
    return f"{head} (scheduler: {said})" if said else head


OLD_ANSWERS = "searches are answered by the old pod meanwhile"
NOT_CREATED = "a new one is not created yet"
STANDBY = (
    "a replacement has loaded the index and answers searches; it takes over when the old pod stops"
)


READING = "reading documents; searches are answered from what is indexed so far"


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _replacement(o: Observation) -> Verdict | None:
    """While the pod of a base that served is being replaced, until the new pod answers
    on its own: what replaces what, where the new pod stands, and whether a pod answers
    searches meanwhile (said only where one does). None: nothing is being replaced, or
    the new pod is ready beside none and the indexer's phase speaks."""
    pod, old = o.pod, o.old
    if not o.served or (pod is None and not o.replacing):
        return None
    after = f" after a change ({o.change})" if o.change else " after a change"
    if pod is None:
        return Verdict(
            State.STARTING, f"its old pod has stopped{after}; the new one is not created yet"
        )
    if pod.terminating:  # no pod beside it
        if o.replacing:
            why = f"its pod {pod.name} stops{after}; the new one starts once it has stopped"
        else:
            why = f"its pod {pod.name} is going away (deleted or evicted); {NOT_CREATED}"
        return Verdict(State.STARTING, why)
    placed = pod.unschedulable is None and pod.node is not None
    if old is None:  # one pod, of the old template or the new: whichever it is answers
        if not o.replacing or not placed:
            return None
        said = f"a change is rolling out ({o.change})" if o.change else "a change is rolling out"
        return Verdict(
            State.STARTING, _join(said, "searches are answered meanwhile" if pod.ready else "")
        )
    if pod.ready:
        return None if old.terminating else Verdict(State.STARTING, STANDBY)
    waits = "waits for a machine"
    if pod.unschedulable is not None:
        waits += ": " + unschedulable(pod.unschedulable, o.placement, pod.taints)
    rollout = o.replacing or old.template != pod.template
    if old.terminating and not rollout:
        head = f"its pod {old.name} is going away (deleted or evicted); a new one"
        if not placed:
            return Verdict(State.PENDING, f"{head} {waits}")
        if pod.waiting:
            return Verdict(State.STARTING, f"{head} waits on machine {pod.node}: {pod.waiting}")
        return Verdict(State.STARTING, f"{head} starts on machine {pod.node}")
    change = after if rollout else ""
    answers = OLD_ANSWERS if old.ready else ""
    meanwhile = "the old one is going away" if old.terminating else answers
    if not placed:
        return Verdict(State.PENDING, _join(f"a replacement pod{change} {waits}", meanwhile))
    beside = "" if old.terminating else " beside the old one"
    waiting = (
        f"its indexer container waits on machine {pod.node}: {pod.waiting}" if pod.waiting else ""
    )
    return Verdict(
        State.STARTING, _join(f"a replacement pod is starting{beside}{change}", waiting, meanwhile)
    )


def _pending(o: Observation) -> str | None:
    if o.refused:
        return f"the API server refused {o.refused}; tried again at every turn"
    if o.unlisted_drives or o.unlisted_fluxes:
        return "; ".join(
            [
                *(
                    f"drive {d} waits for its data source's first listing"
                    for d in o.unlisted_drives
                ),
                *(f"waiting for the first listing of {f}" for f in o.unlisted_fluxes),
            ]
        )
    if o.unbound_drives:
        return "; ".join(f"drive {d} is not bound to a volume yet" for d in o.unbound_drives)
    if not o.index_drive_bound:
        return f"its index drive {o.index_drive} is not bound to a volume yet"
    if o.pod_failure:
        return f"its pod cannot be created: {o.pod_failure}"
    if (replacing := _replacement(o)) is not None:
        return replacing.reason if replacing.state is State.PENDING else None
    if o.pod is None or o.pod.terminating:
        return "its pod is not created yet"
    if o.pod.unschedulable is not None:
        return unschedulable(o.pod.unschedulable, o.placement, o.pod.taints)
    if o.pod.node is None:
        return "its pod waits for a machine"
    return None


def _starting(o: Observation) -> str | None:
    if (replacing := _replacement(o)) is not None:
        return replacing.reason
    pod = o.pod
    assert pod is not None  # _pending returned for a missing pod
    if not pod.running:
        if pod.waiting:
            return f"its indexer container waits on machine {pod.node}: {pod.waiting}"
        return f"its indexer is starting on machine {pod.node}"
    if o.indexer is None:
        if not pod.ready:
            return f"its indexer does not answer yet: {o.indexer_error}"
        if pod.ready_seconds is not None and pod.ready_seconds < ROUTING_GRACE_SECONDS:
            return f"its indexer is ready; its Service does not reach it yet: {o.indexer_error}"
        return None
    if o.indexer.phase == "loading":
        return "loading its index"
    if o.indexer.phase == "standby":
        return STANDBY
    runs = o.indexer.generation
    if o.generation and runs != o.generation:
        old = f"generation {runs}" if runs is not None else "a configuration of no generation"
        return f"applying generation {o.generation}: the indexer still runs {old}"
    if stale := _behind(o.revisions, o.indexer.revisions):
        return "; ".join(
            f"drive {d} has revision {new}: its indexer still reads {old}" for d, new, old in stale
        )
    return None


def _behind(wanted: Mapping[str, str], has: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(drive, wanted revision, the one it has) for each drive whose revision differs."""
    return [
        (d, rev, f"revision {has[d]}" if d in has else "no revision")
        for d, rev in sorted(wanted.items())
        if has.get(d) != rev
    ]


def _waiting(o: Observation) -> str | None:
    e = o.embedding
    if e is not None and e.result is Model.NOT_ANSWERING:
        return f"waiting for embedding model {e.service}: {e.detail}"
    if o.indexer is None:
        return f"the operator cannot reach its indexer: {o.indexer_error}"
    if o.indexer.phase == "waiting":
        return o.indexer.reason or "its index waits"
    return None


SEARCHES_ENOUGH = 5
"""Searches of the last minute from which their outcomes say something of the base:
below it, one question that met a model's hiccup would be half of a quiet base's."""
SEARCHES_DEGRADED_SHARE = 0.2
"""The share of those searches answered by words only or failed from which the status
no longer says searches are answered: a model too slow for questions (most often while
a pass keeps it busy) shows as a share of searches, not as a state."""


def degraded_searches(s: Searches | None) -> str:
    """What the last minute's searches say against "searches are answered" (by words
    only or failed: a search without its reranker is still answered by meaning); empty
    when too few were made, too few fell back, or the indexer does not count them."""
    if s is None:
        return ""
    total = s.answered + s.by_words_only + s.without_reranker + s.failed
    fell = s.by_words_only + s.failed
    if total < SEARCHES_ENOUGH or not fell or fell < SEARCHES_DEGRADED_SHARE * total:
        return ""
    if s.by_words_only and s.failed:
        how = f"were answered by words only ({s.by_words_only}) or failed ({s.failed})"
    else:
        how = "were answered by words only" if s.by_words_only else "failed"
    minute = "the last minute" if s.seconds == 60 else f"the last {s.seconds} s"
    said = f"{fell} of {total} searches in {minute} {how}"
    return f"{said}: {s.reason}" if s.reason else said


def _but(reason: str, degraded: str) -> str:
    return f"{reason}; but {degraded}" if degraded else reason


def _replica(r: ReplicaView, placement: Placement) -> str:
    """Where a replica that does not answer yet stands."""
    name = f"replica {r.replica}"
    if r.failure:
        return f"{name}: its pod cannot be created: {r.failure}"
    pod = r.pod
    if pod is None or (pod.terminating and not r.replacing):
        return f"{name}: its pod is not created yet"
    if pod.unschedulable is not None:
        return f"{name} waits for a machine: {unschedulable(pod.unschedulable, placement)}"
    if pod.node is None:
        return f"{name} waits for a machine"
    if pod.waiting:
        return f"{name}: its indexer container waits on machine {pod.node}: {pod.waiting}"
    if not pod.running:
        return f"{name} is starting on machine {pod.node}"
    if not pod.ready:
        return f"{name} builds its index on machine {pod.node} (vectors from its peers first)"
    return f"{name}: a change is rolling out"


def _replicas_behind(o: Observation) -> str | None:
    """Why not every replica answers from a current index, when one does not."""
    behind = [r for r in o.others if not r.answers or r.replacing]
    if not behind:
        return None
    said = "; ".join(_replica(r, o.placement) for r in behind)
    return f"{said}; {o.answering} of {o.replicas} replicas answer searches"


def derive(o: Observation) -> Verdict:
    """The state and its reason; the table's rows in order, the first that holds wins."""
    if failures := _failures(o):
        return Verdict(State.FAILED, "; ".join(failures))
    if reason := _pending(o):
        return Verdict(State.PENDING, reason)
    if (restoring := _restore(o)) is not None:
        return restoring
    if reason := _starting(o):
        return Verdict(State.STARTING, reason)
    if reason := _waiting(o):
        return Verdict(State.WAITING, reason)
    ix = o.indexer
    assert ix is not None  # _waiting returned for a missing status
    degraded = degraded_searches(ix.searches)
    if (e := ix.embedding) is not None and e.next is not None:
        return Verdict(
            State.INDEXING,
            _but(
                f"making the vectors of embedding model {e.next} beside those of "
                f"{e.answering}, which answer searches meanwhile ({e.done} of {e.total} chunks)",
                degraded,
            ),
        )
    if (c := ix.chunking) is not None and c.next is not None:
        return Verdict(
            State.INDEXING,
            _but(
                f"building the index of chunks of {c.next.size} characters (overlap "
                f"{c.next.overlap}) beside the one of chunks of {c.answering.size} (overlap "
                f"{c.answering.overlap}), which answers searches meanwhile ({c.done} of "
                f"{c.total} documents)",
                degraded,
            ),
        )
    reading = _but("reading documents", degraded) if degraded else READING
    if o.generation and ix.indexed_generation != o.generation:
        return Verdict(State.INDEXING, f"indexing for generation {o.generation}: {reading}")
    if stale := _behind(o.revisions, ix.indexed_revisions):
        said = ", ".join(f"revision {new} of drive {d}" for d, new, _ in stale)
        return Verdict(State.INDEXING, f"indexing {said}: {reading}")
    # A rescan after a finished pass scans without reading anything: still Ready.
    if ix.phase == "indexing" or (ix.phase == "scanning" and not ix.passes):
        return Verdict(State.INDEXING, reading)
    if lagging := _replicas_behind(o):
        return Verdict(State.STARTING, lagging)
    if degraded:
        return Verdict(State.READY, _but("everything is indexed", degraded))
    return Verdict(State.READY, "everything is indexed; watching its sources")
