"""Vectors from the base's other replicas (`IndexerConfig.peers`), so that a replica that
starts with an empty index costs the embedding model only what no other replica holds.

A passage is asked for by the hash of exactly the text the model is sent (the document
prefix, the title and headings, the text): a vector a peer gives for it is the one the
model would give. A peer gives only the vectors of the model asked for, and none while
its own model changes. Asking is never an error of a pass: a peer that is down, slow,
refuses or answers for another model is left alone for a while (`REST_SECONDS`), and
the passages it did not give go to the model as before.

Each index answers from a map of its chunks' hashes to their ids, built from the stored
texts on the first question and brought up to date with the chunks written since; every
vector given is checked against its chunk's stored text first, so a map a little behind
the index misses a vector, never gives a wrong one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence

import httpx
import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from metis_indexer.index import texts
from metis_indexer.index.store import Store
from metis_indexer.schema import HASHES_MAX, VectorsAnswer, VectorsRequest

log = logging.getLogger("metis.indexer")

ASK_SECONDS = 5.0
"""How long a peer's answer is waited for: it reads a few hundred rows of its index, in
milliseconds; past this it is slow or gone, and the model embeds what it would have given."""
CONNECT_SECONDS = 1.0
REST_SECONDS = 60.0
"""How long a peer that did not answer (or answered for another model) is not asked
again: a peer that is gone costs a pass one wait a minute, not one a batch."""
NOT_READY = "the first pass has not ended: the base's other replicas answer meanwhile"
"""Why a replica with peers is not ready before its index has had one whole pass."""


def passage_hash(sent: str) -> str:
    """The hash a passage is asked for by: of `sent`, the text the model is sent."""
    return _digest(sent).hex()


def _digest(sent: str) -> bytes:
    return hashlib.blake2b(sent.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def encode_rows(rows: npt.NDArray[np.float32]) -> str:
    """Vectors as the API carries them: base64 of float32 little-endian, row after row."""
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<f4").tobytes()).decode("ascii")


def decode_rows(data: str, count: int, dimensions: int) -> npt.NDArray[np.float32] | None:
    """`count` vectors of `dimensions` from `encode_rows`; None where `data` is not that."""
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    if dimensions <= 0 or len(raw) != 4 * count * dimensions:
        return None
    return np.frombuffer(raw, dtype="<f4").reshape(count, dimensions).astype(np.float32)


def usable(
    answer: VectorsAnswer, model: str, dimensions: int, asked: int
) -> dict[int, npt.NDArray[np.float32]]:
    """The vectors of a peer's answer that may be used, by position in what was asked:
    none where they are another model's or of other dimensions, or where the answer does
    not add up (positions out of range, repeated or out of order, vectors short)."""
    found = answer.found
    if answer.model != model or answer.dimensions != dimensions or not found:
        return {}
    if found != sorted(set(found)) or found[0] < 0 or found[-1] >= asked:
        return {}
    rows = decode_rows(answer.vectors, len(found), dimensions)
    if rows is None or not np.isfinite(rows).all():
        return {}
    return {at: rows[i] for i, at in enumerate(found)}


def left_to_embed(count: int, found: Mapping[int, object]) -> list[int]:
    """Positions of the passages no peer gave: what the model is sent."""
    return [i for i in range(count) if i not in found]


def merged(
    count: int,
    dimensions: int,
    found: Mapping[int, npt.NDArray[np.float32]],
    rest: Sequence[int],
    embedded: npt.NDArray[np.float32] | None,
) -> npt.NDArray[np.float32]:
    """The vectors of all `count` passages, in order: the peers' where they gave one, the
    model's (`embedded`, one row per position of `rest`) for the others."""
    out = np.zeros((count, dimensions), dtype=np.float32)
    for at, row in found.items():
        out[at] = row
    if rest:
        assert embedded is not None and len(embedded) == len(rest)
        out[list(rest)] = embedded
    return out


def askable(peers: Sequence[str], resting: Mapping[str, float], now: float) -> list[str]:
    """The peers to ask now, in their order: those not resting."""
    return [p for p in peers if resting.get(p, 0.0) <= now]


def not_ready(peers: Sequence[str], passed: bool) -> str | None:
    """Why a loaded index is not ready: with peers, until it has had one whole pass
    (searches are routed to the replicas that have); None when it is ready."""
    return NOT_READY if peers and not passed else None


def serving_problem(
    asked: str, loaded: bool, configured: str | None, held: str | None, changing: bool
) -> str | None:
    """Why an index gives no vectors of model `asked`: it is not loaded, its vectors are
    another model's (`held`), or being made anew for its `configured` model. None: it
    gives them."""
    if not loaded:
        return "the index is not loaded yet"
    if configured is None:
        return "the embedding model has not answered yet"
    if not held:
        return "this index holds no vectors yet"
    if changing or held != configured:
        return f"the embedding model is changing to {configured}: no vectors are given meanwhile"
    if held != asked:
        return f"this index holds the vectors of {held}, not of {asked}"
    return None


class HeldVectors:
    """The vectors an index gives its peers, found by passage hash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._prefix = ""
        self._ids: dict[bytes, int] = {}
        self._after = 0
        """The last chunk id the map has read."""
        self._tag: tuple[str, int] | None = None
        """The store's id and generation the map was brought up to date at."""

    def find(
        self, store: Store, prefix: str, hashes: Sequence[str], dimensions: int
    ) -> tuple[list[int], npt.NDArray[np.float32]]:
        """Positions in `hashes` of the vectors this index holds, and those vectors (of
        `dimensions`), each checked against its chunk's text with the model's `prefix`.
        Blocking: SQLite reads."""
        with self._lock:
            self._refresh(store, prefix)
            ids = {at: self._ids.get(bytes.fromhex(h)) for at, h in enumerate(hashes)}
        rows = store.passages([i for i in ids.values() if i is not None])
        found: list[int] = []
        vectors: list[bytes] = []
        for at, chunk_id in ids.items():
            row = rows.get(chunk_id) if chunk_id is not None else None
            if row is None:
                continue
            title, headings, text, vector = row
            if vector is None or len(vector) != 4 * dimensions:
                continue
            if passage_hash(prefix + texts.passage(title, headings, text)) != hashes[at]:
                continue  # the chunk id was given to another chunk since the map read it
            found.append(at)
            vectors.append(vector)
        matrix = np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(found), dimensions)
        return found, matrix

    def refresh(self, store: Store, prefix: str) -> None:
        """Bring the map up to date now (after a pass), so a peer's first question does not
        wait for it: 3.7 s and 15 MB for 100,000 chunks, once; the chunks written since
        after that."""
        with self._lock:
            self._refresh(store, prefix)

    def _refresh(self, store: Store, prefix: str) -> None:
        """The map up to date with the chunks written since it last was (all of them for
        another store or prefix, or once it holds many chunks no longer there)."""
        with store.reading() as tag:
            if store is self._store and prefix == self._prefix and tag == self._tag:
                return
            count = store.chunk_count()
            if store is not self._store or prefix != self._prefix or len(self._ids) > 2 * count:
                self._store, self._prefix, self._ids, self._after = store, prefix, {}, 0
            self._after = min(self._after, store.last_chunk_id())  # ids past it are given again
            ids = self._ids
            for batch in store.chunk_texts(after=self._after):
                for chunk_id, title, headings, text in batch:
                    sent = prefix + texts.passage(title, headings, text)
                    ids[_digest(sent)] = chunk_id
                self._after = batch[-1][0]
            self._tag = tag


class PeerVectors:
    """Asks the peers for vectors; shared by a pass's documents."""

    def __init__(self, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(ASK_SECONDS, connect=CONNECT_SECONDS), headers=headers
        )
        self._resting: dict[str, float] = {}
        """Peers not asked until then (a monotonic time)."""

    async def close(self) -> None:
        await self._client.aclose()

    async def vectors(
        self, peers: Sequence[str], model: str, dimensions: int, hashes: Sequence[str]
    ) -> dict[int, npt.NDArray[np.float32]]:
        """The vectors the peers give of `hashes`, by position: each peer in turn is asked
        for those the ones before did not give."""
        found: dict[int, npt.NDArray[np.float32]] = {}
        for peer in askable(peers, self._resting, time.monotonic()):
            wanted = left_to_embed(len(hashes), found)
            for start in range(0, len(wanted), HASHES_MAX):
                part = wanted[start : start + HASHES_MAX]
                given = await self._ask(peer, model, dimensions, [hashes[i] for i in part])
                if given is None:
                    break
                found.update((part[at], row) for at, row in given.items())
            if len(found) == len(hashes):
                break
        return found

    async def _ask(
        self, peer: str, model: str, dimensions: int, hashes: list[str]
    ) -> dict[int, npt.NDArray[np.float32]] | None:
        """What one peer gives; None (and the peer rests) where it did not answer, or
        answered for another model."""
        body = VectorsRequest(model=model, hashes=hashes).model_dump()
        try:
            response = await self._client.post(f"{peer}/v1/vectors", json=body)
            if response.status_code != 200:
                return self._rest(peer, f"it answered {response.status_code}")
            answer = VectorsAnswer.model_validate_json(response.content)
        except httpx.HTTPError as e:
            return self._rest(peer, f"it did not answer ({type(e).__name__}: {e})")
        except ValidationError:
            return self._rest(peer, "its answer is not a vectors answer")
        if answer.model != model:
            return self._rest(peer, answer.reason or f"it holds the vectors of {answer.model}")
        return usable(answer, model, dimensions, len(hashes))

    def _rest(self, peer: str, why: str) -> None:
        log.warning(
            "peer %s gives no vectors: %s; the model embeds them, and it is asked again in %g s",
            peer,
            why,
            REST_SECONDS,
        )
        self._resting[peer] = time.monotonic() + REST_SECONDS
