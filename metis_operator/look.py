"""One look at a base, in three parts: what its spec asks (`Asked`), what applying its
children found (`Applied`), what runs (`Running`). reconcile.py reads each part in its
own step; `Look.observation` assembles them into the state's `Observation`, the one place
that is done. Pure: no I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from metis_indexer.schema import StatusAnswer
from metis_operator.api.spec import Placement
from metis_operator.cache import Deps
from metis_operator.state import ModelCheck, Observation, PodView, ReplicaView


@dataclasses.dataclass(frozen=True)
class Asked:
    """What the spec asks, and what of it there is now: its drives and model Services as
    the cache and the model probers find them. Read before anything is applied."""

    generation: int
    """The base's metadata.generation."""
    deps: Deps
    """What the base reads besides its own children (the runner's `Dependents`)."""
    address: str = ""
    """Where its indexer answers (its Service); empty for an invalid spec."""
    with_reranker: bool = False
    invalid: str | None = None
    """Why the spec is invalid (then nothing else is read)."""
    placement: Placement = dataclasses.field(default_factory=Placement)
    missing_drives: tuple[str, ...] = ()
    unlisted_drives: tuple[str, ...] = ()
    unbound_drives: tuple[str, ...] = ()
    missing_fluxes: tuple[str, ...] = ()
    """Flux source objects named and not found, as "GitRepository docs"."""
    unlisted_fluxes: tuple[str, ...] = ()
    """Flux source objects with no artifact yet, each with what their controller says."""
    artifacts: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    """Each Flux source's artifact (url, digest, revision), by its name."""
    embedding: ModelCheck | None = None
    reranker: ModelCheck | None = None
    index_drive: str = ""
    revisions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Each data-source drive's revision, as its claim says now."""
    served: bool = False
    """The stored status holds index totals: an indexer of the base answered before."""
    unknown_fields: tuple[str, ...] = ()
    restore_from: str | None = None
    """The backup spec.restore names."""


@dataclasses.dataclass(frozen=True)
class Applied:
    """What applying the children found. Until a turn has applied them (a turn that
    applies nothing, the early outcome), the defaults or the last turn's."""

    replicas: int = 1
    """The replicas applied (the spec's, once its children are applied)."""
    index_drive_bound: bool = False
    conflicts: tuple[str, ...] = ()
    """Children of the base's names that another base owns."""
    child_notes: tuple[str, ...] = ()
    """What keeps a child from being what the spec asks, and why (`apply.Applying`)."""
    refused: str | None = None
    """A child the API server would not take, and its words."""


@dataclasses.dataclass(frozen=True)
class Running:
    """What runs: replica 0's Deployment, pods and indexer, and the other replicas."""

    pod_failure: str | None = None
    replacing: bool = False
    change: str = ""
    pod: PodView | None = None
    old: PodView | None = None
    indexer: StatusAnswer | None = None
    """The indexer's answer, if this turn asked."""
    indexer_error: str | None = None
    others: tuple[ReplicaView, ...] = ()
    shared_machines: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Look:
    """One look at a base, in its three parts."""

    asked: Asked
    applied: Applied = dataclasses.field(default_factory=Applied)
    running: Running = dataclasses.field(default_factory=Running)

    def observation(self) -> Observation:
        """The look as the state's derivation and the status read it: the one place an
        `Observation` is assembled."""
        asked, applied, running = self.asked, self.applied, self.running
        return Observation(
            invalid=asked.invalid,
            placement=asked.placement,
            missing_drives=asked.missing_drives,
            unlisted_drives=asked.unlisted_drives,
            unbound_drives=asked.unbound_drives,
            missing_fluxes=asked.missing_fluxes,
            unlisted_fluxes=asked.unlisted_fluxes,
            embedding=asked.embedding,
            reranker=asked.reranker,
            index_drive=asked.index_drive,
            generation=asked.generation,
            revisions=asked.revisions,
            served=asked.served,
            unknown_fields=asked.unknown_fields,
            restore_from=asked.restore_from,
            replicas=applied.replicas,
            index_drive_bound=applied.index_drive_bound,
            conflicts=applied.conflicts,
            child_notes=applied.child_notes,
            refused=applied.refused,
            pod_failure=running.pod_failure,
            replacing=running.replacing,
            change=running.change,
            pod=running.pod,
            old=running.old,
            indexer=running.indexer,
            indexer_error=running.indexer_error,
            others=running.others,
            shared_machines=running.shared_machines,
        )


def before_applying(asked: Asked, replicas: int, last: Look) -> Look:
    """What the base is known to be while a new generation of it is applied: what its
    spec asks now; its children and what runs as the last turn found them, for the
    `replicas` asked now and with no refusal yet."""
    applied = dataclasses.replace(last.applied, replicas=replicas, refused=None)
    return Look(asked, applied, last.running)
