"""The bodies the indexer's API takes and gives (spec 002, DESIGN.md), as pydantic models.

Requests are parsed loosely (types only) and then checked by `check_*` functions,
so each limit gets the spec's own error code rather than a generic 422.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metis_indexer.documents import Kind
from metis_indexer.errors import BadRequest

Mode = Literal["hybrid", "dense", "keyword"]
_B = TypeVar("_B", bound=BaseModel)
QUERY_MAX = 4000
TOP_K_MAX = 50


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Filters(_Body):
    path_prefix: str | None = None
    kinds: list[Kind] | None = None
    sources: list[str] | None = None


class SearchRequest(_Body):
    query: str
    top_k: int = 5
    mode: Mode = "hybrid"
    rerank: bool | None = None
    filters: Filters | None = None


class Citation(BaseModel):
    source: str
    document: str
    title: str | None = None
    kind: Kind
    page: int | None = None
    line: int | None = None
    headings: list[str] = Field(default_factory=list)
    snippet: str


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


class EvaluateRequest(_Body):
    k: int = 10


class ReindexRequest(_Body):
    full: bool = False


def parse_body(model: type[_B], raw: bytes) -> _B:
    """A body as `model`, or INVALID_BODY naming what is wrong with it."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise BadRequest("INVALID_BODY", f"{where}: {first['msg']}") from None


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
