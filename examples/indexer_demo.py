"""`make demo-indexer`: the indexer alone, end to end, on the example handbook.

Starts the local model server (`metis models`) and the indexer (`metis serve`) on
examples/handbook, waits until the index is ready, asks three questions with
`metis search`, and stops both. Nothing leaves this machine.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
QUESTIONS = [
    ("How many holidays do I get?", []),
    ("Xid 79", ["--mode", "keyword"]),
    ("How much can a hotel night cost?", ["--kind", "pdf"]),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metis(*args: str) -> list[str]:
    return [sys.executable, "-m", "metis_indexer.cli", *args]


@contextlib.contextmanager
def started(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


def wait(
    what: str,
    url: str,
    ready: str | None,
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout: float = 300,
) -> dict:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            body = httpx.get(url, timeout=5).json()
            last = body.get("phase", "up")
            if ready is None or body.get("phase") == ready:
                return body
        time.sleep(0.2)
    raise SystemExit(f"{what} not ready after {timeout:.0f} s (last: {last})")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metis-demo-") as tmp:
        work = Path(tmp)
        models_port, port = free_port(), free_port()
        models_url, url = f"http://127.0.0.1:{models_port}", f"http://127.0.0.1:{port}"
        print(f"$ metis models --port {models_port}")
        with started(metis("models", "--port", str(models_port)), work / "models.log") as m:
            wait("metis models", f"{models_url}/health", None, m, work / "models.log")
            print(
                f"$ metis serve --source handbook={HERE / 'handbook'} --index {work / 'index'} "
                f"--embedding {models_url} --reranker {models_url} --port {port}"
            )
            serve = metis(
                "serve",
                "--source",
                f"handbook={HERE / 'handbook'}",
                "--index",
                str(work / "index"),
                "--embedding",
                models_url,
                "--reranker",
                models_url,
                "--port",
                str(port),
            )
            with started(serve, work / "serve.log") as s:
                t = time.monotonic()
                status = wait("metis serve", f"{url}/v1/status", "ready", s, work / "serve.log")
                print(
                    f"ready in {time.monotonic() - t:.1f} s: {status['documents']} documents, "
                    f"{status['chunks']} chunks, {status['failed']} failed\n"
                )
                for question, flags in QUESTIONS:
                    print(f"$ metis search {question!r} --top-k 2 {' '.join(flags)}".rstrip())
                    subprocess.run(
                        metis("search", question, "--url", url, "--top-k", "2", *flags), check=True
                    )
                    print()
        print("stopped metis serve and metis models")


if __name__ == "__main__":
    main()
