"""An indexer whose pass is busy at the model: a real `metis serve` reading the handbook and
then a document of thousands of chunks (minutes of embedding), held until a batch of that
document is running at a real `metis models`, whose `GET /health` counts its work."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.support.model_server import ModelServer
from tests.support.processes import Process, indexer, running

from .test_faults import write_huge_docx
from .test_service import HANDBOOK


def batches(model: httpx.Client) -> dict[str, int]:
    """The model server's count of batch requests (an indexer's passages)."""
    return dict(model.get("/health").json()["work"]["bulk"])


@contextlib.contextmanager
def pass_busy_at_the_model(
    models: ModelServer, folder: Path
) -> Iterator[tuple[Process, httpx.Client, httpx.Client]]:
    """The indexer, a client of the model server and one of the indexer, once only the huge
    document is left and a batch of it runs at the model. One client each, kept open: a
    client made per call costs tens of milliseconds (its TLS context), long enough for a
    batch to be answered between the reads around a request."""
    big = folder / "big"
    big.mkdir()
    write_huge_docx(big / "huge.docx")  # about 2,400 chunks
    p = indexer({"a-handbook": HANDBOOK, "z-big": big}, folder / "index", models.base_url)
    with (
        running(p),
        httpx.Client(base_url=models.base_url, timeout=30) as model,
        httpx.Client(base_url=p.base_url, timeout=120) as api,
    ):
        p.wait_status(
            "only the huge document left",
            lambda s: s["documents"] >= 6 and s["phase"] == "indexing",
            timeout=300,
        )
        p.wait_for(
            "a batch of the pass running at the model",
            lambda: batches(model)["started"],
            timeout=300,
        )
        yield p, model, api
