"""One evaluation at a time, cancelled when its client goes away unless the operator
asked for it; any request whose client left is cancelled. A real `metis serve` whose
reranker (a real server on loopback) holds every request until the test opens it, so
an evaluation runs exactly as long as the test needs. Every wait watches an event (a
request seen, a log line), never a clock.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.processes import Process, free_port, indexer, running, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
TOKEN = "operator-token-for-evaluations"
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def reranker(tmp_path: Path) -> Iterator[Process]:
    port = free_port()
    p = Process(
        f"http://127.0.0.1:{port}",
        [sys.executable, str(Path(__file__).with_name("gated_reranker.py")), "--port", str(port)],
        tmp_path / "reranker.log",
    )
    with running(p):
        p.wait_for("the reranker", lambda: p.get("/seen").status_code == 200)
        yield p


def seen(reranker: Process) -> dict[str, int]:
    return reranker.get("/seen").json()


def leave_after_sending(
    base_url: str, path: str, body: dict[str, object], headers: dict[str, str] | None = None
) -> socket.socket:
    """Send a request on a plain socket and return it unread: closing it is the client
    going away."""
    url = urlsplit(base_url)
    sock = socket.create_connection((url.hostname, url.port))
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n{head}\r\n".encode()
        + data
    )
    return sock


def logged(p: Process, line: str) -> None:
    p.wait_for(f"{line!r} in the log", lambda: line in p.log(), timeout=60)


def test_a_second_evaluation_is_refused_and_an_abandoned_one_frees_the_slot(
    reranker: Process, tmp_path: Path
) -> None:
    p = indexer({"handbook": HANDBOOK}, tmp_path / "index", None, reranker=reranker.base_url)
    with running(p):
        wait_ready(p)
        first = leave_after_sending(p.base_url, "/v1/evaluate", {"k": 5})
        reranker.wait_for("the evaluation at the reranker", lambda: seen(reranker)["received"])
        second = p.post("/v1/evaluate", {"k": 5})
        assert second.status_code == 409, second.text
        assert second.json()["error"]["code"] == "EVALUATION_RUNNING"
        assert "running" in second.json()["error"]["message"]
        assert p.post("/v1/search", {"query": "vacation", "rerank": False}).status_code == 200

        first.close()
        logged(p, ": its client went away")
        assert "evaluation cancelled after" in p.log()
        reranker.wait_for(
            "the reranker's request abandoned", lambda: seen(reranker)["abandoned"] >= 1
        )
        asked = seen(reranker)["received"]
        reranker.post("/open")
        third = p.post("/v1/evaluate", {"k": 5})
        assert third.status_code == 200, third.text
        assert third.json()["cases"] == 13
        assert set(third.json()["modes"]) == {"keyword", "hybrid+rerank"}
        assert seen(reranker)["received"] == asked + 13, "the cancelled one asked nothing more"


def test_an_evaluation_the_operator_asked_for_runs_to_its_end(
    reranker: Process, tmp_path: Path
) -> None:
    p = indexer({"handbook": HANDBOOK}, tmp_path / "index", None, reranker=reranker.base_url)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("METIS_API_TOKEN", TOKEN)
        p.start()
    try:
        wait_ready(p)
        first = leave_after_sending(p.base_url, "/v1/evaluate", {"k": 5}, OPERATOR)
        reranker.wait_for("the evaluation at the reranker", lambda: seen(reranker)["received"])
        first.close()
        logged(p, "it goes on (the operator asked for it)")
        again = httpx.post(f"{p.base_url}/v1/evaluate", json={"k": 5}, headers=OPERATOR)
        assert again.status_code == 409, again.text
        assert again.json()["error"]["code"] == "EVALUATION_RUNNING"

        reranker.post("/open")
        logged(p, "evaluation of 13 questions done")
        after = httpx.post(
            f"{p.base_url}/v1/evaluate", json={"k": 5}, headers=OPERATOR, timeout=120
        )
        assert after.status_code == 200, after.text
        assert after.json()["cases"] == 13
    finally:
        p.stop()


def test_a_search_whose_client_left_is_cancelled(reranker: Process, tmp_path: Path) -> None:
    """aiohttp cancels the handler: the reranker's request is dropped and the search
    is never counted (a search that ran on would count as degraded or ok)."""
    p = indexer({"handbook": HANDBOOK}, tmp_path / "index", None, reranker=reranker.base_url)
    with running(p):
        wait_ready(p)
        client = leave_after_sending(p.base_url, "/v1/search", {"query": "vacation days"})
        reranker.wait_for("the search at the reranker", lambda: seen(reranker)["received"])
        client.close()
        reranker.wait_for(
            "the reranker's request abandoned", lambda: seen(reranker)["abandoned"] == 1
        )
        metrics = p.get("/metrics").text
        assert 'metis_searches_total{mode="hybrid"' not in metrics, metrics
        reranker.post("/open")
        answer = p.post("/v1/search", {"query": "vacation days"}).json()
        assert answer["reranked"] and answer["results"]
        assert 'metis_searches_total{mode="hybrid",outcome="ok"} 1.0' in p.get("/metrics").text
