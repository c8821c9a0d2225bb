"""A changed configuration's clients: a search that took the old one is still answered by
it (a clean-clone CI run saw a search answered by words only, its model's client closed
under its request when the base's embedding model changed: httpx's ReadError).

The server is a small stand-in that holds a question until the test has changed the
configuration: the real one answers before a test can act while the question is out."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from aiohttp import web

from metis_indexer.config import IndexerConfig
from metis_indexer.configured import RETIRING, Configured
from tests.support.model_server import free_port

DIMENSIONS = 8


class HeldModel:
    """An embedding server that answers a question only once `release` is set."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.arrived.set()
        await self.release.wait()
        vector = base64.b64encode(np.ones(DIMENSIONS, "<f4").tobytes()).decode()
        data = [{"index": i, "embedding": vector} for i in range(len(body["input"]))]
        return web.json_response({"data": data})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "held", "object": "model"}]})


def config(url: str, name: str) -> IndexerConfig:
    return IndexerConfig.model_validate(
        {
            "sources": [{"drive": "docs", "root": "/drives/docs"}],
            "index_dir": "/index",
            "embedding": {"url": url, "name": name},
            "reranker": {"url": url, "name": f"{name}-reranker"},
        }
    )


def test_a_question_asked_of_the_old_model_is_answered_across_a_change():
    async def run() -> tuple[int, list[asyncio.Task[object]]]:
        held = HeldModel()
        app = web.Application()
        app.router.add_post("/v1/embeddings", held.embeddings)
        app.router.add_get("/v1/models", held.models)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            configured = Configured(config(f"http://127.0.0.1:{port}", "old"))
            old = configured.embedder
            assert old is not None
            asked = asyncio.create_task(old.embed_query("how many holidays do I get?"))
            await held.arrived.wait()
            configured.take(config(f"http://localhost:{port}", "new"))
            assert configured.embedder is not old
            held.release.set()
            vector = await asked
            await configured.close()
            left = [t for t in asyncio.all_tasks() if t.get_name() == RETIRING]
            return len(vector), left
        finally:
            await runner.cleanup()

    dimensions, left = asyncio.run(run())
    assert dimensions == DIMENSIONS
    assert left == [], "closing closes the retired clients at once, not after their grace"
