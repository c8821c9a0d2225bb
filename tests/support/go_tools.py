"""The Go tools the tests run (tools/<name>/build.sh over tools/gobuild.sh: promtool,
lua-health, helm, kubeconform, source-controller, s3-server), built the first time on a
machine, then taken from the cache; a test skips where a tool is not built and Go is
missing to build it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def built(name: str) -> Path:
    """The path of tools/<name>'s binary, built first where it is missing (helm: minutes)."""
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / name / "build.sh")],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    if done.returncode != 0 and shutil.which(os.environ.get("GO", "go")) is None:
        pytest.skip(f"{name} is not built and Go is missing to build it: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())
