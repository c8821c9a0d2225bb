"""A stopping indexer (`metis serve`, SIGTERM): it hands its writing over at once, answers
every read through its drain, refuses what it would not finish, then exits 0; a second
signal ends the drain. Real processes over loopback, on the handbook, by words only."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from metis_indexer.cli import build_parser, serve_config
from metis_indexer.config import ConfigError, IndexerConfig
from metis_indexer.service.service import LOCK_FILE
from tests.support.processes import Process, indexer, running, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
QUESTION = {"query": "vacation days", "mode": "keyword"}


def draining(index_dir: Path, seconds: int) -> Process:
    return indexer({"handbook": HANDBOOK}, index_dir, None, extra=("--drain-seconds", str(seconds)))


def signal_and_wait_for_the_drain(p: Process) -> httpx.Response:
    """SIGTERM, then the reindex it refuses once its drain has begun."""
    assert p.proc is not None
    p.proc.send_signal(signal.SIGTERM)

    def refused() -> httpx.Response | None:
        r = p.post("/v1/reindex", {})
        return r if r.status_code == 409 else None

    return p.wait_for("the reindex refused while stopping", refused, timeout=60)


def mcp_search(p: Process) -> Any:
    async def session() -> Any:
        async with Client(f"{p.base_url}/mcp") as client:
            return await client.call_tool("search", {**QUESTION, "top_k": 1})

    return asyncio.run(session())


def lock_is_free(index_dir: Path) -> bool:
    fd = os.open(index_dir / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing lets go of the lock again
    return True


def test_a_stopping_indexer_answers_every_read_refuses_writes_then_exits_0(tmp_path):
    index_dir = tmp_path / "index"
    p = draining(index_dir, 20)
    with running(p):
        wait_ready(p)
        assert not lock_is_free(index_dir), "the writer holds its lock"
        assert p.get("/v1/status").json()["stopping"] is False
        refused = signal_and_wait_for_the_drain(p)
        assert refused.json() == {
            "error": {
                "code": "STANDBY",
                "message": "this indexer is stopping and its replacement takes over; "
                "ask again in a moment",
            }
        }
        evaluation = p.post("/v1/evaluate", {"k": 5})
        assert (evaluation.status_code, evaluation.json()["error"]["code"]) == (409, "STANDBY")
        assert lock_is_free(index_dir), "the writer lock is let go at once"
        ready = p.get("/readyz")
        assert (ready.status_code, ready.json()["ok"]) == (200, True)
        assert p.get("/healthz").status_code == 200
        found = p.post("/v1/search", QUESTION)
        assert found.status_code == 200 and found.json()["results"]
        assert found.headers["Connection"] == "close", "a client's next request goes elsewhere"
        status = p.get("/v1/status").json()
        assert (status["documents"], status["stopping"]) == (6, True)
        assert p.get("/v1/documents").json()["total"] == 6
        assert "vacation" in " ".join(c.text for c in mcp_search(p).content).lower()
        assert p.proc is not None
        assert p.proc.wait(120) == 0, p.log()
    log = p.log()
    assert "SIGTERM: stopping: writing stopped" in log and "stopped: no longer listening" in log


def test_a_standby_takes_over_while_the_stopping_indexer_still_answers(tmp_path):
    index_dir = tmp_path / "index"
    first = draining(index_dir, 120)
    second = indexer({"handbook": HANDBOOK}, index_dir, None)
    with running(first):
        wait_ready(first)
        with running(second):
            second.wait_status("standby", lambda s: s["phase"] == "standby")
            signal_and_wait_for_the_drain(first)
            took_over = wait_ready(second)
            assert took_over["documents"] == 6 and took_over["last_pass"]["read"] == 0
            assert second.post("/v1/reindex", {}).status_code == 202, "the second writes now"
            found = first.post("/v1/search", QUESTION)
            assert found.status_code == 200 and found.json()["results"]
            assert first.get("/readyz").status_code == 200
            assert first.proc is not None
            first.proc.send_signal(signal.SIGTERM)
            assert first.proc.wait(60) == 0, first.log()
            assert second.post("/v1/search", QUESTION).json()["results"]


def test_a_second_signal_ends_the_drain_at_once(tmp_path):
    p = draining(tmp_path / "index", 120)
    with running(p):
        wait_ready(p)
        signal_and_wait_for_the_drain(p)
        assert p.proc is not None
        p.proc.send_signal(signal.SIGINT)
        assert p.proc.wait(60) == 0, p.log()


def config(**over: Any) -> IndexerConfig:
    base = {"sources": [{"drive": "docs", "root": "/drives/docs"}], "index_dir": "/index"}
    return IndexerConfig.model_validate(base | over)


def test_drain_seconds_defaults_to_15_in_a_configuration_and_takes_0_to_120():
    assert config().drain_seconds == 15
    serve = ["serve", "--source", "d=/d", "--index", "/i"]
    assert serve_config(build_parser().parse_args(serve)).drain_seconds == 0  # a laptop
    assert config(drain_seconds=0).drain_seconds == 0
    assert config(drain_seconds=120).drain_seconds == 120


@pytest.mark.parametrize("seconds", ["-1", "121", "nan"])
def test_drain_seconds_out_of_range_is_refused_naming_it(seconds):
    args = build_parser().parse_args(
        ["serve", "--source", "d=/d", "--index", "/i", "--drain-seconds", seconds]
    )
    with pytest.raises(ConfigError, match=r"^drain_seconds: "):
        serve_config(args)
