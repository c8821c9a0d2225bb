"""Events from metis-operator with real actions, and JSON log lines naming the base."""

from __future__ import annotations

import json
import logging

from metis_operator import report

BODY = {
    "apiVersion": "metis.astraeus.io/v1",
    "kind": "KnowledgeBase",
    "metadata": {"name": "handbook", "namespace": "team", "uid": "u-1"},
}


def test_an_event_names_the_operator_and_the_action() -> None:
    e = report.event(
        BODY,
        kind="Warning",
        reason="Waiting",
        action="Reconcile",
        message="waiting for m",
        now="2026-01-01T00:00:00Z",
    )
    assert e["involvedObject"] == {
        **BODY["metadata"],
        "apiVersion": "metis.astraeus.io/v1",
        "kind": "KnowledgeBase",
    }
    assert (e["type"], e["reason"], e["action"]) == ("Warning", "Waiting", "Reconcile")
    assert e["source"] == {"component": "metis-operator"}
    assert e["reportingComponent"] == "metis-operator" and e["reportingInstance"]
    assert e["metadata"] == {"generateName": "handbook.", "namespace": "team"}


def test_a_json_line_carries_the_base() -> None:
    record = logging.LogRecord(
        "metis_operator", logging.INFO, __file__, 1, "team/handbook: %s", ("Ready",), None
    )
    record.base = "team/handbook"
    record.state = "Ready"
    line = json.loads(report.JsonFormatter().format(record))
    assert line["message"] == "team/handbook: Ready"
    assert (line["base"], line["state"], line["level"]) == ("team/handbook", "Ready", "info")
