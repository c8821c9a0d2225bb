"""What each step of a base's loop says of the status it writes: the lines in order,
and the Events."""

from __future__ import annotations

import dataclasses

from metis_indexer.schema import LastPass, StatusAnswer
from metis_operator.api.status_types import KnowledgeBaseStatus
from metis_operator.cache import Deps
from metis_operator.reconcile import Outcome
from metis_operator.state import State, Verdict
from metis_operator.status import announce


def test_a_reconciliation_says_what_it_did_then_its_new_state() -> None:
    body = {"metadata": {"name": "handbook", "namespace": "team"}}
    outcome = Outcome(
        Verdict(State.WAITING, "waiting for bge-m3"),
        KnowledgeBaseStatus(state="Waiting", reason="waiting for bge-m3"),
        Deps("team"),
        applied=("ConfigMap metis-handbook updated", "Deployment metis-handbook repaired"),
        rollout="started",
    )
    update = announce.reconciled(body, {"state": "Ready"}, outcome)
    assert update.status is outcome.status
    assert [line.message for line in update.lines] == [
        "rolling out the operator's change (an image or setting)",
        "ConfigMap metis-handbook updated",
        "Deployment metis-handbook repaired",
        "Waiting: waiting for bge-m3",
    ]
    assert [(e.kind, e.reason) for e in update.events] == [
        ("Normal", "Repaired"),
        ("Warning", "Waiting"),
    ]
    again = announce.reconciled(
        body, {"state": "Waiting"}, dataclasses.replace(outcome, applied=())
    )
    assert again.events == []
    assert [line.message for line in again.lines] == [
        "rolling out the operator's change (an image or setting)"
    ]


def test_a_new_indexed_revision_is_said_with_its_source_and_what_the_pass_read() -> None:
    body = {
        "metadata": {"name": "handbook", "namespace": "team"},
        "spec": {
            "sources": [
                {"flux": {"kind": "GitRepository", "name": "wiki"}, "path": "a"},
                {"flux": {"kind": "GitRepository", "name": "wiki"}, "path": "b"},
                {"drive": "docs"},
            ]
        },
    }
    observed = {"indexed_revisions": {"wiki": "main@sha1:b2", "docs": "r7"}}
    status = KnowledgeBaseStatus.read({"state": "Ready", "observed": observed})
    answer = StatusAnswer.model_construct(last_pass=LastPass(read=14, unchanged=0, dropped=2))
    previous = {
        "state": "Ready",
        "observed": {"indexed_revisions": {"wiki": "main@sha1:a1", "docs": "r7"}},
    }
    assert announce.indexed_revisions(body, previous, status, answer) == [
        "indexed GitRepository wiki at main@sha1:b2 (14 files read, 2 dropped)"
    ]
    outcome = Outcome(Verdict(State.READY, "ready"), status, Deps("team"))
    update = announce.reconciled(body, previous, outcome)
    assert [(e.kind, e.reason, e.message) for e in update.events] == [
        ("Normal", "Indexed", "indexed GitRepository wiki at main@sha1:b2")  # no answer read
    ]
    assert announce.indexed_revisions(body, {"observed": observed}, status, None) == []
