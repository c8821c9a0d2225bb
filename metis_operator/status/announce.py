"""What each step of a base's loop writes and says of it, as a `StatusUpdate` for
write.py to apply: a reconciliation (`reconciled`), a pause (`paused`), the evaluation
after a change of retrieval settings (`judged`) and one a user asked for
(`evaluated`). Pure: the status composed, the lines and the Events chosen, nothing sent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import ValidationError

from metis_indexer.schema import StatusAnswer
from metis_operator import rollout
from metis_operator.api.spec import Source
from metis_operator.api.status_types import KnowledgeBaseStatus
from metis_operator.state import State, Verdict
from metis_operator.status import compose, quality
from metis_operator.status.write import StatusUpdate

_WARNING_STATES = (State.FAILED, State.WAITING)


class Reconciled(Protocol):
    """What a reconciliation decided and did (reconcile.Outcome)."""

    @property
    def verdict(self) -> Verdict: ...

    @property
    def status(self) -> KnowledgeBaseStatus: ...

    @property
    def applied(self) -> tuple[str, ...]: ...

    @property
    def rollout(self) -> str: ...

    @property
    def indexer(self) -> StatusAnswer | None: ...


def paused(body: Mapping[str, Any], previous: Mapping[str, Any]) -> StatusUpdate:
    """A paused base: its status as it was with a Paused condition, and a line when
    it was not paused yet."""
    update = StatusUpdate(body, compose.paused(previous, compose.now()))
    if not compose.is_paused(previous):
        update.say("paused: the base and its children are left as they are")
    return update


def reconciled(
    body: Mapping[str, Any], previous: Mapping[str, Any], outcome: Reconciled
) -> StatusUpdate:
    """The reconciled status, and what is said of it: a rollout started, each child
    created, updated or repaired (someone changed what the operator owns: a Repaired
    Event), and a new state (a line and an Event, a Warning for Failed and Waiting)."""
    update = StatusUpdate(body, outcome.status)
    if outcome.rollout == rollout.STARTED:
        update.say("rolling out the operator's change (an image or setting)")
    for done in outcome.applied:
        update.say(done, child=done.split(" ")[0])
        if done.endswith(" repaired"):
            update.post("Normal", "Repaired", "Apply", done)
    for said in indexed_revisions(body, previous, outcome.status, outcome.indexer):
        update.say(said)
        update.post("Normal", "Indexed", "Reconcile", said)
    state, reason = outcome.verdict.state, outcome.verdict.reason
    if state.value != previous.get("state"):
        update.say(f"{state.value}: {reason}", state=state.value)
        kind = "Warning" if state in _WARNING_STATES else "Normal"
        update.post(kind, state.value, "Reconcile", reason)
    return update


def indexed_revisions(
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
    status: KnowledgeBaseStatus,
    indexer: StatusAnswer | None,
) -> list[str]:
    """A sentence for each source whose indexed revision is new in `status`: "indexed
    GitRepository docs at main@sha1:… (2 files read, 1 dropped)", the counts the indexer's
    last pass gave."""
    before = (previous.get("observed") or {}).get("indexed_revisions") or {}
    now = (status.observed.indexed_revisions if status.observed else None) or {}
    new = {name: rev for name, rev in sorted(now.items()) if before.get(name) != rev}
    if not new:
        return []
    said = {}
    for raw in (body.get("spec") or {}).get("sources") or []:
        try:
            source = Source.model_validate(raw)
        except ValidationError:
            continue  # a refused source: said by its name alone
        said[source.name] = source.said
    counts = ""
    if indexer is not None:
        last = indexer.last_pass
        counts = f" ({last.read} files read, {last.dropped} dropped)"
    return [f"indexed {said.get(name, name)} at {rev}{counts}" for name, rev in new.items()]


def judged(
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
    before: Mapping[str, Any],
    current: Mapping[str, Any],
    tolerance: float,
) -> StatusUpdate:
    """The evaluation `current`, made after a change of retrieval settings, compared
    with the evaluation `before` it: QualityRegressed set and the Event posted."""
    generation = int(body["metadata"].get("generation", 0))
    verdict = quality.judge(before, current, tolerance, generation)
    status = compose.with_judgement(previous, current, verdict.condition, compose.now())
    update = StatusUpdate(body, status)
    update.say(verdict.message, request="quality")
    update.post(verdict.event_type, verdict.event_reason, "Evaluate", verdict.message)
    return update


def evaluated(
    body: Mapping[str, Any], previous: Mapping[str, Any], figures: Mapping[str, Any]
) -> StatusUpdate:
    """The figures of an evaluation a user asked for, and the Evaluated Event."""
    message = (
        f"recall@{figures['k']} {figures['recall_at_k']:.3f}, MRR {figures['mrr']:.3f} over "
        f"{figures['cases']} questions"
    )
    update = StatusUpdate(body, compose.with_evaluation(previous, figures))
    update.say(f"evaluated: {message}", request="evaluate")
    update.post("Normal", "Evaluated", "Evaluate", message)
    return update
