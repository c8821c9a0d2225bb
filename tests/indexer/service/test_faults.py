"""Faults a running indexer meets, with real processes: a document no part can store or
send, a damaged index, a full drive, a model that stops answering, a file swapped for
a link during a pass, a pass that floods the model, and a burst against a slow
reranker. In each, the indexer keeps going and says why."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from metis_indexer.documents import FailReason
from metis_indexer.schema import StatusAnswer
from metis_operator.state import Observation
from metis_operator.status import compose
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process, free_port, indexer, running, wait_ready

from .test_service import HANDBOOK, TORTURE, perf_drive

SURROGATE_PDF = (
    TORTURE / "apache-tika-test-documents/tika-parsers/tika-parsers-standard/"
    "tika-parsers-standard-modules/tika-parser-pdf-module/src/test/resources/"
    "test-documents/testPDFVarious.pdf"
)
REASONS = {r.value for r in FailReason}


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


def documents(p: Process, state: str | None = None) -> list[dict]:
    params = {"page_size": 1000, **({"state": state} if state else {})}
    return p.get("/v1/documents", params=params).json()["documents"]


@pytest.mark.parametrize("with_model", [False, True], ids=["keyword-only", "local-model"])
def test_a_pdf_with_lone_surrogates_is_indexed_and_the_pass_ends(with_model, models, tmp_path):
    drive = tmp_path / "drive"
    drive.mkdir()
    shutil.copyfile(SURROGATE_PDF, drive / "various.pdf")
    p = indexer({"docs": drive}, tmp_path / "index", models.base_url if with_model else None)
    with running(p):
        status = wait_ready(p, timeout=120)
        assert (status["documents"], status["failed"]) == (1, 0)
        [doc] = documents(p)
        assert doc["state"] == "indexed" and doc["chunks"] > 0
        answer = p.post("/v1/search", {"query": "Gothic text", "mode": "keyword"}).json()
        assert answer["results"][0]["citation"]["document"] == "various.pdf"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("with_model", "size"), [(False, 1200), (True, 4000)], ids=["keyword-only", "local-model"]
)
def test_the_whole_torture_set_is_indexed_or_failed_with_a_reason(
    with_model, size, models, tmp_path
):
    """Every file of the torture set through the whole pass, store included. With the
    model, chunks of 4,000 characters keep it to a few minutes on two cores."""
    p = indexer(
        {"torture": TORTURE},
        tmp_path / "index",
        models.base_url if with_model else None,
        extra=("--chunk-size", str(size)),
    )
    with running(p):
        status = wait_ready(p, timeout=1500)
        listed = documents(p)
        assert len(listed) == status["pass_total"] == status["documents"] + status["failed"]
        assert all(d["state"] == "indexed" or d["reason"] in REASONS for d in listed)
        assert not [d for d in listed if d["reason"] == FailReason.NOT_STORED.value]
        assert status["documents"] >= 500 and status["chunks"] > 0
        answer = p.post("/v1/search", {"query": "Gothic text", "top_k": 50}).json()
        assert "testPDFVarious.pdf" in {
            r["citation"]["document"].rsplit("/", 1)[-1] for r in answer["results"]
        }
        if with_model:
            assert answer["warnings"] == [] and status["dimensions"] == 384


# -- a damaged index --------------------------------------------------------------------


def index_then_stop(drive: Path, index_dir: Path) -> dict:
    p = indexer({"peps": drive}, index_dir, None)
    with running(p):
        status = wait_ready(p)
    assert not (index_dir / "index.sqlite3-wal").exists(), "closed cleanly: all in one file"
    return status


def quick_check(path: Path) -> str:
    try:
        db = sqlite3.connect(path)
        try:
            return str(db.execute("PRAGMA quick_check").fetchone()[0])
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        return str(e)


def overwrite_a_page(path: Path) -> None:
    """4 KB of random bytes over pages from the middle on, until SQLite sees damage."""
    pages = path.stat().st_size // 4096
    for page in range(pages // 2, pages):
        with path.open("r+b") as f:
            f.seek(page * 4096)
            f.write(os.urandom(4096))
        if quick_check(path) != "ok":
            return
    raise AssertionError("no page overwritten made the index look damaged")


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def overwrite_header(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(os.urandom(100))


@pytest.mark.parametrize("damage", [overwrite_a_page, truncate, overwrite_header])
def test_a_damaged_index_is_moved_aside_and_rebuilt(damage, tmp_path):
    drive = perf_drive(tmp_path, files=40)
    index_dir = tmp_path / "index"
    before = index_then_stop(drive, index_dir)
    damage(index_dir / "index.sqlite3")
    assert quick_check(index_dir / "index.sqlite3") != "ok"
    p = indexer({"peps": drive}, index_dir, None)
    with running(p):
        status = wait_ready(p)
        assert (status["documents"], status["chunks"], status["failed"]) == (
            before["documents"],
            before["chunks"],
            0,
        )
        assert status["last_pass"]["read"] == before["documents"], "read again from the sources"
        [note] = [w for w in status["warnings"] if "damaged" in w]
        assert "index.sqlite3.damaged" in note and str(tmp_path) not in note
        assert "metis_index_rebuilds_total 1.0" in p.get("/metrics").text
        answer = p.post("/v1/search", {"query": "enhancement proposal", "mode": "keyword"})
        assert answer.json()["results"]
    assert quick_check(index_dir / "index.sqlite3") == "ok"
    assert (index_dir / "index.sqlite3.damaged").exists(), "kept for a person to look at"
    assert "the index is damaged" in p.log()


def mount_tmpfs(folder: Path, size: str) -> None:
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        check=True,
        capture_output=True,
    )


def test_an_index_folder_that_cannot_be_written_says_which_and_waits(tmp_path):
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    if os.geteuid() == 0:  # root writes any folder whatever its mode: mount it read-only
        try:
            mount_tmpfs(index_dir, "1m,ro")
        except (OSError, subprocess.CalledProcessError) as e:
            pytest.skip(f"cannot mount a tmpfs here: {e}")
    else:
        index_dir.chmod(0o500)
    p = indexer({"handbook": HANDBOOK}, index_dir, None)
    try:
        with running(p):
            status = p.wait_status("waiting on the folder", lambda s: s["phase"] == "waiting")
            assert status["reason"] == (
                f"cannot open the index {index_dir / 'index.sqlite3'}: the folder is not writable"
            )
            assert p.get("/readyz").status_code == 503
            if os.geteuid() == 0:
                subprocess.run(["mount", "-o", "remount,rw", str(index_dir)], check=True)
            else:
                index_dir.chmod(0o700)
            assert wait_ready(p)["documents"] == 6
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(index_dir)], check=False)


@pytest.fixture
def small_drive(tmp_path):
    """An index folder on a tmpfs of 400 KB (root only: mount)."""
    folder = tmp_path / "index"
    folder.mkdir()
    try:
        mount_tmpfs(folder, "400k")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_index_drive_waits_with_its_reason_and_resumes(small_drive, tmp_path):
    drive = perf_drive(tmp_path, files=60)
    p = indexer({"peps": drive}, small_drive, None)
    with running(p):
        full = p.wait_status("the drive full", lambda s: s["phase"] == "waiting")
        assert full["reason"].startswith("the index drive is full (")
        assert full["reason"].endswith(" MB free); indexing resumes when there is room")
        assert "rollback" not in full["reason"]
        drive = full["drive"]
        assert drive["size_bytes"] == 400 * 1024 and drive["used_bytes"] >= 0.8 * 400 * 1024
        metrics = p.get("/metrics").text
        assert "metis_index_drive_size_bytes 409600.0" in metrics
        # The base's warning and condition, as the operator derives them from this answer.
        o = Observation(indexer=StatusAnswer.read(full), index_drive="metis-peps")
        [warning] = [w for w in compose.warnings(o) if w.startswith("index drive")]
        assert warning.startswith("index drive metis-peps is ") and " full (of 0.4 MiB)" in warning
        answer = p.post("/v1/search", {"query": "enhancement proposal", "mode": "keyword"})
        assert answer.status_code == 200, "what is indexed is still answered"
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_drive)], check=True)
        status = wait_ready(p)
        assert (status["documents"], status["failed"]) == (60, 0), "no document failed for it"
        assert status["drive"]["size_bytes"] == 64 * 1024 * 1024, "read at each answer"


# -- a model that stops answering ---------------------------------------------------------


def test_a_model_that_stops_answering_shows_waiting_within_40_s(tmp_path):
    server = start_model_server()
    drive = perf_drive(tmp_path, files=40)
    p = indexer({"peps": drive}, tmp_path / "index", server.base_url)
    try:
        with running(p):
            p.wait_status(
                "indexing under way", lambda s: s["phase"] == "indexing" and s["pass_done"] >= 2
            )
            os.kill(server.proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            waiting = p.wait_status("waiting", lambda s: s["phase"] == "waiting", timeout=40)
            assert time.monotonic() - stopped <= 40
            assert waiting["reason"].startswith(f"waiting for embedding model {server.base_url}")
            assert waiting["reason"].endswith(": no answer for 30 s")
            os.kill(server.proc.pid, signal.SIGCONT)
            status = wait_ready(p)
            assert (status["documents"], status["failed"]) == (40, 0)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


# -- a name swapped for a link during a pass -----------------------------------------------


def test_a_file_swapped_for_a_link_during_a_pass_reads_nothing_outside(tmp_path):
    drive = perf_drive(tmp_path, files=120)
    target = drive / "zz-last.md"
    outside = tmp_path / "outside.md"
    outside.write_text("# Outside\n\nzanzibarsecret lives outside the drive.\n")
    target.write_text("# Last\n\nAn ordinary page.\n")
    p = indexer({"peps": drive}, tmp_path / "index", None, extra=("--workers", "1"))
    with running(p):
        wait_ready(p)
        for _ in range(5):  # a pass that outran the swap proves nothing: try again
            if target.is_symlink():
                target.unlink()
            target.write_text("# Last\n\nAn ordinary page.\n")
            p.post("/v1/reindex", {"full": True})
            listed = p.wait_status(
                "the pass under way", lambda s: s["phase"] == "indexing" and s["pass_done"] >= 1
            )
            target.unlink()
            os.symlink(outside, target)
            swapped = p.status()
            if swapped["pass_done"] < swapped["pass_total"] - 1 and listed["pass_total"] == 121:
                break
        else:
            pytest.fail("every pass outran the swap")
        wait_ready(p)
        answer = p.post("/v1/search", {"query": "zanzibarsecret", "mode": "keyword"}).json()
        assert answer["results"] == []
        [doc] = [d for d in documents(p) if d["document"] == "zz-last.md"]
        assert (doc["state"], doc["reason"]) == ("failed", FailReason.UNREADABLE.value)
        assert doc["detail"] == "it became a link that leads out of its drive"


# -- a pass that floods the model, and a burst against a slow reranker ---------------------


def write_huge_docx(path: Path, paragraphs: int = 12000) -> None:
    """A small file holding a lot of text (about 2,400 chunks, minutes of embedding on
    two cores): what a 139 KB DOCX of 20 MiB of text does to a pass."""
    import docx

    document = docx.Document()
    document.add_heading("Inventory", level=1)
    for i in range(paragraphs):
        document.add_paragraph(
            f"Item {i} of the warehouse ledger: shelf {i % 97}, row {i % 13}, counted on "
            f"day {i % 365} by team {i % 7}, with {i * 7 % 1000} units in stock and a "
            f"reorder threshold of {i * 3 % 500} units, supplier code S-{i * 31 % 9973}."
        )
    document.save(str(path))


def test_searches_are_answered_by_meaning_while_a_huge_docx_is_embedded(models, tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    write_huge_docx(big / "huge.docx")
    # Batches of 8: a question waits behind at most two of them at the one model server
    # (batches of 64 on a loaded 2-core machine can hold it past the 10 s a search waits).
    p = indexer(
        {"a-handbook": HANDBOOK, "z-big": big},
        tmp_path / "index",
        models.base_url,
        extra=("--embedding-batch", "8"),
    )
    with running(p):
        p.wait_status(
            "only the huge document left",
            lambda s: s["documents"] >= 6 and s["phase"] == "indexing",
            timeout=300,
        )
        # Reading it takes seconds, embedding it minutes: a minute of searches overlaps
        # the embedding for most of that minute.
        searches, end = 0, time.monotonic() + 60
        while time.monotonic() < end and p.status()["phase"] == "indexing":
            answer = p.post(
                "/v1/search",
                {"query": "How many vacation days do I get?", "top_k": 3, "rerank": False},
            ).json()
            assert answer["warnings"] == [], answer["warnings"]
            top = answer["results"][0]
            assert top["scores"].get("dense") is not None, "found by meaning"
            assert top["citation"]["source"] == "a-handbook"
            searches += 1
        assert searches >= 10
        assert p.status()["phase"] == "indexing", "the huge document was still embedding"


class SlowReranker:
    """A stand-in reranker that scores one call at a time, a second each: a real one
    cannot be made this slow on purpose (the only fake here, and why)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.calls = 0

    def app(self) -> web.Application:
        one_at_a_time = asyncio.Lock()

        async def rerank(request: web.Request) -> web.Response:
            body = await request.json()
            async with one_at_a_time:
                await asyncio.sleep(1.0)
                self.calls += 1
            results = [
                {"index": i, "relevance_score": 1.0 / (i + 1)}
                for i in range(len(body["documents"]))
            ]
            return web.json_response({"results": results})

        app = web.Application()
        app.router.add_post("/v1/rerank", rerank)
        return app


@pytest.fixture
def slow_reranker() -> Iterator[str]:
    server = SlowReranker()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(server.app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", server.port).start())
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.run_until_complete(runner.cleanup())
    loop.close()


async def burst(url: str, clients: int, seconds: float) -> int:
    """`clients` clients searching for `seconds`; how many answers came back."""
    body = {"query": "vacation days", "mode": "keyword", "top_k": 3}
    end = time.monotonic() + seconds
    answered = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal answered
        while time.monotonic() < end:
            r = await http.post(f"{url}/v1/search", json=body)
            answered += r.status_code == 200

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return answered


def test_after_a_burst_against_a_slow_reranker_searches_are_normal_within_15_s(
    slow_reranker, tmp_path
):
    p = indexer({"handbook": HANDBOOK}, tmp_path / "index", None, reranker=slow_reranker)
    with running(p):
        wait_ready(p)
        answered = asyncio.run(burst(p.base_url, clients=128, seconds=8))
        assert answered >= 128, "the burst was answered, shed or not"
        ended = time.monotonic()

        def normal() -> bool:
            answer = p.post("/v1/search", {"query": "vacation days", "mode": "keyword"}).json()
            return answer["reranked"] and answer["warnings"] == []

        p.wait_for("a normal search", normal, timeout=15)
        assert time.monotonic() - ended <= 15


def test_an_index_of_a_newer_format_is_refused_and_left_as_it_is(tmp_path):
    """After a rollback of the image: the base waits, saying why, and the index (hours of
    embedding, which the newer image still reads) is neither rebuilt nor changed."""
    index_dir = tmp_path / "index"
    before = index_then_stop(HANDBOOK, index_dir)
    db = sqlite3.connect(index_dir / "index.sqlite3")
    with db:
        assert db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone() == ("1",)
        db.execute("UPDATE meta SET value = '2' WHERE key = 'format'")
    db.close()
    written = (index_dir / "index.sqlite3").read_bytes()
    p = indexer({"peps": HANDBOOK}, index_dir, None)
    with running(p):
        status = p.wait_status("waiting on the format", lambda s: s["phase"] == "waiting")
        assert status["reason"] == (
            f"cannot open the index {index_dir / 'index.sqlite3'}: it was written in format 2 "
            "by a newer indexer, and this one reads format 1 at most: run the newer image "
            "again (nothing was changed)"
        )
        assert p.get("/readyz").status_code == 503
    assert (index_dir / "index.sqlite3").read_bytes() == written
    assert not (index_dir / "index.sqlite3.damaged").exists()
    db = sqlite3.connect(index_dir / "index.sqlite3")
    with db:
        db.execute("UPDATE meta SET value = '1' WHERE key = 'format'")
    db.close()
    p = indexer({"peps": HANDBOOK}, index_dir, None)
    with running(p):
        status = wait_ready(p)
        assert (status["documents"], status["chunks"]) == (before["documents"], before["chunks"])
        assert status["last_pass"]["read"] == 0, "the same index, not one read again"
