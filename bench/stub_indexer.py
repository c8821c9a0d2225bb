"""One process standing in for every base's indexer and every model Service, for the
operator's scale bench on kwok (bench/operator_kwok.py), where pods run no container.

The operator reaches a Service at `METIS_URL_TEMPLATE`; the bench sets it to
`http://127.0.0.1:<port>/r/{namespace}/{name}/{port}`, so each request names the Service
it is for: `metis-<base>` (the base's indexer) or a model Service.

- `GET  /r/<ns>/<service>/<port>/v1/status`: the indexer's status (`StatusAnswer`), from
  the base's script: `loading` for `loading` seconds, then `indexing` for `indexing`
  seconds (running generation `generation`, the last one indexed still the one before),
  then `ready` with `generation` indexed. A base never told about starts, when first asked,
  on generation 1 with the default script (`--loading`, `--indexing`).
- `GET  /r/<ns>/<service>/<port>/v1/models` and `POST .../v1/embeddings`: a model server.
- `POST /control/bases`: `{"bases": [[ns, service], ...] | "all", "generation": n | null
  (keep), "loading": s, "indexing": s, "answer": true | false}`: restart those bases'
  scripts now (`answer: false`: HTTP 503 to every status call until told otherwise).
- `GET  /control/counts`: requests served so far, by kind (`status`, `models`,
  `embeddings`, `other`), and the number of bases known.

    .venv/bin/python bench/stub_indexer.py --port 0 --port-file /tmp/stub.port
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import time
from pathlib import Path
from typing import Any

from aiohttp import web

MODEL_ID = "stub-embedding-model"
DIMENSIONS = 8


@dataclasses.dataclass
class Script:
    """One base's indexer: what it runs and since when."""

    generation: int = 1
    indexed_before: int | None = None
    since: float = 0.0
    loading: float = 2.0
    indexing: float = 3.0
    answer: bool = True


def status_answer(name: str, s: Script, now: float) -> dict[str, Any] | None:
    """The `GET /v1/status` body of a base at `now`; None: it does not answer."""
    if not s.answer:
        return None
    elapsed = now - s.since
    if elapsed < s.loading:
        phase, indexed = "loading", s.indexed_before
    elif elapsed < s.loading + s.indexing:
        phase, indexed = "indexing", s.indexed_before
    else:
        phase, indexed = "ready", s.generation
    done = indexed is not None
    return {
        "name": name,
        "phase": phase,
        "reason": "",
        "documents": 3 if done else 0,
        "notes": 0,
        "chunks": 6 if done else 0,
        "failed": 0,
        "pass_total": 3,
        "pass_done": 3 if phase == "ready" else 0,
        "last_indexed_at": "2026-01-01T00:00:00Z" if done else None,
        "passes": 1 if done else 0,
        "dimensions": DIMENSIONS if done else None,
        "embedding_model": MODEL_ID,
        "reranker": None,
        "skipped": {},
        "revisions": {},
        "indexed_revisions": {},
        "generation": s.generation,
        "indexed_generation": indexed,
        "last_pass": {"read": 3 if done else 0, "unchanged": 0, "dropped": 0},
        "warnings": [],
    }


class Stub:
    def __init__(self, loading: float, indexing: float) -> None:
        self.loading, self.indexing = loading, indexing
        self.scripts: dict[tuple[str, str], Script] = {}
        self.counts: collections.Counter[str] = collections.Counter()

    def script(self, key: tuple[str, str]) -> Script:
        s = self.scripts.get(key)
        if s is None:
            s = self.scripts[key] = Script(
                since=time.monotonic(), loading=self.loading, indexing=self.indexing
            )
        return s

    async def route(self, request: web.Request) -> web.StreamResponse:
        ns, service = request.match_info["ns"], request.match_info["service"]
        rest = request.match_info["rest"]
        if request.method == "GET" and rest == "v1/status":
            self.counts["status"] += 1
            base = service.removeprefix("metis-")
            answer = status_answer(base, self.script((ns, service)), time.monotonic())
            if answer is None:
                return web.json_response({"error": "stopped"}, status=503)
            return web.json_response(answer)
        if request.method == "GET" and rest == "v1/models":
            self.counts["models"] += 1
            return web.json_response(
                {
                    "object": "list",
                    "data": [{"id": MODEL_ID, "object": "model", "type": "embedding"}],
                }
            )
        if request.method == "POST" and rest == "v1/embeddings":
            self.counts["embeddings"] += 1
            body = await request.json()
            inputs = body.get("input") or [""]
            data = [
                {"object": "embedding", "index": i, "embedding": [0.1] * DIMENSIONS}
                for i, _ in enumerate(inputs)
            ]
            return web.json_response({"object": "list", "data": data, "model": MODEL_ID})
        self.counts["other"] += 1
        return web.json_response({"error": f"no route {request.method} /{rest}"}, status=404)

    async def control_bases(self, request: web.Request) -> web.Response:
        body = await request.json()
        keys = list(self.scripts) if body.get("bases") == "all" else body["bases"]
        now = time.monotonic()
        for ns, service in keys:
            s = self.script((ns, service))
            if body.get("generation") is not None and body["generation"] != s.generation:
                s.indexed_before = (
                    s.generation if s.since + s.loading + s.indexing <= now else s.indexed_before
                )
                s.generation = int(body["generation"])
            s.since = now
            s.loading = float(body.get("loading", 0.0))
            s.indexing = float(body.get("indexing", 0.0))
            s.answer = bool(body.get("answer", True))
        return web.json_response({"bases": len(keys)})

    async def control_counts(self, request: web.Request) -> web.Response:
        return web.json_response({**self.counts, "bases": len(self.scripts)})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/r/{ns}/{service}/{port}/{rest:.*}", self.route)
        app.router.add_post("/control/bases", self.control_bases)
        app.router.add_get("/control/counts", self.control_counts)
        return app


async def serve(port: int, port_file: Path | None, loading: float, indexing: float) -> None:
    runner = web.AppRunner(Stub(loading, indexing).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    if port_file is not None:
        port_file.write_text(str(bound))
    print(f"stub indexer on 127.0.0.1:{bound}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--loading", type=float, default=2.0, help="seconds a new base loads")
    parser.add_argument("--indexing", type=float, default=3.0, help="seconds it then indexes")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.port_file, args.loading, args.indexing))


if __name__ == "__main__":
    main()
