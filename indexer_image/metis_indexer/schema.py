"""The bodies the indexer's API takes and gives, as pydantic models.

Requests are parsed with strict types (`"5"` is not a top_k) and then checked by
`check_*` functions, so each limit gets its own error code rather than a
generic INVALID_BODY. The limits still appear in the models' JSON Schemas (and so
in the OpenAPI document) through `json_schema_extra`, from the same constants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metis_indexer import notes
from metis_indexer.documents import Kind
from metis_indexer.errors import BadRequest
from metis_indexer.limits import BACKUP_NAME, VectorKind

Mode = Literal["hybrid", "dense", "keyword"]
_B = TypeVar("_B", bound=BaseModel)
QUERY_MAX = 4000
TOP_K_MAX = 50
PAGE_SIZE_MAX = 1000
Phase = Literal["loading", "scanning", "indexing", "ready", "waiting", "standby"]
DocumentState = Literal["indexed", "failed"]
HASHES_MAX = 1024
"""Passage hashes one `POST /v1/vectors` asks for at most: 1,024 of them are 36 KB, within
the 64 KiB a body may have, and their vectors a few MB at most (1,024 dimensions)."""
TOKEN_HEADER = "X-Metis-Token"
"""The base's token as a header of its own, for a client that reaches the indexer through
the Kubernetes API server's service proxy (`kubectl metis note`): the API server takes the
Authorization header as its own and drops it before proxying."""

PassageHash = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]

_QUERY_SCHEMA: dict[str, Any] = {
    "minLength": 1,
    "maxLength": QUERY_MAX,
    "pattern": r"\S",
    "description": f"The question: 1 to {QUERY_MAX} characters, not only blanks "
    "(QUERY_EMPTY, QUERY_TOO_LONG).",
}


def _k_schema(name: str) -> dict[str, Any]:
    return {
        "minimum": 1,
        "maximum": TOP_K_MAX,
        "description": f"{name}: 1 to {TOP_K_MAX} (TOP_K_OUT_OF_RANGE).",
    }


class _Body(BaseModel):
    """A request body: no unknown fields, no coercion (`"5"`, `5.0`, `true` are not 5)."""

    model_config = ConfigDict(extra="forbid", strict=True)


@dataclasses.dataclass(frozen=True)
class Asked:
    """How a search filter is asked outside a JSON body: `name`, its flag (`metis search
    --NAME`) and its Search page parameter; `label` and `example`, its field on that page;
    `help`, what it keeps (the flag's help)."""

    name: str
    label: str
    example: str = ""
    help: str | None = None


# The search filters, each declared once: the API's `filters`, and through `FILTERS` the
# flags of `metis search`, the parameters of MCP's `search` and the Search page's fields.
class Filters(_Body):
    path_prefix: Annotated[
        str | None,
        Asked("prefix", "Path prefix", "policies/", "only documents whose path starts with this"),
    ] = None
    kinds: Annotated[list[Kind] | None, Asked("kind", "Kinds")] = None
    sources: Annotated[
        list[str] | None,
        Asked("source", "Sources", "docs, runbooks", "only documents of this source"),
    ] = None


@dataclasses.dataclass(frozen=True)
class Filter:
    """One field of `Filters` as a flag, a tool's parameter or a form's field asks it."""

    field: str
    """Its name in the body's `filters`."""
    asked: Asked
    schema: Mapping[str, Any]
    """Its JSON Schema with an absent filter as null (`"type": [T, "null"]`), its `$ref`s
    inlined, without titles."""

    @property
    def many(self) -> bool:
        """A list: the flag or the parameter is repeated, once per value."""
        return "array" in self.schema["type"]

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The values it may take (each of a list's), or None: any string."""
        enum = self.schema.get("items", self.schema).get("enum")
        return None if enum is None else tuple(enum)


def _filters() -> tuple[Filter, ...]:
    described = Filters.model_json_schema()
    defs = described.get("$defs", {})

    def inlined(schema: Mapping[str, Any]) -> dict[str, Any]:
        """`schema` with each `$ref` replaced by what it names (less its title and words)."""
        if "$ref" in schema:
            named = defs[schema["$ref"].rsplit("/", 1)[1]]
            schema = {k: v for k, v in named.items() if k not in ("title", "description")}
        return {k: inlined(v) if isinstance(v, Mapping) else v for k, v in schema.items()}

    made = []
    for name, field in Filters.model_fields.items():
        said = described["properties"][name]
        (given,) = [s for s in said["anyOf"] if s != {"type": "null"}]
        schema = inlined(given)
        schema["type"] = [schema["type"], "null"]
        schema |= {"description": said["description"]} if "description" in said else {}
        (asked,) = [m for m in field.metadata if isinstance(m, Asked)]
        made.append(Filter(name, asked, schema))
    return tuple(made)


FILTERS = _filters()
"""Each search filter, in the order `Filters` declares them."""


class SearchRequest(_Body):
    query: str = Field(json_schema_extra=_QUERY_SCHEMA)
    top_k: int = Field(5, json_schema_extra=_k_schema("Results"))
    mode: Mode = "hybrid"
    rerank: bool | None = None
    filters: Filters | None = None


class NoteCitation(BaseModel):
    """What a note's result says of the note: when it was written, and whether a newer
    note replaced it (its results then come after those of notes that still hold)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    written_at: str
    replaces: list[str] = Field(default_factory=list)
    replaced_by: str | None = None
    """The newest note that replaces this one; null while it holds."""
    replaced_at: str | None = None
    """When that note was written."""


class Citation(BaseModel):
    source: str
    document: str
    title: str | None = None
    kind: Kind
    page: int | None = None
    line: int | None = None
    headings: list[str] = Field(default_factory=list)
    snippet: str
    note: NoteCitation | None = None
    """For a result of the base's own notes (source `metis-<name>`); absent otherwise."""


class Scores(BaseModel):
    dense: float | None = None
    dense_rank: int | None = None
    keyword: float | None = None
    keyword_rank: int | None = None
    fused: float | None = None
    rerank: float | None = None


class Result(BaseModel):
    score: float
    text: str
    citation: Citation
    scores: Scores


class Took(BaseModel):
    """Milliseconds spent in each step of one search."""

    embed: float = 0.0
    dense: float = 0.0
    keyword: float = 0.0
    fuse: float = 0.0
    rerank: float = 0.0
    total: float = 0.0


class SearchAnswer(BaseModel):
    results: list[Result]
    mode: Mode
    reranked: bool
    warnings: list[str]
    took: Took
    words: list[str] | None = None
    """The question's words that tell passages apart in this base (held by at least one
    chunk and at most a quarter of them), as search compares words: what a snippet's
    marks show. None from an indexer older than the field."""


class EvaluateRequest(_Body):
    k: int = Field(10, json_schema_extra=_k_schema("Documents looked at per question"))


class ReindexRequest(_Body):
    full: bool = False


class ReindexAnswer(BaseModel):
    accepted: bool
    full: bool


class VectorsRequest(_Body):
    """`POST /v1/vectors`: the vectors this index holds of passages, by their hashes; what
    another replica of the base asks before it sends passages to the model."""

    model: str = Field(min_length=1, max_length=512)
    """The embedding model the vectors must be of (its id, as the model server names it)."""
    hashes: list[PassageHash] = Field(min_length=1, max_length=HASHES_MAX)
    """BLAKE2b-128 (hex) of each passage exactly as the model is sent it: the document
    prefix, the title and headings, then the text."""


class VectorsAnswer(BaseModel):
    """The vectors of the asked hashes this index holds, of the asked model only."""

    model_config = ConfigDict(extra="forbid")

    model: str | None
    """The model whose vectors this index gives; null when it gives none now."""
    dimensions: int = Field(ge=0)
    found: list[int]
    """Positions in `hashes` of the vectors given, ascending."""
    vectors: str
    """The vectors of `found`, in that order: base64 of float32 little-endian, `dimensions`
    values each."""
    reason: str | None = None
    """Why none are given (another model, a model change, the index not loaded)."""


_NOTE_TEXT: dict[str, Any] = {
    "minLength": 1,
    "maxLength": notes.TEXT_MAX,
    "pattern": r"\S",
    "description": f"The note: 1 to {notes.TEXT_MAX} characters, not only blanks "
    "(NOTE_EMPTY, NOTE_TOO_LONG).",
}


class NoteRequest(_Body):
    """`POST /v1/notes`: a note to keep on the base's own drive and index at once."""

    text: str = Field(json_schema_extra=_NOTE_TEXT)
    title: str | None = Field(
        None,
        json_schema_extra={
            "maxLength": notes.TITLE_MAX,
            "description": f"Up to {notes.TITLE_MAX} characters (NOTE_TOO_LONG).",
        },
    )
    replaces: list[str] = Field(
        default_factory=list,
        json_schema_extra={
            "maxItems": notes.REPLACES_MAX,
            "items": {"type": "string", "pattern": notes.ID_PATTERN},
            "description": "Ids of the notes this one replaces: they stay searchable, after "
            "the notes that hold (NOTE_REPLACES_UNKNOWN, NOTE_REPLACES_ITSELF, "
            "NOTE_REPLACES_CYCLE, NOTE_REPLACES_TOO_MANY).",
        },
    )
    id: str | None = Field(
        None,
        json_schema_extra={
            "pattern": notes.ID_PATTERN,
            "description": "The note's id; a new one is made when absent. A note of this id "
            "already held is written over (200 rather than 201), so a retried write keeps "
            "one note (NOTE_ID_INVALID).",
        },
    )


class NoteAnswer(BaseModel):
    """One note, as the base keeps it."""

    model_config = ConfigDict(extra="forbid")
    id: str
    source: str
    """The source its results are cited with: `metis-<name>`."""
    document: str
    """Its path in that source (`<id>.md`): what citations and evaluation cases name."""
    title: str | None
    text: str
    written_at: str
    replaces: list[str]
    replaced_by: str | None
    replaced_at: str | None


class NotesPage(BaseModel):
    """`GET /v1/notes`: newest first."""

    model_config = ConfigDict(extra="forbid")
    notes: list[NoteAnswer]
    page: int
    page_size: int
    total: int


class NotesQuery(BaseModel):
    """The query string of `GET /v1/notes`."""

    model_config = ConfigDict(extra="ignore")
    page: int = Field(1, ge=1)
    page_size: int = Field(100, ge=1, le=PAGE_SIZE_MAX)


class LastPass(BaseModel):
    read: int
    unchanged: int
    dropped: int


class EmbeddingState(BaseModel):
    """Which embedding model's vectors answer, and how far a new model's are made (its
    vectors are made beside the ones that answer, and take their place at once)."""

    model_config = ConfigDict(extra="forbid")

    answering: str
    """The model whose vectors answer questions now."""
    next: str | None
    """The model whose vectors are being made; null when none is."""
    done: int
    """Chunks that have the next model's vector."""
    total: int
    """Chunks of the index (0 when no model's vectors are being made)."""


class Chunks(BaseModel):
    """How documents are cut: chunks of `size` characters, each repeating the last
    `overlap` of the one before."""

    model_config = ConfigDict(extra="forbid")

    size: int
    overlap: int


class ChunkingState(BaseModel):
    """Which chunking's index answers, and how far an index of a new chunking is built
    (beside the one that answers, which it takes the place of at once when complete)."""

    model_config = ConfigDict(extra="forbid")

    answering: Chunks
    """The chunking of the index that answers searches now."""
    next: Chunks | None
    """The chunking of the index being built; null when none is."""
    done: int
    """Documents the new index holds."""
    total: int
    """Documents it is built of: those it holds and those still to read (0 when none is
    built)."""


class Searches(BaseModel):
    """How the searches of the last `seconds` were answered. Each search counts once, by
    the worst that befell it; a refused one (4xx) is no search and is not counted."""

    model_config = ConfigDict(extra="forbid")

    seconds: int
    answered: int
    """As asked: by meaning where the base has an embedding model, reranked where it
    has a reranker (unless the search asked not to be)."""
    by_words_only: int
    """By words only: the embedding model did not answer in time or is unavailable, or
    no chunk has a vector."""
    without_reranker: int
    """By meaning, but in the fused order: the reranker did not answer in time."""
    failed: int
    """Answered with a 5xx: the index not serving, mode dense without its model, or the
    indexer broke."""
    reason: str | None
    """The words of the most frequent fallback or failure (shortened); null when none."""


class DriveUse(BaseModel):
    """The index drive: what is in use and its size, in bytes."""

    model_config = ConfigDict(extra="forbid")

    used_bytes: int
    size_bytes: int


BackupPhase = Literal["Running", "Completed", "Failed"]
RestorePhase = Literal["Restoring", "Restored", "Failed"]


class BackupRequest(_Body):
    """`POST /v1/backups`: the backup's name (a Kubernetes object's)."""

    name: str = Field(pattern=BACKUP_NAME, max_length=253)


class Backup(BaseModel):
    """A backup of the base's index and notes in its object store (`metis_indexer.backups`):
    one in flight or failed in this process, or a completed one read from its manifest."""

    model_config = ConfigDict(extra="forbid")

    name: str
    phase: BackupPhase
    started_at: str
    finished_at: str | None
    bytes: int
    """Bytes of its objects (the index and the notes' tarball; 0 until written)."""
    chunks: int
    notes: int
    model: str | None
    """The embedding model whose vectors it holds; null without one."""
    dimensions: int | None
    chunking: Chunks
    base: str
    """The base it was made of."""
    error: str | None
    """Why it failed, naming the object or the step; null otherwise."""


class BackupsAnswer(BaseModel):
    """`GET /v1/backups`: every completed backup of the store, and the one in flight or the
    last failed one of this indexer, by name."""

    model_config = ConfigDict(extra="forbid")

    backups: list[Backup]


class RestoreState(BaseModel):
    """The restore of this index from a backup, at start (`service.restoring`)."""

    model_config = ConfigDict(extra="forbid")

    backup: str
    phase: RestorePhase
    chunks: int
    notes: int
    error: str | None
    """Why it cannot be done (it is tried again; no pass runs meanwhile)."""
    reembedding: str | None
    """What is embedded again because the configured model or chunking differ from the
    backup's; null when nothing is."""


class StatusAnswer(BaseModel):
    """`GET /v1/status`: what the operator reads to write a base's status.

    Unknown fields are refused, so a field the service adds without this model
    fails the tests instead of going undocumented.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    phase: Phase
    reason: str
    documents: int
    """Documents indexed: the sources' and the base's own notes."""
    notes: int = 0
    """Notes the base keeps on its own drive (written over `/v1/notes`)."""
    chunks: int
    failed: int
    pass_total: int
    pass_done: int
    last_indexed_at: str | None
    passes: int
    dimensions: int | None
    vectors: VectorKind = "float32"
    """How the index holds its vectors in memory (float32, or int8 rescored exactly)."""
    embedding_model: str | None
    embedding: EmbeddingState | None = None
    """Which model answers, and how far a new one is; null without an embedding model."""
    chunking: ChunkingState | None = None
    """Which chunking's index answers, and how far a new one is; null before the index
    records one."""
    reranker: str | None
    skipped: dict[str, int]
    revisions: dict[str, str]
    indexed_revisions: dict[str, str]
    generation: int | None
    indexed_generation: int | None
    last_pass: LastPass
    warnings: list[str]
    searches: Searches | None = None
    """How the searches of the last minute were answered; null from an indexer that
    does not count them."""
    vectors_from_peers: int = 0
    """Passages whose vectors the base's other replicas gave, since the indexer started."""
    vectors_from_model: int = 0
    """Passages the embedding model was sent by the passes, since the indexer started."""
    vectors_kept: int = 0
    """Passages of a new chunking's index whose vectors the index it replaces held (cut
    the same), since the indexer started."""
    drive: DriveUse | None = None
    """The index drive's use; null where it cannot be read."""
    restore: RestoreState | None = None
    """The restore from a backup this indexer made or is making at start; null when none."""
    stopping: bool = False
    """It got SIGTERM: it answers reads for its drain while its replacement takes over,
    and its Service may still send a request to it a moment after that replacement is
    ready (kube-proxy learns late). A status client wants the replacement's answer."""

    @classmethod
    def read(cls, answer: object) -> StatusAnswer:
        """An answer as a client (the operator) reads it: a field it does not know, from an
        indexer newer than itself, is left out rather than refused."""
        if isinstance(answer, Mapping):
            answer = {k: v for k, v in answer.items() if k in cls.model_fields}
        return cls.model_validate(answer)


class Document(BaseModel):
    """One document of `GET /v1/documents`; `reason` and `detail` say why one failed."""

    model_config = ConfigDict(extra="forbid")

    source: str
    document: str
    kind: Kind
    title: str | None
    state: DocumentState
    chunks: int
    size: int
    reason: str | None
    detail: str | None
    indexed_at: str | None


class DocumentsPage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[Document]
    page: int
    page_size: int
    total: int


class DocumentsQuery(BaseModel):
    """The query string of `GET /v1/documents` (strings, so numbers are parsed)."""

    model_config = ConfigDict(extra="ignore")

    page: int = Field(1, ge=1)
    page_size: int = Field(100, ge=1, le=PAGE_SIZE_MAX)
    state: DocumentState | None = None


class Health(BaseModel):
    ok: bool


class Readiness(BaseModel):
    ok: bool
    phase: Phase


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorAnswer(BaseModel):
    """Every answer that is not a result: `{"error": {"code", "message"}}`."""

    error: ErrorBody


def parse_body(model: type[_B], raw: bytes) -> _B:
    """A body as `model`, or INVALID_BODY naming what is wrong with it."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as e:
        raise invalid(e) from None


def parse_query(model: type[_B], query: Mapping[str, str]) -> _B:
    """A query string as `model`, or INVALID_BODY naming the parameter."""
    try:
        return model.model_validate(dict(query))
    except ValidationError as e:
        raise invalid(e) from None


def invalid(e: ValidationError, most: int = 3) -> BadRequest:
    """INVALID_BODY naming each field pydantic refused (a few at most), and why."""
    said = [
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
        for err in e.errors()[:most]
    ]
    return BadRequest("INVALID_BODY", "; ".join(said))


def check_search(req: SearchRequest) -> SearchRequest:
    if not req.query.strip():
        raise BadRequest("QUERY_EMPTY", "the question is empty")
    if len(req.query) > QUERY_MAX:
        raise BadRequest(
            "QUERY_TOO_LONG",
            f"the question has {len(req.query)} characters; at most {QUERY_MAX} are allowed",
        )
    check_k("top_k", req.top_k)
    return req


def check_k(name: str, value: int) -> None:
    if not 1 <= value <= TOP_K_MAX:
        raise BadRequest(
            "TOP_K_OUT_OF_RANGE", f"{name} is {value}; it must be between 1 and {TOP_K_MAX}"
        )
