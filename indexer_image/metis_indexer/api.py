"""The indexer's HTTP API (port 7700): thin handlers over `answers.Answers`.

Bodies are parsed into pydantic models, and the service answers in them too
(schema.py). Each route is declared once, in ROUTES (http/routes.py): the router is
registered from it and the OpenAPI document made from it (http/openapi.py), with the
same models, so the document is what the API answers. Every domain error becomes
`{"error": {"code", "message"}}` in one middleware. The routes that cost model time
(reindex, evaluate), those that write or forget a note, and the one that hands out the
index's vectors to its peers take the operator's token when one is set (`token=True`: the
router checks it before the handler runs); one evaluation runs at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.http_exceptions import (
    ContentEncodingError,
    ContentLengthError,
    HttpProcessingError,
    LineTooLong,
    TransferEncodingError,
)
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from pydantic import BaseModel

from metis_indexer import console, limits, mcp, notes
from metis_indexer.errors import (
    BadRequest,
    Conflict,
    NotFound,
    Refusal,
    TimedOut,
    TooLarge,
    Unauthorized,
    UnsupportedEncoding,
)
from metis_indexer.http import openapi
from metis_indexer.http.routes import Answer, Failure, Handler, Route, codes, register
from metis_indexer.schema import (
    TOKEN_HEADER,
    Backup,
    BackupRequest,
    BackupsAnswer,
    DocumentsPage,
    DocumentsQuery,
    ErrorAnswer,
    ErrorBody,
    EvaluateRequest,
    Health,
    NoteAnswer,
    NoteRequest,
    NotesPage,
    NotesQuery,
    Readiness,
    ReindexAnswer,
    ReindexRequest,
    SearchAnswer,
    SearchRequest,
    StatusAnswer,
    VectorsAnswer,
    VectorsRequest,
    check_k,
    check_search,
    parse_body,
    parse_query,
)
from metis_indexer.search.evaluation import Evaluation
from metis_indexer.service.answers import Answers
from metis_indexer.service.service import Indexer

log = logging.getLogger("metis.api")

MAX_BODY = 64 * 1024
"""Bytes a request body may have: a 4,000-character question fits many times over."""
ESCAPE_MAX = len(json.dumps("\U0001f600")) - 2
"""Bytes of the longest JSON escape of one character: a character beyond the BMP as its
surrogate pair, `\\ud83d\\ude00` (12)."""
ID_ESCAPED = len(json.dumps("a")) - 2 + 5
"""Bytes of an id's character escaped (`\\u0061`: 6)."""
NOTE_BODY = (
    MAX_BODY
    + (notes.TEXT_MAX + notes.TITLE_MAX) * ESCAPE_MAX
    + notes.REPLACES_MAX * (63 * ID_ESCAPED + len('"", '))
)
"""Bytes a note's body may have (and an MCP request's, which may carry one): the longest
text and title a note may have with every character escaped as long as JSON escapes one,
its replaced ids escaped too, and MAX_BODY of room for the keys, the spaces and an MCP
envelope. The note's own bounds are counted in characters, however they were sent."""
ENCODINGS = ("gzip", "deflate", *(("br",) if HAS_BROTLI else ()), *(("zstd",) if HAS_ZSTD else ()))
"""The `Content-Encoding`s a body is decoded from (besides `identity`)."""
BODY_SECONDS = 30.0
"""Seconds a body may take to arrive whole once its request has begun."""
MAX_LINE = 8190
"""Bytes of the request line (aiohttp's default): past it, 414."""
MAX_FIELD = 16384
"""Bytes of one header (a long bearer token or cookie fits): past it, 431. It differs
from MAX_LINE so that the limit aiohttp's parser names tells which one was crossed."""


@dataclasses.dataclass
class Costly:
    """Who may start the work that costs model time, and the one evaluation running."""

    token: str | None = None
    """The operator's token (env METIS_API_TOKEN); None: the routes are open."""
    evaluation: asyncio.Task[Evaluation] | None = None

    def authorize(self, request: web.Request) -> bool:
        """True when the request carries the operator's token; 401 when one is set and
        the request does not carry it; False when none is set."""
        if self.token is None:
            return False
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if TOKEN_HEADER in request.headers:  # through the API server's proxy (kubectl metis)
            scheme, given = "bearer", request.headers[TOKEN_HEADER]
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized(
                "UNAUTHORIZED",
                f"{request.method} {request.path} needs the operator's token: "
                "Authorization: Bearer <token>",
            )
        if not hmac.compare_digest(
            given.strip().encode("utf-8", "backslashreplace"), self.token.encode()
        ):
            raise Unauthorized(
                "UNAUTHORIZED", f"the token sent to {request.path} is not the operator's"
            )
        return True

    def finished(self, started: float, task: asyncio.Task[Evaluation]) -> None:
        """Free the slot and say how the evaluation ended: here, because the client
        that asked may be gone."""
        self.evaluation = None
        took = time.monotonic() - started
        if task.cancelled():
            log.info(
                "evaluation cancelled after %.1f s: its client went away (or the indexer stops)",
                took,
            )
        elif (e := task.exception()) is not None:
            log.info("evaluation failed after %.1f s: %s", took, e)
        else:
            log.info("evaluation of %d questions done in %.1f s", task.result().cases, took)


answers_key = web.AppKey("answers", Answers)
costly_key = web.AppKey("costly", Costly)
indexer_key = web.AppKey("indexer", Indexer)


def error(status: int, code: str, message: str, headers: Any = None) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=headers
    )


def answer(model: BaseModel, status: int = 200, *, exclude_none: bool = False) -> web.Response:
    return web.json_response(text=model.model_dump_json(exclude_none=exclude_none), status=status)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every answer in the API's shape, counted by route and status."""
    try:
        response = await handler(request)
    except Refusal as e:
        response = error(e.status, e.code, e.message, dict(e.headers))
    except web.HTTPException as e:
        response = _http_error(request, e)
    except Exception:
        log.exception("error handling %s %s", request.method, request.path)
        response = error(500, "INTERNAL", "the indexer failed on this request; see its log")
    if request.content.exception() is not None:
        # A body that could not be decoded leaves the rest of the connection unreadable: the
        # answer says so (Connection: close) and the connection ends after it, rather than
        # a client's next request on it being cut.
        response.force_close()
        request.content.feed_eof()  # read no further: the connection closes
    route = request.match_info.route.name or "none"
    request.app[answers_key].metrics.requests.labels(route=route, code=response.status).inc()
    return response


def _http_error(request: web.Request, e: web.HTTPException) -> web.Response:
    """aiohttp's own refusals (no route, a method the route lacks, a body too large or
    undecodable) in the API's shape."""
    if isinstance(e, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(e.allowed_methods))
        return error(
            405,
            "METHOD_NOT_ALLOWED",
            f"{request.method} is not allowed on {request.path}; it takes {allowed}",
            {"Allow": allowed},
        )
    if isinstance(e, web.HTTPNotFound):
        return error(404, "NOT_FOUND", f"no route {request.method} {request.path}")
    if isinstance(e, web.HTTPRequestEntityTooLarge):
        return error(413, "INVALID_BODY", f"the body is larger than {MAX_BODY} bytes")
    return error(e.status, "INVALID_BODY" if e.status < 500 else "INTERNAL", e.reason)


async def read_body(request: web.Request, limit: int = MAX_BODY) -> bytes:
    """The whole body, at most `limit` bytes, within BODY_SECONDS: a client that sends
    half a body holds one waiting request, not a worker, and not for ever. A body that
    cannot be decoded (a broken `Content-Encoding`, a chunked body cut short) is
    INVALID_BODY naming why; one in an encoding not decoded here, ENCODING_UNSUPPORTED
    (read as it came, it would be taken for other words)."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", *ENCODINGS):
        raise UnsupportedEncoding(
            "ENCODING_UNSUPPORTED",
            f"the body's Content-Encoding {encoding[:40]!r} is not decoded here; send it in "
            f"{', '.join(ENCODINGS)} or none",
        )
    if (request.content_length or 0) > limit:  # refused before waiting for it
        raise _too_large(limit)
    try:
        async with asyncio.timeout(BODY_SECONDS):
            body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None
    except TimeoutError:
        raise TimedOut(
            "REQUEST_TIMEOUT", f"the body did not arrive whole within {BODY_SECONDS:g} s"
        ) from None
    except web.RequestPayloadError as e:
        why = e.__cause__ or e
        sent = request.headers.get("Content-Encoding")
        said = f" (Content-Encoding: {sent})" if sent else ""
        raise BadRequest(
            "INVALID_BODY", f"the body could not be read{said}: {_words(why)}"
        ) from None
    if len(body) > limit:
        raise _too_large(limit)
    return body


def _too_large(limit: int) -> TooLarge:
    return TooLarge("INVALID_BODY", f"the body is larger than {limit} bytes")


def _words(e: BaseException) -> str:
    """An aiohttp error's message without its status prefix ("400, message: ...")."""
    text = str(getattr(e, "message", "") or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


async def searched(answers: Answers, asked: bytes | SearchRequest) -> SearchAnswer:
    """A search from its body (or an already parsed request: the console's), every
    outcome counted in `metis_searches_total`: ok, degraded (answered without a model),
    error (refused, 4xx or 503) and failed (the indexer broke: 500)."""
    count = answers.metrics.searches
    try:
        req = asked if isinstance(asked, SearchRequest) else parse_body(SearchRequest, asked)
    except BadRequest:
        count.labels(mode="unknown", outcome="error").inc()  # no mode to name: not a search
        raise
    try:
        result = await answers.search(check_search(req))
    except Refusal:
        count.labels(mode=req.mode, outcome="error").inc()
        raise
    except Exception:
        count.labels(mode=req.mode, outcome="failed").inc()
        raise
    count.labels(
        mode=req.mode, outcome="degraded" if result.warnings and result.results else "ok"
    ).inc()
    for step, ms in result.took:
        answers.metrics.search_seconds.labels(step=step, mode=result.mode).observe(ms / 1000.0)
    return result


async def search(request: web.Request) -> web.Response:
    result = await searched(request.app[answers_key], await read_body(request))
    return answer(result, exclude_none=True)  # a score a step did not give is absent


async def status(request: web.Request) -> web.Response:
    stopping = request.app[indexer_key].stopping
    return answer(request.app[answers_key].status().model_copy(update={"stopping": stopping}))


async def documents(request: web.Request) -> web.Response:
    q = parse_query(DocumentsQuery, request.query)
    return answer(request.app[answers_key].documents(q.page, q.page_size, q.state))


def refuse_while_stopping(request: web.Request) -> None:
    """A stopping indexer has handed its writing over and exits in a moment: a pass or an
    evaluation asked of it would not end here, and its replacement takes them."""
    if request.app[indexer_key].stopping:
        raise Conflict(
            "STANDBY",
            "this indexer is stopping and its replacement takes over; ask again in a moment",
        )


async def reindex(request: web.Request) -> web.Response:
    req = parse_body(ReindexRequest, await read_body(request))
    refuse_while_stopping(request)
    request.app[answers_key].request_pass(full=req.full)
    return answer(ReindexAnswer(accepted=True, full=req.full), status=202)


async def evaluate(request: web.Request) -> web.Response:
    """One evaluation at a time. One whose client went away is cancelled (aiohttp
    cancels the handler) unless the operator asked for it: that one runs to its end
    and its figures are lost with the connection, but the model time is not wasted
    twice by a retry racing it."""
    costly = request.app[costly_key]
    operator = costly.token is not None  # the route has checked the token
    req = parse_body(EvaluateRequest, await read_body(request))
    check_k("k", req.k)
    refuse_while_stopping(request)
    if costly.evaluation is not None:
        raise Conflict(
            "EVALUATION_RUNNING", "an evaluation is running; ask again when it has finished"
        )
    task = asyncio.create_task(request.app[answers_key].evaluate(req.k), name="metis-evaluation")
    costly.evaluation = task
    task.add_done_callback(functools.partial(costly.finished, time.monotonic()))
    try:
        return answer(await (asyncio.shield(task) if operator else task))
    except asyncio.CancelledError:
        if operator:
            log.info("evaluation: its client went away; it goes on (the operator asked for it)")
        raise


async def vectors(request: web.Request) -> web.Response:
    """The vectors a peer asks for: no model time, but the index's data, so the token's."""
    req = parse_body(VectorsRequest, await read_body(request))
    return answer(await request.app[answers_key].vectors(req))


def write_refusal(request: web.Request) -> Refusal | None:
    """Why a request may not write the base's notes (MCP's `remember` and `forget`), as
    the HTTP write routes would refuse it; None: it may."""
    try:
        request.app[costly_key].authorize(request)
        refuse_while_stopping(request)
    except Refusal as e:
        return e
    return None


async def write_note(request: web.Request) -> web.Response:
    """A note kept on the base's drive and searchable when this returns: a write, so the
    token's when one is set."""
    req = parse_body(NoteRequest, await read_body(request, NOTE_BODY))
    refuse_while_stopping(request)
    note, new = await request.app[answers_key].write_note(req)
    return answer(note, status=201 if new else 200)


async def notes_page(request: web.Request) -> web.Response:
    q = parse_query(NotesQuery, request.query)
    return answer(request.app[answers_key].notes_page(q))


async def note(request: web.Request) -> web.Response:
    return answer(request.app[answers_key].note(request.match_info["id"]))


async def forget_note(request: web.Request) -> web.Response:
    refuse_while_stopping(request)
    return answer(await request.app[answers_key].forget_note(request.match_info["id"]))


async def start_backup(request: web.Request) -> web.Response:
    """A backup of the index and notes started: 202, it runs on (`service.backups`)."""
    req = parse_body(BackupRequest, await read_body(request))
    refuse_while_stopping(request)
    return answer(await request.app[indexer_key].backups.start(req.name), status=202)


async def backups(request: web.Request) -> web.Response:
    found = await request.app[indexer_key].backups.listed()
    return answer(BackupsAnswer(backups=found))


async def backup(request: web.Request) -> web.Response:
    return answer(await request.app[indexer_key].backups.one(_backup_name(request)))


async def delete_backup(request: web.Request) -> web.Response:
    await request.app[indexer_key].backups.delete(_backup_name(request))
    return web.Response(status=204)


def _backup_name(request: web.Request) -> str:
    """The `{name}` of a backup's path; BACKUP_NOT_FOUND for what names none."""
    name = request.match_info["name"]
    if not re.fullmatch(limits.BACKUP_NAME, name):
        raise NotFound("BACKUP_NOT_FOUND", f"{name[:80]!r} is not a backup's name")
    return name


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[answers_key].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    return answer(Health(ok=True))


async def readyz(request: web.Request) -> web.Response:
    answers = request.app[answers_key]
    if not answers.loaded:
        return error(503, "KNOWLEDGE_BASE_NOT_READY", f"the index is {answers.phase}")
    why = answers.not_ready()
    if why is not None:
        return error(503, "KNOWLEDGE_BASE_NOT_READY", why)
    return answer(Readiness(ok=True, phase=answers.phase))


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(token=request.app[costly_key].token is not None))


def reading(limit: int = MAX_BODY) -> tuple[Failure, ...]:
    """What reading a body of at most `limit` bytes answers besides the route's own
    (`read_body`); a body the route's model refuses is its 400 INVALID_BODY."""
    return (
        Failure(413, f"The body is larger than {limit} bytes", ("INVALID_BODY",)),
        Failure(
            415,
            f"The body's Content-Encoding is none of {', '.join(ENCODINGS)}",
            ("ENCODING_UNSUPPORTED",),
        ),
    )


NOT_LOADED = Failure(503, "The index is not loaded", ("KNOWLEDGE_BASE_NOT_READY",))
BACKUP_NAME = {"name": {"type": "string", "pattern": limits.BACKUP_NAME, "maxLength": 253}}
"""The path parameter of `/v1/backups/{name}`."""
NO_BACKUP_STORE = "NO_BACKUP_STORE"
STORE_DOWN = Failure(
    503,
    "The object store cannot be reached, or refuses this indexer's key pair",
    ("BACKUP_STORE_UNAVAILABLE",),
)
NOTE_ID = {"id": {"type": "string", "pattern": notes.ID_PATTERN}}
"""The path parameter of `/v1/notes/{id}`."""
UNAUTHORIZED = Failure(
    401,
    "Without the operator's token (Authorization: Bearer <token>)",
    ("UNAUTHORIZED",),
    Unauthorized.headers,
)
"""What a route that takes the token answers without it (`Costly.authorize`)."""

ROUTES: tuple[Route, ...] = (
    Route(
        "search",
        "POST",
        "/v1/search",
        search,
        "Hybrid search with citations",
        body=SearchRequest,
        answers=(Answer(200, "The results", SearchAnswer),),
        fails=(
            Failure(
                400,
                "The question or the body is refused",
                (
                    "QUERY_EMPTY",
                    "QUERY_TOO_LONG",
                    "TOP_K_OUT_OF_RANGE",
                    "INVALID_BODY",
                    "NO_EMBEDDING_MODEL",
                ),
            ),
            *reading(),
            Failure(
                503,
                "The index is not loaded, or mode dense without its model",
                ("KNOWLEDGE_BASE_NOT_READY", "EMBEDDING_MODEL_UNAVAILABLE"),
            ),
        ),
    ),
    Route(
        "status",
        "GET",
        "/v1/status",
        status,
        "Phase, totals and pass progress",
        answers=(Answer(200, "The status", StatusAnswer),),
    ),
    Route(
        "documents",
        "GET",
        "/v1/documents",
        documents,
        "Documents with their state and why one failed",
        query=DocumentsQuery,
        answers=(Answer(200, "A page of documents", DocumentsPage),),
        fails=(Failure(400, "A parameter out of its bounds", ("INVALID_BODY",)),),
    ),
    Route(
        "reindex",
        "POST",
        "/v1/reindex",
        reindex,
        "Start a pass (full: read everything again)",
        body=ReindexRequest,
        body_required=False,
        token=True,
        answers=(Answer(202, "Accepted", ReindexAnswer),),
        fails=(
            Failure(400, "The body is refused", ("INVALID_BODY",)),
            Failure(409, "A replacement is taking over, or this indexer is stopping", ("STANDBY",)),
            *reading(),
        ),
    ),
    Route(
        "evaluate",
        "POST",
        "/v1/evaluate",
        evaluate,
        "Evaluate .metis/evals.jsonl of the source drives, one at a time",
        body=EvaluateRequest,
        body_required=False,
        token=True,
        answers=(Answer(200, "The figures", Evaluation),),
        fails=(
            Failure(
                400,
                "The body or the evaluation set is refused",
                (
                    "EVAL_EMPTY",
                    "EVAL_FILE",
                    "EVAL_CASE_INVALID",
                    "EVAL_TOO_LARGE",
                    "TOP_K_OUT_OF_RANGE",
                    "INVALID_BODY",
                    "QUERY_EMPTY",
                    "QUERY_TOO_LONG",
                ),
            ),
            Failure(
                409,
                "An evaluation is running, or this indexer is stopping",
                ("EVALUATION_RUNNING", "STANDBY"),
            ),
            *reading(),
            Failure(
                503,
                "The index is not loaded or cannot be read, or its model does not answer",
                ("KNOWLEDGE_BASE_NOT_READY", "EMBEDDING_MODEL_UNAVAILABLE"),
            ),
        ),
    ),
    Route(
        "write_note",
        "POST",
        "/v1/notes",
        write_note,
        "Keep a note on the base's own drive, searchable when this returns",
        description="The note is indexed as a document of the source "
        "`metis-<name>`: by words at once, by meaning once the embedding model "
        "has embedded it (within seconds when it answers). A note naming others "
        "in `replaces` ranks before them in results; they stay searchable.",
        body=NoteRequest,
        token=True,
        answers=(
            Answer(201, "The note, kept", NoteAnswer),
            Answer(200, "The note of this id, written over", NoteAnswer),
        ),
        fails=(
            Failure(
                400,
                "The note is refused",
                (
                    "INVALID_BODY",
                    "NOTE_EMPTY",
                    "NOTE_TOO_LONG",
                    "NOTE_ID_INVALID",
                    "NOTE_REPLACES_TOO_MANY",
                ),
            ),
            Failure(
                409,
                "The notes held refuse the replacement (an unknown note, the note itself, a "
                f"cycle, a chain over {notes.REPLACES_DEPTH_MAX} notes); the base runs several "
                "replicas; a replacement is taking over, or this indexer is stopping",
                (
                    "NOTE_REPLACES_UNKNOWN",
                    "NOTE_REPLACES_ITSELF",
                    "NOTE_REPLACES_CYCLE",
                    "NOTE_REPLACES_TOO_DEEP",
                    "NOTES_REPLICATED",
                    "STANDBY",
                ),
            ),
            *reading(NOTE_BODY),
            NOT_LOADED,
            Failure(
                507,
                "The index drive has no room for the note: nothing of it is kept",
                ("NOTES_DRIVE_FULL",),
            ),
        ),
    ),
    Route(
        "notes",
        "GET",
        "/v1/notes",
        notes_page,
        "The base's notes, newest first",
        query=NotesQuery,
        answers=(Answer(200, "A page of notes", NotesPage),),
        fails=(Failure(400, "A parameter out of its bounds", ("INVALID_BODY",)), NOT_LOADED),
    ),
    Route(
        "note",
        "GET",
        "/v1/notes/{id}",
        note,
        "One note",
        path_parameters=NOTE_ID,
        answers=(Answer(200, "The note", NoteAnswer),),
        fails=(
            Failure(400, "Not a note's id", ("NOTE_ID_INVALID",)),
            Failure(404, "The base holds no such note", ("NOTE_NOT_FOUND",)),
            Failure(
                409,
                "The note's Markdown is on the drive (and found by search) but its record "
                "cannot be read: DELETE removes it",
                ("NOTE_UNREADABLE",),
            ),
            NOT_LOADED,
        ),
    ),
    Route(
        "forget_note",
        "DELETE",
        "/v1/notes/{id}",
        forget_note,
        "Forget a note: it is removed from the drive and the index",
        description="The notes it replaced hold again, unless another "
        "replaces them. A note whose record cannot be read is removed too, "
        "answered with what its Markdown holds.",
        path_parameters=NOTE_ID,
        token=True,
        answers=(Answer(200, "The note forgotten", NoteAnswer),),
        fails=(
            Failure(400, "Not a note's id", ("NOTE_ID_INVALID",)),
            Failure(404, "The base holds no such note", ("NOTE_NOT_FOUND",)),
            Failure(
                409,
                "The base runs several replicas; a replacement is taking over, or this "
                "indexer is stopping",
                ("NOTES_REPLICATED", "STANDBY"),
            ),
            NOT_LOADED,
        ),
    ),
    Route(
        "vectors",
        "POST",
        "/v1/vectors",
        vectors,
        "The vectors this index holds of passages, by hash (for peers)",
        description="What another replica of the base asks before it sends "
        "passages to the model. Each hash is BLAKE2b-128, hex, of a passage exactly "
        "as the model is sent it (the document prefix, title and headings, text). "
        "The answer gives the positions found and their vectors as base64 of "
        "float32 little-endian, `dimensions` values each, in that order; only of "
        "the model asked for, and none (with a reason) while the index's vectors "
        "are another model's or its model changes.",
        body=VectorsRequest,
        token=True,
        answers=(Answer(200, "The vectors found", VectorsAnswer),),
        fails=(Failure(400, "The body is refused", ("INVALID_BODY",)), *reading()),
    ),
    Route(
        "start_backup",
        "POST",
        "/v1/backups",
        start_backup,
        "Back up the index and the notes to the base's object store",
        description="Answers at once (202) with the backup Running; it runs on, searches "
        "and passes going on meanwhile. Its objects (index.sqlite3, notes.tar) are "
        "uploaded under `<prefix>/<name>/` of the bucket, then manifest.json last: a "
        "backup without its manifest (cut short) is none.",
        body=BackupRequest,
        token=True,
        answers=(Answer(202, "The backup, started", Backup),),
        fails=(
            Failure(400, "The body is refused (a name that is not an object's)", ("INVALID_BODY",)),
            Failure(
                409,
                "No backup store is configured; a backup is running; the store holds a "
                "backup of that name; or this indexer is stopping",
                (NO_BACKUP_STORE, "BACKUP_RUNNING", "BACKUP_EXISTS", "STANDBY"),
            ),
            *reading(),
            STORE_DOWN,
        ),
    ),
    Route(
        "backups",
        "GET",
        "/v1/backups",
        backups,
        "The backups in the base's object store",
        description="Every completed backup (one whose manifest is written), and the one "
        "running or the last one failed of this indexer.",
        answers=(Answer(200, "The backups, by name", BackupsAnswer),),
        fails=(Failure(409, "No backup store is configured", (NO_BACKUP_STORE,)), STORE_DOWN),
    ),
    Route(
        "backup",
        "GET",
        "/v1/backups/{name}",
        backup,
        "One backup",
        path_parameters=BACKUP_NAME,
        answers=(Answer(200, "The backup", Backup),),
        fails=(
            Failure(404, "The store holds no such backup", ("BACKUP_NOT_FOUND",)),
            Failure(409, "No backup store is configured", (NO_BACKUP_STORE,)),
            STORE_DOWN,
        ),
    ),
    Route(
        "delete_backup",
        "DELETE",
        "/v1/backups/{name}",
        delete_backup,
        "Delete a backup: its manifest first, then its objects",
        path_parameters=BACKUP_NAME,
        token=True,
        answers=(Answer(204, "Deleted"),),
        fails=(
            Failure(404, "The store holds no such backup", ("BACKUP_NOT_FOUND",)),
            Failure(
                409,
                "No backup store is configured, or the backup is running",
                (NO_BACKUP_STORE, "BACKUP_RUNNING"),
            ),
            STORE_DOWN,
        ),
    ),
    Route(
        "metrics",
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics",
        answers=(
            Answer(200, "Text exposition", media_type="text/plain", schema={"type": "string"}),
        ),
    ),
    Route("healthz", "GET", "/healthz", healthz, "Liveness", answers=(Answer(200, "Up", Health),)),
    Route(
        "readyz",
        "GET",
        "/readyz",
        readyz,
        "Readiness: the index is loaded (with peers: and has had one whole pass)",
        answers=(Answer(200, "Ready", Readiness),),
        fails=(
            Failure(
                503,
                "The index is not loaded, or (with peers) its first pass has not ended",
                ("KNOWLEDGE_BASE_NOT_READY",),
            ),
        ),
    ),
    Route(
        "openapi",
        "GET",
        "/openapi.json",
        openapi_json,
        "This document",
        answers=(Answer(200, "OpenAPI 3.1", schema={"type": "object"}),),
    ),
)
"""The API's routes, one declaration each: the router registers them in this order (each
that takes the token checking it first), and the OpenAPI document lists them so."""

ANYWHERE = (
    "NOT_FOUND",
    "METHOD_NOT_ALLOWED",
    "REQUEST_TIMEOUT",
    "INVALID_REQUEST",
    "URI_TOO_LONG",
    "HEADERS_TOO_LARGE",
    "INTERNAL",
)
"""The codes any request may be answered besides its route's: no route, a method the route
lacks (`_http_error`); a body too slow (`read_body`); what the HTTP parser refuses
(`parser_refusal`); the indexer failing."""
CODES = codes(
    ROUTES, UNAUTHORIZED, *ANYWHERE, *dict.fromkeys(code for code, _ in mcp.REFUSALS.values())
)
"""Every code the indexer answers: its routes', those of any request, and those of the MCP
transport's own checks (its Origin and Host: FORBIDDEN, MISDIRECTED_REQUEST)."""

INFO = {
    "title": "Metis indexer",
    "version": "1",
    "description": "Any route answers 404 NOT_FOUND for a path it does not have and "
    "405 METHOD_NOT_ALLOWED (with Allow) for a method it does not take; "
    f"408 REQUEST_TIMEOUT for a body not whole within {BODY_SECONDS:g} "
    "s; 400 INVALID_REQUEST, 414 URI_TOO_LONG (a request line over "
    f"{MAX_LINE} bytes) and 431 HEADERS_TOO_LARGE (a header over "
    f"{MAX_FIELD} bytes) for what is not valid HTTP. Every error is "
    'JSON: {"error": {"code", "message"}}. MCP (Streamable '
    "HTTP, stateless, JSON answers) is served at POST /mcp.",
}


def openapi_document(*, token: bool = False) -> dict[str, Any]:
    """OpenAPI 3.1 of ROUTES. `token`: the routes that take it need the operator's token
    (only then do they answer 401)."""
    return openapi.document(
        ROUTES,
        info=INFO,
        token=UNAUTHORIZED if token else None,
        codes=CODES,
        error=ErrorAnswer,
    )


def setup_routes(app: web.Application) -> None:
    register(app, ROUTES, lambda request: request.app[costly_key].authorize(request))


class _Connection(RequestHandler):
    """aiohttp's connection, answering what its HTTP parser refuses (a request line or a
    header too long, a malformed request, a broken chunked body) in the API's error
    shape: aiohttp answers those in text/plain before any middleware, and offers no hook
    for it (aio-libs/aiohttp#3287). Each refusal is counted in `requests` (route none)."""

    def __init__(self, manager: web.Server, *, requests: Counter, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.requests = requests

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the answer had begun; no error can follow it")
        status, code, said = parser_refusal(status, exc)
        log.info(
            "refused a request from %s: %s (%s)",
            request.remote,
            said,
            _words(exc) if exc else status,
        )
        response = error(status, code, said)
        response.force_close()
        self.requests.labels(route="none", code=status).inc()
        return response


def parser_refusal(status: int, exc: BaseException | None) -> tuple[int, str, str]:
    """Status, code and words for what aiohttp's protocol could not hand to a route. The
    two line limits differ, so the limit a `LineTooLong` names says which was crossed."""
    if isinstance(exc, LineTooLong):
        if str(exc.args[1]) == str(MAX_FIELD):
            return 431, "HEADERS_TOO_LARGE", f"a header is longer than {MAX_FIELD:,} bytes"
        return 414, "URI_TOO_LONG", f"the request line is longer than {MAX_LINE:,} bytes"
    if isinstance(exc, ContentEncodingError) and "can not decode" in _words(exc).lower():
        return (
            415,
            "ENCODING_UNSUPPORTED",
            f"the body's Content-Encoding is not decoded here ({_words(exc)}); send it in "
            f"{', '.join(ENCODINGS)} or none",
        )
    if isinstance(exc, ContentEncodingError):
        return 400, "INVALID_BODY", f"the body is not what its Content-Encoding says: {_words(exc)}"
    if isinstance(exc, TransferEncodingError | ContentLengthError):
        return 400, "INVALID_BODY", f"the body was cut short or malformed: {_words(exc)}"
    if isinstance(exc, HttpProcessingError) or status == 400:
        return (
            400,
            "INVALID_REQUEST",
            f"the request is not valid HTTP/1.1: {_words(exc)}"
            if exc
            else "the request is not valid HTTP/1.1",
        )
    return status, "INTERNAL", "the indexer failed on this request; see its log"


class _Server(web.Server):
    """aiohttp's server, its connections `_Connection`s counting into `requests`."""

    def __init__(self, *args: Any, requests: Counter, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = requests

    def __call__(self) -> RequestHandler:
        return _Connection(self, loop=self._loop, requests=self.requests, **self._kwargs)


def runner(app: web.Application) -> web.AppRunner:
    """The app's runner: no access log, a request whose client went away is cancelled
    (it stops costing model time), the line limits above, and the parser's refusals in
    the API's shape, counted."""
    requests = app[answers_key].metrics.requests

    class Runner(web.AppRunner):
        async def _make_server(self) -> web.Server:
            made = await super()._make_server()
            return _Server(
                made.request_handler,
                request_factory=made.request_factory,
                handler_cancellation=made.handler_cancellation,
                requests=requests,
                **made._kwargs,
            )

    return Runner(
        app,
        access_log=None,
        handler_cancellation=True,
        max_line_size=MAX_LINE,
        max_field_size=MAX_FIELD,
    )


def create_app(
    indexer: Indexer, *, token: str | None = None, config_path: Path | None = None
) -> web.Application:
    """The app; the indexer starts and stops with it. `token`: the operator's, required on
    the routes that cost model time (None: they are open, as locally). `config_path`: the
    configuration file to follow; a change is applied while the app runs."""
    answers = indexer.answers
    app = web.Application(middlewares=[errors], client_max_size=NOTE_BODY)
    app[answers_key] = answers
    app[costly_key] = Costly(token=token)
    app[indexer_key] = indexer

    async def running(_: web.Application) -> AsyncIterator[None]:
        started = time.monotonic()
        await indexer.start(follow=config_path)
        log.info("indexer started in %.2f s", time.monotonic() - started)
        yield
        await indexer.stop()

    async def ask(req: SearchRequest) -> SearchAnswer | ErrorBody:
        try:
            return await searched(answers, req)
        except Refusal as e:
            return ErrorBody(code=e.code, message=e.message)

    async def closing(_: web.Request, response: web.StreamResponse) -> None:
        """A stopping indexer closes each connection after its answer: a client's next
        request opens one to an indexer that stays, none is cut when this one exits."""
        if indexer.stopping:
            response.force_close()
            response.headers["Connection"] = "close"  # the hook runs after headers are made

    app.cleanup_ctx.append(running)
    app.on_response_prepare.append(closing)
    setup_routes(app)
    console.add_search_page(app, ask, answers.config.name)
    read_note = functools.partial(read_body, limit=NOTE_BODY)  # `remember` carries a note
    mcp.mount(app, answers, functools.partial(searched, answers), read_note, write_refusal)
    return app
