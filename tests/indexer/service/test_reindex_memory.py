"""A base read again and again keeps its memory: a real `metis serve` (keyword search alone,
no model, so that a hundred passes take a minute or two) on real documents, its resident
memory read from /proc.

30 full reindexes of 1,149 chunks once took the indexer from 151 to 257 MB, and 60 to 333 MB.
Here (1,420 chunks, no vectors), measured as this test does on 2026-12-01: before the write
path compacted, 152.3 MB after the first full reindex and 179.7 MB after the
hundredth (+18 %); with it, 149.0 and 150.1 MB (+0.7 %)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.support.processes import Process, indexer, running, wait_ready

PEPS = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "perf" / "python-peps"
REINDEXES = 100


def resident_mb(p: Process) -> float:
    assert p.proc is not None
    with open(f"/proc/{p.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def full_reindex(p: Process, passes: int) -> dict[str, Any]:
    """Ask for a full reindex and wait for it to end (the indexer's `passes`-th pass)."""
    assert p.post("/v1/reindex", {"full": True}).status_code == 202
    return p.wait_status(
        f"pass {passes}", lambda s: s["passes"] == passes and s["phase"] == "ready"
    )


def found(p: Process) -> list[tuple[str, int | None, str]]:
    answer = p.post("/v1/search", {"query": "generator expressions", "mode": "keyword"})
    assert answer.status_code == 200
    return [
        (r["citation"]["document"], r["citation"].get("line"), r["text"])
        for r in answer.json()["results"]
    ]


def test_a_hundred_full_reindexes_keep_the_indexer_s_memory(tmp_path):
    """Measured after the first full reindex rather than the first pass: a reindex's own
    code has then run once (what it imports and caches stays, whatever is compacted)."""
    drive = tmp_path / "peps"
    drive.mkdir()
    for path in sorted((PEPS / "peps").glob("pep-*.rst"))[:100]:
        shutil.copy(path, drive / path.name)
    p = indexer({"peps": drive}, tmp_path / "index", None)
    with running(p):
        first = wait_ready(p)
        assert first["documents"] == 100 and first["chunks"] > 1024
        full_reindex(p, 2)
        before, answers = resident_mb(p), found(p)
        for passes in range(3, REINDEXES + 2):
            last = full_reindex(p, passes)
        after = resident_mb(p)
        assert last["chunks"] == first["chunks"] and last["last_pass"]["read"] == 100
        assert found(p) == answers and answers
        assert after <= before * 1.10, f"{before:.1f} MB, then {after:.1f} MB"
