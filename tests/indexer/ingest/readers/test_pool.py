"""The reader pool: same results as reading in-process, deadlines that kill, deaths that fail."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from metis_indexer.documents import FailReason, Kind, ReadFailed
from metis_indexer.index import texts
from metis_indexer.index.memory import count_words
from metis_indexer.ingest import readers
from metis_indexer.ingest.chunking import chunk_document
from metis_indexer.ingest.readers.pool import CountedChunks, Limits, ReaderPool

from .paths import PERF, POI, TORTURE

SLOW_PDF = TORTURE / "pdfjs-test-pdfs/test/pdfs/bug1978317.pdf"  # about 35 s in pypdf
FILES = [
    (PERF / "tldr/pages/common/tar.md", Kind.MD),
    (PERF / "python-peps/peps/pep-0008.rst", Kind.TXT),
    (PERF / "trafilatura-test-html/tests/cache/gregoryszorc.com.python3.html", Kind.HTML),
    (TORTURE / "py-pdf-sample-files/004-pdflatex-4-pages/pdflatex-4-pages.pdf", Kind.PDF),
    (POI / "document/61787.docx", Kind.DOCX),
]


@pytest.fixture(scope="module")
def pool():
    with ReaderPool(workers=2) as pool:
        yield pool


def test_a_worker_reads_what_the_readers_read(pool):
    futures = [pool.submit_read(path, kind) for path, kind in FILES]
    for (path, kind), future in zip(FILES, futures, strict=True):
        done = future.result()
        assert done.result == readers.read_document(path, kind)
        assert done.seconds > 0


def test_a_worker_can_chunk_so_only_chunks_come_back(pool):
    path, kind = FILES[1]
    done = pool.submit_chunks(path, kind, 800, 100).result()
    assert done.result == chunk_document(readers.read_document(path, kind), 800, 100)
    assert asyncio.run(pool.read_chunks(path, kind, 800, 100)) == done.result


def test_a_worker_can_count_the_words_of_its_chunks_as_the_index_does(pool):
    for path, kind in FILES:
        counted = asyncio.run(pool.read_counted(path, kind, 800, 100))
        assert isinstance(counted, CountedChunks)
        chunks, terms = counted.chunks, counted.terms
        assert chunks == chunk_document(readers.read_document(path, kind), 800, 100)
        here = count_words(chunks)
        assert terms.words == here.words and len(terms.words) > 0
        assert terms.which.tolist() == here.which.tolist()
        assert terms.counts.tolist() == here.counts.tolist()
        assert (
            terms.sizes.tolist()
            == here.sizes.tolist()
            == [len(texts.counted(c.title, c.headings, c.text)) for c in chunks]
        )


def test_failures_come_back_as_values(pool):
    protected = TORTURE / "camelot-test-files/tests/files/health_protected.pdf"
    result = pool.submit_read(protected, Kind.PDF).result().result
    assert isinstance(result, ReadFailed)
    assert (result.reason, result.detail) == (
        FailReason.PASSWORD,
        "the empty password does not open it",
    )


def test_bad_chunk_settings_are_refused_when_submitted(pool):
    with pytest.raises(ValueError, match="overlap"):
        pool.submit_chunks(FILES[0][0], Kind.MD, 400, 300)


def test_a_parse_past_its_deadline_is_killed_and_the_worker_replaced():
    with ReaderPool(workers=1, limits=Limits(pdf_seconds=1.0)) as pool:
        before = pool.pids
        done = pool.submit_read(SLOW_PDF, Kind.PDF).result()
        assert isinstance(done.result, ReadFailed)
        assert (done.result.reason, done.result.detail) == (
            FailReason.TIMEOUT,
            "stopped after 1 s",
        )
        assert 1.0 <= done.seconds < 10.0
        assert pool.pids != before
        assert pool.submit_read(*FILES[0]).result().result.title == "tar"


def test_every_kind_has_a_deadline(tmp_path):
    """Markdown too: 40 MB of it take seconds to parse, against a deadline of 0.05 s (a
    named pipe, which once stood for a read that never ends, is now refused at open)."""
    slow = tmp_path / "slow.md"
    slow.write_text("# A heading\n\nA paragraph with *emphasis* and a [link](x).\n\n" * 700_000)
    with ReaderPool(workers=1, limits=Limits(other_seconds=0.05)) as pool:
        result = pool.submit_read(slow, Kind.MD).result().result
    assert isinstance(result, ReadFailed)
    assert (result.reason, result.detail) == (FailReason.TIMEOUT, "stopped after 0.05 s")


def cpu_ticks(pid: int) -> int:
    """User and system CPU of a process, in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_a_worker_that_dies_fails_its_document_and_is_replaced():
    with ReaderPool(workers=1) as pool:
        [pid] = pool.pids
        assert pid is not None
        idle = cpu_ticks(pid)
        future = pool.submit_read(SLOW_PDF, Kind.PDF)  # about 35 s of parsing
        deadline = time.monotonic() + 60
        while cpu_ticks(pid) < idle + 20 and time.monotonic() < deadline:
            time.sleep(0.05)  # pacing between polls: the worker is parsing once it burns CPU
        assert not future.done(), "killed mid-read"
        os.kill(pid, signal.SIGKILL)
        result = future.result(timeout=60).result
        assert isinstance(result, ReadFailed)
        assert (result.reason, result.detail) == (
            FailReason.MALFORMED,
            "the reader process died reading it (killed by SIGKILL)",
        )
        assert pool.pids != (pid,)
        assert pool.submit_read(*FILES[0]).result().result.title == "tar"


def test_closing_fails_what_is_unfinished_and_refuses_more():
    pool = ReaderPool(workers=1)
    running = pool.submit_read(SLOW_PDF, Kind.PDF)
    queued = pool.submit_read(*FILES[0])
    pool.close()
    with pytest.raises(RuntimeError, match="the reader pool was closed"):
        running.result()
    assert isinstance(queued.exception(), RuntimeError)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit_read(*FILES[0])
