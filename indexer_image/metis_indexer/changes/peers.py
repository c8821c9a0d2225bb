"""Vectors from the base's other replicas (`IndexerConfig.peers`), so that a replica that
starts with an empty index costs the embedding model only what no other replica holds.

A passage is asked for by the hash of exactly the text the model is sent (the document
prefix, the title and headings, the text): a vector a peer gives for it should be the one
the model would give. A peer gives only the vectors of the model asked for, and none while
its own model changes. Asking is never an error of a pass: a peer that is down, slow,
refuses or answers for another model is left alone for a while (`REST_SECONDS`), and
the passages it did not give go to the model as before.

A peer's answer is input, not truth: the replica trusts the model, not the peer. Every
vector of a peer's first `NEW_CHECKS`, and then one in `1 / CHECK_RATE` at random, is
embedded by the model too and compared (`AGREE`); an answer with one vector unlike the
model's is refused whole, and the peer is not asked for `DISTRUST_SECONDS`. An answer has
`ASK_SECONDS` for the whole request and `answer_limit` bytes; one that takes longer or is
larger is refused the same way. A full reindex asks the model alone.

Each index answers from a map of its chunks' hashes to their ids, built from the stored
texts on the first question and brought up to date with the chunks written since; every
vector given is checked against its chunk's stored text first, so a map a little behind
the index misses a vector, never gives a wrong one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import hashlib
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import httpx
import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from metis_indexer.index import texts
from metis_indexer.index.store import Store
from metis_indexer.schema import HASHES_MAX, VectorsAnswer, VectorsRequest

log = logging.getLogger("metis.indexer")

ASK_SECONDS = 5.0
"""How long a peer's whole answer is waited for, from the request to its last byte: it reads
a few hundred rows of its index, in milliseconds, and sends a few MB at most; past this it
is slow or gone (or sends a byte at a time), and the model embeds what it would have given."""
CONNECT_SECONDS = 1.0
REST_SECONDS = 60.0
"""How long a peer that did not answer (or answered for another model) is not asked
again: a peer that is gone costs a pass one wait a minute, not one a batch."""
DISTRUST_SECONDS = 600.0
"""How long a peer whose answer was refused (vectors unlike the model's, an answer that
does not add up, too large or too slow) is not asked again: it is broken, not busy, and
each of its answers costs the model the vectors checked in it."""
AGREE = 0.95
"""The least cosine a peer's vector may have to the model's own vector of the same passage.
The same model gives the same passage the same vector up to float rounding (cosine 0.9999
or more for the reference vectors, MODELS.md); a dynamically quantised model's vector moves
with its batch (cosine 0.97-0.99, MODELS.md), which a peer's batch and this replica's may
differ in. Another passage's vector is below it: over the 994 pairs of a chunk and the next
one of its document in the Helm docs (107 documents, all-MiniLM-L6-v2, measured 2026-12-07),
the median cosine is 0.68, the 99th percentile 0.93, and 0.3 % reach 0.95 (near-duplicates,
whose vectors are all but interchangeable); a random vector has about 0 (1 / sqrt of the
dimensions). One passage embedded alone and in a batch: cosine 1.000000 at least."""
NEW_CHECKS = 16
"""Vectors of a peer checked, every one, before it is trusted with sampling: a peer that
gives wrong vectors from the start (another model under the same name, rows shifted, zeros
or noise) is caught by its first vector checked and gives none that is used; one that gives
a share f of wrong vectors is caught within these with the chance 1 - (1 - f) ** 16 (82 %
at f = 0.1), and later by the sample. A base of a few chunks costs a new replica its
model calls: a few chunks."""
CHECK_RATE = 1 / 16
"""The share of a trusted peer's vectors checked, each drawn at random: a peer whose vectors
turn wrong is caught within 16 vectors on average (within 48 at 95 %), for a sixteenth of
the model calls the peer saves."""
ANSWER_SLACK = 4096
"""Bytes of an answer's JSON besides its vectors and positions (keys, the model's name)."""
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
) -> dict[int, npt.NDArray[np.float32]] | str:
    """The vectors of a peer's answer that may be used, by position in what was asked;
    why none may be where the answer does not add up (another model's or of other
    dimensions, positions out of range, repeated or out of order, vectors short, not
    finite or of no length: a vector of zeros is as near every question as any other)."""
    found = answer.found
    if not found:
        return {}
    if answer.model != model or answer.dimensions != dimensions:
        return f"it gave vectors of {answer.model} in {answer.dimensions} dimensions"
    if found != sorted(set(found)) or found[0] < 0 or found[-1] >= asked:
        return "its answer's positions are not those asked, once each and in order"
    rows = decode_rows(answer.vectors, len(found), dimensions)
    if rows is None:
        return "its answer's vectors are not as many as its positions"
    if not np.isfinite(rows).all():
        return "its answer holds values that are not finite"
    if (np.linalg.norm(rows, axis=1) < 1e-6).any():
        return "its answer holds vectors of zeros"
    return {at: rows[i] for i, at in enumerate(found)}


def answer_limit(count: int, dimensions: int) -> int:
    """Bytes an answer to `count` hashes may take: every one found, its vector in base64 (4
    bytes a value, 4 characters for each 3 bytes), its position (up to 4 digits and a
    comma), and `ANSWER_SLACK`."""
    return 4 * -(-4 * count * dimensions // 3) + 5 * count + ANSWER_SLACK


def to_check(given: Sequence[int], checked: int, draw: Callable[[], float]) -> list[int]:
    """The positions of a peer's vectors the model embeds too: every one while the peer
    has had fewer than `NEW_CHECKS` checked (`checked`), then each with `CHECK_RATE`'s
    chance (`draw`: a uniform number in [0, 1))."""
    out: list[int] = []
    for at in given:
        if checked + len(out) < NEW_CHECKS or draw() < CHECK_RATE:
            out.append(at)
    return out


def cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """Row by row, the cosine of `a`'s row to `b`'s (0 where either has no length)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    dots = np.einsum("ij,ij->i", a64, b64)
    found = np.zeros(len(dots), dtype=np.float64)
    np.divide(dots, norms, out=found, where=norms > 0)
    return found


def unlike(peer: npt.NDArray[np.float32], model: npt.NDArray[np.float32]) -> str | None:
    """Why a peer's vectors (rows of `peer`) are not the model's of the same passages
    (`model`, in the same order): some cosine below `AGREE`. None: they agree."""
    found = cosines(peer, model)
    below = int(np.count_nonzero(found < AGREE))
    if not below:
        return None
    return (
        f"{below} of the {len(found)} of its vectors checked are unlike the model's own "
        f"(cosine {float(found.min()):.3f} at worst; {AGREE} at least is the same passage)"
    )


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


Check = Callable[[list[int]], Awaitable[npt.NDArray[np.float32]]]
"""Embeds, by the model, the passages at these positions of those asked: their vectors, in
that order."""


@dataclasses.dataclass
class Given:
    """What asking the peers gave, by position in what was asked."""

    by_peers: dict[int, npt.NDArray[np.float32]] = dataclasses.field(default_factory=dict)
    by_model: dict[int, npt.NDArray[np.float32]] = dataclasses.field(default_factory=dict)
    """The vectors the model embedded to check a peer's: the model's, used as they are."""

    def left(self, count: int) -> list[int]:
        held = collections.ChainMap[int, npt.NDArray[np.float32]](self.by_peers, self.by_model)
        return left_to_embed(count, held)


class Refused(Exception):
    """A peer's answer that is not used, and why; `kind` labels the metric."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why


REFUSALS = ("unlike_model", "malformed", "too_large", "too_slow")
"""Why a peer's answer is refused (the metric's label), each making the peer distrusted."""


class PeerVectors:
    """Asks the peers for vectors, and checks what they give against the model; shared by a
    pass's documents."""

    def __init__(
        self,
        token: str | None,
        refused: Callable[[str], None] | None = None,
        checked: Callable[[int], None] | None = None,
    ) -> None:
        """`refused`: told each refusal's kind (`REFUSALS`); `checked`: the vectors checked."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(ASK_SECONDS, connect=CONNECT_SECONDS), headers=headers
        )
        self._resting: dict[str, float] = {}
        """Peers not asked until then (a monotonic time)."""
        self._checked: dict[str, int] = {}
        """Vectors of each peer checked and found the model's since it was last refused."""
        self._probation: dict[str, asyncio.Lock] = {}
        """Held around the check of a peer's answer until it has had `NEW_CHECKS` checked."""
        self.distrusted: dict[str, tuple[float, str, str]] = {}
        """Peers whose answer was refused: until when (a monotonic time, and the clock's, as
        the status says it: a text that does not change at each look), and why."""
        self._on_refused = refused or (lambda kind: None)
        self._on_checked = checked or (lambda n: None)

    async def close(self) -> None:
        await self._client.aclose()

    def warnings(self, now: float) -> list[str]:
        """What the status says of the peers not asked now because an answer was refused."""
        return [
            f"the vectors of peer {peer} are not used until {at}: {why}"
            for peer, (until, at, why) in sorted(self.distrusted.items())
            if until > now
        ]

    async def vectors(
        self, peers: Sequence[str], model: str, dimensions: int, hashes: Sequence[str], check: Check
    ) -> Given:
        """The vectors the peers give of `hashes`, by position: each peer in turn is asked
        for those the ones before did not give, and its answers checked against the model
        (`check`)."""
        given = Given()
        for peer in askable(peers, self._resting, time.monotonic()):
            wanted = given.left(len(hashes))
            for start in range(0, len(wanted), HASHES_MAX):
                part = wanted[start : start + HASHES_MAX]
                answer = await self._ask(peer, model, dimensions, [hashes[i] for i in part])
                if answer is None:
                    break
                rows = {part[at]: row for at, row in answer.items()}
                if not await self._checks_out(peer, rows, check, given):
                    break
                given.by_peers.update(rows)
            if not given.left(len(hashes)):
                break
        return given

    async def _checks_out(
        self, peer: str, rows: dict[int, npt.NDArray[np.float32]], check: Check, given: Given
    ) -> bool:
        """Whether a peer's vectors agree with the model's where the model embeds them too
        (those positions' vectors then are the model's, taken out of `rows`); False, and the
        peer distrusted, where one does not. A peer not trusted yet has its answers checked
        one at a time: a pass's documents ask at once, and an answer is not taken on trust
        while the checks of those before it are still out."""
        if self._checked.get(peer, 0) >= NEW_CHECKS:
            return await self._check(peer, rows, check, given)
        async with self._probation.setdefault(peer, asyncio.Lock()):
            if self._resting.get(peer, 0.0) > time.monotonic():
                return False  # refused while this answer waited
            return await self._check(peer, rows, check, given)

    async def _check(
        self, peer: str, rows: dict[int, npt.NDArray[np.float32]], check: Check, given: Given
    ) -> bool:
        positions = to_check(sorted(rows), self._checked.get(peer, 0), random.random)
        if not positions:
            return True
        mine = await check(positions)
        self._on_checked(len(positions))
        theirs = np.stack([rows.pop(at) for at in positions])
        given.by_model.update(zip(positions, mine, strict=True))
        why = unlike(theirs, mine)
        if why is not None:
            self._distrust(peer, Refused("unlike_model", why))
            return False
        self._checked[peer] = self._checked.get(peer, 0) + len(positions)
        return True

    async def _ask(
        self, peer: str, model: str, dimensions: int, hashes: list[str]
    ) -> dict[int, npt.NDArray[np.float32]] | None:
        """What one peer gives; None (and the peer rests, or is distrusted) where it did not
        answer, answered for another model, or its answer is refused."""
        body = VectorsRequest(model=model, hashes=hashes).model_dump()
        limit = answer_limit(len(hashes), dimensions)
        try:
            async with asyncio.timeout(ASK_SECONDS):
                status, content = await self._post(f"{peer}/v1/vectors", body, limit)
            if status != 200:
                self._rest(peer, f"it answered {status}")
                return None
            answer = VectorsAnswer.model_validate_json(content)
        except TimeoutError:
            self._distrust(
                peer, Refused("too_slow", f"its answer took over {ASK_SECONDS:g} s, whole")
            )
            return None
        except Refused as e:
            self._distrust(peer, e)
            return None
        except httpx.HTTPError as e:
            self._rest(peer, f"it did not answer ({type(e).__name__}: {e})")
            return None
        except ValidationError:
            self._distrust(peer, Refused("malformed", "its answer is not a vectors answer"))
            return None
        if answer.model != model and not answer.found:
            self._rest(peer, answer.reason or f"it holds the vectors of {answer.model}")
            return None
        rows = usable(answer, model, dimensions, len(hashes))
        if isinstance(rows, str):
            self._distrust(peer, Refused("malformed", rows))
            return None
        return rows

    async def _post(self, url: str, body: dict[str, object], limit: int) -> tuple[int, bytes]:
        """A request's status and body; Refused where the body is longer than `limit`
        bytes (said, or as read: it is not read further)."""
        async with self._client.stream("POST", url, json=body) as response:
            said = response.headers.get("Content-Length", "")
            if said.isdigit() and int(said) > limit:
                raise Refused("too_large", f"its answer is {int(said)} bytes, over {limit}")
            content = bytearray()
            async for part in response.aiter_bytes():
                content += part
                if len(content) > limit:
                    raise Refused("too_large", f"its answer is over {limit} bytes")
            return response.status_code, bytes(content)

    def _rest(self, peer: str, why: str) -> None:
        log.warning(
            "peer %s gives no vectors: %s; the model embeds them, and it is asked again in %g s",
            peer,
            why,
            REST_SECONDS,
        )
        self._resting[peer] = time.monotonic() + REST_SECONDS

    def _distrust(self, peer: str, refused: Refused) -> None:
        """A peer's answer refused: the model embeds what it gave, and the peer is not asked
        for `DISTRUST_SECONDS`, then checked one by one again."""
        log.warning(
            "peer %s: its vectors are refused: %s; the model embeds them, and it is not "
            "asked again for %g s",
            peer,
            refused.why,
            DISTRUST_SECONDS,
        )
        until = time.monotonic() + DISTRUST_SECONDS
        at = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + DISTRUST_SECONDS))
        self._resting[peer] = until
        self.distrusted[peer] = (until, at, refused.why)
        self._checked.pop(peer, None)
        self._on_refused(refused.kind)
