"""Composing a status: conditions that keep their time unless they changed, totals
that survive a moment without the indexer, no folder names, and a merge patch that
is empty when nothing changed (so nothing is written)."""

from __future__ import annotations

import dataclasses
from typing import Any, get_args

import pytest

from metis_operator.api.status_types import StateName
from metis_operator.state import (
    Model,
    ModelCheck,
    Observation,
    PodView,
    State,
    Verdict,
    derive,
)
from metis_operator.status import compose as status_compose
from tests.operator.answers import indexer_status

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
EMBEDDING = ModelCheck("embedding model", "bge-m3", Model.AVAILABLE, "serves BAAI/bge-m3 (1024)")
STATUS = indexer_status(
    phase="ready",
    documents=40,
    notes=3,
    chunks=120,
    failed=1,
    passes=2,
    last_indexed_at=T0,
    dimensions=1024,
    vectors="int8",
    indexed_revisions={"docs": "r1"},
)
READY = Verdict(State.READY, "everything is indexed; watching its sources")
OBSERVED = Observation(
    embedding=EMBEDDING,
    index_drive_bound=True,
    pod=PodView("p", node="node-a", running=True, ready=True),
    indexer=STATUS,
)


def compose(
    previous: dict[str, Any],
    verdict: Verdict = READY,
    o: Observation = OBSERVED,
    now: str = T1,
    with_reranker: bool = False,
) -> dict[str, Any]:
    return status_compose.compose(
        previous,
        verdict,
        o,
        generation=3,
        address="http://metis-hb.ns.svc:7700",
        revisions={"docs": "r1"},
        with_reranker=with_reranker,
        now=now,
    ).dump()


def test_a_ready_base() -> None:
    s = compose({})
    assert s["state"] == "Ready" and s["observedGeneration"] == 3
    assert s["observed"] == {
        "index": {
            "phase": "ready",
            "documents": 40,
            "notes": 3,
            "chunks": 120,
            "failed": 1,
            "pass_total": 0,
            "pass_done": 0,
            "last_indexed_at": T0,
            "dimensions": 1024,
            "vectors": "int8",
        },
        "machine": "node-a",
        "address": "http://metis-hb.ns.svc:7700",
        "revisions": {"docs": "r1"},
        "indexed_revisions": {"docs": "r1"},
        "replicas": {"wanted": 1, "answering": 1},
    }
    assert s["replicas"] == "1/1"
    assert [(c["type"], c["status"], c["reason"]) for c in s["conditions"]] == [
        ("Ready", "True", "Ready"),
        ("Reconciling", "False", "Ready"),
        ("Stalled", "False", "Ready"),
        ("EmbeddingModelAvailable", "True", "Available"),
    ]
    assert all(c["lastTransitionTime"] == T1 for c in s["conditions"])
    assert all(c["observedGeneration"] == 3 for c in s["conditions"])
    assert [c["message"] for c in s["conditions"]] == [
        READY.reason,
        "",
        "",
        "serves BAAI/bge-m3 (1024)",
    ]
    assert s["reason"] == READY.reason
    assert "progress" not in s and "evaluation" not in s


def test_an_unchanged_base_composes_the_same_status_so_nothing_is_written() -> None:
    first = compose({}, now=T0)
    again = compose(first, now=T1)
    assert again == first
    assert status_compose.merge_patch(first, again) == {}


def test_a_rescan_that_read_nothing_writes_nothing() -> None:
    """The indexer's report after another pass that found nothing to read differs only in
    the pass count, which the status does not copy: it keeps `last_indexed_at`."""
    first = compose({}, now=T0)
    rescanned = STATUS.model_copy(update={"passes": STATUS.passes + 1})
    again = compose(first, o=dataclasses.replace(OBSERVED, indexer=rescanned), now=T1)
    assert status_compose.merge_patch(first, again) == {}


def test_a_stored_status_with_a_field_this_version_cannot_read_is_composed_anew() -> None:
    """A state a newer operator wrote and a hand-edited evaluation: the loop goes on, the
    new status replaces both, and what it can read (the conditions' times) is kept."""
    first = compose({}, now=T0)
    odd = {**first, "state": "Hibernating", "evaluation": {"k": "ten"}}
    again = compose(odd, now=T1)
    assert again == first
    assert status_compose.merge_patch(odd, again) == {"state": "Ready", "evaluation": None}


def test_a_condition_keeps_its_time_unless_status_or_message_change() -> None:
    first = compose({}, now=T0)
    waiting = Verdict(State.WAITING, "waiting for embedding model bge-m3: connection refused")
    later = compose(first, verdict=waiting, now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert times == {"Ready": T1, "Reconciling": T1, "Stalled": T0, "EmbeddingModelAvailable": T0}
    reworded = compose(later, verdict=Verdict(State.WAITING, "waiting for x"), now="later")
    assert (
        next(c for c in reworded["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
        == "later"
    )


@pytest.mark.parametrize(
    ("state", "ready", "reconciling", "stalled"),
    [
        (State.READY, "True", "False", "False"),
        (State.INDEXING, "False", "True", "False"),
        (State.STARTING, "False", "True", "False"),
        (State.PENDING, "False", "True", "False"),
        (State.WAITING, "False", "True", "False"),
        (State.FAILED, "False", "False", "True"),
    ],
)
def test_kstatus_conditions_follow_the_state(
    state: State, ready: str, reconciling: str, stalled: str
) -> None:
    """Reconciling and Stalled are kstatus' abnormal-true conditions: True says why."""
    s = compose({}, verdict=Verdict(state, f"why {state}"))
    got = {c["type"]: (c["status"], c["message"]) for c in s["conditions"]}
    assert got["Ready"] == (ready, f"why {state}")
    assert got["Reconciling"] == (reconciling, f"why {state}" if reconciling == "True" else "")
    assert got["Stalled"] == (stalled, f"why {state}" if stalled == "True" else "")


def test_progress_while_a_pass_reads() -> None:
    o = Observation(indexer=indexer_status(phase="indexing", pass_total=40, pass_done=12))
    s = compose({}, verdict=Verdict(State.INDEXING, "reading"), o=o)
    assert s["progress"] == "12/40"


def test_a_new_models_vectors_made_beside_show_which_answers_and_how_far() -> None:
    embedding = {"answering": "minilm", "next": "bge-m3", "done": 40, "total": 120}
    o = Observation(indexer=indexer_status(phase="indexing", embedding=embedding))
    s = compose({}, verdict=Verdict(State.INDEXING, "making"), o=o)
    assert s["observed"]["index"]["embedding"] == embedding
    assert s["progress"] == "40/120 chunks"
    switched = {"answering": "bge-m3", "next": None, "done": 0, "total": 0}
    o = Observation(indexer=indexer_status(phase="ready", embedding=switched))
    s = compose({}, o=o)
    assert s["observed"]["index"]["embedding"] == {"answering": "bge-m3"}
    assert "progress" not in s


def test_a_new_chunkings_index_built_beside_shows_which_answers_and_how_far() -> None:
    old, new = {"size": 1200, "overlap": 200}, {"size": 1600, "overlap": 200}
    chunking = {"answering": old, "next": new, "done": 12, "total": 300}
    o = Observation(indexer=indexer_status(phase="indexing", pass_total=288, chunking=chunking))
    s = compose({}, verdict=Verdict(State.INDEXING, "building"), o=o)
    assert s["observed"]["index"]["chunking"] == chunking
    assert s["progress"] == "12/300 documents", "the whole build, not the pass's part of it"
    switched = {"answering": new, "next": None, "done": 0, "total": 0}
    o = Observation(indexer=indexer_status(phase="ready", chunking=switched))
    s = compose({}, o=o)
    assert s["observed"]["index"]["chunking"] == {"answering": new}
    assert "progress" not in s


def test_totals_survive_a_moment_without_the_indexer_but_its_phase_does_not() -> None:
    before = compose({})
    s = compose(before, verdict=Verdict(State.STARTING, "a replacement"), o=Observation())
    assert s["observed"]["index"] == {
        "documents": 40,
        "notes": 3,
        "chunks": 120,
        "failed": 1,
        "last_indexed_at": T0,
        "dimensions": 1024,
        "vectors": "int8",
    }
    assert s["observed"]["indexed_revisions"] == {"docs": "r1"}
    assert "machine" not in s["observed"]


def test_the_evaluation_is_kept_only_an_evaluation_writes_it() -> None:
    evaluation = {"k": 5, "cases": 6, "recall_at_k": 0.8, "mrr": 0.7, "at": T0}
    s = compose({**compose({}), "evaluation": evaluation})
    assert s["evaluation"] == evaluation


def test_reranker_condition_only_with_a_reranker() -> None:
    rr = ModelCheck("reranker", "rr", Model.NOT_FOUND)
    o = Observation(embedding=EMBEDDING, reranker=rr)
    s = compose({}, o=o, with_reranker=True)
    cond = next(c for c in s["conditions"] if c["type"] == "RerankerAvailable")
    assert (cond["status"], cond["reason"], cond["message"], cond["observedGeneration"]) == (
        "False",
        "ServiceNotFound",
        "no Service rr in this namespace",
        3,
    )


def test_an_invalid_spec_leaves_the_models_unchecked() -> None:
    s = compose({}, verdict=Verdict(State.FAILED, "the spec is invalid"), o=Observation())
    cond = next(c for c in s["conditions"] if c["type"] == "EmbeddingModelAvailable")
    assert (cond["status"], cond["reason"], cond["message"], cond["observedGeneration"]) == (
        "False",
        "NotChecked",
        "the spec is invalid",
        3,
    )


def test_warnings_count_folders_instead_of_naming_them() -> None:
    idle = ModelCheck(
        "embedding model",
        "bge-m3",
        Model.AVAILABLE,
        warnings=("embedding model bge-m3: Deployment bge-m3 is scaled to zero",),
    )
    o = Observation(
        embedding=idle,
        reranker=ModelCheck("reranker", "rr", Model.NOT_ANSWERING, "timed out"),
        indexer=indexer_status(
            phase="ready",
            warnings=[
                "source docs: cannot list hr/salaries-2026",
                "source docs: cannot list legal/x",
                "source wiki: the drive at /drives/wiki is not a folder",
            ],
        ),
    )
    assert status_compose.warnings(o) == [
        "embedding model bge-m3: Deployment bge-m3 is scaled to zero",
        "reranker rr does not answer (timed out): results come in the fused order",
        "source wiki: the drive at /drives/wiki is not a folder",
        "source docs: 2 folder(s) cannot be listed",
    ]
    assert compose({}, o=o)["observed"]["warnings"] == status_compose.warnings(o)


def test_fields_of_a_newer_crd_are_a_warning() -> None:
    o = Observation(unknown_fields=("spec.sources[0].exclude", "spec.retention"))
    assert status_compose.warnings(o) == [
        "spec.sources[0].exclude, spec.retention: not known to this operator (a newer CRD's "
        "field): kept, and without effect until an operator that knows it runs"
    ]
    assert derive(o).state is not State.FAILED


SLOW = "embedding model bge-m3 did not answer (no answer within 10 s): results by keywords only"


def counted(answered: int, by_words_only: int, failed: int = 0) -> dict[str, Any]:
    return {
        "seconds": 60,
        "answered": answered,
        "by_words_only": by_words_only,
        "without_reranker": 0,
        "failed": failed,
        "reason": SLOW,
    }


@pytest.mark.parametrize(
    ("searches", "warned"),
    [
        pytest.param(
            counted(28, 12),
            ["12 of 40 searches in the last minute were answered by words only: " + SLOW],
            id="a-large-share-by-words",
        ),
        pytest.param(counted(35, 5), [], id="a-small-share"),
        pytest.param(counted(0, 4), [], id="too-few"),
        pytest.param(None, [], id="not-counted"),
    ],
)
def test_searches_that_fell_back_to_words_are_a_warning_and_the_ready_message(
    searches: dict[str, Any] | None, warned: list[str]
) -> None:
    ix = indexer_status(**{**STATUS.model_dump(), "searches": searches})
    o = dataclasses.replace(OBSERVED, indexer=ix)
    verdict = derive(o)
    s = compose({}, verdict=verdict, o=o)
    assert s["state"] == "Ready"
    assert s["observed"].get("warnings", []) == warned
    [ready] = [c for c in s["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "True"
    if warned:
        assert ready["message"] == f"everything is indexed; but {warned[0]}" == s["reason"]
    else:
        assert ready["message"] == "everything is indexed; watching its sources"


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({}, {}, {}),
        ({"a": 1}, {"a": 1}, {}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({"o": {"x": 1, "y": 2}}, {"o": {"x": 1, "y": 3}}, {"o": {"y": 3}}),
        ({"o": {"x": 1}}, {"o": {}}, {"o": {"x": None}}),
        ({"l": [1, 2]}, {"l": [1]}, {"l": [1]}),
        ({"a": None}, {"a": None}, {}),
        ({"o": 1}, {"o": {"x": 1}}, {"o": {"x": 1}}),
        ({"o": {"x": 1}}, {"o": 2}, {"o": 2}),
    ],
    ids=[
        "empty",
        "same",
        "changed",
        "removed",
        "nested",
        "nested-removed",
        "list-whole",
        "same-null",
        "mapping-over-scalar",
        "scalar-over-mapping",
    ],
)
def test_merge_patch(old: dict[str, Any], new: dict[str, Any], patch: dict[str, Any]) -> None:
    assert status_compose.merge_patch(old, new) == patch


def test_a_paused_base_keeps_its_status_and_says_so() -> None:
    before = compose({}, now=T0)
    paused = status_compose.paused(before, T1).dump()
    assert status_compose.is_paused(paused) and not status_compose.is_paused(before)
    cond = next(c for c in paused["conditions"] if c["type"] == "Paused")
    assert cond == {
        "type": "Paused",
        "status": "True",
        "reason": "Paused",
        "lastTransitionTime": T1,
        "message": 'annotation metis.astraeus.io/paused is "true": the operator leaves the '
        "base and its children as they are",
    }
    assert {k: v for k, v in paused.items() if k != "conditions"} == {
        k: v for k, v in before.items() if k != "conditions"
    }
    assert status_compose.paused(paused, "later").dump() == paused  # nothing more to write
    resumed = compose(paused, now=T1)
    assert not status_compose.is_paused(resumed)


def test_the_quality_condition_only_an_evaluation_sets_is_kept_as_it_was() -> None:
    regressed = {
        "type": "QualityRegressed",
        "status": "True",
        "reason": "Regressed",
        "message": "recall@5 0.80 → 0.50",
        "observedGeneration": 2,
        "lastTransitionTime": T0,
    }
    before = compose({}, now=T0)
    s = compose({**before, "conditions": [*before["conditions"], regressed]}, now=T1)
    assert [c for c in s["conditions"] if c["type"] == "QualityRegressed"] == [regressed]
    assert [c["type"] for c in s["conditions"]] == [c["type"] for c in before["conditions"]] + [
        "QualityRegressed"
    ]


def test_the_status_model_names_every_state() -> None:
    """`status.state`'s values in the CRD are the states `derive` decides."""
    assert set(get_args(StateName)) == {s.value for s in State}
