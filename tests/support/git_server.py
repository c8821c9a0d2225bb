"""A real Git server on loopback, for tests whose Git client must fetch over HTTP (Flux's
source-controller, through go-git): git's own `git http-backend`, the smart-HTTP server that
git ships, behind a small threaded HTTP server that runs it as CGI, one process a request.

    with git_server(tmp_path) as server:
        repo = server.create("handbook")
        sha = repo.commit({"README.md": "# Handbook\\n"})
        server.url("handbook")  # http://127.0.0.1:PORT/handbook.git

Repositories are bare, under `root/git`; each has a work tree under `root/work` that commits
and pushes to it through the file system, so what the server serves is what git pushed.
Nothing reads the user's git configuration.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO
from urllib.parse import unquote, urlsplit

BRANCH = "main"

_GIT_ENV = {
    # Neither ~/.gitconfig nor /etc/gitconfig: the same repositories on every machine.
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Metis Tests",
    "GIT_AUTHOR_EMAIL": "tests@metis.invalid",
    "GIT_COMMITTER_NAME": "Metis Tests",
    "GIT_COMMITTER_EMAIL": "tests@metis.invalid",
}


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git with the tests' identity and no user configuration; its stdout, stripped."""
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env={**os.environ, **_GIT_ENV},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _backend() -> str:
    """git-http-backend is not on PATH: it lives in git's exec path (/usr/lib/git-core)."""
    return str(Path(git("--exec-path")) / "git-http-backend")


@dataclass
class Repository:
    """A bare repository that the server exports and the work tree that pushes to it."""

    name: str
    bare: Path
    work: Path

    def commit(
        self,
        files: Mapping[str, str | bytes | None],
        message: str = "change",
        *,
        amend: bool = False,
    ) -> str:
        """Write `files` (path: content; None deletes the file), commit them all, push, and
        return the new commit's sha. `amend` replaces the last commit and force-pushes: the
        branch's old head is then gone from the server (history rewritten)."""
        for path, content in files.items():
            target = self.work / path
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
        git("add", "--all", cwd=self.work)
        amending = ["--amend"] if amend else []
        git("commit", "--quiet", "--allow-empty", "-m", message, *amending, cwd=self.work)
        self.push(force=amend)
        return self.head()

    def push(self, *, force: bool = False) -> None:
        """Push the work tree's branch to the served repository."""
        forcing = ["--force"] if force else []
        git("push", "--quiet", *forcing, "origin", f"HEAD:refs/heads/{BRANCH}", cwd=self.work)

    def reset(self, revision: str) -> str:
        """Move the branch back to `revision` and force-push it; the sha it now points at."""
        git("reset", "--quiet", "--hard", revision, cwd=self.work)
        self.push(force=True)
        return self.head()

    def head(self) -> str:
        """The sha the served branch points at."""
        return git("rev-parse", f"refs/heads/{BRANCH}", cwd=self.bare)


class _CGIBridge(BaseHTTPRequestHandler):
    """Runs git http-backend for each request, as a CGI server would (RFC 3875)."""

    server: _Server

    def do_GET(self) -> None:
        self._run()

    def do_POST(self) -> None:
        self._run()

    def _run(self) -> None:
        url = urlsplit(self.path)
        env = {
            **os.environ,
            **_GIT_ENV,
            "GIT_PROJECT_ROOT": str(self.server.project_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": self.request_version,
            "REQUEST_METHOD": self.command,
            "PATH_INFO": unquote(url.path),
            "QUERY_STRING": url.query,
            "REMOTE_ADDR": self.client_address[0],
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
        }
        # Other headers go as HTTP_*: git reads Git-Protocol (v2) and Content-Encoding (gzip).
        for key, value in self.headers.items():
            if key.lower() not in {"content-type", "content-length"}:
                env["HTTP_" + key.upper().replace("-", "_")] = value
        body = self._body()
        if body is not None:
            env["CONTENT_LENGTH"] = str(len(body))
        proc = subprocess.Popen(
            [self.server.backend],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None
        # Fed from a thread: the backend may answer before it has read everything.
        feeder = threading.Thread(target=_feed, args=(proc.stdin, body or b""), daemon=True)
        feeder.start()
        try:
            self._relay(proc.stdout)
        finally:
            feeder.join()
            proc.stdout.close()
            proc.wait()

    def _body(self) -> bytes | None:
        """The request's body, whether sized or chunked (git sends large requests chunked)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        length = self.headers.get("Content-Length")
        return None if length is None else self.rfile.read(int(length))

    def _relay(self, out: IO[bytes]) -> None:
        """The CGI answer's headers (Status: among them) as an HTTP answer, then its body,
        streamed; HTTP/1.0, so the body ends where the connection closes."""
        status, headers = "200 OK", []
        while line := out.readline().rstrip(b"\r\n"):
            key, _, value = line.decode("latin-1").partition(":")
            if key.lower() == "status":
                status = value.strip()
            else:
                headers.append((key, value.strip()))
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason or None)
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        shutil.copyfileobj(out, self.wfile)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a fetch is several requests; failing tests show git's own errors."""


def _feed(stdin: IO[bytes], body: bytes) -> None:
    with contextlib.suppress(BrokenPipeError):
        stdin.write(body)
    with contextlib.suppress(BrokenPipeError):
        stdin.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, project_root: Path) -> None:
        self.project_root = project_root
        self.backend = _backend()
        super().__init__(("127.0.0.1", 0), _CGIBridge)


@dataclass
class GitServer:
    """The running server: repositories to make, and their URLs."""

    root: Path
    port: int

    def url(self, name: str) -> str:
        """Where a Git client clones repository `name` from."""
        return f"http://127.0.0.1:{self.port}/{name}.git"

    def create(self, name: str) -> Repository:
        """An empty repository `name` (branch main), served at url(name)."""
        bare = self.root / "git" / f"{name}.git"
        work = self.root / "work" / name
        git("init", "--quiet", "--bare", f"--initial-branch={BRANCH}", str(bare))
        git("init", "--quiet", f"--initial-branch={BRANCH}", str(work))
        git("remote", "add", "origin", str(bare), cwd=work)
        return Repository(name, bare, work)


@contextlib.contextmanager
def git_server(root: Path) -> Iterator[GitServer]:
    """A Git server on a free loopback port, serving the repositories made under `root`."""
    (root / "git").mkdir(parents=True, exist_ok=True)
    server = _Server(root / "git")
    thread = threading.Thread(target=server.serve_forever, name="git-server", daemon=True)
    thread.start()
    try:
        yield GitServer(root, server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
