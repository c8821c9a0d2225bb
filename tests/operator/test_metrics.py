"""The operator's metrics as Prometheus scrapes them: per-state counts and each base's
state series, which a deleted base takes with it."""

from __future__ import annotations

from prometheus_client import generate_latest

from metis_operator.metrics import Metrics
from metis_operator.state import State


def scraped(m: Metrics) -> str:
    return generate_latest(m.registry).decode()


def test_each_base_has_one_series_per_state_set_for_its_own() -> None:
    m = Metrics.create()
    m.record(("team-a", "handbook"), State.FAILED)
    m.record(("team-b", "wiki"), State.READY)
    m.record(("team-a", "handbook"), State.WAITING)
    text = scraped(m)
    handbook = 'metis_knowledge_base_state{knowledgebase="handbook",namespace="team-a"'
    assert f'{handbook},state="Waiting"}} 1.0' in text
    assert f'{handbook},state="Failed"}} 0.0' in text
    assert text.count(handbook) == len(State)
    assert 'metis_operator_knowledge_bases{state="Ready"} 1.0' in text
    assert 'metis_operator_knowledge_bases{state="Failed"} 0.0' in text


def test_a_deleted_base_leaves_no_series() -> None:
    m = Metrics.create()
    m.record(("team-a", "handbook"), State.READY)
    m.evaluated(("team-a", "handbook"), 0.9, 0.8)
    m.forget(("team-a", "handbook"))
    text = scraped(m)
    assert 'knowledgebase="handbook"' not in text
    assert 'metis_operator_knowledge_bases{state="Ready"} 0.0' in text
