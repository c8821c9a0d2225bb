"""A real S3-compatible server on loopback, for tests whose S3 client must fetch a bucket
(Flux's source-controller for a Bucket, through minio-go): versitygw (Apache-2.0), its posix
backend keeping each bucket as a folder and each object as a file, checking the AWS SigV4
signature of every request against one root key pair.

    with s3_server(tmp_path) as s3:
        s3.make_bucket("docs")
        s3.put("docs", "leave.md", b"# Leave\\n")
        s3.endpoint  # 127.0.0.1:PORT, plain HTTP (a Bucket's spec.insecure: true)

The binary comes from tools/s3-server/build.sh (built once a machine, about 2 minutes on
2 cores; then cached). The helpers here sign their requests by hand (SigV4, hashlib and hmac):
no S3 client library is a dependency of the project.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import httpx

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
