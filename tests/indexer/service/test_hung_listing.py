"""A source drive whose listing hangs, under a real indexer: a FUSE filesystem mounted over
the drive that never answers (a stale network mount does the same). Searches answer
throughout, the pass stops, waiting, and names the source; it is tried again without a
second listing of the drive left stuck, nothing indexed from the drive is dropped, and
once the drive answers the next pass runs. Before, the listing ran on the threads searches
rank on with no deadline: the pass never ended and said nothing."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metis_indexer.config import IndexerConfig, SourceConfig
from metis_indexer.ingest import plan
from metis_indexer.ingest.runner import PassState
from metis_indexer.schema import SearchRequest
from metis_indexer.service import passes
from metis_indexer.service.service import Indexer

from .test_service import perf_drive

FILES = 12
SECONDS = 2.0
"""The listing deadline here: the real one is a quarter of an hour."""
DEADLINE = 120.0
"""Far past any state this test waits for."""
RETRIES = 2
"""Passes tried again while the drive is still hung."""


class HungDrive:
    """A folder whose every look blocks until `release`: a FUSE filesystem mounted over it
    whose connection is never answered, so the kernel holds each request (its INIT too).
    Closing the connection fails them all and the mount is taken away."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._fd: int | None = None
        self._libc = ctypes.CDLL(None, use_errno=True)

    def hang(self) -> bool:
        """Mounted; False where this machine cannot mount FUSE (no /dev/fuse, no right)."""
        try:
            fd = os.open("/dev/fuse", os.O_RDWR)
        except OSError:
            return False
        options = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}"
        if self._libc.mount(b"metis-hung", bytes(self.folder), b"fuse", 0, options.encode()):
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        self._libc.umount2(bytes(self.folder), 2)  # MNT_DETACH: no look at the folder
        os.close(self._fd)  # the requests held fail, and the stuck listing returns
        self._fd = None


class BlockedLister:
    """Where FUSE cannot be mounted, the listing of one drive blocked at `plan.scan_source`
    until `release`: a real hung mount cannot be made on such a machine."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, drive: str) -> None:
        self._open = threading.Event()
        self._open.set()
        listed = plan.scan_source

        def scan_source(source: SourceConfig) -> plan.Scan:
            if source.drive == drive:
                self._open.wait()
            return listed(source)

        monkeypatch.setattr(plan, "scan_source", scan_source)

    def hang(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()


class Hang:
    """The drive's listing hung: by a real hung mount where this machine can make one."""

    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self._mount = HungDrive(folder)
        self._stand_in = BlockedLister(monkeypatch, folder.name)

    def hang(self) -> None:
        if not self._mount.hang():
            self._stand_in.hang()

    def release(self) -> None:
        self._mount.release()
        self._stand_in.release()


@pytest.fixture
def drive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Hang]]:
    folder = perf_drive(tmp_path, files=FILES)
    hang = Hang(folder, monkeypatch)
    try:
        yield folder, hang
    finally:
        hang.release()


def listing_threads() -> list[str]:
    """The names of the threads inside a walk of a source now."""
    names = {t.ident: t.name for t in threading.enumerate()}
    found = []
    for ident, frame in sys._current_frames().items():
        f = frame
        while f is not None and f.f_code.co_name != "scan_source":
            f = f.f_back
        if f is not None:
            found.append(names.get(ident, "?"))
    return found


async def until(what: str, done: Callable[[], bool], searched: Indexer | None = None) -> None:
    """Polls `done`; with `searched`, a search answered from its index between each look."""
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while not done():
        if searched is not None:
            answer = await asyncio.wait_for(
                searched.answers.search(SearchRequest(query="Python enhancement", mode="keyword")),
                DEADLINE,
            )
            assert answer.results, "a search answered from what is indexed"
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


async def through_a_hung_listing(tmp_path: Path, folder: Path, hang: Hang) -> None:
    phases: list[str] = []  # each phase once a time: a pass tried again is scanning, waiting

    def progress(state: PassState) -> None:
        if not phases or phases[-1] != state.phase:
            phases.append(state.phase)

    config = IndexerConfig(
        sources=[SourceConfig(drive="peps", root=folder)],
        index_dir=tmp_path / "index",
        rescan_seconds=0,
        workers=1,
    )
    indexer = Indexer(config, on_progress=progress)
    state = indexer.progress.state
    await indexer.start()
    try:
        await until("the first pass done", lambda: state.completed == 1)
        indexed = sorted(indexer.passes.index.files)
        assert len(indexed) == FILES

        hang.hang()
        indexer.passes.request()
        await until("waiting, naming the hung source", lambda: state.phase == "waiting", indexer)
        assert state.reason == (
            f"the listing of source peps did not finish in {SECONDS:g} s (is the drive hung?); "
            "the pass is tried again once it has, and what was indexed from it is kept"
        )
        assert listing_threads() and all(
            name.startswith("metis-files") for name in listing_threads()
        ), "the listing is on the pass's file threads, not on those searches rank on"

        waited = phases.count("waiting")
        await until(
            "the pass tried again while the drive is hung",
            lambda: phases.count("waiting") >= waited + RETRIES,
            indexer,
        )
        assert len(listing_threads()) == 1, "one listing of the drive in flight, not one a try"
        assert state.phase == "waiting" and "source peps" in state.reason
        assert sorted(indexer.passes.index.files) == indexed, "nothing indexed is dropped"

        hang.release()
        await until("the next pass done", lambda: state.completed == 2, indexer)
        assert (state.phase, state.dropped, state.total) == ("ready", 0, 0), "all unchanged"
        assert sorted(indexer.passes.index.files) == indexed
        assert listing_threads() == []
    finally:
        hang.release()  # else a listing stuck on the threads asyncio joins at exit hangs here
        await indexer.stop()


def test_a_hung_listing_stops_the_pass_waiting_and_searches_answer_throughout(
    tmp_path, drive, monkeypatch
):
    monkeypatch.setattr(passes, "LISTING_SECONDS", SECONDS)
    folder, hang = drive
    asyncio.run(through_a_hung_listing(tmp_path, folder, hang))
