"""The dashboard and the alert rules name only metrics the project exports: every metric in
their PromQL is one a live indexer (`metis serve` with the local model, after a pass and a
search) or a live operator (against the test control plane) lists on `/metrics`."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from metis_dev.build import ensure_binaries
from metis_dev.plane import ControlPlane
from metis_dev.process import free_port
from tests.kube.conftest import kube  # noqa: F401  (the control plane, for the operator)
from tests.kube.operator_support import running_operator
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import indexer, wait_ready

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring" / "component"
HANDBOOK = ROOT / "examples" / "handbook"
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
    "summary": ("", "_count", "_sum", "_created"),
}
_METRIC = re.compile(r"\b(metis_[a-z0-9_]+)")


def exported(exposition: str) -> set[str]:
    """Every series name an exposition declares, samples or not yet (a labelled counter
    has no sample until it counts once, but its # TYPE line is there)."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names |= {family.name + s for s in SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def rule_queries() -> list[str]:
    rule = yaml.safe_load((MONITORING / "rules.yaml").read_text())
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


@pytest.fixture
def indexer_metrics(models: ModelServer, tmp_path: Path) -> str:
    p = indexer({"handbook": HANDBOOK}, tmp_path / "index", models.base_url).start()
    try:
        wait_ready(p)
        assert p.post("/v1/search", {"query": "vacation days"}).status_code == 200
        return p.get("/metrics").text
    finally:
        p.stop()


@pytest.fixture
def operator_metrics(kube: ControlPlane, tmp_path: Path) -> str:  # noqa: F811
    kube.kubectl("apply", "-k", str(ROOT / "manifests"))
    with running_operator(kube, tmp_path, free_port()) as op:
        return op.metrics()


def test_the_dashboard_and_the_rules_name_only_exported_metrics(
    indexer_metrics: str, operator_metrics: str
) -> None:
    names = exported(indexer_metrics) | exported(operator_metrics)
    assert "metis_search_step_seconds_bucket" in names  # the indexer's, after a search
    assert "metis_evaluation_recall_at_k" in names  # the operator's, before any evaluation
    queries = dashboard_queries()
    assert len(queries) >= 12
    used = {m for q in [*queries, *rule_queries()] for m in _METRIC.findall(q)}
    assert used - names == set(), f"not exported: {sorted(used - names)}"
    # What the issue asks the dashboard to show, each from a series of its own.
    for metric in (
        "metis_operator_knowledge_bases",
        "metis_pass_documents_done",
        "metis_searches_total",
        "metis_search_step_seconds_bucket",
        "metis_embedding_request_seconds_bucket",
        "metis_embedding_failures_total",
    ):
        assert any(metric in q for q in queries), metric


def test_a_misspelt_metric_would_be_caught() -> None:
    """The comparison above reads real names: a near miss is not among them."""
    exposition = '# TYPE metis_searches counter\nmetis_searches_total{mode="hybrid"} 1\n'
    assert exported(exposition) == {"metis_searches_total", "metis_searches_created"}
    assert not {"metis_search_total", "metis_searches"} & exported(exposition)


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    assert dashboard["uid"] == "metis" and dashboard["title"] == "Metis"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and panel["gridPos"]["w"] in (12, 24)
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    (generator,) = kustomization["configMapGenerator"]
    assert generator["files"] == ["metis.json=dashboard.json"]


def test_the_component_builds_with_kustomize() -> None:
    """kubectl's own kustomize: PodMonitors for the operator and the indexers, the rules,
    and the dashboard in a ConfigMap Grafana's sidecar picks up by its label."""
    out = subprocess.run(
        [str(ensure_binaries() / "kubectl"), "kustomize", str(MONITORING.parent)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out)}
    assert sorted(objects) == [
        ("ConfigMap", "metis-dashboard"),
        ("PodMonitor", "metis-indexers"),
        ("PodMonitor", "metis-operator"),
        ("PrometheusRule", "metis"),
    ]
    dashboard = objects[("ConfigMap", "metis-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["metis.json"])["uid"] == "metis"
    indexers = objects[("PodMonitor", "metis-indexers")]["spec"]
    assert indexers["namespaceSelector"] == {"any": True}
    assert indexers["selector"]["matchLabels"] == {"app.kubernetes.io/name": "metis-indexer"}
