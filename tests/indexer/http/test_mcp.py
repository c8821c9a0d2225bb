"""MCP at /mcp of a real `metis serve` (local model), asked by the official SDK's own client
over Streamable HTTP, as an agent would: the tools it lists, a cited search that answers
what the HTTP API answers, the failed documents, and bad arguments that come back as tool
errors while the server goes on answering.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process, indexer, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(models: ModelServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("mcp")
    drive = root / "handbook"
    shutil.copytree(HANDBOOK, drive)
    (drive / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a PDF at all")
    p = indexer({"handbook": drive}, root / "index", models.base_url).start()
    try:
        wait_ready(p)
        yield p
    finally:
        p.stop()


def ask(p: Process, calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, list[Any]]:
    """One client session: the tools it lists, then each call's result, in order."""

    async def session() -> tuple[Any, list[Any]]:
        async with Client(f"{p.base_url}/mcp") as client:
            tools = await client.list_tools()
            return tools, [await client.call_tool(name, args) for name, args in calls]

    return asyncio.run(session())


def text(result: Any) -> str:
    return " ".join(c.text for c in result.content if getattr(c, "text", None))


def test_an_agent_lists_the_tools_and_gets_cited_results(served: Process) -> None:
    question = {"query": "How many holidays do I get?", "top_k": 2}
    tools, (found, keyword, status, failed) = ask(
        served,
        [
            ("search", question),
            ("search", {"query": "Xid 79", "mode": "keyword", "top_k": 1}),
            ("status", {}),
            ("documents", {}),
        ],
    )
    by_name = {t.name: t for t in tools.tools}
    assert sorted(by_name) == ["documents", "forget", "remember", "search", "status"]
    for tool in by_name.values():
        writes = tool.name in ("remember", "forget")
        assert tool.annotations.read_only_hint is not writes
        assert tool.annotations.destructive_hint is (tool.name == "forget")
        assert len(tool.description) > 100  # enough for an agent to choose by
    search = by_name["search"].input_schema
    assert search["required"] == ["query"]
    assert set(search["properties"]) >= {"query", "top_k", "mode", "path_prefix", "kinds"}

    assert not found.is_error, text(found)
    over_http = httpx.post(f"{served.base_url}/v1/search", json=question, timeout=60).json()
    answer = found.structured_content
    assert [r["citation"] for r in answer["results"]] == [
        r["citation"] for r in over_http["results"]
    ]
    assert answer["results"][0]["citation"]["document"] == "policies/leave.md"
    assert "25 days of paid vacation" in " ".join(r["text"] for r in answer["results"])
    assert answer["mode"] == "hybrid" and answer["warnings"] == []
    assert {"dense", "keyword", "fused"} <= set(answer["results"][0]["scores"])
    assert "policies/leave.md" in text(found)  # the unstructured form says it too

    assert keyword.structured_content["mode"] == "keyword"
    (hit,) = keyword.structured_content["results"]
    assert hit["citation"]["document"] == "runbooks/gpu-errors.txt"
    assert set(hit["scores"]) == {"keyword", "keyword_rank", "fused"}  # no dense score

    assert status.structured_content["phase"] == "ready"
    assert status.structured_content["documents"] == served.status()["documents"]
    (doc,) = failed.structured_content["documents"]
    assert (doc["document"], doc["state"], doc["reason"]) == (
        "broken.pdf",
        "failed",
        "malformed document",
    )


def test_bad_arguments_are_tool_errors_not_crashes(served: Process) -> None:
    _, results = ask(
        served,
        [
            ("search", {"query": "vacation", "top_k": 99}),
            ("search", {"query": "   "}),
            ("search", {"query": "vacation", "top_k": "many"}),
            ("search", {"query": "vacation", "mode": "psychic"}),
            ("documents", {"page_size": 5000}),
            ("search", {"query": "vacation", "top_k": 1}),
        ],
    )
    *refused, fine = results
    assert [r.is_error for r in refused] == [True] * 5
    assert "TOP_K_OUT_OF_RANGE: top_k is 99; it must be between 1 and 50" in text(refused[0])
    assert "QUERY_EMPTY" in text(refused[1])
    assert "top_k" in text(refused[2]) and "mode" in text(refused[3])
    assert "page_size" in text(refused[4])
    assert not fine.is_error and len(fine.structured_content["results"]) == 1
    assert served.get("/healthz").status_code == 200
    beside = httpx.post(f"{served.base_url}/mcpx", json={}, timeout=10)
    assert beside.status_code == 404 and beside.json()["error"]["code"] == "NOT_FOUND"
    metrics = served.get("/metrics").text
    assert 'metis_searches_total{mode="hybrid",outcome="error"}' in metrics
