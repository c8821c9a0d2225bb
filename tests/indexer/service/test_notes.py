"""A base's own notes (spec 002, "Memories") on a real `metis serve` with the local model,
over HTTP and through the official MCP SDK's client: a fact, a newer fact replacing it,
questions about now and about the past, the source filter, forgetting, and every note
kept through a restart, a full reindex, a chunking change and a model change. Writes
need the base's token; bad bodies get their codes; a note written while the embedding
model is down is found by words at once and by meaning once the model is back."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.support import layered_model
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process, free_port, indexer, served, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
TOKEN = "notes-test-token"
OLD_FACT = (
    "Ana Souza leads the payments team as its engineering manager: she took the role in "
    "September 2026 and runs the team's weekly planning."
)
NEW_FACT = (
    "Ana Souza now works on the search platform team as a staff engineer, building the "
    "ranking service; she left the payments team in November 2026."
)
NOW = "What does Ana work on?"
PAST = "What was Ana's role in September?"


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


def configure(path: Path, drive: Path, index: Path, url: str, **extra: Any) -> None:
    config = {
        "name": "team",
        "sources": [{"drive": "handbook", "root": str(drive)}],
        "embedding": {"url": url, "name": url},
        "index_dir": str(index),
        "rescan_seconds": 0,
        **extra,
    }
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(config))
    staged.replace(path)


def write(p: Process, body: dict[str, Any], token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return httpx.post(f"{p.base_url}/v1/notes", json=body, headers=headers, timeout=30)


def search(p: Process, query: str, **extra: Any) -> dict[str, Any]:
    response = p.post("/v1/search", {"query": query, "top_k": 5, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def notes_of(answer: dict[str, Any]) -> list[str]:
    """The note ids among the results, in order."""
    return [r["citation"]["note"]["id"] for r in answer["results"] if "note" in r["citation"]]


def by_meaning(answer: dict[str, Any], note_id: str) -> bool:
    return any(
        r["citation"].get("note", {}).get("id") == note_id and r["scores"].get("dense") is not None
        for r in answer["results"]
    )


def assert_memory(p: Process, old: str, new: str) -> None:
    """Now: the newer fact first, the older one below it, cited as replaced; the past:
    the older fact still in the top 5; both by meaning."""
    now = search(p, NOW)
    assert now["warnings"] == [], now["warnings"]
    found = notes_of(now)
    assert found[:1] == [new] and old in found, found
    assert by_meaning(now, new)
    replaced = next(r for r in now["results"] if r["citation"].get("note", {}).get("id") == old)
    assert replaced["citation"]["source"] == "metis-team"
    assert replaced["citation"]["document"] == f"{old}.md"
    note = replaced["citation"]["note"]
    assert note["replaced_by"] == new and note["replaced_at"] >= note["written_at"]
    assert old in notes_of(search(p, PAST))


def test_a_memory_holds_through_restarts_reindexes_and_changes(
    models: ModelServer, tmp_path: Path
) -> None:
    drive = tmp_path / "handbook"
    shutil.copytree(HANDBOOK, drive)
    index, config, port = tmp_path / "index", tmp_path / "config.json", free_port()
    configure(config, drive, index, models.base_url, port=port)
    p = served(config, port).start()
    layered: ModelServer | None = None
    try:
        wait_ready(p)
        first = write(p, {"text": OLD_FACT, "title": "Ana's role", "id": "ana-role"})
        assert first.status_code == 201, first.text
        old = first.json()
        assert old["id"] == "ana-role" and old["source"] == "metis-team"
        assert old["document"] == "ana-role.md" and old["replaced_by"] is None
        # Searchable as soon as the write returns, by words and by meaning.
        answer = search(p, "payments engineering manager Ana", mode="keyword")
        assert notes_of(answer)[:1] == ["ana-role"]
        assert by_meaning(search(p, "Who manages the payments team?"), "ana-role")

        second = write(p, {"text": NEW_FACT, "replaces": ["ana-role"]})
        assert second.status_code == 201, second.text
        new = second.json()["id"]
        assert_memory(p, "ana-role", new)

        only = search(p, NOW, filters={"sources": ["metis-team"]})
        assert {r["citation"]["source"] for r in only["results"]} == {"metis-team"}
        listed = p.get("/v1/notes").json()
        assert [n["id"] for n in listed["notes"]] == [new, "ana-role"] and listed["total"] == 2
        assert listed["notes"][1]["replaced_by"] == new
        assert p.get("/v1/notes/ana-role").json()["text"] == OLD_FACT
        status = p.status()
        assert status["notes"] == 2 and status["warnings"] == []

        # An evaluation case may expect a note, named as citations name it.
        case = {"id": "past-role", "question": PAST, "expected": ["metis-team/ana-role.md"]}
        with (drive / ".metis" / "evals.jsonl").open("a") as f:
            f.write("\n" + json.dumps(case) + "\n")
        evaluated = p.post("/v1/evaluate", {"k": 5}).json()
        assert not [m for m in evaluated["misses"] if m["case"] == "past-role"], evaluated

        # A full reindex reads every document again: the notes with them.
        passes = status["passes"]
        assert p.post("/v1/reindex", {"full": True}).status_code == 202
        p.wait_status("the full pass", lambda s: s["passes"] > passes and s["phase"] == "ready")
        assert_memory(p, "ana-role", new)

        p.stop()
        p = served(config, port).start()
        wait_ready(p)
        assert p.status()["notes"] == 2
        assert_memory(p, "ana-role", new)

        configure(config, drive, index, models.base_url, port=port, chunking={"size": 800})
        p.wait_status(
            "the index of chunks of 800 answering",
            lambda s: s["chunking"]["answering"]["size"] == 800 and s["phase"] == "ready",
        )
        assert_memory(p, "ana-role", new)

        layered = layered_model.start(tmp_path / "layered")
        configure(config, drive, index, layered.base_url, port=port, chunking={"size": 800})
        p.wait_status(
            "the new model answering",
            lambda s: (
                (s.get("embedding") or {}).get("answering") == layered_model.MODEL_ID
                and s["phase"] == "ready"
            ),
        )
        assert_memory(p, "ana-role", new)

        # Forgetting the newer fact: the older one holds again.
        gone = httpx.delete(f"{p.base_url}/v1/notes/{new}", timeout=30)
        assert gone.status_code == 200 and gone.json()["id"] == new
        assert p.get(f"/v1/notes/{new}").json()["error"]["code"] == "NOTE_NOT_FOUND"
        answer = search(p, NOW)
        assert new not in notes_of(answer) and "ana-role" in notes_of(answer)
        kept = next(r for r in answer["results"] if r["citation"].get("note"))
        assert kept["citation"]["note"].get("replaced_by") is None
        assert p.status()["notes"] == 1
    finally:
        p.stop()
        if layered is not None:
            layered.stop()


@pytest.fixture(scope="module")
def guarded(models: ModelServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A base with a token, as the operator runs one."""
    root = tmp_path_factory.mktemp("guarded")
    drive = root / "handbook"
    shutil.copytree(HANDBOOK, drive)
    p = indexer({"handbook": drive}, root / "index", models.base_url, extra=("--name", "team"))
    p.env["METIS_API_TOKEN"] = TOKEN
    p.start()
    try:
        wait_ready(p)
        yield p
    finally:
        p.stop()


def test_writes_need_the_token_and_bad_notes_get_their_codes(guarded: Process) -> None:
    p = guarded
    refused = write(p, {"text": "Deploys freeze on Fridays."})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHORIZED"
    wrong = write(p, {"text": "Deploys freeze on Fridays."}, token="not-it")
    assert wrong.status_code == 401
    assert p.get("/v1/notes").json()["total"] == 0  # nothing was kept

    x = write(p, {"text": "The on-call rotation is weekly.", "id": "oncall"}, TOKEN)
    assert x.status_code == 201
    y = write(
        p, {"text": "The on-call rotation is every two weeks.", "replaces": ["oncall"]}, TOKEN
    )
    assert y.status_code == 201
    y_id = y.json()["id"]
    again = write(p, {"text": "The on-call rotation is weekly, again.", "id": "oncall"}, TOKEN)
    assert again.status_code == 200  # the same id: written over, still one note
    assert p.get("/v1/notes").json()["total"] == 2

    cases: list[tuple[dict[str, Any] | str, int, str]] = [
        ({"text": "   "}, 400, "NOTE_EMPTY"),
        ({"text": "x" * 8001}, 400, "NOTE_TOO_LONG"),
        ({"text": "fact", "title": "t" * 201}, 400, "NOTE_TOO_LONG"),
        ({"text": "fact", "replaces": ["no-such-note"]}, 409, "NOTE_REPLACES_UNKNOWN"),
        ({"text": "fact", "id": "self", "replaces": ["self"]}, 409, "NOTE_REPLACES_ITSELF"),
        ({"text": "fact", "id": "oncall", "replaces": [y_id]}, 409, "NOTE_REPLACES_CYCLE"),
        ({"text": "fact", "id": "Not An Id"}, 400, "NOTE_ID_INVALID"),
        ({"text": "fact", "replaces": [f"n{i}" for i in range(17)]}, 400, "NOTE_REPLACES_TOO_MANY"),
        ({"text": "fact", "color": "red"}, 400, "INVALID_BODY"),
        ({"text": 5}, 400, "INVALID_BODY"),
        ({"text": "fact", "replaces": "oncall"}, 400, "INVALID_BODY"),
        ({"text": "fact", "replaces": ["Not An Id"]}, 400, "NOTE_ID_INVALID"),
        ({"text": "fact", "id": ""}, 400, "NOTE_ID_INVALID"),
        ("not json", 400, "INVALID_BODY"),
    ]
    for body, status, code in cases:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        raw = body if isinstance(body, str) else json.dumps(body)
        r = httpx.post(f"{p.base_url}/v1/notes", content=raw, headers=headers, timeout=30)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), (body, r.text)
    assert p.get("/v1/notes").json()["total"] == 2  # none of them was kept
    assert p.get("/v1/notes/nobody").json()["error"]["code"] == "NOTE_NOT_FOUND"
    assert p.get("/v1/notes/Bad%20Id").status_code == 400

    unauthorized = httpx.delete(f"{p.base_url}/v1/notes/oncall", timeout=30)
    assert unauthorized.status_code == 401
    headers = {"Authorization": f"Bearer {TOKEN}"}
    forgot = httpx.delete(f"{p.base_url}/v1/notes/{y_id}", headers=headers, timeout=30)
    assert forgot.status_code == 200
    missing = httpx.delete(f"{p.base_url}/v1/notes/{y_id}", headers=headers, timeout=30)
    assert missing.status_code == 404
    httpx.delete(f"{p.base_url}/v1/notes/oncall", headers=headers, timeout=30)


def mcp_session(p: Process, calls: list[tuple[str, dict[str, Any]]], token: str | None) -> Any:
    async def session() -> tuple[Any, list[Any]]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with create_mcp_http_client(headers=headers) as http:
            transport = streamable_http_client(f"{p.base_url}/mcp", http_client=http)
            async with Client(transport) as client:
                tools = await client.list_tools()
                return tools, [await client.call_tool(name, args) for name, args in calls]

    return asyncio.run(session())


def test_an_agent_remembers_and_forgets_through_mcp(guarded: Process) -> None:
    p = guarded
    _, [refused] = mcp_session(p, [("remember", {"text": OLD_FACT})], token=None)
    assert refused.is_error and "UNAUTHORIZED" in refused.content[0].text
    assert p.get("/v1/notes").json()["total"] == 0

    tools, [old, new, bad, now] = mcp_session(
        p,
        [
            ("remember", {"text": OLD_FACT, "title": "Ana's role", "id": "ana"}),
            ("remember", {"text": NEW_FACT, "replaces": ["ana"], "id": "ana-now"}),
            ("remember", {"text": "   "}),
            ("search", {"query": NOW, "top_k": 5}),
        ],
        token=TOKEN,
    )
    by_name = {t.name: t for t in tools.tools}
    assert {"remember", "forget", "search", "status", "documents"} <= set(by_name)
    assert by_name["remember"].annotations.read_only_hint is False
    assert by_name["forget"].annotations.destructive_hint is True
    assert not old.is_error and old.structured_content["id"] == "ana"
    assert new.structured_content["replaces"] == ["ana"]
    assert bad.is_error and "NOTE_EMPTY" in bad.content[0].text
    results = now.structured_content["results"]
    cited = [r["citation"]["note"] for r in results if "note" in r["citation"]]
    assert [c["id"] for c in cited][:2] == ["ana-now", "ana"]
    assert cited[1]["replaced_by"] == "ana-now" and cited[0]["written_at"]

    _, [forgot, after] = mcp_session(
        p, [("forget", {"id": "ana-now"}), ("search", {"query": NOW, "top_k": 5})], token=TOKEN
    )
    assert forgot.structured_content["id"] == "ana-now"
    ids = [r["citation"].get("note", {}).get("id") for r in after.structured_content["results"]]
    assert "ana-now" not in ids and "ana" in ids
    mcp_session(p, [("forget", {"id": "ana"})], token=TOKEN)


def test_a_note_is_found_by_words_while_the_model_is_down_and_by_meaning_after(
    tmp_path: Path,
) -> None:
    model = start_model_server()
    drive = tmp_path / "handbook"
    shutil.copytree(HANDBOOK, drive)
    p = indexer({"handbook": drive}, tmp_path / "index", model.base_url).start()
    try:
        wait_ready(p)
        port = int(model.base_url.rsplit(":", 1)[1])
        model.stop()
        written = write(p, {"text": NEW_FACT, "id": "ana-now"})
        assert written.status_code == 201, written.text
        answer = search(p, "search platform staff engineer ranking service", mode="keyword")
        assert notes_of(answer)[:1] == ["ana-now"]
        hybrid = search(p, NOW)
        assert "ana-now" in notes_of(hybrid) and hybrid["mode"] == "keyword"
        model = start_model_server(port=port)
        p.wait_for("the note embedded", lambda: by_meaning(search(p, NOW), "ana-now"))
        assert search(p, NOW)["warnings"] == []
        assert p.get("/v1/notes").json()["notes"][0]["document"] == "ana-now.md"
    finally:
        p.stop()
        model.stop()
