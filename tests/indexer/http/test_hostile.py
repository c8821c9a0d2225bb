"""What a cluster sends an indexer, against a real `metis serve`: a plain
`GET /mcp`, half-sent bodies, clients that never read, lines too long, bodies that
cannot be decoded. The indexer must go on answering `/healthz` within a second and
searches throughout, and answer every refusal as JSON in the API's error shape.

Requests are raw bytes on raw sockets: an HTTP client library would refuse to send most
of them.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metis_indexer import api, notes
from tests.support.processes import Process, indexer, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
LIVENESS_SECONDS = 1.0
"""How fast `/healthz` must answer while the other routes are hit: a frozen event loop
never answers at all, so the figure only has to be above a loaded machine's delays."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A keyword-only indexer of the handbook: what is under test is the HTTP server."""
    root = tmp_path_factory.mktemp("hostile")
    p = indexer({"handbook": HANDBOOK}, root / "index", None).start()
    try:
        wait_ready(p)
        yield p
    finally:
        p.stop()


def port(p: Process) -> int:
    return int(p.base_url.rsplit(":", 1)[1])


class Client(socket.socket):
    """A raw connection to the indexer: `@HOST@` in what it sends is the indexer's own
    `Host` (host and port, as curl sends it: the MCP transport's DNS-rebinding check
    answers a bare `127.0.0.1` with 421 before anything else)."""

    host = b""

    def sendall(self, data: bytes, flags: int = 0) -> None:  # type: ignore[override]
        super().sendall(data.replace(b"@HOST@", self.host), flags)

    def send(self, data: bytes, flags: int = 0) -> int:  # type: ignore[override]
        return super().send(data.replace(b"@HOST@", self.host), flags)


def connect(p: Process) -> Client:
    s = Client(socket.AF_INET, socket.SOCK_STREAM)
    s.host = f"127.0.0.1:{port(p)}".encode()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client slow to read fills up
    s.settimeout(30)
    s.connect(("127.0.0.1", port(p)))
    return s


def exchange(p: Process, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` whole, read the answer to its end (the server closes, or Content-Length)."""
    with connect(p) as s:
        s.sendall(raw)
        return read_answer(s)


def read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One answer read from `s`, to its Content-Length (or until the server closes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    length = int(headers.get("content-length", -1))
    while length < 0 or len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    length: int | None = None,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: @HOST@", "Connection: close"]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body) if length is None else length}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def alive(p: Process) -> None:
    """`/healthz` answers within LIVENESS_SECONDS, and a search answers."""
    started = time.monotonic()
    health = httpx.get(f"{p.base_url}/healthz", timeout=LIVENESS_SECONDS)
    assert health.status_code == 200, health.text
    assert time.monotonic() - started < LIVENESS_SECONDS
    found = httpx.post(
        f"{p.base_url}/v1/search",
        timeout=30,
        json={"query": "sick leave", "mode": "keyword", "top_k": 1},
    )
    assert found.status_code == 200, found.text
    assert found.json()["results"][0]["citation"]["document"] == "policies/leave.md"


@pytest.mark.parametrize("accept", [None, "text/event-stream", MCP_HEADERS["Accept"]])
@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_get_or_delete_of_mcp_is_refused_and_the_indexer_goes_on(served, method, accept):
    """A plain `curl http://…:7700/mcp` froze the whole indexer: the SDK answered GET with
    an event stream waiting for a disconnect its bridge never delivered."""
    headers = {"Accept": accept} if accept else {}
    with connect(served) as held:  # a client that asks and never reads nor leaves
        held.sendall(request(method, "/mcp", headers=headers).replace(b"close", b"keep-alive"))
        status, answered, body = exchange(served, request(method, "/mcp", headers=headers))
        alive(served)
    assert status == 405
    assert answered["allow"] == "POST"
    assert answered["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["code"] == "METHOD_NOT_ALLOWED"
    alive(served)


ROUTES = [
    ("POST", "/v1/search"),
    ("POST", "/v1/reindex"),
    ("POST", "/v1/evaluate"),
    ("POST", "/mcp"),
    ("GET", "/mcp"),
    ("GET", "/v1/status"),
    ("GET", "/v1/documents"),
    ("GET", "/metrics"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/openapi.json"),
    ("GET", "/?q=leave"),
    ("GET", "/static/console.css"),
    ("GET", "/nowhere"),
]


def test_every_route_under_hostile_clients_leaves_healthz_and_search_answering(served):
    """Each route held at once by a client that sent half its body, one that sent half its
    headers, one that pipelines requests and never reads an answer, and one that sent a
    whole request and never reads its answer."""
    held: list[socket.socket] = []
    try:
        for method, path in ROUTES:
            half_body = connect(served)
            half_body.sendall(
                request(method, path, b'{"query": "sick', MCP_HEADERS, length=4000).replace(
                    b"close", b"keep-alive"
                )
            )
            half_head = connect(served)
            half_head.sendall(f"{method} {path} HTTP/1.1\r\nHost: @HOST@\r\nX-Wait: ".encode())
            deaf = connect(served)
            deaf.setblocking(False)
            one = request(
                method, path, b'{"query": "leave"}' if method == "POST" else b"", MCP_HEADERS
            ).replace(b"close", b"keep-alive")
            with contextlib.suppress(BlockingIOError):
                for _ in range(200):
                    deaf.send(one)
            unread = connect(served)  # one whole request, its answer never read
            unread.sendall(
                request(
                    method, path, b'{"query": "leave"}' if method == "POST" else b"", MCP_HEADERS
                )
            )
            held += [half_body, half_head, deaf, unread]
            alive(served)
        for _ in range(5):
            alive(served)
    finally:
        for s in held:
            s.close()
    alive(served)


def deflated_garbage() -> bytes:
    return b"\x00\x01garbage that is not deflate"


@pytest.mark.parametrize(
    ("name", "raw", "status", "code"),
    [
        (
            "a deflate body that is not deflate",
            request(
                "POST",
                "/v1/search",
                deflated_garbage(),
                {"Content-Encoding": "deflate", "Content-Type": "application/json"},
            ),
            400,
            "INVALID_BODY",
        ),
        (
            "a gzip body that is not gzip",
            request("POST", "/v1/search", b"not gzip at all" * 10, {"Content-Encoding": "gzip"}),
            400,
            "INVALID_BODY",
        ),
        (
            "a chunked body with a bad chunk size",
            b"POST /v1/search HTTP/1.1\r\nHost: @HOST@\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
            "INVALID_REQUEST",
        ),
        ("a URL over 8,190 bytes", request("GET", "/v1/status?" + "a" * 9000), 414, "URI_TOO_LONG"),
        (
            "a header over 16,384 bytes",
            request("GET", "/v1/status", headers={"X-A": "a" * 17000}),
            431,
            "HEADERS_TOO_LARGE",
        ),
        ("a request line that is not HTTP", b"GARBAGE\r\n\r\n", 400, "INVALID_REQUEST"),
        (
            "a body over 64 KB on /v1/search",
            request("POST", "/v1/search", b'{"query": "' + b"a" * 70_000 + b'"}'),
            413,
            "INVALID_BODY",
        ),
        (
            "a body of 50 MB on /mcp (declared)",
            request("POST", "/mcp", b"{}", MCP_HEADERS, length=50 * 1024 * 1024),
            413,
            "INVALID_BODY",
        ),
        (
            "a body over a note's bound on /mcp (sent)",
            request("POST", "/mcp", b'{"a": "' + b"a" * api.NOTE_BODY + b'"}', MCP_HEADERS),
            413,
            "INVALID_BODY",
        ),
        (
            "a body over a note's bound on /v1/notes (sent)",
            request("POST", "/v1/notes", b'{"text": "' + b"a" * api.NOTE_BODY + b'"}'),
            413,
            "INVALID_BODY",
        ),
        (
            "a body in an encoding no one decodes",
            request(
                "POST",
                "/v1/search",
                b'{"query": "sick leave", "mode": "keyword"}',
                {"Content-Encoding": "x-unknown"},
            ),
            415,
            "ENCODING_UNSUPPORTED",
        ),
        (
            "a body in two encodings at once",
            request(
                "POST",
                "/v1/notes",
                zlib.compress(b'{"text": "a note"}'),
                {"Content-Encoding": "deflate, gzip"},
            ),
            415,
            "ENCODING_UNSUPPORTED",
        ),
        *(
            [
                (
                    "a body in brotli, not decoded here",
                    request(
                        "POST", "/v1/search", b"\x0b\x02\x80{}\x03", {"Content-Encoding": "br"}
                    ),
                    415,
                    "ENCODING_UNSUPPORTED",
                )
            ]
            if "br" not in api.ENCODINGS
            else []
        ),
        (
            "an MCP body that is not JSON by its type",
            request("POST", "/mcp", b"{}", {**MCP_HEADERS, "Content-Type": "text/plain"}),
            400,
            "INVALID_BODY",
        ),
        (
            "an MCP request to another host",
            request("POST", "/mcp", b"{}", MCP_HEADERS).replace(b"@HOST@", b"evil.example"),
            421,
            "MISDIRECTED_REQUEST",
        ),
        (
            "a method the route lacks",
            request("PUT", "/v1/search", b"{}"),
            405,
            "METHOD_NOT_ALLOWED",
        ),
        ("a path there is not", request("GET", "/v2/search"), 404, "NOT_FOUND"),
    ],
)
def test_every_refusal_is_json_in_the_error_shape(served, name, raw, status, code):
    answered, headers, body = exchange(served, raw)
    assert (answered, headers.get("content-type", "").split(";")[0]) == (
        status,
        "application/json",
    ), f"{name}: {answered} {body[:200]!r}"
    error = json.loads(body)["error"]
    assert error["code"] == code, f"{name}: {error}"
    assert error["message"], name
    alive(served)


def test_a_valid_deflate_body_is_read(served):
    """The decoding refusals above are of broken bodies, not of Content-Encoding itself."""
    body = zlib.compress(b'{"query": "sick leave", "mode": "keyword", "top_k": 1}')
    status, _, answered = exchange(
        served, request("POST", "/v1/search", body, {"Content-Encoding": "deflate"})
    )
    assert status == 200, answered
    assert json.loads(answered)["results"][0]["citation"]["document"] == "policies/leave.md"


def test_an_encoding_refused_names_those_decoded(served):
    """A body in an encoding not decoded here was read as plain text: taken for other
    words, or refused as JSON it is not, without saying why."""
    status, _, body = exchange(
        served,
        request("POST", "/v1/search", b'{"query": "leave"}', {"Content-Encoding": "x-unknown"}),
    )
    assert status == 415
    assert ", ".join(api.ENCODINGS) in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("encoding", ["deflate", "gzip"])
def test_a_connection_kept_alive_after_a_body_that_cannot_be_decoded(served, encoding):
    """The answer to a body its Content-Encoding does not decode left the connection kept
    alive, then the server dropped it: the client's next request on it was reset. Either
    the answer says `Connection: close` and the server closes, or the next request on the
    connection is answered."""
    broken = request(
        "POST",
        "/v1/search",
        deflated_garbage() * 4,
        {"Content-Encoding": encoding, "Content-Type": "application/json"},
    ).replace(b"Connection: close", b"Connection: keep-alive")
    with connect(served) as s:
        s.sendall(broken)
        status, headers, body = read_answer(s)
        assert status == 400 and json.loads(body)["error"]["code"] == "INVALID_BODY"
        if headers.get("connection", "").lower() == "close":
            assert s.recv(65536) == b"", "closed after the answer, as it said"
        else:
            s.sendall(request("GET", "/healthz").replace(b"close", b"keep-alive"))
            assert read_answer(s)[0] == 200, "the connection kept alive answers"
    alive(served)


def test_a_note_of_the_longest_text_is_taken_however_it_is_escaped(served):
    """8,000 emoji were taken as raw UTF-8 (32 KB) and refused with 413 when JSON-escaped
    (`\\ud83d\\ude00`, 12 bytes each: 96 KB): a note's bounds are characters, whichever
    way they were sent. One character more is NOTE_TOO_LONG either way, not 413."""
    url = f"{served.base_url}/v1/notes"
    text, title = "\U0001f600" * notes.TEXT_MAX, "\U0001f600" * notes.TITLE_MAX
    longest = {"text": text, "title": title, "id": "emoji"}
    escaped = json.dumps(longest).encode()  # ensure_ascii: every emoji as its escape
    assert len(escaped) > api.MAX_BODY
    headers = {"Content-Type": "application/json"}
    try:
        for body in (json.dumps(longest, ensure_ascii=False).encode(), escaped):
            kept = httpx.post(url, content=body, headers=headers, timeout=60)
            assert kept.status_code in (200, 201), kept.text[:300]
            assert (kept.json()["text"], kept.json()["title"]) == (text, title)
        over = json.dumps({"text": text + "\U0001f600", "id": "emoji"}).encode()
        refused = httpx.post(url, content=over, headers=headers, timeout=60)
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "NOTE_TOO_LONG")
    finally:
        httpx.delete(f"{url}/emoji", timeout=30)
    alive(served)


def test_a_body_that_never_arrives_whole_is_refused_in_time(served):
    """A client that declares a body and sends part of it gets 408 once BODY_SECONDS pass
    (30 s), not a request held for ever."""
    with connect(served) as s:
        s.sendall(request("POST", "/v1/search", b'{"query"', length=100))
        s.settimeout(90)
        data = b""
        while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
            data += chunk
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]
    assert b'"REQUEST_TIMEOUT"' in data


def mcp_call(p: Process, arguments: dict) -> dict:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "search", "arguments": arguments},
    }
    answer = httpx.post(f"{p.base_url}/mcp", json=body, headers=MCP_HEADERS, timeout=30)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["result"])


@pytest.mark.parametrize("top_k", ["5", True, 5.0, [5]])
def test_mcp_arguments_are_as_strict_as_the_api(served, top_k):
    api = httpx.post(
        f"{served.base_url}/v1/search",
        timeout=30,
        json={"query": "leave", "mode": "keyword", "top_k": top_k},
    )
    assert api.status_code == 400
    assert api.json()["error"]["code"] == "INVALID_BODY"
    result = mcp_call(served, {"query": "leave", "mode": "keyword", "top_k": top_k})
    assert result["isError"] is True
    assert "INVALID_BODY: top_k" in result["content"][0]["text"]


def test_mcp_searches_and_refusals_are_counted(served):
    def count(outcome: str) -> float:
        for line in httpx.get(f"{served.base_url}/metrics").text.splitlines():
            if (
                line.startswith("metis_searches_total{")
                and f'outcome="{outcome}"' in line
                and 'mode="keyword"' in line
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    ok, error = count("ok"), count("error")
    assert mcp_call(served, {"query": "leave", "mode": "keyword"})["isError"] is False
    assert mcp_call(served, {"query": " ", "mode": "keyword"})["isError"] is True
    assert (count("ok"), count("error")) == (ok + 1, error + 1)
