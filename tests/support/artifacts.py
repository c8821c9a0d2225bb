"""Artifacts as a source-controller serves them, for the indexer's tests: gzip tarballs made
with tarfile (hostile ones too: `../`, a link out), served by a loopback HTTP server that
can also stop mid-answer."""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from tests.support.model_server import free_port


def tarball(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """A gzip tarball of `files` (name: content) and symbolic `links` (name: target)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(content))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return out.getvalue()


def digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


class Server:
    """A loopback HTTP server of archives by name; `cut` names one sent half, then the
    connection closed (a server stopped mid-fetch)."""

    def __init__(self) -> None:
        self.archives: dict[str, bytes] = {}
        self.cut: set[str] = set()
        self.port = free_port()

    async def serve(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.archives:
            return web.Response(status=404)
        data = self.archives[name]
        if name not in self.cut:
            return web.Response(body=data)
        response = web.StreamResponse(headers={"Content-Length": str(len(data))})
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        assert request.transport is not None
        request.transport.close()
        return response

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


@pytest.fixture
def server() -> Iterator[Server]:
    served = Server()
    app = web.Application()
    app.router.add_get("/{name}", served.serve)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", served.port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield served
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.run_until_complete(runner.cleanup())
    loop.close()
