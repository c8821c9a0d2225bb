"""A base's status, composed fresh from a verdict and an observation, compared with
what is stored, and written only as the difference.

Conditions keep their lastTransitionTime unless their status or message changed,
so an unchanged base composes an identical status and nothing is written. The
status holds totals only: the indexer's warnings about folders it cannot list
name those folders, so they are counted here, never copied.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from metis_indexer.schema import StatusAnswer
from metis_operator import index_drive
from metis_operator.api.conditions import ConditionType
from metis_operator.api.status_types import (
    Chunking,
    Chunks,
    Condition,
    Drive,
    Embedding,
    Evaluation,
    IndexTotals,
    KnowledgeBaseStatus,
    Observed,
    Replicas,
    Restored,
)
from metis_operator.index_drive import GIB
from metis_operator.state import (
    Model,
    ModelCheck,
    Observation,
    State,
    Verdict,
    degraded_searches,
)
from metis_operator.status import quality

READY = ConditionType.READY
RECONCILING = ConditionType.RECONCILING
STALLED = ConditionType.STALLED
PAUSED = ConditionType.PAUSED
EMBEDDING_CONDITION = ConditionType.EMBEDDING_MODEL_AVAILABLE
RERANKER_CONDITION = ConditionType.RERANKER_AVAILABLE
DRIVE_CONDITION = ConditionType.DRIVE_FILLING
RESTORED_CONDITION = ConditionType.RESTORED

INDEX_TOTALS = (
    "documents",
    "notes",
    "chunks",
    "failed",
    "last_indexed_at",
    "dimensions",
    "vectors",
)
"""What survives a moment when the indexer does not answer (a replacement)."""

_UNLISTED = re.compile(r"^source (?P<drive>\S+): cannot list ")


def now() -> str:
    """The time a condition changed, as a status writes it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int) -> Condition:
    return Condition(
        type=kind,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        observed_generation=generation,
    )


def _model_condition(kind: str, check: ModelCheck | None, generation: int) -> Condition:
    if check is None:
        return _condition(kind, False, "NotChecked", "the spec is invalid", generation)
    ok = check.result is Model.AVAILABLE
    message = check.detail
    if check.result is Model.NOT_FOUND:
        message = f"no Service {check.service} in this namespace"
    return _condition(kind, ok, check.result.value, message, generation)


def conditions(
    verdict: Verdict,
    o: Observation,
    generation: int,
    with_reranker: bool,
    recorded: Restored | None = None,
) -> list[Condition]:
    """The conditions, without timestamps (`merge_conditions` adds them)."""
    state, why = verdict.state, verdict.reason
    settled = state in (State.READY, State.FAILED)
    stalled = state is State.FAILED
    cause = verdict.cause or state.value
    out = [
        _condition(READY, state is State.READY, cause, why, generation),
        _condition(RECONCILING, not settled, cause, "" if settled else why, generation),
        _condition(STALLED, stalled, cause, why if stalled else "", generation),
        _model_condition(EMBEDDING_CONDITION, o.embedding, generation),
    ]
    if with_reranker:
        out.append(_model_condition(RERANKER_CONDITION, o.reranker, generation))
    drive = o.indexer.drive if o.indexer is not None else None
    if drive is not None:
        full = index_drive.filling(drive.used_bytes, drive.size_bytes)
        reason = "AboveThreshold" if full is not None else "BelowThreshold"
        out.append(_condition(DRIVE_CONDITION, full is not None, reason, drive_note(o), generation))
    if (restore := restored(o.indexer, recorded)) is not None:
        out.append(restored_condition(restore, generation))
    return out


def restored(ix: StatusAnswer | None, previous: Restored | None) -> Restored | None:
    """The restore the indexer says it made or makes; the one recorded before while it says
    none (an indexer restarted after a restore reports none)."""
    r = ix.restore if ix is not None else None
    if r is None:
        return previous
    return Restored(
        backup=r.backup,
        phase=r.phase,
        chunks=r.chunks,
        notes=r.notes,
        reembedding=r.reembedding or None,
    )


def restored_condition(r: Restored, generation: int) -> Condition:
    """Restored: True once restored (saying what is embedded again, if anything), False
    while restoring or failing."""
    if r.phase == "Restored":
        said = f"made from backup {r.backup}: {r.chunks} chunks and {r.notes} notes"
        if r.reembedding:
            said += f"; embedded again: {r.reembedding}"
        else:
            said += ", nothing embedded again"
        return _condition(RESTORED_CONDITION, True, "Restored", said, generation)
    cause = "RestoreFailed" if r.phase == "Failed" else "Restoring"
    return _condition(RESTORED_CONDITION, False, cause, f"backup {r.backup}: {r.phase}", generation)


def restore_warning(o: Observation, recorded: Restored | None) -> str:
    """spec.restore named on a base it was not made from (set, or changed, after the base
    had an index): said, and nothing more is done."""
    ix = o.indexer
    if o.restore_from is None or ix is None or ix.restore is not None or ix.phase == "loading":
        return ""
    if recorded is not None and recorded.backup == o.restore_from:
        return ""
    made = f"was made from backup {recorded.backup}" if recorded else "was not made from a backup"
    return (
        f"spec.restore names backup {o.restore_from}, but a base is restored only when it is "
        f"created, into an empty index: this one {made}; create a new base to restore it"
    )


def _bytes(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def drive_note(o: Observation) -> str:
    """What a drive 80 % full or more says; empty below that. Its fill to the whole
    percent, and its size: a status that said the bytes in use was written again at each
    look that found them moved (a drive shared with other writers moves all the time)."""
    drive = o.indexer.drive if o.indexer is not None else None
    if drive is None or (full := index_drive.filling(drive.used_bytes, drive.size_bytes)) is None:
        return ""
    return (
        f"index drive {o.index_drive} is {full:.0%} full (of {_bytes(drive.size_bytes)}): "
        "a full drive stops indexing; give the base more "
        "placement.memory_gb (its drive grows with it where the StorageClass allows), or a "
        "larger METIS_INDEX_STORAGE for new drives"
    )


def evaluated(previous: KnowledgeBaseStatus) -> list[Condition]:
    """The condition only an evaluation sets (QualityRegressed), kept as it was."""
    return [c for c in previous.conditions or [] if c.type == quality.CONDITION]


def merge_conditions(
    previous: Sequence[Condition], new: Sequence[Condition], now: str
) -> list[Condition]:
    """`new`, each keeping the previous lastTransitionTime unless its status or
    message changed."""
    before = {c.type: c for c in previous}
    out = []
    for c in new:
        old = before.get(c.type)
        same = old is not None and (old.status, old.message) == (c.status, c.message)
        stamp = old.last_transition_time if same and old is not None else None
        out.append(c.model_copy(update={"last_transition_time": stamp or now}))
    return out


def warnings(o: Observation) -> list[str]:
    """What a user should know: models' warnings, a reranker that does not answer,
    searches of the last minute that fell back to words or failed, and the indexer's own
    warnings with folder names counted instead of named."""
    out: list[str] = []
    for m in (o.embedding, o.reranker):
        if m is not None:
            out += m.warnings
    r = o.reranker
    if r is not None and r.result is Model.NOT_ANSWERING:
        out.append(
            f"reranker {r.service} does not answer ({r.detail}): results come in the fused order"
        )
    if o.indexer is not None and (degraded := degraded_searches(o.indexer.searches)):
        out.append(degraded)
    if o.replicas > 1 and o.shared_machines:
        out.append(
            f"{o.replicas} replicas but machine(s) {', '.join(o.shared_machines)} run several "
            "of them: the cluster has too few machines the placement allows to keep each on "
            "its own, and losing one stops those it runs"
        )
    if o.unknown_fields:
        out.append(
            f"{', '.join(o.unknown_fields)}: not known to this operator (a newer CRD's field): "
            "kept, and without effect until an operator that knows it runs"
        )
    out += o.child_notes
    if note := drive_note(o):
        out.append(note)
    unlisted: dict[str, int] = {}
    for w in o.indexer.warnings if o.indexer else []:
        cannot_list = _UNLISTED.match(w)
        if cannot_list:
            unlisted[cannot_list["drive"]] = unlisted.get(cannot_list["drive"], 0) + 1
        else:
            out.append(w)
    out += [f"source {d}: {n} folder(s) cannot be listed" for d, n in sorted(unlisted.items())]
    return list(dict.fromkeys(out))


def _index(ix: StatusAnswer | None, previous: IndexTotals | None) -> IndexTotals | None:
    if ix is None:
        kept = previous.model_dump(include=set(INDEX_TOTALS), exclude_none=True) if previous else {}
        return IndexTotals(**kept) if kept else None
    return IndexTotals(
        phase=ix.phase,
        documents=ix.documents,
        notes=ix.notes,
        chunks=ix.chunks,
        failed=ix.failed,
        pass_total=ix.pass_total,
        pass_done=ix.pass_done,
        last_indexed_at=ix.last_indexed_at,
        dimensions=ix.dimensions,
        vectors=ix.vectors,
        embedding=_embedding(ix),
        chunking=_chunking(ix),
    )


def _embedding(ix: StatusAnswer) -> Embedding | None:
    e = ix.embedding
    if e is None:
        return None
    if e.next is None:
        return Embedding(answering=e.answering)
    return Embedding(answering=e.answering, next=e.next, done=e.done, total=e.total)


def _chunking(ix: StatusAnswer) -> Chunking | None:
    c = ix.chunking
    if c is None:
        return None
    answering = Chunks(size=c.answering.size, overlap=c.answering.overlap)
    if c.next is None:
        return Chunking(answering=answering)
    following = Chunks(size=c.next.size, overlap=c.next.overlap)
    return Chunking(answering=answering, next=following, done=c.done, total=c.total)


def drive(ix: StatusAnswer | None) -> Drive | None:
    """The index drive as the status shows it: its use to the whole percent."""
    if ix is None or ix.drive is None or ix.drive.size_bytes <= 0:
        return None
    d = ix.drive
    return Drive(
        size_gib=round(d.size_bytes / GIB, 1), used_percent=int(100 * d.used_bytes / d.size_bytes)
    )


def compose(
    previous: Mapping[str, Any],
    verdict: Verdict,
    o: Observation,
    *,
    generation: int,
    address: str | None,
    revisions: Mapping[str, str],
    with_reranker: bool,
    now: str,
) -> KnowledgeBaseStatus:
    """The whole status, from `previous` as stored. `evaluation` is kept from it (only an
    evaluation writes it); index totals too while the indexer does not answer."""
    before = KnowledgeBaseStatus.read(previous)
    seen = before.observed or Observed()
    ix = o.indexer
    indexed = ix.indexed_revisions if ix else seen.indexed_revisions
    restore = restored(ix, seen.restore)
    warned = warnings(o)
    if said := restore_warning(o, seen.restore):
        warned.append(said)
    observed = Observed(
        index=_index(ix, seen.index),
        machine=o.pod.node if o.pod is not None and o.pod.node else None,
        address=address or None,
        revisions=dict(sorted(revisions.items())) or None,
        indexed_revisions=dict(sorted(indexed.items())) if indexed else None,
        warnings=warned or None,
        replicas=Replicas(wanted=o.replicas, answering=o.answering),
        drive=drive(ix),
        restore=restore,
    )
    progress = None
    if ix is not None and ix.embedding is not None and ix.embedding.next is not None:
        progress = f"{ix.embedding.done}/{ix.embedding.total} chunks"
    elif ix is not None and ix.chunking is not None and ix.chunking.next is not None:
        progress = f"{ix.chunking.done}/{ix.chunking.total} documents"
    elif ix is not None and ix.phase == "indexing" and ix.pass_total:
        progress = f"{ix.pass_done}/{ix.pass_total}"
    return KnowledgeBaseStatus(
        state=verdict.state.value,
        reason=verdict.reason,
        observed_generation=generation,
        observed=observed,
        conditions=merge_conditions(
            before.conditions or [],
            conditions(verdict, o, generation, with_reranker, seen.restore) + evaluated(before),
            now,
        ),
        progress=progress,
        replicas=f"{o.answering}/{o.replicas}",
        evaluation=before.evaluation,
    )


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`; empty when equal.
    Lists are replaced whole, a key that went away is set to null."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value or key not in old:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def is_paused(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == PAUSED and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def paused(previous: Mapping[str, Any], now: str) -> KnowledgeBaseStatus:
    """The status of a paused base: as it was, with a Paused condition. The
    observedGeneration stays: a change made meanwhile is not observed."""
    before = KnowledgeBaseStatus.read(previous)
    condition = Condition(
        type=PAUSED,
        status="True",
        reason="Paused",
        message='annotation metis.astraeus.io/paused is "true": the operator leaves the '
        "base and its children as they are",
    )
    return before.model_copy(update={"conditions": _set_condition(before, condition, now)})


def with_evaluation(
    previous: Mapping[str, Any], evaluation: Mapping[str, Any]
) -> KnowledgeBaseStatus:
    """The status as it was, with the figures of an evaluation a user asked for."""
    before = KnowledgeBaseStatus.read(previous)
    return before.model_copy(update={"evaluation": Evaluation.model_validate(evaluation)})


def with_judgement(
    previous: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    condition: Mapping[str, Any],
    now: str,
) -> KnowledgeBaseStatus:
    """The status as it was, with the evaluation made after a change of retrieval
    settings and the QualityRegressed condition `quality.judge` set from it."""
    before = KnowledgeBaseStatus.read(previous)
    merged = _set_condition(before, Condition.model_validate(condition), now)
    return before.model_copy(
        update={"evaluation": Evaluation.model_validate(evaluation), "conditions": merged}
    )


def _set_condition(before: KnowledgeBaseStatus, condition: Condition, now: str) -> list[Condition]:
    """The conditions with `condition` in place of the one of its type (last, when new)."""
    kept = [c for c in before.conditions or [] if c.type != condition.type]
    return merge_conditions(before.conditions or [], [*kept, condition], now)
