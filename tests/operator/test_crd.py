"""The CRD enforces the limits of their one home (`metis_indexer.limits`, which the
operator's spec model, the indexer's configuration, the chunker and the sources read)
with the same defaults: a limit changed in one place only is a bug this catches (the
API server's behaviour itself is tested in tests/kube/test_operator_crd.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_indexer import limits
from metis_operator import spec as spec_mod

CRD = Path(__file__).resolve().parents[2] / "crds" / "knowledgebase.yaml"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def test_numeric_limits_and_defaults_match(schema: dict[str, Any]) -> None:
    chunking = schema["chunking"]["properties"]
    placement = schema["placement"]["properties"]
    assert (chunking["size"]["minimum"], chunking["size"]["maximum"]) == (
        limits.CHUNK_SIZE_MIN, limits.CHUNK_SIZE_MAX)  # fmt: skip
    assert chunking["size"]["default"] == limits.CHUNK_SIZE_DEFAULT
    assert chunking["overlap"]["default"] == limits.CHUNK_OVERLAP_DEFAULT
    assert schema["chunking"]["default"] == {
        "size": limits.CHUNK_SIZE_DEFAULT, "overlap": limits.CHUNK_OVERLAP_DEFAULT}  # fmt: skip
    assert (placement["cpu_cores"]["minimum"], placement["cpu_cores"]["maximum"]) == (
        spec_mod.CPU_MIN, spec_mod.CPU_MAX)  # fmt: skip
    assert (placement["memory_gb"]["minimum"], placement["memory_gb"]["maximum"]) == (
        spec_mod.MEMORY_MIN, spec_mod.MEMORY_MAX)  # fmt: skip
    assert schema["placement"]["default"] == {
        "cpu_cores": spec_mod.CPU_DEFAULT, "memory_gb": spec_mod.MEMORY_DEFAULT}  # fmt: skip
    assert placement["machines"]["maxItems"] == spec_mod.MACHINES_MAX
    rescan = schema["rescan_seconds"]
    assert (rescan["default"], rescan["maximum"]) == (limits.RESCAN_DEFAULT, limits.RESCAN_MAX)
    assert f"self >= {limits.RESCAN_MIN}" in rescan["x-kubernetes-validations"][0]["rule"]
    sources = schema["sources"]
    assert (sources["minItems"], sources["maxItems"]) == (
        limits.SOURCES_MIN, limits.SOURCES_MAX)  # fmt: skip
    vectors = schema["vectors"]
    assert (tuple(vectors["enum"]), vectors["default"]) == (
        limits.VECTOR_KINDS, limits.VECTORS_DEFAULT)  # fmt: skip


def test_names_and_lengths_match(schema: dict[str, Any]) -> None:
    source = schema["sources"]["items"]["properties"]
    assert source["drive"]["pattern"] == spec_mod.DRIVE_RE
    assert source["drive"]["maxLength"] == spec_mod.DRIVE_MAX
    assert source["path"]["maxLength"] == limits.PATH_MAX
    for model in ("embedding", "reranker"):
        deployment = schema[model]["properties"]["deployment"]
        assert deployment["pattern"] == spec_mod.SERVICE_RE
        assert deployment["maxLength"] == spec_mod.SERVICE_MAX
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    rules = [r["rule"] for r in version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]]
    assert f"<= {spec_mod.NAME_MAX}" in rules[1]
    assert re.search(re.escape(spec_mod.NAME_RE.pattern), rules[0])


def test_the_printer_columns_are_designs() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["State", "Documents", "Chunks", "Progress", "Last Indexed", "Age"]
    assert crd["spec"]["names"]["shortNames"] == ["kb"]


def _undocumented(node: dict[str, Any], where: str) -> list[str]:
    """The fields under `node` (a schema) without a description, by path."""
    out = []
    for name, child in node.get("properties", {}).items():
        path = f"{where}.{name}"
        if path == "kb.metadata":  # the API server's own ObjectMeta, described by it
            continue
        if not str(child.get("description", "")).strip():
            out.append(path)
        out += _undocumented(child, path)
        out += _undocumented(child.get("items", {}), f"{path}[]")
    return out


def test_every_field_is_documented_for_kubectl_explain() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]
    assert root["description"].strip()
    assert _undocumented(root, "kb") == []
    conditions = root["properties"]["status"]["properties"]["conditions"]["description"]
    for kind in ("Ready", "Reconciling", "Stalled", "Paused"):
        assert kind in conditions


def test_the_overlap_rule_names_the_default(schema: dict[str, Any]) -> None:
    (rule,) = schema["chunking"]["x-kubernetes-validations"]
    assert f"self.overlap == {limits.CHUNK_OVERLAP_DEFAULT}" in rule["messageExpression"]
    assert "its default when not set" in rule["messageExpression"]
