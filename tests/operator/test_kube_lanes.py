"""Status writes have threads of their own: a base's status is written while every other
API call the operator has in flight waits on the API server.

A stand-in HTTP server answers here, not a kube-apiserver: a real one cannot be made to
hold every other request while it answers a status write."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from metis_operator import kube

STATUS = "/apis/metis.astraeus.io/v1/namespaces/team/knowledgebases/handbook/status"


class Held(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Answer)
        self.release = threading.Event()
        self.waiting = 0
        self.lock = threading.Lock()


class Answer(BaseHTTPRequestHandler):
    """A status write is answered at once; everything else once the test releases it."""

    server: Held

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if not self.path.startswith(STATUS):
            with self.server.lock:
                self.server.waiting += 1
            self.server.release.wait(30)
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Held]:
    held = Held()
    thread = threading.Thread(target=held.serve_forever, daemon=True)
    thread.start()
    yield held
    held.release.set()
    held.shutdown()
    held.server_close()


def test_a_status_write_is_not_queued_behind_every_other_call(server: Held) -> None:
    configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    cluster = kube.Cluster(client.ApiClient(configuration))

    async def scenario() -> dict[str, str]:
        others = [
            asyncio.ensure_future(cluster.get(f"/api/v1/namespaces/team/configmaps/c{i}"))
            for i in range(kube.CALLS_AT_ONCE + 4)
        ]
        deadline = asyncio.get_running_loop().time() + 10
        while server.waiting < kube.CALLS_AT_ONCE:  # every thread of the others is taken
            assert asyncio.get_running_loop().time() < deadline, server.waiting
            await asyncio.sleep(0.01)
        written = await asyncio.wait_for(cluster.merge_patch(STATUS, {"status": {}}), 10)
        assert not any(o.done() for o in others)
        server.release.set()
        await asyncio.gather(*others)
        return written

    assert asyncio.run(scenario()) == {"path": STATUS + "?fieldManager=metis-operator"}
