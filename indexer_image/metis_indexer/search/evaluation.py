"""Evaluation: recall@k and MRR of an evaluation set, per retrieval mode (docs/search.md,
"Evaluation sets").

The set lives in `.metis/evals.jsonl` of a source drive, or of the folder a source
reads of it, never indexed. One JSON
object a line:

    {"question": "How many vacation days do I get?", "expected": ["docs/handbook/leave.md"]}

`expected` lists the documents that answer it, each named `<drive>/<path in the
drive>`; an optional `id` names the case in the misses. Blank lines and lines
starting with `#` are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metis_indexer.errors import BadRequest
from metis_indexer.schema import Mode, SearchAnswer, check_k

MAX_CASES = 500
TIME_LIMIT = 60.0
"""Seconds an evaluation may take; past it, it stops and says how far it got."""
MRR_DEPTH = 10
EVALS_FILE = Path(".metis") / "evals.jsonl"


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1)
    expected: list[str] = Field(min_length=1)
    id: str | None = None


class Miss(BaseModel):
    """A case whose expected documents were not all among the first k."""

    case: str
    mode: str
    missing: list[str]
    found: list[str]


class Figures(BaseModel):
    recall_at_k: float
    mrr: float


class Evaluation(BaseModel):
    """The headline figures (for the mode searches use), plus each mode's and the misses."""

    k: int
    cases: int
    recall_at_k: float
    mrr: float
    at: str
    modes: dict[str, Figures]
    misses: list[Miss]
    warnings: list[str] = Field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class Way:
    """One way of asking: a mode, with or without the reranker."""

    name: str
    mode: Mode
    rerank: bool


Ask = Callable[[str, Way], Awaitable[SearchAnswer]]


def parse_cases(lines: Sequence[tuple[str, str]]) -> list[Case]:
    """Cases from (file name, text) pairs; errors name the file and line."""
    cases: list[Case] = []
    for name, text in lines:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadRequest(
                    "EVAL_FILE", f"{name} line {number} is not JSON ({e.msg}): JSON Lines expected"
                ) from None
            try:
                case = Case.model_validate(raw)
            except ValidationError as e:
                first = e.errors()[0]
                field = ".".join(str(p) for p in first["loc"]) or "case"
                raise BadRequest(
                    "EVAL_CASE_INVALID",
                    f"{name} line {number}: {field}: {first['msg']} "
                    '(each case needs "question" and at least one "expected" document)',
                ) from None
            cases.append(case if case.id else case.model_copy(update={"id": f"{name}:{number}"}))
    if not cases:
        names = ", ".join(n for n, _ in lines) or "the sources"
        raise BadRequest("EVAL_EMPTY", f"no questions in {names}")
    if len(cases) > MAX_CASES:
        raise BadRequest(
            "EVAL_TOO_LARGE", f"{len(cases)} questions; an evaluation takes at most {MAX_CASES}"
        )
    return cases


def read_cases(places: Sequence[tuple[str, Path]]) -> list[Case]:
    """The cases of every `.metis/evals.jsonl` in `places`: (name, folder) pairs, a source
    drive's root and the folder a source reads of it. None found names where it looked."""
    found: list[tuple[str, str]] = []
    for place, folder in places:
        path = folder / EVALS_FILE
        if not path.is_file():
            continue
        name = f"{place}/{EVALS_FILE}"
        try:
            found.append((name, path.read_text(encoding="utf-8-sig")))
        except (OSError, UnicodeDecodeError) as e:
            raise BadRequest("EVAL_FILE", f"{name} could not be read: {e}") from None
    if not found:
        looked = ", ".join(f"{place}/{EVALS_FILE}" for place, _ in places) or "no source"
        raise BadRequest("EVAL_EMPTY", f"no evaluation set: looked in {looked}")
    return parse_cases(found)


def ranked_documents(answer: SearchAnswer) -> list[str]:
    """Documents in the order of their first chunk: a document counts once."""
    seen: dict[str, None] = {}
    for r in answer.results:
        seen.setdefault(f"{r.citation.source}/{r.citation.document}")
    return list(seen)


def recall(expected: Sequence[str], ranked: Sequence[str], k: int) -> float:
    first = set(ranked[:k])
    return sum(1 for d in set(expected) if d in first) / len(set(expected))


def reciprocal_rank(
    expected: Sequence[str], ranked: Sequence[str], depth: int = MRR_DEPTH
) -> float:
    wanted = set(expected)
    for i, doc in enumerate(ranked[:depth], start=1):
        if doc in wanted:
            return 1.0 / i
    return 0.0


def ways(has_embedding: bool, has_reranker: bool) -> list[Way]:
    out = [Way("keyword", "keyword", False)]
    if has_embedding:
        out += [Way("dense", "dense", False), Way("hybrid", "hybrid", False)]
    if has_reranker:
        out.append(Way("hybrid+rerank", "hybrid", True))
    return out


async def evaluate(
    cases: Sequence[Case],
    k: int,
    ask: Ask,
    modes: Sequence[Way],
    now: Callable[[], str],
    time_limit: float = TIME_LIMIT,
    clock: Callable[[], float] = time.monotonic,
) -> Evaluation:
    """Ask every case every way; the headline figures are those of the last way listed,
    the one plain searches use. `clock` (seconds) is there so tests can move time."""
    check_k("k", k)
    deadline = clock() + time_limit
    totals = {w.name: [0.0, 0.0] for w in modes}
    misses: list[Miss] = []
    done = 0
    warnings: list[str] = []
    for case in cases:
        if clock() > deadline:
            warnings.append(
                f"stopped after {time_limit:g} s: {done} of {len(cases)} questions asked"
            )
            break
        for way in modes:
            ranked = ranked_documents(await ask(case.question, way))
            totals[way.name][0] += recall(case.expected, ranked, k)
            totals[way.name][1] += reciprocal_rank(case.expected, ranked)
            missing = sorted(set(case.expected) - set(ranked[:k]))
            if missing:
                misses.append(
                    Miss(
                        case=case.id or case.question,
                        mode=way.name,
                        missing=missing,
                        found=ranked[:k],
                    )
                )
        done += 1
    per_mode = {
        name: Figures(recall_at_k=round(r / max(done, 1), 4), mrr=round(m / max(done, 1), 4))
        for name, (r, m) in totals.items()
    }
    headline = per_mode[modes[-1].name]
    return Evaluation(
        k=k,
        cases=done,
        recall_at_k=headline.recall_at_k,
        mrr=headline.mrr,
        at=now(),
        modes=per_mode,
        misses=misses,
        warnings=warnings,
    )
