"""tools/progress.sh, the progress of a cold machine's long steps: a wait on a build lock
names its holder and counts the seconds, and a long build says what it still does."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

from pytest import MonkeyPatch

from metis_dev import progress

ROOT = Path(__file__).resolve().parents[2]
PROGRESS = ROOT / "tools" / "progress.sh"


def bash(script: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", "-c", f'source "{PROGRESS}"\n{script}'],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "METIS_PROGRESS_SECONDS": "1", **env},
    )


def test_a_wait_on_the_lock_names_its_holder_and_counts(tmp_path: Path) -> None:
    lock = tmp_path / ".build.lock"
    (tmp_path / ".build.lock.holder").write_text("pid 42 (build.sh building kube since 10:00:00Z)")
    held = os.open(lock, os.O_CREAT | os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    proc = bash(f'exec 9>"{lock}"; take_lock 9 "{lock}" "the binaries"; echo taken')
    assert proc.stderr is not None
    said = []
    deadline = time.monotonic() + 30
    while not any("still waiting" in line for line in said):
        assert time.monotonic() < deadline, said
        said.append(proc.stderr.readline())
    fcntl.flock(held, fcntl.LOCK_UN)
    os.close(held)
    out, rest = proc.communicate(timeout=30)
    said.append(rest)
    text = "".join(said)
    assert "waiting for the lock on the binaries: pid 42 (build.sh building kube" in text
    assert "still waiting for the lock on the binaries (" in text
    assert "got the lock on the binaries after" in text
    assert out == "taken\n"
    # The new holder says who it is, for the next one to wait.
    assert "building the binaries since" in (tmp_path / ".build.lock.holder").read_text()


def test_a_long_command_says_it_is_still_running_and_keeps_its_status() -> None:
    proc = bash('with_heartbeat "building etcd" bash -c "sleep 2.5; exit 3"; echo "status $?"')
    out, err = proc.communicate(timeout=30)
    assert out == "status 3\n"
    assert err.count("still building etcd (") >= 2
    quiet = bash('with_heartbeat "building etcd" true; echo "status $?"')
    out, err = quiet.communicate(timeout=30)
    assert (out, err) == ("status 0\n", "")


def test_a_long_python_step_says_what_it_does_as_it_goes(monkeypatch: MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(progress, "say", said.append)
    with progress.step("building the base image", done="tagged localhost/base:1", every=0.05):
        deadline = time.monotonic() + 30
        while not any(line.startswith("  still building the base image (") for line in said):
            assert time.monotonic() < deadline, said
            time.sleep(0.01)
    assert said[0] == "building the base image ..."
    assert said[-1].startswith("  building the base image: done in ")
    assert said[-1].endswith("; tagged localhost/base:1")
