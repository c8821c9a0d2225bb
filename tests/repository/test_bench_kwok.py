"""The pure parts of the kwok scale bench (bench/operator_kwok.py) and its stub indexer
(bench/stub_indexer.py): percentiles, audit-log counting, /proc and metrics parsing, the
stub's status script, and the results file's sections."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pytest

from bench import operator_kwok as bench
from bench import stub_indexer as stub
from metis_indexer.schema import StatusAnswer

USER = bench.OPERATOR_USER
T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def event(audit_id: str, at: str, verb: str = "get", user: str = USER, **ref: str) -> str:
    body = {
        "auditID": audit_id,
        "stage": "ResponseComplete",
        "verb": verb,
        "user": {"username": user},
        "requestURI": "/api/v1/namespaces/a/configmaps?labelSelector=x&resourceVersion=12",
        "requestReceivedTimestamp": at,
    }
    if ref:
        body["objectRef"] = ref
    return json.dumps(body)


def test_percentile_interpolates_between_ranks() -> None:
    assert bench.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert bench.percentile([1.0, 2.0], 50) == 1.5
    assert bench.percentile(list(map(float, range(101))), 99) == 99.0
    assert bench.percentile([5.0], 99) == 5.0
    assert math.isnan(bench.percentile([], 50))


def test_audit_counts_one_request_per_audit_id_in_the_window_of_the_user() -> None:
    lines = [
        event("1", "2026-01-01T12:00:10.5Z", "get", resource="leases"),
        event("1", "2026-01-01T12:00:10.5Z", "get", resource="leases"),  # another stage
        event(
            "2", "2026-01-01T12:00:20Z", "patch", resource="knowledgebases", subresource="status"
        ),
        event("3", "2026-01-01T12:00:30Z", "get", user="someone-else", resource="leases"),
        event("4", "2026-01-01T12:01:00Z", "get", resource="leases"),  # past the window
        event("5", "2026-01-01T12:00:40Z", "get"),  # a non-resource request
        "",
    ]
    counts = bench.audit_counts(lines, USER, T0, T0 + dt.timedelta(minutes=1))
    assert counts == {
        "get leases": 1,
        "patch knowledgebases/status": 1,
        "get /api/v1/namespaces/a/configmaps": 1,
    }


def test_audit_uris_keep_the_query_without_resource_versions() -> None:
    lines = [event("1", "2026-01-01T12:00:00Z", "watch"), event("2", "2026-01-01T12:00:00Z", "get")]
    assert bench.audit_uris(lines, USER, {"watch", "list"}) == {
        "watch /api/v1/namespaces/a/configmaps?labelSelector=x&resourceVersion=N": 1
    }


def test_proc_usage_reads_user_and_system_ticks_and_rss() -> None:
    # A process name with a space and a parenthesis: fields count from the last ")".
    stat = "42 (metis (op) x) S 1 42 42 0 -1 4194560 1 0 0 0 150 50 0 0 20 0 3 0 100 0 0"
    status = "Name:\tx\nVmRSS:\t  2048 kB\nThreads:\t3\n"
    assert bench.proc_usage(stat, status, 100) == (2.0, 2048 * 1024)


def test_metric_sum_adds_every_sample_of_one_name_only() -> None:
    text = "\n".join(
        [
            "# HELP metis_operator_knowledge_bases Bases by state.",
            'metis_operator_knowledge_bases{state="Ready"} 998.0',
            'metis_operator_knowledge_bases{state="Indexing"} 2.0',
            'metis_operator_knowledge_bases_other{state="Ready"} 5.0',
            'metis_operator_reconciliations_total{trigger="poll"} 7.0',
        ]
    )
    assert bench.metric_sum(text, "metis_operator_knowledge_bases") == 1000.0
    assert bench.metric_sum(text, "metis_operator_reconciliations_total") == 7.0
    assert bench.metric_sum(text, "absent") == 0.0


def test_condition_and_ready_now_need_the_current_generation() -> None:
    status = {
        "conditions": [
            {"type": "Ready", "status": "True", "observedGeneration": 2},
            {"type": "Reconciling", "status": "False", "observedGeneration": 2},
        ]
    }
    assert bench.condition(status, "Ready") == (True, 2)
    assert bench.condition(status, "Stalled") == (False, 0)
    assert bench.condition(None, "Ready") == (False, 0)
    view = {"generation": 3, "ready": (True, 2)}
    assert not bench.ready_now(view)
    assert bench.ready_now({**view, "generation": 2})


def test_verdict() -> None:
    assert bench.verdict(1.0, 2.0) == "met"
    assert bench.verdict(3.0, 2.0) == "**not met**"
    assert bench.verdict(math.nan, 2.0) == "not measured"


@pytest.mark.parametrize(
    ("elapsed", "phase", "indexed"), [(0.5, "loading", 1), (2.5, "indexing", 1), (5.5, "ready", 2)]
)
def test_stub_status_follows_its_script(elapsed: float, phase: str, indexed: int) -> None:
    script = stub.Script(generation=2, indexed_before=1, since=100.0, loading=2.0, indexing=3.0)
    answer = stub.status_answer("kb-1", script, 100.0 + elapsed)
    assert answer is not None
    parsed = StatusAnswer.model_validate(answer)  # the operator's own reading of it
    assert (parsed.phase, parsed.generation, parsed.indexed_generation) == (phase, 2, indexed)


def test_stub_that_was_told_to_stop_does_not_answer() -> None:
    assert stub.status_answer("kb-1", stub.Script(answer=False), 0.0) is None


def test_results_keep_one_section_per_run_shape(tmp_path: Path) -> None:
    path = tmp_path / "out.md"
    sections = iter(["first", "second", "third"])

    def fake(f: dict[str, object]) -> str:
        return f"<!-- run: bases={f['bases']} namespaces={f['namespaces']} -->\n{next(sections)}\n"

    original = bench.section
    bench.section = fake  # type: ignore[assignment]
    try:
        bench.write_results({"bases": 100, "namespaces": 1}, path)
        bench.write_results({"bases": 1000, "namespaces": 1}, path)
        bench.write_results({"bases": 100, "namespaces": 1}, path)
    finally:
        bench.section = original  # type: ignore[assignment]
    text = path.read_text()
    assert text.startswith("# Operator at scale on kwok")
    assert "first" not in text and "second" in text and "third" in text
