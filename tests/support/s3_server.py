"""A real S3-compatible server on loopback, for tests whose S3 client must fetch a bucket
(Flux's source-controller for a Bucket, through minio-go): versitygw (Apache-2.0), its posix
backend keeping each bucket as a folder and each object as a file, checking the AWS SigV4
signature of every request against one root key pair.

    with s3_server(tmp_path) as s3:
        s3.make_bucket("docs")
        s3.put("docs", "leave.md", b"# Leave\\n")
        s3.endpoint  # 127.0.0.1:PORT, plain HTTP (a Bucket's spec.insecure: true)

The binary comes from tools/s3-server/build.sh (built once a machine, about 2 minutes on
2 cores; then cached). The helpers here sign their requests by hand (SigV4, hashlib and hmac),
as a client the indexer's boto3 does not share code with; `write_keys` writes the key pair
as the indexer reads it (a Secret's files), and `Holding` stands between the indexer and
the server, holding the requests a test names (a backup stopped before its manifest).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import httpx
from aiohttp import web

from metis_dev.process import Process, free_port, wait_for
from tests.support import go_tools

REGION = "us-east-1"
"""versitygw's default region; SigV4 signs it into every request's scope."""


def binary() -> Path:
    """versitygw, built first where it is missing (about 2 minutes on 2 cores)."""
    return go_tools.built("s3-server")


def sigv4_headers(
    method: str,
    url: httpx.URL,
    body: bytes,
    access_key: str,
    secret_key: str,
    region: str = REGION,
    now: datetime | None = None,
) -> dict[str, str]:
    """The headers that sign a request to S3 with AWS Signature Version 4 (the `Authorization`
    header form, path-style URL, the payload's SHA-256 signed). Query parameters are signed
    sorted by name, as the scheme wants; the path is taken as already encoded."""
    when = now or datetime.now(UTC)
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    payload = hashlib.sha256(body).hexdigest()
    host = url.netloc.decode()
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": stamp}
    signed = ";".join(sorted(headers))
    query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
        for k, v in sorted(url.params.multi_items())
    )
    canonical = "\n".join(
        [
            method,
            url.raw_path.split(b"?", 1)[0].decode() or "/",
            query,
            "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
            signed,
            payload,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            stamp,
            scope,
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    key = f"AWS4{secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "x-amz-content-sha256": payload,
        "x-amz-date": stamp,
        "authorization": (
            f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        ),
    }


@dataclass
class S3Server:
    """The running server: its process, address, root key pair and the folder it serves."""

    process: Process
    endpoint: str
    """host:port, plain HTTP, path-style addressing."""
    access_key: str
    secret_key: str
    root: Path

    def check_alive(self) -> None:
        """Raise with the log's tail if the server has exited (for wait_for's `alive`)."""
        self.process.check_alive()

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """One request signed with the root key; `path` is /bucket[/key], unencoded."""
        url = httpx.URL(f"http://{self.endpoint}{quote(path, safe='/-_.~')}", params=params)
        headers = sigv4_headers(method, url, body, self.access_key, self.secret_key)
        return httpx.request(method, url, content=body, headers=headers, timeout=30)

    def _expect(self, response: httpx.Response, *codes: int) -> httpx.Response:
        if response.status_code not in codes:
            raise AssertionError(
                f"S3 {response.request.method} {response.request.url}: "
                f"{response.status_code} {response.text}"
            )
        return response

    def make_bucket(self, name: str) -> None:
        self._expect(self.request("PUT", f"/{name}"), 200)

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Write (or overwrite) one object; its ETag, unquoted."""
        response = self._expect(self.request("PUT", f"/{bucket}/{key}", data), 200)
        etag: str = response.headers.get("etag", "")
        return etag.strip('"')

    def get(self, bucket: str, key: str) -> bytes:
        return self._expect(self.request("GET", f"/{bucket}/{key}"), 200).content

    def delete(self, bucket: str, key: str) -> None:
        self._expect(self.request("DELETE", f"/{bucket}/{key}"), 204, 200)

    @property
    def url(self) -> str:
        """The endpoint as an S3 client's endpoint_url."""
        return f"http://{self.endpoint}"

    def write_keys(self, folder: Path) -> Path:
        """The root key pair as files `accesskey` and `secretkey` of `folder` (a mounted
        Secret, a Flux Bucket's key names): what the indexer's `secret_dir` names."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "accesskey").write_text(self.access_key)
        (folder / "secretkey").write_text(self.secret_key)
        return folder

    def keys(self, bucket: str) -> list[str]:
        """Every object's key in `bucket`, from the server's own folder (posix backend)."""
        root = self.root / bucket
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


class Holding:
    """A loopback HTTP proxy to the S3 server that forwards every request as it came (its
    Host header too, which the SigV4 signature covers) but holds, unanswered for ever, those
    `hold(method, path)` names; `held` is set when the first arrives.

        with Holding(s3, lambda method, path: path.endswith("/manifest.json")) as proxy:
            proxy.url  # the endpoint to give the client
    """

    def __init__(self, server: S3Server, hold: Callable[[str, str], bool]) -> None:
        self.server = server
        self.hold = hold
        self.held = threading.Event()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._closing = False

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self.hold(request.method, request.path):
            self.held.set()
            while not self._closing:  # unanswered until the proxy closes
                await asyncio.sleep(0.05)
            return web.Response(status=503)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "transfer-encoding"}
        async with httpx.AsyncClient(timeout=60) as client:
            answered = await client.request(
                request.method,
                f"http://{self.server.endpoint}{request.raw_path}",
                content=body,
                headers=headers,
            )
        drop = {"transfer-encoding", "content-encoding", "content-length", "connection"}
        kept = {k: v for k, v in answered.headers.items() if k.lower() not in drop}
        return web.Response(status=answered.status_code, body=answered.content, headers=kept)

    async def _start(self) -> str:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    def __enter__(self) -> Holding:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *_: object) -> None:
        self._closing = True
        if self._runner is not None:
            runner = self._runner
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def s3_server(workdir: Path) -> Iterator[S3Server]:
    """versitygw on a free 127.0.0.1 port, serving workdir/data with a fresh root key pair,
    ready (a signed ListBuckets answers 200); stopped afterwards. Its log is
    workdir/s3-server.log."""
    built = binary()
    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir / "data"
    # Object metadata (ETags, content types, bucket ACLs) in a folder of its own rather than
    # in extended attributes, which not every file system a test runs on keeps (tmpfs on
    # older kernels). Without it the ETag never changes, and so neither does a Bucket's
    # revision, which Flux computes from the keys and ETags.
    sidecar = workdir / "meta"
    root.mkdir(exist_ok=True)
    sidecar.mkdir(exist_ok=True)
    endpoint = f"127.0.0.1:{free_port()}"
    access_key, secret_key = f"metis{secrets.token_hex(6)}", secrets.token_hex(20)
    process = Process(
        "s3-server",
        [
            str(built),
            f"--port={endpoint}",
            "--region",
            REGION,
            "--quiet",
            "posix",
            f"--sidecar={sidecar}",
            str(root),
        ],
        workdir / "s3-server.log",
        # Given by environment, not flags: a key on the command line shows in `ps`.
        env={"ROOT_ACCESS_KEY": access_key, "ROOT_SECRET_KEY": secret_key},
    ).start()
    server = S3Server(process, endpoint, access_key, secret_key, root)
    try:
        wait_for(
            lambda: server.request("GET", "/").status_code == 200,
            timeout=30,
            what=f"the S3 server's ListBuckets ({process.log_path})",
            alive=server.check_alive,
        )
        yield server
    finally:
        process.stop()
