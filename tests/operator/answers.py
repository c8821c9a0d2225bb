"""The indexer's status answer as tests of the operator write it: only the fields a test
is about, the rest those of an indexer that has just started."""

from __future__ import annotations

from typing import Any

from metis_indexer.schema import StatusAnswer

STARTED: dict[str, Any] = {
    "name": "hb",
    "phase": "loading",
    "reason": "",
    "documents": 0,
    "chunks": 0,
    "failed": 0,
    "pass_total": 0,
    "pass_done": 0,
    "last_indexed_at": None,
    "passes": 0,
    "dimensions": None,
    "embedding_model": None,
    "reranker": None,
    "skipped": {},
    "revisions": {},
    "indexed_revisions": {},
    "generation": None,
    "indexed_generation": None,
    "last_pass": {"read": 0, "unchanged": 0, "dropped": 0},
    "warnings": [],
}


def indexer_status(**fields: Any) -> StatusAnswer:
    return StatusAnswer.model_validate({**STARTED, **fields})
