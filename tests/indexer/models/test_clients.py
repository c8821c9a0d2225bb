"""The embedding client's requests: filled across documents, base64 where the server
takes it, floats once it does not, and a refusal kept to the document refused.

The local model server is the real one; the servers that refuse base64 or a word are
small stand-ins for servers that do (their answers are what they would send)."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager

import httpx
import numpy as np
import pytest
from aiohttp import web

from metis_indexer.models.clients import (
    IN_FLIGHT,
    MIN_BATCH,
    REQUEST_SECONDS,
    EmbeddingClient,
    ModelRefused,
    _Asked,
    _Item,
    base64_rows,
    batch_size,
    decode_embeddings,
    in_flight,
    paced,
    send_now,
    take_batch,
)
from tests.support.model_server import ModelServer, free_port, start_model_server


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


def recording() -> tuple[httpx.AsyncClient, list[dict]]:
    """An HTTP client that keeps each embeddings request's body."""
    bodies: list[dict] = []

    async def keep(request: httpx.Request) -> None:
        if request.url.path.endswith("/embeddings"):
            bodies.append(json.loads(request.content))

    return httpx.AsyncClient(timeout=60, event_hooks={"request": [keep]}), bodies


def documents() -> list[list[str]]:
    return [[f"document {d} passage {p} about topic {d * p}" for p in range(3)] for d in range(10)]


def test_passages_of_many_documents_share_requests_and_get_their_own_vectors(models):
    async def run() -> tuple[list[np.ndarray], list[np.ndarray], list[dict]]:
        http, bodies = recording()
        client = EmbeddingClient(models.base_url, client=http, batch=8, min_batch=8, in_flight=1)
        await client.connect()
        together = await asyncio.gather(*(client.embed_documents(d) for d in documents()))
        batched = list(bodies)
        alone = [await client.embed_documents(d) for d in documents()]
        await client.close()
        return together, alone, batched

    together, alone, bodies = asyncio.run(run())
    assert [len(b["input"]) for b in bodies] == [8, 8, 8, 6], "full requests across documents"
    assert {b["encoding_format"] for b in bodies} == {"base64"}, "the local server takes it"
    for got, want in zip(together, alone, strict=True):
        assert got.shape == (3, 384)
        assert np.allclose(got, want, atol=1e-5)


@asynccontextmanager
async def stand_in(answer: Callable[[dict], web.Response]) -> AsyncIterator[str]:
    """An OpenAI-shaped server whose embeddings answers `answer` gives."""

    async def embeddings(request: web.Request) -> web.Response:
        return answer(await request.json())

    async with stand_in_async(embeddings) as url:
        yield url


@asynccontextmanager
async def stand_in_async(
    embeddings: Callable[[web.Request], Awaitable[web.Response]],
) -> AsyncIterator[str]:
    """An OpenAI-shaped server whose embeddings requests `embeddings` handles."""

    async def models_list(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stand-in", "object": "model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models_list)
    app.router.add_post("/v1/embeddings", embeddings)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def floats_only(body: dict) -> web.Response:
    """A server that knows only floats, and refuses any passage with "poison"."""
    if body.get("encoding_format") != "float":
        return web.json_response({"error": "encoding_format: only float"}, status=422)
    if any("poison" in t for t in body["input"]):
        return web.json_response({"error": "input refused"}, status=400)
    data = [{"index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(body["input"])]
    return web.json_response({"data": data})


def test_a_server_refusing_base64_is_asked_in_floats_from_then_on():
    async def run() -> tuple[list[str], np.ndarray]:
        http, bodies = recording()
        async with stand_in(floats_only) as url:
            client = EmbeddingClient(url, client=http)
            first = await client.embed_documents(["abc", "de"])
            await client.embed_documents(["f"])
            await client.close()
        return [b["encoding_format"] for b in bodies], first

    formats, first = asyncio.run(run())
    assert formats == ["base64", "float", "float"]
    assert first.tolist() == [[3.0, 1.0], [2.0, 1.0]]


def test_a_refused_passage_fails_its_own_document_only():
    async def run() -> list[np.ndarray | BaseException]:
        async with stand_in(floats_only) as url:
            client = EmbeddingClient(url, batch=64, in_flight=1)
            await client.connect()
            docs = [["fine", "words"], ["a poison pill", "more"], ["also fine"]]
            got = await asyncio.gather(
                *(client.embed_documents(d) for d in docs), return_exceptions=True
            )
            await client.close()
        return got

    fine, poisoned, also = asyncio.run(run())
    assert isinstance(poisoned, ModelRefused) and "HTTP 400" in str(poisoned)
    assert fine.tolist() == [[4.0, 1.0], [5.0, 1.0]]
    assert also.tolist() == [[9.0, 1.0]]


def test_a_batch_is_taken_in_order_without_documents_that_stopped_waiting():
    async def run() -> list[tuple[int, str]]:
        waiting: collections.deque[_Item] = collections.deque()
        first, gone, last = _Asked(2), _Asked(1), _Asked(2)
        gone.done.cancel()
        for asked, texts in ((first, "ab"), (gone, "x"), (last, "cd")):
            waiting.extend(_Item(asked, i, t) for i, t in enumerate(texts))
        batch = take_batch(waiting, 3)
        return [(i.index, i.text) for i in batch] + [(-1, i.text) for i in waiting]

    assert asyncio.run(run()) == [(0, "a"), (1, "b"), (0, "c"), (-1, "d")]


@pytest.mark.parametrize(
    ("waiting", "out", "limit", "now"),
    [
        (8, 1, 2, True),
        (9, 1, 2, True),
        (3, 0, 2, True),
        (3, 1, 2, False),
        (0, 0, 2, False),
        (8, 1, 1, False),
        (3, 0, 1, True),
    ],
    ids=[
        "full-while-another-is-out",
        "more-than-full",
        "partial-when-none-is-out",
        "partial-waits-while-another-is-out",
        "nothing-to-send",
        "full-but-one-is-the-limit",
        "partial-with-one-as-the-limit",
    ],
)
def test_a_request_goes_when_full_or_when_the_server_has_nothing_else(waiting, out, limit, now):
    assert send_now(waiting, 8, out, limit) is now


@pytest.mark.parametrize(
    ("pace", "ceiling", "size"),
    [
        (None, 64, MIN_BATCH),
        (None, 1, 1),
        (1e-5, 64, 64),
        (0.0, 64, 64),
        (REQUEST_SECONDS / 20, 64, 20),
        (REQUEST_SECONDS / 20, 16, 16),
        (REQUEST_SECONDS / 3.5, 64, 3),
        (5.0, 64, MIN_BATCH),
        (5.0, 1, 1),
    ],
    ids=[
        "first-request",
        "first-below-the-floor",
        "fast-server",
        "instant-server",
        "paced",
        "paced-past-the-ceiling",
        "cpu-server",
        "crawling-server",
        "ceiling-below-the-floor",
    ],
)
def test_a_pass_request_carries_what_the_server_answers_in_request_seconds(pace, ceiling, size):
    assert batch_size(pace, ceiling) == size


def test_a_floor_as_high_as_the_ceiling_fixes_the_size():
    assert {batch_size(pace, 8, floor=8) for pace in (None, 1e-6, 0.1, 5.0)} == {8}


def test_the_pace_follows_the_server_within_a_request_or_two():
    assert paced(None, 2.0, 8) == 0.25
    assert paced(0.25, 0.5, 8) == pytest.approx((0.25 + 0.0625) / 2)


@pytest.mark.parametrize(
    ("took", "now", "want"),
    [
        (REQUEST_SECONDS / 2, 2, 1),
        (REQUEST_SECONDS * 4, 2, 1),
        (REQUEST_SECONDS / 5, 1, IN_FLIGHT),
        (REQUEST_SECONDS / 3, 1, 1),
        (REQUEST_SECONDS / 3, 2, 2),
    ],
    ids=[
        "slow-goes-to-one",
        "crawling",
        "fast-goes-back-to-two",
        "between-stays-one",
        "between-stays-two",
    ],
)
def test_one_request_is_out_where_a_request_takes_longer_than_a_question_should_wait(
    took, now, want
):
    assert in_flight(took / 8, 8, now) == want


class Serializing:
    """A server that embeds one request at a time, first come first served, as a plain
    model server does: a stand-in in front of the real local model (which does not
    serialize), keeping the order it took and answered requests in."""

    def __init__(self, model_url: str) -> None:
        self.model_url = model_url
        self.events: list[tuple[str, str, int]] = []
        """("arrived" or "answered", "question" or "pass", texts), in order."""

    def handler(self, http: httpx.AsyncClient) -> Callable[[web.Request], Awaitable[web.Response]]:
        one_at_a_time = asyncio.Lock()

        async def embeddings(request: web.Request) -> web.Response:
            body = await request.read()
            texts = json.loads(body)["input"]
            who = "question" if any("question" in t for t in texts) else "pass"
            self.events.append(("arrived", who, len(texts)))
            async with one_at_a_time:
                answer = await http.post(
                    f"{self.model_url}/v1/embeddings",
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
            self.events.append(("answered", who, len(texts)))
            return web.Response(
                body=answer.content, status=answer.status_code, content_type="application/json"
            )

        return embeddings


def waited_behind(events: list[tuple[str, str, int]]) -> list[tuple[int, int]]:
    """For each question, the pass's requests answered between its arrival and its answer,
    and their passages: what it waited behind."""
    waits: list[tuple[int, int]] = []
    waiting: tuple[int, int] | None = None
    for what, who, texts in events:
        if who == "question":
            if what == "arrived":
                waiting = (0, 0)
            elif waiting is not None:
                waits.append(waiting)
                waiting = None
        elif what == "answered" and waiting is not None:
            waiting = (waiting[0] + 1, waiting[1] + texts)
    return waits


def test_what_a_question_waited_behind_is_read_from_the_order_of_events():
    events = [
        ("arrived", "pass", 8),
        ("arrived", "question", 1),
        ("answered", "pass", 8),
        ("arrived", "pass", 5),
        ("answered", "question", 1),
        ("answered", "pass", 5),
        ("arrived", "question", 1),
        ("answered", "question", 1),
    ]
    assert waited_behind(events) == [(1, 8), (0, 0)]


SMALL = 16
"""Passages of a small request: a quarter of what the pass sent before (64)."""


def test_a_question_waits_behind_one_small_request_at_a_serializing_server():
    """The pass's requests are sized to the real model's pace (one thread: a passage of 256
    tokens takes a tenth of a second or more on CPUs of these machines' class, so a few a
    request), and only one is out at a time: at a server that takes one request at a
    time, a question waits behind at most one small request. With requests of 64, it
    waited behind 64 passages (seconds)."""
    passages = [f"passage {i}: " + "words of a long passage " * 60 for i in range(136)]
    model = start_model_server(threads=1)

    async def run() -> tuple[list[tuple[str, str, int]], int]:
        async with httpx.AsyncClient(timeout=120) as forward:
            serializing = Serializing(model.base_url)
            async with stand_in_async(serializing.handler(forward)) as url:
                client = EmbeddingClient(url)
                await client.connect()
                document = asyncio.create_task(client.embed_documents(passages))
                async with asyncio.timeout(120):
                    while not any(e[:2] == ("answered", "pass") for e in serializing.events):
                        await asyncio.sleep(0.01)  # pacing the polls of the first answer
                asked = 0
                while not document.done():
                    await client.embed_query("a question about the passages")
                    asked += 1
                vectors = await document
                await client.close()
        assert vectors.shape == (136, 384)
        return serializing.events, asked

    try:
        events, asked = asyncio.run(run())
    finally:
        model.stop()
    waits = waited_behind(events)
    assert len(waits) == asked, waits
    assert all(requests <= 1 and passages <= SMALL for requests, passages in waits), waits
    assert asked >= 3, "questions asked while the pass's requests were out"


def test_passages_arriving_while_a_request_is_out_wait_to_share_the_next():
    async def run() -> list[int]:
        inputs: list[int] = []
        answered = asyncio.Event()

        async def embeddings(request: web.Request) -> web.Response:
            body = await request.json()
            inputs.append(len(body["input"]))
            if len(inputs) == 1:
                await answered.wait()  # the first request stays out
            data = [{"index": i, "embedding": [1.0, 0.0]} for i in range(len(body["input"]))]
            return web.json_response({"data": data})

        async with stand_in_async(embeddings) as url:
            client = EmbeddingClient(url, batch=8, min_batch=8, in_flight=2)
            await client.connect()
            first = asyncio.create_task(client.embed_documents(["a", "b", "c"]))
            async with asyncio.timeout(10):
                while not inputs:
                    await asyncio.sleep(0.01)
            later = []
            for d in range(2):  # each arrives with a slot free, and a request out
                later.append(asyncio.create_task(client.embed_documents([f"{d}x", f"{d}y"])))
                for _ in range(20):
                    await asyncio.sleep(0)
            answered.set()
            await asyncio.gather(first, *later)
            await client.close()
        return inputs

    assert asyncio.run(run()) == [3, 4], "the second request carries both later documents"


def b64(v: list[float]) -> str:
    return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode()


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        ([b64([1, 2]), b64([3, 4])], [[1, 2], [3, 4]]),
        ([[1.0, 2.0], [3.0, 4.0]], [[1, 2], [3, 4]]),
    ],
    ids=["base64", "floats-from-a-server-ignoring-the-format"],
)
def test_embeddings_decode_in_input_order(rows, want):
    answer = {"data": [{"index": 1, "embedding": rows[1]}, {"index": 0, "embedding": rows[0]}]}
    assert decode_embeddings(answer, 2).tolist() == want


@pytest.mark.parametrize(
    "rows",
    [[b64([1, 2]), b64([3])], [b64([1, 2])], [[1.0, 2.0], [3.0]]],
    ids=["unequal-lengths", "too-few", "ragged-floats"],
)
def test_malformed_embeddings_are_refused(rows):
    answer = {"data": [{"index": i, "embedding": r} for i, r in enumerate(rows)]}
    with pytest.raises(ValueError):
        decode_embeddings(answer, 2)


@pytest.mark.parametrize("dim", [1, 2, 3, 384, 1024])
def test_base64_rows_decode_as_the_standard_library_does(dim):
    rows = [b64(np.random.default_rng(i).random(dim).tolist()) for i in range(3)]
    want = [list(base64.b64decode(r)) for r in rows]
    assert base64_rows(rows).tolist() == want


@pytest.mark.parametrize(
    "rows",
    [["AAA$"], ["AAAA", "AAA="], ["A=AA"], ["éééé"], ["AAAAAA"], ["A==="]],
    ids=[
        "outside-the-alphabet",
        "padded-unequally",
        "padding-inside",
        "not-ascii",
        "partial-quartet",
        "three-pads",
    ],
)
def test_what_is_not_base64_is_refused(rows):
    with pytest.raises(ValueError):
        base64_rows(rows)
