"""An index file damaged while its indexer runs, with a real `metis serve`:
pages of the chunks' table overwritten on disk under a ready indexer. A search that meets
the damage answers 503 in the API's error shape (never 500), the status says so, and the index
is moved aside and rebuilt from the sources; damage on pages no search reads is found by
the integrity check, which reads a few pages more every `--check-seconds`."""

from __future__ import annotations

import collections
import os
import random
import sqlite3
import threading
from pathlib import Path

import httpx

from metis_indexer.index import folders
from tests.support.processes import Process, indexer, running, wait_ready

from .test_service import perf_drive

QUESTIONS = (
    "enhancement proposal",
    "python version",
    "the standard library",
    "import module",
    "backwards compatibility",
    "rationale",
    "reference implementation",
    "unicode",
    "syntax",
    "exceptions",
)


def damage_chunk_pages(index: Path, pages: int = 40) -> list[int]:
    """Random bytes over `pages` leaf and overflow pages of the chunks' table, after the log
    is copied into the file (so what a reader reads next is the file's page, not a newer
    copy in the log), as a failing disk or a stray writer would leave them. Then a
    transaction, so that the indexer's readers read those pages from the file again rather
    than from their caches (as they do after any write)."""
    db = sqlite3.connect(index)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        size = db.execute("PRAGMA page_size").fetchone()[0]
        found = [
            row[0]
            for row in db.execute(
                "SELECT pageno FROM dbstat WHERE name = 'chunks' "
                "AND pagetype IN ('leaf', 'overflow')"
            )
        ]
    finally:
        db.close()
    chosen = sorted(random.Random(24).sample(found, min(pages, len(found))))
    with index.open("r+b") as f:
        for page in chosen:
            f.seek((page - 1) * size)
            f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    db = sqlite3.connect(index)
    try:  # a write of another page: every reader drops the pages it kept in memory
        with db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('test-touched', '1')")
    finally:
        db.close()
    return chosen


def metric(p: Process, name: str) -> float:
    total = 0.0
    for line in p.get("/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rebuilt(p: Process, before: dict) -> dict:
    """The status once the damaged index was rebuilt and read again whole."""
    return p.wait_status(
        "the index rebuilt from the sources",
        lambda s: (
            s["phase"] == "ready"
            and s["documents"] == before["documents"]
            and any("rebuilt from the sources" in w for w in s["warnings"])
        ),
        timeout=300,
    )


def test_a_search_that_meets_damage_answers_503_and_the_index_is_rebuilt(tmp_path):
    drive = perf_drive(tmp_path, files=40)
    index_dir = tmp_path / "index"
    p = indexer({"peps": drive}, index_dir, None, extra=("--check-seconds", "3600"))
    with running(p):
        before = wait_ready(p)
        damage_chunk_pages(index_dir / "index.sqlite3")
        answers = [
            httpx.post(
                f"{p.base_url}/v1/search",
                timeout=60,
                json={"query": q, "mode": "keyword", "top_k": 50},
            )
            for q in QUESTIONS
            for _ in range(4)
        ]
        statuses = [a.status_code for a in answers]
        assert set(statuses) <= {200, 503}, [a.text for a in answers if a.status_code != 200]
        refused = [a.json()["error"] for a in answers if a.status_code == 503]
        assert refused, "no search met the damaged pages"
        assert {e["code"] for e in refused} == {"KNOWLEDGE_BASE_NOT_READY"}
        assert all("the index is damaged" in e["message"] for e in refused)
        assert metric(p, 'metis_index_damage_found_total{found_by="search"}') >= 1
        assert metric(p, 'metis_searches_total{mode="hybrid",outcome="error"}') == 0
        assert metric(p, 'metis_searches_total{mode="keyword",outcome="error"}') == len(refused)

        after = rebuilt(p, before)
        assert after["chunks"] == before["chunks"] and after["failed"] == 0
        assert after["last_pass"]["read"] == before["documents"], "read again from the sources"
        assert metric(p, "metis_index_rebuilds_total") == 1
        for q in QUESTIONS:
            found = p.post("/v1/search", {"query": q, "mode": "keyword", "top_k": 50})
            assert found.status_code == 200, found.text
    assert (index_dir / "index.sqlite3.damaged").exists(), "kept for a person to look at"


def test_damage_no_search_reads_is_found_by_the_integrity_check(tmp_path):
    drive = perf_drive(tmp_path, files=40)
    index_dir = tmp_path / "index"
    p = indexer({"peps": drive}, index_dir, None, extra=("--check-seconds", "0.5"))
    with running(p):
        before = wait_ready(p)
        damage_chunk_pages(index_dir / "index.sqlite3", pages=3)
        after = rebuilt(p, before)
        assert after["chunks"] == before["chunks"]
        assert metric(p, 'metis_index_damage_found_total{found_by="check"}') >= 1
        assert metric(p, 'metis_index_damage_found_total{found_by="search"}') == 0
        assert "met by the integrity check" in p.log()


class Searching:
    """Clients that search without pause until the block ends, and what they were answered:
    the statuses, and each answer that is neither a 200 nor a 503 saying why."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url = url
        self.codes: collections.Counter[int] = collections.Counter()
        self.wrong: list[str] = []
        self._stop = threading.Event()
        self._clients = [threading.Thread(target=self._search, args=(i,)) for i in range(clients)]

    def __enter__(self) -> Searching:
        for t in self._clients:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._clients:
            t.join()

    def _search(self, seed: int) -> None:
        questions = random.Random(seed)
        with httpx.Client(timeout=60) as c:
            while not self._stop.is_set():
                body = {"query": questions.choice(QUESTIONS), "mode": "keyword", "top_k": 50}
                r = c.post(f"{self.url}/v1/search", json=body)
                self.codes[r.status_code] += 1
                said = r.status_code == 503 and bool(r.json()["error"]["message"])
                if r.status_code != 200 and not said:
                    self.wrong.append(f"{r.status_code} {r.text[:300]}")


def test_searches_beside_rebuilds_are_answered_or_refused_and_the_indexer_lives(tmp_path):
    """Four clients search without pause while the answering index's file is damaged under
    them, three times over: every answer is a 200 or a 503 that says why, never a 500, and
    the indexer never dies. (A rebuild used to close the store's connections under the
    searches still reading them: 500s, and once a segfault inside libsqlite3.)"""
    drive = perf_drive(tmp_path, files=300)
    index_dir = tmp_path / "index"
    p = indexer({"peps": drive}, index_dir, None, extra=("--check-seconds", "3600"))
    with running(p):
        before = wait_ready(p)
        for rounds in range(1, 4):
            # Each round waits for a rebuild after its own damage, counting from the
            # rebuilds before it (a round is not over at the rebuild count it expects).
            done = metric(p, "metis_index_rebuilds_total")
            with Searching(p.base_url) as searching:
                damage_chunk_pages(folders.live(index_dir) / "index.sqlite3")
                p.wait_status(
                    f"rebuild {rounds} done",
                    lambda s, n=done: (
                        metric(p, "metis_index_rebuilds_total") > n
                        and s["phase"] == "ready"
                        and s["documents"] == before["documents"]
                    ),
                    timeout=300,
                )
            assert p.proc is not None and p.proc.poll() is None, f"the indexer died: {p.log()}"
            assert not searching.wrong, (searching.codes, searching.wrong[:5])
            said = [line for line in p.log().splitlines() if "damaged" in line]
            assert searching.codes[503] >= 1 and searching.codes[200] >= 1, (
                searching.codes,
                said[-6:],
            )
        assert "Traceback" not in p.log()
