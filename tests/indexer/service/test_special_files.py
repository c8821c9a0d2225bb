"""Files swapped for named pipes in the middle of a real `metis serve` pass: each fails
with its reason, the pass ends, searches answer throughout, a reindex runs, and SIGTERM
stops the process. Before, each pipe pinned one of the threads searches rank on, waiting
for a writer: the pass never ended, and eight of them left searches none."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from metis_indexer.documents import FailReason
from metis_indexer.ingest.runner import IN_FLIGHT_DOCUMENTS
from tests.support.processes import Process, indexer, running, wait_ready

from .test_faults import documents
from .test_service import perf_drive

PIPES = 8
"""More than asyncio's default executor has threads on two cores (six)."""
FIFO = "it is a named pipe (FIFO), not a regular file"


def search(p: Process) -> list[dict]:
    """A keyword search that must answer, with a deadline far past any normal answer."""
    answer = httpx.post(
        f"{p.base_url}/v1/search",
        json={"query": "Python enhancement", "mode": "keyword"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    results: list[dict] = answer.json()["results"]
    assert results
    return results


def as_pages(names: list[Path]) -> None:
    for name in names:
        if name.exists() and not name.is_file():
            name.unlink()
        name.write_text("# A page\n\nAn ordinary page, for now.\n")


def swap_mid_pass(p: Process, names: list[Path]) -> None:
    """A full reindex, and the pages swapped for pipes once it has read a document but
    before it can have reached them (they sort last; a few dozen are in flight)."""
    for _ in range(5):  # a pass that outran the swap proves nothing: try again
        as_pages(names)
        p.post("/v1/reindex", {"full": True})
        p.wait_status(
            "the pass under way", lambda s: s["phase"] == "indexing" and s["pass_done"] >= 1
        )
        for name in names:
            name.unlink()
            os.mkfifo(name)
        s = p.status()
        if s["phase"] == "indexing" and (
            s["pass_done"] + IN_FLIGHT_DOCUMENTS + len(names) < s["pass_total"]
        ):
            return
        wait_ready(p)
    pytest.fail("every pass outran the swap")


def test_pipes_swapped_in_mid_pass_fail_and_searches_answer_throughout(tmp_path):
    drive = perf_drive(tmp_path, files=120)
    names = [drive / f"zz-pipe-{i}.md" for i in range(PIPES)]
    as_pages(names)
    p = indexer({"peps": drive}, tmp_path / "index", None, extra=("--workers", "1"))
    with running(p):
        before = wait_ready(p)
        assert before["documents"] == 120 + PIPES
        swap_mid_pass(p, names)
        answered, deadline = 0, time.monotonic() + 300
        while answered < 5 or p.status()["phase"] != "ready":
            search(p)
            answered += 1
            assert time.monotonic() < deadline, f"the pass did not end:\n{p.log()}"
        status = wait_ready(p)
        assert (status["documents"], status["failed"]) == (120, PIPES)
        pipes = [d for d in documents(p) if d["document"].startswith("zz-pipe-")]
        assert [(d["state"], d["reason"], d["detail"]) for d in pipes] == [
            ("failed", FailReason.UNREADABLE.value, FIFO)
        ] * PIPES

        p.post("/v1/reindex", {"full": True})
        p.wait_status(
            "a reindex after it", lambda s: s["passes"] > status["passes"] and s["phase"] == "ready"
        )
        search(p)

        assert p.proc is not None
        p.proc.send_signal(signal.SIGTERM)
        try:
            code = p.proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGTERM did not stop the indexer within 60 s:\n{p.log()}")
        assert code == 0, p.log()
