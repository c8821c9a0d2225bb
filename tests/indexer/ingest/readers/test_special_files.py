"""Names in a drive that are not regular files: a named pipe, a socket, a device node, a
link to /dev/zero. The walk does not list them; a listed file swapped for one after the
walk fails its document at once with a reason, rather than waiting for a writer that
never comes or reading zeros forever. And the pass's own file threads give up on a read
that never returns without pinning a search's thread or the process's exit."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from metis_indexer.documents import FailReason, Kind, ReadFailed
from metis_indexer.ingest import readers, sources
from metis_indexer.ingest.readers.pool import FileThreads, ReaderPool
from metis_indexer.ingest.runner import file_hash

pytestmark = pytest.mark.timeout(120)
"""Before these were refused, opening a pipe waited for a writer and hashing /dev/zero
never ended: a test that hangs is a test that fails."""

FIFO = "it is a named pipe (FIFO), not a regular file"
SOCKET = "it is a socket, not a regular file"
DEVICE = "it is a character device, not a regular file"


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        (stat.S_IFREG | 0o644, None),
        (stat.S_IFIFO | 0o644, FIFO),
        (stat.S_IFSOCK | 0o755, SOCKET),
        (stat.S_IFCHR | 0o666, DEVICE),
        (stat.S_IFBLK | 0o660, "it is a block device, not a regular file"),
        (stat.S_IFDIR | 0o755, "it is a folder, not a regular file"),
    ],
    ids=["regular", "fifo", "socket", "char-device", "block-device", "folder"],
)
def test_what_is_not_a_regular_file_is_named(mode, why):
    assert readers.not_regular(mode) == why


@pytest.fixture
def drive(tmp_path: Path) -> Path:
    root = tmp_path / "drive"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "page.md").write_text("# Page\n\nAn ordinary page.\n")
    return root


def make_socket(path: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    """A Unix socket bound at `path` (by a relative name: a pytest folder can be longer than
    the 107 bytes a socket's path may have)."""
    monkeypatch.chdir(path.parent)
    server = socket.socket(socket.AF_UNIX)
    server.bind(path.name)
    return server


@pytest.fixture
def zero_node(drive: Path) -> Path:
    """A device node like /dev/zero inside the drive, where this process may make one."""
    node = drive / "docs" / "zero.md"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    return node


def read_it(path: Path, root: Path | None) -> tuple[ReadFailed, ReadFailed]:
    """How `read_document` and `file_hash` each refuse `path`."""
    with pytest.raises(ReadFailed) as read:
        readers.read_document(path, Kind.MD, root)
    with pytest.raises(ReadFailed) as hashed:
        file_hash(path, root)
    return read.value, hashed.value


def assert_refused(path: Path, root: Path | None, why: str) -> None:
    for e in read_it(path, root):
        assert (e.reason, e.detail) == (FailReason.UNREADABLE, why)


# -- what the walk lists --------------------------------------------------------------------


def test_the_walk_lists_no_pipe_socket_or_device(drive, monkeypatch, tmp_path):
    """This much held before: a name that is not a regular file is neither listed nor
    counted, and a link to a device is a link not followed."""
    os.mkfifo(drive / "docs" / "pipe.md")
    with make_socket(drive / "docs" / "socket.md", monkeypatch):
        os.symlink("/dev/zero", drive / "docs" / "zero-outside.md")
        os.symlink(drive / "docs" / "pipe.md", drive / "docs" / "to-the-pipe.md")
        listing = sources.walk(drive)
    assert [f.path for f in listing.files] == ["docs/page.md"]
    assert listing.skipped == {}
    assert listing.links_skipped == 2


def test_the_walk_lists_no_device_node_inside_the_drive(drive, zero_node):
    listing = sources.walk(drive)
    assert [f.path for f in listing.files] == ["docs/page.md"]


# -- a listed file swapped after the walk ---------------------------------------------------


def swapped(drive: Path) -> Path:
    """The drive's one listed file, removed after the walk for something to put there."""
    [found] = sources.walk(drive).files
    found.absolute.unlink()
    return found.absolute


@pytest.mark.parametrize("root", [True, False], ids=["in-its-drive", "no-root"])
def test_a_file_swapped_for_a_named_pipe_fails_at_once(drive, root):
    page = swapped(drive)
    os.mkfifo(page)
    assert_refused(page, drive if root else None, FIFO)


def test_a_file_swapped_for_a_socket_fails_with_what_it_is(drive, monkeypatch):
    page = swapped(drive)
    with make_socket(page, monkeypatch):
        assert_refused(page, drive, SOCKET)


@pytest.mark.parametrize("root", [True, False], ids=["in-its-drive", "no-root"])
def test_a_file_swapped_for_a_link_to_dev_zero_is_not_read(drive, root):
    page = swapped(drive)
    os.symlink("/dev/zero", page)
    assert_refused(page, drive if root else None, DEVICE)


def test_a_file_swapped_for_a_link_to_a_pipe_inside_the_drive_is_not_read(drive):
    os.mkfifo(drive / "docs" / "pipe.txt")
    page = swapped(drive)
    os.symlink(drive / "docs" / "pipe.txt", page)
    assert_refused(page, drive, FIFO)


def test_a_file_swapped_for_a_device_node_inside_the_drive_is_not_read(drive, zero_node):
    page = swapped(drive)
    os.rename(zero_node, page)
    assert_refused(page, drive, DEVICE)


def test_a_regular_file_still_reads_and_hashes(drive):
    page = drive / "docs" / "page.md"
    assert readers.read_document(page, Kind.MD, drive).title == "Page"
    assert file_hash(page, drive) == file_hash(page)
    fd = readers.open_inside(page, drive)
    try:
        assert os.get_blocking(fd), "reads of the file wait for its data as usual"
    finally:
        os.close(fd)


def test_the_reader_workers_refuse_a_pipe_too(drive):
    page = swapped(drive)
    os.mkfifo(page)
    with ReaderPool(workers=1) as pool:
        done = pool.submit_read(page, Kind.MD, drive).result(timeout=120)
    assert isinstance(done.result, ReadFailed)
    assert (done.result.reason, done.result.detail) == (FailReason.UNREADABLE, FIFO)


def test_the_hash_reads_no_more_than_a_document_may_hold(tmp_path, monkeypatch):
    """A file too long to read is hashed as far as its first bytes past the limit: enough
    to see it change, without reading gigabytes before it fails as too large."""
    monkeypatch.setattr(readers, "MAX_BYTES", 1000)
    long, longer = tmp_path / "long.txt", tmp_path / "longer.txt"
    long.write_bytes(b"a" * 1001 + b"b" * 5000)
    longer.write_bytes(b"a" * 1001 + b"c" * 9000)
    fits = tmp_path / "fits.txt"
    fits.write_bytes(b"a" * 1000)
    assert file_hash(long) == file_hash(longer)
    assert file_hash(fits) != file_hash(long)


# -- the pass's own file threads ------------------------------------------------------------


@pytest.fixture
def never_written(tmp_path: Path) -> Iterator[Path]:
    """A pipe no one writes to, opened the blocking way: the stand-in for a read from a hung
    NFS server, which a test cannot make. Opened for writing at the end, to free the
    threads still waiting in it."""
    pipe = tmp_path / "hung"
    os.mkfifo(pipe)
    yield pipe
    with contextlib.suppress(OSError):  # ENXIO: no thread is waiting in it any more
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))


def release(pipe: Path) -> None:
    """Opens `pipe` for writing once a reader waits in it, which frees that reader."""
    deadline = time.monotonic() + 60
    while True:
        try:
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError:  # ENXIO: its reader is not in the open yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # pacing between tries


def blocking_read(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read()


async def files_on_threads(threads: FileThreads, hung: Path, drive: Path) -> None:
    """Two hung reads given up at their deadline, then the drive's next file fails at
    once while another drive's is still hashed."""
    for _ in range(2):
        with pytest.raises(ReadFailed) as e:
            await threads.within(drive, blocking_read, hung)
        assert e.value.reason is FailReason.TIMEOUT
        assert e.value.detail == (
            "reading it from its drive did not finish in 2 s (is the drive hung?)"
        )
    assert threads.hung(drive) == 2
    with pytest.raises(ReadFailed) as e:
        await threads.within(drive, file_hash, drive / "docs" / "page.md")
    assert e.value.detail == "2 reads of its drive have not returned in 2 s (is the drive hung?)"
    other = drive.parent / "other.md"
    other.write_text("# Other\n")
    assert await threads.within(None, file_hash, other) == file_hash(other)
    assert await threads.call(sum, [1, 2, 3]) == 6


def test_a_hung_read_times_out_and_the_drive_stops_pinning_threads(drive, never_written):
    threads = FileThreads(threads=1, seconds=2.0, most_hung=2)
    try:
        asyncio.run(files_on_threads(threads, never_written, drive))
    finally:
        threads.close()


def test_a_hung_read_returning_frees_its_drive(drive, never_written):
    threads = FileThreads(threads=1, seconds=2.0, most_hung=1)

    async def hang_then_read() -> str:
        with pytest.raises(ReadFailed):
            await threads.within(drive, blocking_read, never_written)
        await asyncio.to_thread(release, never_written)  # the drive is back
        deadline = asyncio.get_running_loop().time() + 60
        while threads.hung(drive) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)  # pacing between polls of the count
        return await threads.within(drive, file_hash, drive / "docs" / "page.md")

    try:
        assert asyncio.run(hang_then_read()) == file_hash(drive / "docs" / "page.md")
        assert threads.hung(drive) == 0
    finally:
        threads.close()


def test_search_threads_are_free_while_file_threads_hang(drive, never_written):
    """The loop's default executor (where searches rank), two threads here, answers while
    three file threads are stuck in a read: work that used it would leave it none."""
    threads = FileThreads(threads=3, seconds=60.0)
    started: list[int] = []

    def stuck() -> bytes:
        started.append(threading.get_ident())
        return blocking_read(never_written)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        work = [asyncio.create_task(threads.within(drive, stuck)) for _ in range(3)]
        deadline = loop.time() + 60
        while len(started) < 3:
            assert loop.time() < deadline, f"{len(started)} of 3 file calls started"
            await asyncio.sleep(0.05)  # pacing between looks
        answer = await asyncio.wait_for(asyncio.to_thread(sum, [1, 2]), 30)
        for task in work:
            task.cancel()
        await asyncio.gather(*work, return_exceptions=True)
        release(never_written)  # before the loop joins its executor at the end
        return answer

    try:
        assert asyncio.run(main()) == 3
    finally:
        threads.close()


def test_a_thread_stuck_in_a_read_does_not_keep_the_process_from_exiting(never_written, tmp_path):
    """A child process whose reader pool has a read stuck for good (the test's pipe) exits
    when its main code ends, as `metis serve` must on SIGTERM: executor threads would be
    joined at exit and hold it for as long as the read."""
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""
        import asyncio
        from pathlib import Path

        from metis_indexer.documents import ReadFailed
        from metis_indexer.ingest.readers.pool import Limits, ReaderPool


        def stuck(path):
            with open(path, "rb") as f:
                return f.read()


        async def main(pool):
            try:
                await pool.files.within(None, stuck, Path({str(never_written)!r}))
            except ReadFailed as e:
                print(e.reason.name, flush=True)


        if __name__ == "__main__":
            with ReaderPool(workers=1, limits=Limits(file_seconds=0.5)) as pool:
                asyncio.run(main(pool))
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "TIMEOUT"), proc.stderr
