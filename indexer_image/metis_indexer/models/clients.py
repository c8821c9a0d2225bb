"""Clients of the team's model servers, over their public protocols only.

    ModelUnavailable         the server did not answer, or answered with an error
     └── ModelRefused        it answered, but refused this input (a 4xx): retrying won't help
          └── Unencodable    the input cannot even be sent (text JSON cannot carry)

Their messages say what went wrong, not which model: callers name the model.

Embeddings: OpenAI-compatible `POST /v1/embeddings` (TEI, vLLM, Infinity, Ollama);
the model's id from `GET /v1/models` or TEI's `GET /info`. Vectors are asked as
base64 (little-endian float32: a quarter of the bytes of JSON floats, and no float
parsing), falling back to floats once, remembered, for a server that refuses it. Reranking: `POST
/v1/rerank` (Cohere/Jina/vLLM/Infinity shape), else TEI's `POST /rerank`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import orjson

from metis_indexer.models.prefixes import default_prefixes

BATCH = 64
"""The most passages in one embeddings request, filled across documents: large enough
to amortise a request at a fast server, small enough to retry."""
MIN_BATCH = 2
"""The fewest passages in a full request, and what a pass's first request carries while
the server's pace is unknown. A CPU server embeds requests of 2 about as fast as of 8
(bench/results/preemption.md)."""
REQUEST_SECONDS = 0.25
"""How long a pass's request should take, answer included: a question queues behind
what the pass has out at a server that embeds one request at a time, so about this
long, whatever the server's speed (down to MIN_BATCH passages)."""
IN_FLIGHT = 2
"""A pass's requests out at once where requests are quick: the second keeps the server
busy while the first's answer travels. One where a request takes half of
REQUEST_SECONDS or more: the round trip is then a few hundredths of it, and a question
waits behind one request, not two."""
QUERY_IN_FLIGHT = 8
"""Questions embedded at once. Their own slots: a search never queues behind a pass."""
RERANK_IN_FLIGHT = 4
"""Rerank calls at once; one more is shed at once (the search answers in the fused
order) rather than queued behind calls whose searches may already be gone."""
RETRIES = 4
"""Tries of one request before the model counts as not answering."""
BACKOFF = 0.5
"""Seconds before the first retry; doubled each time."""
TIMEOUT = httpx.Timeout(120.0, connect=5.0)
"""How long one request may take. A busy server answers a pass's batches in turn, so
this is generous; a server that answers nothing at all is noticed sooner, by
`EmbeddingClient.silent_for`."""


class ModelUnavailable(Exception):
    """The model server did not answer, or answered with an error."""


class ModelRefused(ModelUnavailable):
    """The model answered but refused the input: the same input will be refused again."""


class Unencodable(ModelRefused):
    """The input could not be put into a request at all: no server was asked."""


@dataclasses.dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a model server says it serves."""

    id: str
    kinds: tuple[str, ...] = ()


def describe(e: BaseException) -> str:
    """What went wrong, in a few words for a reason or a warning. httpx's async connect
    error says "All connection attempts failed"; the refusal is further down its chain."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    if isinstance(e, httpx.ConnectError):
        return "connection refused" if "refused" in str(e).lower() else f"cannot connect: {e}"
    if isinstance(e, httpx.TimeoutException):
        return "timed out"
    if isinstance(e, httpx.HTTPStatusError):
        body = e.response.text[:200].strip()
        return f"HTTP {e.response.status_code}" + (f": {body}" if body else "")
    return str(e) or type(e).__name__


async def _json(client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> Any:
    response = await client.request(method, url, **kw)
    response.raise_for_status()
    return orjson.loads(response.content)


async def _post_json(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Any:
    headers = {"Content-Type": "application/json"}
    return await _json(client, "POST", url, content=encode(body), headers=headers)


async def discover(client: httpx.AsyncClient, base_url: str) -> ModelInfo:
    """The model a server serves: OpenAI's `/v1/models`, else TEI's `/info`."""
    try:
        body = await _json(client, "GET", f"{base_url}/v1/models")
        data = body.get("data") or []
        if data and isinstance(data[0], dict) and data[0].get("id"):
            kinds = tuple(k for k in ("embedding", "rerank") if k in str(data).lower())
            return ModelInfo(str(data[0]["id"]), kinds)
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    try:
        body = await _json(client, "GET", f"{base_url}/info")
        model_type = body.get("model_type")
        kinds = tuple(model_type) if isinstance(model_type, dict) else ()
        return ModelInfo(str(body["model_id"]), tuple(k.lower() for k in kinds))
    except (httpx.TransportError, httpx.HTTPStatusError) as e:
        raise ModelUnavailable(describe(e)) from None
    except (ValueError, KeyError, AttributeError):
        raise ModelUnavailable(
            "it answers, but names no model at GET /v1/models or GET /info"
        ) from None


class EmbeddingClient:
    """Embeds passages in batches sized to the server's pace, one or two requests in
    flight, retrying with backoff."""

    def __init__(
        self,
        base_url: str,
        *,
        query_prefix: str | None = None,
        document_prefix: str | None = None,
        client: httpx.AsyncClient | None = None,
        batch: int = BATCH,
        min_batch: int = MIN_BATCH,
        in_flight: int | None = None,
        retries: int = RETRIES,
        backoff: float = BACKOFF,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._query_prefix = query_prefix
        self._document_prefix = document_prefix
        self.model: str | None = None
        self.dimensions: int | None = None
        self._client = client or httpx.AsyncClient(timeout=TIMEOUT)
        self._batch = batch
        self._min_batch = min_batch
        self._fixed_in_flight = in_flight
        self._in_flight = in_flight or IN_FLIGHT
        self._pace: float | None = None
        """Seconds a passage of the pass took at the server, as a moving average."""
        self._query_slots = asyncio.Semaphore(QUERY_IN_FLIGHT)
        self._sent: dict[int, float] = {}
        self._ids = itertools.count()
        self._last_answer = time.monotonic()
        self._retries = retries
        self._backoff = backoff
        self._base64: bool | None = None
        """Whether the server takes `encoding_format: base64`; None until it answers."""
        self._waiting: collections.deque[_Item] = collections.deque()
        self._arrived = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._out = 0
        """A pass's requests out at the server now."""
        self._requests: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        tasks = [t for t in (self._sender, *self._requests) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

    @property
    def query_prefix(self) -> str:
        if self._query_prefix is not None:
            return self._query_prefix
        return default_prefixes(self.model or "")[0]

    @property
    def document_prefix(self) -> str:
        if self._document_prefix is not None:
            return self._document_prefix
        return default_prefixes(self.model or "")[1]

    def silent_for(self) -> float:
        """Seconds the server has been asked and has answered nothing at all: 0 when
        nothing is asked. A busy server answers some request every few seconds; one
        that is hung (stopped, deadlocked, partitioned) answers none."""
        if not self._sent:
            return 0.0
        return time.monotonic() - max(self._last_answer, min(self._sent.values()))

    @contextlib.asynccontextmanager
    async def _asking(self) -> AsyncIterator[None]:
        key = next(self._ids)
        self._sent[key] = time.monotonic()
        try:
            yield
            self._last_answer = time.monotonic()
        except httpx.HTTPStatusError:
            self._last_answer = time.monotonic()  # an error is an answer too
            raise
        finally:
            del self._sent[key]

    async def connect(self) -> ModelInfo:
        """Learn the model's id (which chooses the default prefixes)."""
        async with self._asking():
            info = await discover(self._client, self.base_url)
        self.model = info.id
        return info

    async def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Vectors of passages, in order, with the document prefix.

        Passages wait in one queue with those of other documents being embedded, and go
        out in requests sized to the server's pace (`batch_size`, at most `batch`), one
        or two at once (`in_flight`): a pass's requests are full even where its
        documents are short. A document is refused (ModelRefused) only for its own
        passages.
        """
        if self.model is None:
            await self.connect()
        prefix = self.document_prefix
        prefixed = [prefix + t for t in texts]
        sendable(prefixed)
        if not prefixed:
            return np.zeros((0, self.dimensions or 0), dtype=np.float32)
        asked = _Asked(len(prefixed))
        self._waiting.extend(_Item(asked, i, t) for i, t in enumerate(prefixed))
        self._arrived.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="metis-embedding-batches")
        return await asked.done  # cancelled with its document: its passages are not sent

    async def _send(self) -> None:
        """Fill requests from the queue as requests come back; a request that is not full
        goes only when no other is out (`send_now`), so the server is never idle for it."""
        while True:
            while not (
                send_now(len(self._waiting), self._size(), self._out, self._in_flight)
                and (batch := take_batch(self._waiting, self._size()))
            ):
                self._arrived.clear()
                await self._arrived.wait()
            self._out += 1
            task = asyncio.create_task(self._send_batch(batch), name="metis-embedding-request")
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    async def _send_batch(self, batch: list[_Item]) -> None:
        """One request; a refusal of several documents' passages is asked again document by
        document, so only the document the server refuses fails."""
        try:
            groups = [batch]
            while groups:
                group = groups.pop()
                started = time.monotonic()
                try:
                    vectors = await self._embed_batch([item.text for item in group], self._retries)
                    self._paced(time.monotonic() - started, len(group))
                except ModelRefused as e:
                    owners = list(dict.fromkeys(item.asked for item in group))
                    if len(owners) == 1:
                        owners[0].fail(e)
                    else:
                        groups += [[i for i in group if i.asked is a] for a in owners]
                    continue
                except Exception as e:  # not answering, or worse: no document may hang on it
                    for asked in dict.fromkeys(item.asked for item in group):
                        asked.fail(e)
                    continue
                for item, v in zip(group, vectors, strict=True):
                    item.asked.put(item.index, v)
        except asyncio.CancelledError:
            for item in batch:
                item.asked.fail(ModelUnavailable("the client was closed"))
            raise
        finally:
            self._out -= 1
            self._arrived.set()  # a request that waited to be full may go now

    def _size(self) -> int:
        return batch_size(self._pace, self._batch, self._min_batch)

    def _paced(self, seconds: float, passages: int) -> None:
        """Learn the server's pace from a request's answer, and size what follows by it."""
        self._pace = paced(self._pace, seconds, passages)
        if self._fixed_in_flight is None:
            self._in_flight = in_flight(self._pace, self._size(), self._in_flight)

    async def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """A question's vector, with the query prefix; one try (searches have a deadline)."""
        if self.model is None:
            await self.connect()
        async with self._query_slots:
            return (await self._embed_batch([self.query_prefix + text], 1))[0]

    async def embed_now(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Vectors of a few passages (a note's), with the document prefix, in one request on
        the questions' slots: a note written while a pass embeds in bulk waits for a slot,
        not behind the pass's queue. One try, as a question's."""
        if self.model is None:
            await self.connect()
        prefixed = [self.document_prefix + t for t in texts]
        if not prefixed:
            return np.zeros((0, self.dimensions or 0), dtype=np.float32)
        async with self._query_slots:
            return await self._embed_batch(prefixed, 1)

    async def answers(self, timeout: float) -> bool:
        """Whether the model embeds a word within `timeout` seconds: one try, for a pass
        that waits for it to come back."""
        try:
            async with asyncio.timeout(timeout):
                if self.model is None:
                    await self.connect()
                async with self._query_slots:
                    await self._embed_batch(["ping"], 1)
        except (ModelUnavailable, TimeoutError):
            return False
        return True

    async def _embed_batch(self, texts: list[str], tries: int) -> npt.NDArray[np.float32]:
        """One request's vectors: base64 where the server takes it, else JSON floats (a
        server that refuses base64 is asked in floats from then on)."""
        url = f"{self.base_url}/v1/embeddings"
        body: dict[str, Any] = {"input": texts, "model": self.model}
        if self._base64 is not False:
            try:
                answer = await self._post(url, {**body, "encoding_format": "base64"}, tries)
            except ModelRefused:
                if self._base64:
                    raise
                answer = await self._post(url, {**body, "encoding_format": "float"}, tries)
                self._base64 = False  # the same input in floats was taken: base64 was refused
            else:
                self._base64 = True
        else:
            answer = await self._post(url, {**body, "encoding_format": "float"}, tries)
        try:
            vectors = decode_embeddings(answer, len(texts))
        except (KeyError, TypeError, ValueError) as e:
            raise ModelUnavailable(f"embeddings in an unknown shape: {e}") from None
        if self.dimensions is None:
            self.dimensions = int(vectors.shape[1])
        elif vectors.shape[1] != self.dimensions:
            raise ModelUnavailable(
                f"embeddings of {vectors.shape[1]} dimensions, earlier {self.dimensions}"
            )
        return vectors

    async def _post(self, url: str, body: dict[str, Any], tries: int) -> Any:
        sendable(body["input"])  # an input no request can carry fails before any try
        delay = self._backoff
        for attempt in range(1, tries + 1):
            try:
                async with self._asking():
                    return await _post_json(self._client, url, body)
            except httpx.HTTPStatusError as e:
                status = e.response.status_code
                if 400 <= status < 500 and status not in (408, 429):
                    raise ModelRefused(f"refused the input: {describe(e)}") from None
                error: Exception = e
            except httpx.TimeoutException as e:  # not answering: the caller decides to wait
                raise ModelUnavailable(describe(e)) from None
            except (httpx.HTTPError, ValueError) as e:
                error = e
            if attempt == tries:
                raise ModelUnavailable(describe(error)) from None
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


@dataclasses.dataclass(eq=False, slots=True)
class _Asked:
    """One document's passages being embedded: their vectors as they come back."""

    n: int
    vectors: list[npt.NDArray[np.float32] | None] = dataclasses.field(default_factory=list)
    left: int = 0
    done: asyncio.Future[npt.NDArray[np.float32]] = dataclasses.field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def __post_init__(self) -> None:
        self.vectors = [None] * self.n
        self.left = self.n

    def put(self, index: int, vector: npt.NDArray[np.float32]) -> None:
        if self.done.done():
            return
        self.vectors[index] = vector
        self.left -= 1
        if self.left == 0:
            self.done.set_result(np.stack(self.vectors))  # type: ignore[arg-type]

    def fail(self, error: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(error)


@dataclasses.dataclass(slots=True)
class _Item:
    """One passage waiting to be sent."""

    asked: _Asked
    index: int
    text: str


def send_now(waiting: int, batch: int, out: int, limit: int) -> bool:
    """Whether a request goes now with what waits: with fewer than `limit` out, when it is
    full, or when no other request is out. A request sent the moment a slot freed carried
    about half a batch (a pass sent nearly twice the requests full ones would be, and a
    request costs the indexer's process milliseconds); one that waits while another is
    out keeps the server as busy, and fills meanwhile."""
    return out < limit and (waiting >= batch or (waiting > 0 and out == 0))


def paced(pace: float | None, seconds: float, passages: int) -> float:
    """Seconds a passage takes at the server, averaged with the last request's (`seconds`
    for `passages`, answer included), so a server that slows down is followed within a
    request or two."""
    now = seconds / passages
    return now if pace is None else (pace + now) / 2


def batch_size(pace: float | None, ceiling: int, floor: int = MIN_BATCH) -> int:
    """Passages for a pass's next request: as many as the server answers in about
    REQUEST_SECONDS at its `pace`, from `floor` (or `ceiling` where that is fewer) to
    `ceiling`. The first request carries `floor`: a slow server's pace is not known yet,
    and a fast one answers so soon that the next is full size."""
    floor = min(floor, ceiling)
    if pace is None:
        return floor
    return max(floor, min(ceiling, int(REQUEST_SECONDS / max(pace, 1e-9))))


def in_flight(pace: float, batch: int, now: int) -> int:
    """A pass's requests out at once: one where a request of `batch` takes half of
    REQUEST_SECONDS or more at `pace`, IN_FLIGHT where it takes under a quarter, else
    `now` (with two out, a request takes up to twice as long at a server that embeds one
    at a time: without the margin it would flap)."""
    took = pace * batch
    if took >= REQUEST_SECONDS / 2:
        return 1
    if took < REQUEST_SECONDS / 4:
        return IN_FLIGHT
    return now


def take_batch(waiting: collections.deque[_Item], size: int) -> list[_Item]:
    """Up to `size` passages from the front of the queue, in order, leaving out those
    whose document no longer waits (cancelled, or already failed)."""
    batch: list[_Item] = []
    while waiting and len(batch) < size:
        item = waiting.popleft()
        if not item.asked.done.done():
            batch.append(item)
    return batch


def decode_embeddings(answer: Any, n: int) -> npt.NDArray[np.float32]:
    """The vectors of an embeddings answer, in input order: each a base64 string of
    little-endian float32, or a list of floats (a server may ignore the format asked)."""
    rows = [r["embedding"] for r in sorted(answer["data"], key=lambda d: d["index"])]
    if len(rows) != n:
        raise ValueError(f"{len(rows)} embeddings for {n} inputs")
    if rows and all(isinstance(r, str) for r in rows):
        raw = base64_rows(rows)
        if raw.shape[1] % 4:
            raise ValueError("base64 embeddings of partial lengths")
        vectors = np.ascontiguousarray(raw).view("<f4").astype(np.float32)
    else:
        vectors = np.array(rows, dtype=np.float32)
    if vectors.ndim != 2 or len(vectors) != n:
        raise ValueError(f"{len(vectors)} embeddings for {n} inputs")
    return vectors


_SEXTETS = np.full(256, 255, dtype=np.uint8)
_SEXTETS[
    np.frombuffer(
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", dtype=np.uint8
    )
] = np.arange(64, dtype=np.uint8)


def base64_rows(rows: list[str]) -> npt.NDArray[np.uint8]:
    """Standard base64 strings of one length, decoded together as rows of bytes; ValueError
    for any other. One array operation an answer: decoding each string alone took 10 µs
    (binascii goes a character at a time), a tenth of a pass's own work in its process."""
    width = len(rows[0])
    if width == 0 or width % 4 or any(len(r) != width for r in rows):
        raise ValueError("base64 embeddings of unequal or partial lengths")
    chars = np.frombuffer("".join(rows).encode("ascii"), dtype=np.uint8).reshape(-1, width)
    pad = width - len(rows[0].rstrip("="))
    if pad > 2 or (chars[:, width - pad :] != ord("=")).any():
        raise ValueError("base64 embeddings padded unequally")
    sextets = np.zeros(chars.shape, dtype=np.uint32)
    sextets[:, : width - pad] = _SEXTETS[chars[:, : width - pad]]
    if (sextets == 255).any():
        raise ValueError("base64 embeddings with characters outside base64")
    s = sextets.reshape(len(rows), -1, 4)
    joined = (s[..., 0] << 18) | (s[..., 1] << 12) | (s[..., 2] << 6) | s[..., 3]
    octets = np.stack([joined >> 16, joined >> 8, joined], axis=-1).astype(np.uint8)
    return octets.reshape(len(rows), -1)[:, : width // 4 * 3 - pad]


def sendable(texts: Sequence[str]) -> None:
    """Unencodable when a text cannot be put into a JSON request (lone surrogates): that
    is the input's fault, not an outage of the model."""
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise Unencodable(f"the text cannot be sent to a model: {e.reason}") from None


def encode(body: dict[str, Any]) -> bytes:
    """A JSON body as bytes, or Unencodable: text with lone surrogates cannot be sent,
    and that is the input's fault, not an outage of the model."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError as e:  # its message: "str is not valid UTF-8: <why>"
        why = str(e).rpartition(": ")[2]
        raise Unencodable(f"the text cannot be sent to a model: {why}") from None


class RerankClient:
    """Scores passages against a question, in the Cohere/Jina shape or TEI's."""

    def __init__(
        self,
        base_url: str,
        *,
        query_prefix: str = "",
        name: str | None = None,
        client: httpx.AsyncClient | None = None,
        in_flight: int = RERANK_IN_FLIGHT,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.query_prefix = query_prefix
        self.name = name or self.base_url
        self._client = client or httpx.AsyncClient(timeout=TIMEOUT)
        self._tei: bool | None = None
        self._slots = asyncio.Semaphore(in_flight)
        self._in_flight = in_flight

    async def close(self) -> None:
        await self._client.aclose()

    async def rerank(self, query: str, passages: list[str]) -> list[float]:
        """One score per passage, in the passages' order; shed at once when every slot
        is taken."""
        if self._slots.locked():
            raise ModelUnavailable(f"busy: {self._in_flight} rerank calls already in flight")
        async with self._slots:
            return await self._rerank(self.query_prefix + query, passages)

    async def _rerank(self, query: str, passages: list[str]) -> list[float]:
        try:
            if self._tei is not True:
                try:
                    scores = await self._cohere(query, passages)
                    self._tei = False
                    return scores
                except httpx.HTTPStatusError as e:
                    if self._tei is False or e.response.status_code not in (404, 405):
                        raise
            scores = await self._tei_shape(query, passages)
            self._tei = True
            return scores
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise ModelUnavailable(describe(e)) from None

    async def _cohere(self, query: str, passages: list[str]) -> list[float]:
        body = {
            "query": query,
            "documents": passages,
            "top_n": len(passages),
            "return_documents": False,
        }
        answer = await _post_json(self._client, f"{self.base_url}/v1/rerank", body)
        return _ordered(answer["results"], "relevance_score", len(passages))

    async def _tei_shape(self, query: str, passages: list[str]) -> list[float]:
        body = {"query": query, "texts": passages, "raw_scores": False}
        answer = await _post_json(self._client, f"{self.base_url}/rerank", body)
        return _ordered(answer, "score", len(passages))


def _ordered(results: list[dict[str, Any]], key: str, n: int) -> list[float]:
    scores = [float("-inf")] * n
    for r in results:
        scores[int(r["index"])] = float(r[key])
    return scores
