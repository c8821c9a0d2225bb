"""Every error code and status the indexer answers, over the wire: one `metis serve`
(keyword-only, with the operator's token set) and one table of requests.

The evaluation set is the drive's `.metis/evals.jsonl`, read on each evaluation, so
a row may rewrite it first.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import Process, indexer, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
TOKEN = "s3cret-operator-token"
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}
GOOD_EVALS = (HANDBOOK / ".metis" / "evals.jsonl").read_text()
CASE = {"question": "How many holidays do I get?", "expected": ["handbook/policies/leave.md"]}


@dataclasses.dataclass(frozen=True)
class Row:
    """One request and the answer it must get: `code` None means a success."""

    method: str
    path: str
    status: int
    code: str | None = None
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    params: dict[str, str] | None = None
    evals: str | None = None
    says: str = ""
    """A part of the message: the field or the limit it names."""


def search(status: int, code: str | None = None, says: str = "", **body: Any) -> Row:
    return Row("POST", "/v1/search", status, code, body=body, says=says)


def evaluate(
    status: int, code: str | None = None, evals: str = GOOD_EVALS, says: str = "", **body: Any
) -> Row:
    return Row(
        "POST", "/v1/evaluate", status, code, body=body, headers=OPERATOR, evals=evals, says=says
    )


def documents(status: int, code: str | None = None, says: str = "", **params: str) -> Row:
    return Row("GET", "/v1/documents", status, code, params=params, says=says)


ROWS = {
    "query-empty": search(400, "QUERY_EMPTY", query=""),
    "query-blank": search(400, "QUERY_EMPTY", query="  \n\t"),
    "query-4001-chars": search(400, "QUERY_TOO_LONG", says="4001", query="a" * 4001),
    "query-4000-chars-accepted": search(200, query="vacation " + "a" * 3991),
    "top-k-0": search(400, "TOP_K_OUT_OF_RANGE", says="top_k", query="leave", top_k=0),
    "top-k-51": search(400, "TOP_K_OUT_OF_RANGE", says="top_k", query="leave", top_k=51),
    "top-k-1-accepted": search(200, query="leave", top_k=1),
    "top-k-50-accepted": search(200, query="leave", top_k=50),
    "top-k-string": search(400, "INVALID_BODY", says="top_k", query="leave", top_k="5"),
    "top-k-float": search(400, "INVALID_BODY", says="top_k", query="leave", top_k=5.0),
    "top-k-bool": search(400, "INVALID_BODY", says="top_k", query="leave", top_k=True),
    "rerank-string": search(400, "INVALID_BODY", says="rerank", query="leave", rerank="yes"),
    "unknown-field": search(400, "INVALID_BODY", says="question", question="leave"),
    "unknown-mode": search(400, "INVALID_BODY", says="mode", query="leave", mode="magic"),
    "unknown-kind": search(
        400, "INVALID_BODY", says="filters.kinds", query="leave", filters={"kinds": ["xls"]}
    ),
    "bad-json": Row("POST", "/v1/search", 400, "INVALID_BODY", raw=b'{"query": "leave"'),
    "not-an-object": Row("POST", "/v1/search", 400, "INVALID_BODY", raw=b'["leave"]'),
    "dense-without-model": search(400, "NO_EMBEDDING_MODEL", query="leave", mode="dense"),
    "body-too-large": Row(
        "POST",
        "/v1/search",
        413,
        "INVALID_BODY",
        says="65536",
        raw=json.dumps({"query": "x" * 70_000}).encode(),
    ),
    "unknown-encoding": Row(
        "POST",
        "/v1/search",
        415,
        "ENCODING_UNSUPPORTED",
        says="gzip, deflate",
        raw=b'{"query": "leave"}',
        headers={"Content-Encoding": "x-unknown"},
    ),
    "note-escaped-at-its-longest-accepted": Row(
        "POST",
        "/v1/notes",
        201,
        raw=json.dumps({"text": "\U0001f600" * 8000, "id": "emoji"}).encode(),
        headers=OPERATOR,
    ),
    "evaluate-accepted": evaluate(200, k=5),
    "eval-not-json": evaluate(400, "EVAL_FILE", says="line 2", evals=json.dumps(CASE) + "\nnope\n"),
    "eval-case-without-expected": evaluate(
        400, "EVAL_CASE_INVALID", says="expected", evals=json.dumps({"question": "a"}) + "\n"
    ),
    "eval-empty": evaluate(400, "EVAL_EMPTY", evals="# nothing yet\n\n"),
    "eval-too-large": evaluate(
        400,
        "EVAL_TOO_LARGE",
        says="501",
        evals="".join(json.dumps(CASE) + "\n" for _ in range(501)),
    ),
    "eval-k-0": evaluate(400, "TOP_K_OUT_OF_RANGE", says="k is 0", k=0),
    "eval-k-51": evaluate(400, "TOP_K_OUT_OF_RANGE", says="k is 51", k=51),
    "eval-k-string": evaluate(400, "INVALID_BODY", says="k", k="5"),
    "eval-unknown-field": evaluate(400, "INVALID_BODY", says="top_k", top_k=5),
    "documents-page-0": documents(400, "INVALID_BODY", says="page", page="0"),
    "documents-page-not-a-number": documents(400, "INVALID_BODY", says="page", page="one"),
    "documents-page-size-0": documents(400, "INVALID_BODY", says="page_size", page_size="0"),
    "documents-page-size-1001": documents(400, "INVALID_BODY", says="page_size", page_size="1001"),
    "documents-page-size-1000-accepted": documents(200, page_size="1000"),
    "documents-unknown-state": documents(400, "INVALID_BODY", says="state", state="gone"),
    "no-such-route": Row("GET", "/v1/nothing", 404, "NOT_FOUND", says="/v1/nothing"),
    "get-on-search": Row("GET", "/v1/search", 405, "METHOD_NOT_ALLOWED", says="POST"),
    "delete-on-status": Row("DELETE", "/v1/status", 405, "METHOD_NOT_ALLOWED", says="GET"),
    "reindex-without-token": Row(
        "POST", "/v1/reindex", 401, "UNAUTHORIZED", body={}, says="Bearer"
    ),
    "reindex-wrong-token": Row(
        "POST",
        "/v1/reindex",
        401,
        "UNAUTHORIZED",
        body={},
        headers={"Authorization": "Bearer not-it"},
        says="not the",
    ),
    "reindex-basic-auth": Row(
        "POST",
        "/v1/reindex",
        401,
        "UNAUTHORIZED",
        body={},
        headers={"Authorization": f"Basic {TOKEN}"},
    ),
    "reindex-with-token": Row("POST", "/v1/reindex", 202, body={"full": False}, headers=OPERATOR),
    "evaluate-without-token": Row("POST", "/v1/evaluate", 401, "UNAUTHORIZED", body={"k": 5}),
    "status-open": Row("GET", "/v1/status", 200),
    "documents-open": documents(200),
    "search-open": search(200, query="leave"),
    "metrics-open": Row("GET", "/metrics", 200),
    "healthz-open": Row("GET", "/healthz", 200),
    "readyz-open": Row("GET", "/readyz", 200),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Process, Path]]:
    """A keyword-only indexer over a copy of the handbook, with the operator's token."""
    tmp = tmp_path_factory.mktemp("errors")
    drive = tmp / "handbook"
    shutil.copytree(HANDBOOK, drive)
    p = indexer({"handbook": drive}, tmp / "index", None)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("METIS_API_TOKEN", TOKEN)
        p.start()
    try:
        wait_ready(p)
        yield p, drive / ".metis" / "evals.jsonl"
    finally:
        p.stop()


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_each_code_over_the_wire(served: tuple[Process, Path], row: Row) -> None:
    p, evals = served
    if row.evals is not None:
        evals.write_text(row.evals)
    content = (
        row.raw
        if row.raw is not None
        else (json.dumps(row.body).encode() if row.body is not None else None)
    )
    r = httpx.request(
        row.method,
        f"{p.base_url}{row.path}",
        content=content,
        params=row.params,
        timeout=120,
        headers={"Content-Type": "application/json", **row.headers},
    )
    assert r.status_code == row.status, r.text
    if row.code is None:
        return
    err = r.json()["error"]
    assert err["code"] == row.code, err
    assert row.says in err["message"], err
    if r.status_code == 401:
        assert r.headers["WWW-Authenticate"] == "Bearer"
    if r.status_code == 405:
        allowed = {m.strip() for m in r.headers["Allow"].split(",")}
        assert row.says in allowed and row.method not in allowed


def test_without_the_token_nothing_asks_for_one(tmp_path: Path) -> None:
    """Locally (no METIS_API_TOKEN) the costly routes stay open, and the OpenAPI
    document declares no security."""
    p = indexer({"handbook": HANDBOOK}, tmp_path / "index", None)
    with pytest.MonkeyPatch.context() as env:
        env.delenv("METIS_API_TOKEN", raising=False)
        p.start()
    try:
        wait_ready(p)
        assert p.post("/v1/reindex", {}).status_code == 202
        assert p.post("/v1/evaluate", {"k": 3}).json()["cases"] == 13
        doc = p.get("/openapi.json").json()
        assert "security" not in doc["paths"]["/v1/reindex"]["post"]
        assert "401" not in doc["paths"]["/v1/evaluate"]["post"]["responses"]
    finally:
        p.stop()
