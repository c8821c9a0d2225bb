"""What `kubectl metis` says when the API server's service proxy gives no answer of the
indexer, decided from the base and the proxy's refusal alone (no cluster): a base whose
indexer runs is never "not ready", and the message names what failed on the way (the
Service, the Endpoints the proxy routes by, the pod's address) and how to ask without
the proxy. tests/kube/test_kubectl_plugin.py meets the same refusals on a real API server.
"""

from __future__ import annotations

from typing import Any

import pytest

from metis_operator import kube
from metis_operator import kubectl_plugin as plugin

NO_ENDPOINTS_OBJECT = kube.ApiError(
    404,
    'services "metis-handbook" not found',
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": 'services "metis-handbook" not found',
        "reason": "NotFound",
        "details": {"name": "metis-handbook", "kind": "services"},
        "code": 404,
    },
)
"""What kube-apiserver answers when the Service's Endpoints object is missing: it names the
request's resource (services), so it reads the same whether the Service exists or not."""


def refused(status: int, message: str) -> kube.ApiError:
    body = {"kind": "Status", "status": "Failure", "message": message, "code": status}
    return kube.ApiError(status, message, body)


def base(state: str | None, reason: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"observed": {"address": "http://metis-handbook.team-a.svc:7700"}}
    if state is not None:
        status |= {"state": state, "reason": reason}
    return {"metadata": {"namespace": "team-a", "name": "handbook"}, "status": status}


def test_a_ready_base_whose_service_has_no_endpoints_is_not_called_not_ready() -> None:
    said = plugin.proxy_failure(base("Ready", "all indexed"), NO_ENDPOINTS_OBJECT, service=True)
    assert "not ready" not in said
    assert said.startswith(
        "the API server's proxy could not reach knowledge base handbook (it is Ready) through "
        "Service metis-handbook in namespace team-a: Service metis-handbook exists but has no "
        "Endpoints object"
    )
    assert 'the API server said: services "metis-handbook" not found' in said
    assert "kubectl get endpoints metis-handbook -n team-a" in said
    assert (
        "kubectl port-forward -n team-a svc/metis-handbook 7700, then add "
        "--url http://127.0.0.1:7700"
    ) in said


def test_a_missing_service_is_named_as_missing() -> None:
    said = plugin.proxy_failure(base("Indexing"), NO_ENDPOINTS_OBJECT, service=False)
    assert "(it is Indexing)" in said and "not ready" not in said
    assert ": Service metis-handbook does not exist; the operator creates it" in said
    assert "Endpoints" not in said


def test_a_service_the_user_may_not_read_is_not_guessed_at() -> None:
    said = plugin.proxy_failure(base("Ready"), NO_ENDPOINTS_OBJECT, service=None)
    assert "no Endpoints object of Service metis-handbook was found" in said
    assert "kubectl get service,endpoints metis-handbook -n team-a" in said


@pytest.mark.parametrize(
    "message",
    [
        'no endpoints available for service "metis-handbook"',
        "error trying to reach service: dial tcp 10.244.0.7:7700: connect: connection refused",
    ],
    ids=["no-ready-endpoint", "connection-refused"],
)
def test_an_unreachable_endpoint_names_the_pod_and_the_address(message: str) -> None:
    said = plugin.proxy_failure(base("Ready"), refused(503, message), service=None)
    assert f"in namespace team-a: {message}; check that the indexer's pod is Ready" in said
    assert "kubectl get pods -n team-a -l app.kubernetes.io/instance=handbook" in said
    assert "not ready" not in said


def test_another_refusal_of_the_proxy_keeps_its_status() -> None:
    said = plugin.proxy_failure(base("Waiting"), refused(502, "bad gateway"), service=None)
    assert "in namespace team-a: HTTP 502: bad gateway." in said


@pytest.mark.parametrize(
    ("state", "reason", "shown"),
    [
        ("Failed", "drive absent does not exist", "it is Failed (drive absent does not exist)"),
        ("Starting", None, "it is Starting;"),
        (None, None, "it is not reconciled yet;"),
    ],
    ids=["failed", "starting", "never-reconciled"],
)
def test_a_base_whose_indexer_does_not_run_is_not_ready(
    state: str | None, reason: str | None, shown: str
) -> None:
    said = plugin.proxy_failure(base(state, reason), NO_ENDPOINTS_OBJECT, service=True)
    assert said.startswith(f"knowledge base handbook is not ready: {shown}")
    assert "kubectl metis status handbook -n team-a" in said
    assert "services" not in said  # the proxy's words would name the wrong thing


def test_only_the_proxys_own_404_means_a_missing_endpoints_object() -> None:
    assert plugin.endpoints_missing(NO_ENDPOINTS_OBJECT)
    indexers = {"error": {"code": "NOTE_NOT_FOUND", "message": "no note x"}}
    assert not plugin.endpoints_missing(kube.ApiError(404, "", indexers))
    assert plugin.indexer_error("handbook", indexers) == "handbook: NOTE_NOT_FOUND: no note x"
    assert plugin.indexer_error("handbook", NO_ENDPOINTS_OBJECT.body) is None
    assert not plugin.endpoints_missing(kube.ApiError(404, "", "404 page not found"))
    assert not plugin.endpoints_missing(refused(503, "no endpoints available"))


def test_without_an_address_the_port_is_left_to_the_user() -> None:
    bare = {**base("Ready"), "status": {"state": "Ready"}}
    said = plugin.proxy_failure(bare, NO_ENDPOINTS_OBJECT, service=True)
    assert "svc/metis-handbook PORT, then add --url http://127.0.0.1:PORT" in said


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "handbook", "q", "--url", "http://127.0.0.1:7700"],
        ["documents", "--url", "http://127.0.0.1:7700", "handbook"],
        ["note", "list", "handbook", "--url", "http://127.0.0.1:7700"],
        ["note", "add", "handbook", "fact", "--url", "http://127.0.0.1:7700"],
        ["note", "rm", "handbook", "x", "--url", "http://127.0.0.1:7700"],
    ],
    ids=["search", "documents", "note-list", "note-add", "note-rm"],
)
def test_the_commands_that_ask_the_indexer_take_a_url(argv: list[str]) -> None:
    assert plugin.build_parser().parse_args(argv).url == "http://127.0.0.1:7700"


def test_by_default_they_go_through_the_proxy() -> None:
    assert plugin.build_parser().parse_args(["search", "handbook", "q"]).url is None
    with pytest.raises(SystemExit):
        plugin.build_parser().parse_args(["status", "handbook", "--url", "http://x"])
