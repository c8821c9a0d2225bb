"""The OpenAPI 3.1 document of a route table (routes.py): each route's body, query and path
parameters, every status it answers with the codes each error carries, and the JSON Schema
of every model it names, all made from the route's one declaration."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from metis_indexer.http.routes import Answer, Failure, Route, failures

SCHEME = "operatorToken"
"""The name of the token's security scheme."""


def document(
    routes: Sequence[Route],
    *,
    info: Mapping[str, Any],
    token: Failure | None,
    codes: Sequence[str],
    error: type[BaseModel],
) -> dict[str, Any]:
    """The document of `routes`. `token`: the answer of a route that takes the token
    without it, where the routes take one (None: they are open, and no route says 401);
    `codes`: every code the API answers; `error`: the model of every error's body, named
    `Error` in the document, its `error.code` one of `codes`."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        item = paths.setdefault(route.path, _path_item(route))
        item[route.method.lower()] = _operation(route, token)
    schemas = _schemas([*_models(routes), error])
    schemas["Error"] = schemas.pop(error.__name__)
    schemas["ErrorBody"]["properties"]["code"]["enum"] = list(codes)
    security = {"securitySchemes": {SCHEME: {"type": "http", "scheme": "bearer"}}}
    return {
        "openapi": "3.1.0",
        "info": dict(info),
        "paths": paths,
        "components": {"schemas": schemas, **(security if token else {})},
    }


def _path_item(route: Route) -> dict[str, Any]:
    """A path's item, with its path parameters (the first route of the path says them)."""
    if not route.path_parameters:
        return {}
    return {
        "parameters": [
            {"name": name, "in": "path", "required": True, "schema": dict(schema)}
            for name, schema in route.path_parameters.items()
        ]
    }


def _operation(route: Route, token: Failure | None) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": route.summary}
    if route.description:
        operation["description"] = route.description
    if route.query is not None:
        operation["parameters"] = query_parameters(route.query)
    if route.body is not None:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": _ref(route.body.__name__)}},
        }
    if route.token and token is not None:
        operation["security"] = [{SCHEME: []}]
    responses = {str(a.status): _answer(a) for a in route.answers}
    responses |= {str(f.status): _failure(f) for f in failures(route, token)}
    operation["responses"] = responses
    return operation


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(answer: Answer) -> dict[str, Any]:
    if answer.status == 204:  # No Content: no body, so no media type
        return {"description": answer.description}
    schema = _ref(answer.model.__name__) if answer.model else dict(answer.schema or {})
    return {"description": answer.description, "content": {answer.media_type: {"schema": schema}}}


def _failure(failure: Failure) -> dict[str, Any]:
    codes = {"properties": {"error": {"properties": {"code": {"enum": list(failure.codes)}}}}}
    said: dict[str, Any] = {
        "description": failure.description,
        "content": {"application/json": {"schema": {"allOf": [_ref("Error"), codes]}}},
    }
    if failure.headers:
        said["headers"] = {
            name: {"schema": {"type": "string", "const": value}}
            for name, value in failure.headers.items()
        }
    return said


def _models(routes: Iterable[Route]) -> list[type[BaseModel]]:
    """The models the routes' bodies and answers are, each once, in the order they come."""
    models = [
        model
        for route in routes
        for model in (route.body, *(a.model for a in route.answers))
        if model is not None
    ]
    return list(dict.fromkeys(models))


def _schemas(models: Iterable[type[BaseModel]]) -> dict[str, Any]:
    """Each model's JSON Schema by its name, and those of the models they hold."""
    schemas: dict[str, Any] = {}
    for model in models:
        s = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(s.pop("$defs", {}))
        schemas[model.__name__] = s
    return schemas


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A query model's fields as OpenAPI parameters; an optional one is left out,
    never sent as null."""
    parameters = []
    for name, schema in model.model_json_schema()["properties"].items():
        schema = {k: v for k, v in schema.items() if k != "title"}
        if "anyOf" in schema:
            given = [s for s in schema.pop("anyOf") if s.get("type") != "null"]
            schema = {**given[0], **{k: v for k, v in schema.items() if v is not None}}
        parameters.append({"name": name, "in": "query", "schema": schema})
    return parameters
