"""A real registry on loopback and a release pushed into it, shared by the real-node tests
(tests/node/test_release.py, tests/node/test_readme.py): conftest.py makes each once per
session, so the release is pushed once however many modules install it.

The registry is the CNCF distribution registry (Debian's `docker-registry`) on a free
loopback port, over plain HTTP with htpasswd (bcrypt) auth, its storage in a temporary
folder; the release is `python -m metis_dev.release` (what `make release` runs) into it,
its credentials from the environment as docs/release.md says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from metis_dev import node, release
from metis_dev.node import wait_for
from metis_dev.process import free_port
from tests.support import go_tools, processes

REGISTRY_BINARY = "/usr/bin/docker-registry"
USER = "metis"
PATH = "metis"
"""The path under the registry's host a release goes to (REGISTRY=host:port/metis)."""
PULL_SECRET = "metis-pull"
"""The pull secret's name in docs/release.md."""

Released = tuple[release.Release, Path, str]
"""What the release recorded (digests.json), its folder and its output."""


@dataclasses.dataclass(frozen=True)
class Registry:
    host: str
    password: str

    @property
    def name(self) -> str:
        """What `make release REGISTRY=` names."""
        return f"{self.host}/{PATH}"

    def get(self, path: str, *, authenticated: bool = True, **kw: Any) -> httpx.Response:
        basic = (USER, self.password) if authenticated else None
        return httpx.get(f"http://{self.host}{path}", auth=basic, timeout=10, **kw)


def _status(registry: Registry) -> int | None:
    try:
        return registry.get("/v2/", authenticated=False).status_code
    except httpx.HTTPError:
        return None


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[Registry]:
    """`docker-registry serve` on a free loopback port, its files under `folder`."""
    missing = [c for c in (REGISTRY_BINARY, "htpasswd") if shutil.which(c) is None]
    if missing:
        pytest.skip(f"{missing} missing: as root, `make node-packages` installs them")
    password = secrets.token_hex(12)
    # distribution reads bcrypt lines only; htpasswd takes the password on stdin (-i).
    line = subprocess.run(
        ["htpasswd", "-niB", USER], input=password, capture_output=True, text=True, check=True
    ).stdout
    (folder / "htpasswd").write_text(line)
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(folder / "data")}},
        "http": {"addr": f"127.0.0.1:{port}"},
        "auth": {"htpasswd": {"realm": "metis", "path": str(folder / "htpasswd")}},
    }
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    reg = Registry(f"127.0.0.1:{port}", password)
    with (folder / "registry.log").open("wb") as log:
        proc = subprocess.Popen(
            [REGISTRY_BINARY, "serve", str(folder / "config.yml")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def alive() -> None:
        if proc.poll() is not None:
            raise AssertionError((folder / "registry.log").read_text()[-3000:])

    try:
        # Unauthenticated, /v2/ answers 401 once the registry serves.
        wait_for(lambda: _status(reg) == 401, timeout=30, what="the registry's /v2/", alive=alive)
        yield reg
    finally:
        processes.stop(proc)


def make_release(registry: Registry, out: Path) -> Released:
    """`python -m metis_dev.release` (what `make release` runs) into the registry, its
    credentials from the environment: what it recorded, its folder and its output."""
    env = {
        **os.environ,
        "METIS_REGISTRY_USERNAME": USER,
        "METIS_REGISTRY_PASSWORD": registry.password,
    }
    argv = ["--registry", registry.name, "--plain-http", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "metis_dev.release", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    output = done.stdout + done.stderr
    print(f"\n{output}")
    assert done.returncode == 0, output
    recorded = release.Release.model_validate_json((out / "digests.json").read_text())
    return recorded, out, output


class Helm:
    """helm with a home of its own, logged in to the registry as docs/release.md says."""

    def __init__(self, registry: Registry, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = go_tools.built("helm")
        self.env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
            **({"KUBECONFIG": str(kubeconfig)} if kubeconfig else {}),
        }
        login = ["registry", "login", registry.host, "--username", USER, "--password-stdin"]
        self(*login, "--plain-http", input=registry.password)

    def __call__(self, *args: str, input: str | None = None) -> str:
        done = subprocess.run(
            [str(self.binary), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout


LOOPBACK_REGISTRY = "127.0.0.1:"
"""How a reference pulled from a test's registry starts (a loopback host and its port)."""


def forget_pulled(n: node.Node) -> list[str]:
    """Remove from the node's containerd every reference pulled from a test's loopback
    registry; the references removed. containerd keeps its images from node to node: a
    release's image is the project's image under another name, and the kubelet reports
    either name for a container of it, so a name left by one module is what the next one's
    pod reports (test_real_node read `127.0.0.1:<port>/metis/metis-indexer:0.1.0`)."""
    refs = [r for r in n.ctr("images", "ls", "-q").split() if r.startswith(LOOPBACK_REGISTRY)]
    for ref in refs:
        with contextlib.suppress(node.NodeError):
            n.ctr("images", "rm", ref)
    return refs
