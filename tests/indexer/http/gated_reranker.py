"""A reranker that holds every request until it is opened: a real server on loopback
that lets a test keep an evaluation running for as long as it needs, and see what the
indexer does to the requests it no longer waits for.

    python tests/indexer/http/gated_reranker.py --port 7801

`POST /v1/rerank` (the Cohere shape) waits for `POST /open`, then answers;
`GET /seen` counts the requests received, answered and abandoned by their client.
"""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web

Counts = dict[str, int]
counts_key = web.AppKey("counts", Counts)
gate_key = web.AppKey("gate", asyncio.Event)


async def rerank(request: web.Request) -> web.Response:
    counts = request.app[counts_key]
    counts["received"] += 1
    body = await request.json()
    try:
        await request.app[gate_key].wait()
    except asyncio.CancelledError:
        counts["abandoned"] += 1
        raise
    counts["answered"] += 1
    n = len(body["documents"])
    return web.json_response(
        {"results": [{"index": i, "relevance_score": 1.0 - i / n} for i in range(n)]}
    )


async def open_gate(request: web.Request) -> web.Response:
    request.app[gate_key].set()
    return web.json_response({"open": True})


async def seen(request: web.Request) -> web.Response:
    return web.json_response(request.app[counts_key])


def create_app() -> web.Application:
    app = web.Application()
    app[counts_key] = {"received": 0, "answered": 0, "abandoned": 0}
    app[gate_key] = asyncio.Event()
    app.router.add_post("/v1/rerank", rerank)
    app.router.add_post("/open", open_gate)
    app.router.add_get("/seen", seen)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    web.run_app(create_app(), host="127.0.0.1", port=port, handler_cancellation=True, print=None)


if __name__ == "__main__":
    main()
