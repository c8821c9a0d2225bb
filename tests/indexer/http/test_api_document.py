"""The OpenAPI document states the API's bounds, statuses and answers. Schemathesis checks
that the API holds to the document; this checks the document against the bounds written
out here, so a bound dropped from both the API and the document is still caught."""

from __future__ import annotations

from typing import Any

import pytest

from metis_indexer.api import openapi_document


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return openapi_document(token=True)


def schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return doc["components"]["schemas"][name]


def codes(doc: dict[str, Any], path: str, method: str, status: str) -> set[str]:
    answer = doc["paths"][path][method]["responses"][status]["content"]["application/json"]
    return set(answer["schema"]["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"])


def test_the_request_bounds_are_the_spec_limits(doc: dict[str, Any]) -> None:
    search = schema(doc, "SearchRequest")["properties"]
    assert (search["query"]["minLength"], search["query"]["maxLength"]) == (1, 4000)
    assert search["query"]["pattern"] == r"\S", "a question of blanks only is empty"
    assert (search["top_k"]["minimum"], search["top_k"]["maximum"]) == (1, 50)
    k = schema(doc, "EvaluateRequest")["properties"]["k"]
    assert (k["type"], k["minimum"], k["maximum"]) == ("integer", 1, 50)
    assert schema(doc, "SearchRequest")["additionalProperties"] is False
    params = {p["name"]: p["schema"] for p in doc["paths"]["/v1/documents"]["get"]["parameters"]}
    assert params["page"]["minimum"] == 1 and "maximum" not in params["page"]
    assert (params["page_size"]["minimum"], params["page_size"]["maximum"]) == (1, 1000)
    assert params["state"]["enum"] == ["indexed", "failed"]


@pytest.mark.parametrize(
    ("path", "method", "statuses"),
    [
        ("/v1/search", "post", {"200", "400", "413", "415", "503"}),
        ("/v1/status", "get", {"200"}),
        ("/v1/documents", "get", {"200", "400"}),
        ("/v1/reindex", "post", {"202", "400", "401", "409", "413", "415"}),
        ("/v1/evaluate", "post", {"200", "400", "401", "409", "413", "415", "503"}),
        ("/v1/notes", "post", {"200", "201", "400", "401", "409", "413", "415", "503", "507"}),
        ("/readyz", "get", {"200", "503"}),
    ],
)
def test_every_status_a_route_answers_is_stated(
    doc: dict[str, Any], path: str, method: str, statuses: set[str]
) -> None:
    assert set(doc["paths"][path][method]["responses"]) == statuses


def test_error_statuses_name_their_codes(doc: dict[str, Any]) -> None:
    assert codes(doc, "/v1/search", "post", "400") == {
        "QUERY_EMPTY",
        "QUERY_TOO_LONG",
        "TOP_K_OUT_OF_RANGE",
        "INVALID_BODY",
        "NO_EMBEDDING_MODEL",
    }
    assert codes(doc, "/v1/evaluate", "post", "409") == {"EVALUATION_RUNNING", "STANDBY"}
    assert codes(doc, "/v1/reindex", "post", "409") == {"STANDBY"}
    # An evaluation searches: an index not loaded or unreadable answers it as a search does.
    assert codes(doc, "/v1/evaluate", "post", "503") == {
        "KNOWLEDGE_BASE_NOT_READY",
        "EMBEDDING_MODEL_UNAVAILABLE",
    }
    assert codes(doc, "/v1/reindex", "post", "401") == {"UNAUTHORIZED"}
    assert {"EVAL_EMPTY", "EVAL_FILE", "EVAL_CASE_INVALID", "EVAL_TOO_LARGE"} <= codes(
        doc, "/v1/evaluate", "post", "400"
    )
    unauthorized = doc["paths"]["/v1/evaluate"]["post"]["responses"]["401"]
    assert unauthorized["headers"]["WWW-Authenticate"]["schema"]["const"] == "Bearer"
    assert doc["paths"]["/v1/evaluate"]["post"]["security"] == [{"operatorToken": []}]
    every = set(schema(doc, "ErrorBody")["properties"]["code"]["enum"])
    assert {"NOT_FOUND", "METHOD_NOT_ALLOWED", "UNAUTHORIZED", "INTERNAL"} <= every


def test_the_answers_are_schemas_not_bare_objects(doc: dict[str, Any]) -> None:
    def answer(path: str, method: str, status: str) -> str:
        content = doc["paths"][path][method]["responses"][status]["content"]
        return content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]

    assert answer("/v1/status", "get", "200") == "StatusAnswer"
    assert answer("/v1/documents", "get", "200") == "DocumentsPage"
    assert answer("/v1/reindex", "post", "202") == "ReindexAnswer"
    status = schema(doc, "StatusAnswer")
    assert status["properties"]["generation"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert "indexed_generation" in status["required"]
    assert set(status["properties"]["phase"]["enum"]) == {
        "loading",
        "scanning",
        "indexing",
        "ready",
        "waiting",
        "standby",
    }
    document = schema(doc, "Document")["properties"]
    assert document["state"]["enum"] == ["indexed", "failed"]


def test_without_a_token_no_route_declares_one() -> None:
    doc = openapi_document(token=False)
    assert "securitySchemes" not in doc["components"]
    for path in ("/v1/reindex", "/v1/evaluate"):
        assert "security" not in doc["paths"][path]["post"]
        assert "401" not in doc["paths"][path]["post"]["responses"]
