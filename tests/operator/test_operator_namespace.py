"""The operator's own namespace, which each base's NetworkPolicy lets in, comes from
the downward API (POD_NAMESPACE in manifests/operator/operator.yaml)."""

from __future__ import annotations

from metis_operator.settings import load


def test_the_operator_namespace_is_its_pods() -> None:
    assert load({}).runtime.operator_namespace == "metis-system"
    assert load({"POD_NAMESPACE": "platform"}).runtime.operator_namespace == "platform"
