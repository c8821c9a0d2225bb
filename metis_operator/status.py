"""A base's status, composed fresh from a verdict and an observation, compared with
what is stored, and written only as the difference (ECK's habit).

Conditions keep their lastTransitionTime unless their status or message changed,
so an unchanged base composes an identical status and nothing is written. The
status holds totals only: the indexer's warnings about folders it cannot list
name those folders, so they are counted here, never copied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from metis_indexer.schema import StatusAnswer
from metis_operator import quality
from metis_operator.state import Model, ModelCheck, Observation, State, Verdict

READY = "Ready"
"""True only in state Ready: what `kubectl wait --for=condition=Ready` and GitOps
health checks read. Its reason is the state; its message, why."""
RECONCILING = "Reconciling"
"""True while the base works towards Ready (Pending, Starting, Waiting, Indexing): kstatus'
abnormal-true condition, which makes Flux and `kstatus` read the base as InProgress."""
STALLED = "Stalled"
"""True while Failed: it will not progress until someone changes something (kstatus)."""
PAUSED = "Paused"
"""True while the base carries the pause annotation: nothing of it is touched."""
EMBEDDING_CONDITION = "EmbeddingModelAvailable"
"""True when the embedding model's Service answers as an embedding model."""
RERANKER_CONDITION = "RerankerAvailable"
"""True when the reranker's Service answers as a reranker; absent without one."""

INDEX_TOTALS = ("documents", "chunks", "failed", "last_indexed_at", "dimensions", "vectors")
"""What survives a moment when the indexer does not answer (a replacement)."""

_UNLISTED = re.compile(r"^source (?P<drive>\S+): cannot list ")


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def _model_condition(kind: str, check: ModelCheck | None, generation: int) -> dict[str, Any]:
    if check is None:
        return _condition(kind, False, "NotChecked", "the spec is invalid", generation)
    ok = check.result is Model.AVAILABLE
    message = check.detail
    if check.result is Model.NOT_FOUND:
        message = f"no Service {check.service} in this namespace"
    return _condition(kind, ok, check.result.value, message, generation)


def conditions(
    verdict: Verdict, o: Observation, generation: int, with_reranker: bool
) -> list[dict[str, Any]]:
    """The conditions, without timestamps (`merge_conditions` adds them)."""
    state, why = verdict.state, verdict.reason
    settled = state in (State.READY, State.FAILED)
    out = [
        _condition(READY, state is State.READY, state.value, why, generation),
        _condition(RECONCILING, not settled, state.value, "" if settled else why, generation),
        _condition(STALLED, state is State.FAILED, state.value,
                   why if state is State.FAILED else "", generation),
        _model_condition(EMBEDDING_CONDITION, o.embedding, generation),
    ]  # fmt: skip
    if with_reranker:
        out.append(_model_condition(RERANKER_CONDITION, o.reranker, generation))
    return out


def evaluated(previous: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The condition only an evaluation sets (QualityRegressed), kept as it was."""
    return [c for c in previous.get("conditions") or [] if c.get("type") == quality.CONDITION]


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], now: str
) -> list[dict[str, Any]]:
    """`new`, each keeping the previous lastTransitionTime unless its status or
    message changed."""
    before = {c.get("type"): c for c in previous}
    out = []
    for c in new:
        old = before.get(c["type"])
        same = old is not None and (old.get("status"), old.get("message")) == (
            c["status"],
            c["message"],
        )
        stamp = old.get("lastTransitionTime") if same and old is not None else None
        out.append({**c, "lastTransitionTime": stamp or now})
    return out


def warnings(o: Observation) -> list[str]:
    """What a user should know: models' warnings, a reranker that does not answer,
    and the indexer's own warnings with folder names counted instead of named."""
    out: list[str] = []
    for m in (o.embedding, o.reranker):
        if m is not None:
            out += m.warnings
    r = o.reranker
    if r is not None and r.result is Model.NOT_ANSWERING:
        out.append(
            f"reranker {r.service} does not answer ({r.detail}): results come in the fused order"
        )
    unlisted: dict[str, int] = {}
    for w in o.indexer.warnings if o.indexer else []:
        m = _UNLISTED.match(w)
        if m:
            unlisted[m["drive"]] = unlisted.get(m["drive"], 0) + 1
        else:
            out.append(w)
    out += [f"source {d}: {n} folder(s) cannot be listed" for d, n in sorted(unlisted.items())]
    return list(dict.fromkeys(out))


def _index(ix: StatusAnswer | None, previous: Mapping[str, Any]) -> dict[str, Any]:
    if ix is None:
        return {k: previous[k] for k in INDEX_TOTALS if previous.get(k) is not None}
    index = {
        "phase": ix.phase,
        "documents": ix.documents,
        "chunks": ix.chunks,
        "failed": ix.failed,
        "pass_total": ix.pass_total,
        "pass_done": ix.pass_done,
        "last_indexed_at": ix.last_indexed_at,
        "dimensions": ix.dimensions,
        "vectors": ix.vectors,
    }
    return {k: v for k, v in index.items() if v is not None}


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
) -> dict[str, Any]:
    """The whole status. `evaluation` is kept from `previous` (only an evaluation
    writes it); index totals too while the indexer does not answer."""
    before_observed = previous.get("observed") or {}
    observed: dict[str, Any] = {}
    index = _index(o.indexer, before_observed.get("index") or {})
    if index:
        observed["index"] = index
    if o.pod is not None and o.pod.node:
        observed["machine"] = o.pod.node
    if address:
        observed["address"] = address
    if revisions:
        observed["revisions"] = dict(sorted(revisions.items()))
    indexed = o.indexer.indexed_revisions if o.indexer else before_observed.get("indexed_revisions")
    if indexed:
        observed["indexed_revisions"] = dict(sorted(indexed.items()))
    if found := warnings(o):
        observed["warnings"] = found
    status: dict[str, Any] = {
        "state": verdict.state.value,
        "reason": verdict.reason,
        "observedGeneration": generation,
        "observed": observed,
        "conditions": merge_conditions(
            previous.get("conditions") or [],
            conditions(verdict, o, generation, with_reranker) + evaluated(previous),
            now,
        ),
    }
    ix = o.indexer
    if ix is not None and ix.phase == "indexing" and ix.pass_total:
        status["progress"] = f"{ix.pass_done}/{ix.pass_total}"
    if "evaluation" in previous:
        status["evaluation"] = previous["evaluation"]
    return status


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


def paused(previous: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The status of a paused base: as it was, with a Paused condition. The
    observedGeneration stays: a change made meanwhile is not observed."""
    condition = {
        "type": PAUSED,
        "status": "True",
        "reason": "Paused",
        "message": "annotation metis.astraeus.io/paused is \"true\": the operator leaves the "
        "base and its children as they are",
    }
    before = previous.get("conditions") or []
    kept = [c for c in before if c.get("type") != PAUSED]
    return {**previous, "conditions": merge_conditions(before, [*kept, condition], now)}
