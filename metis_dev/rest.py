"""Talking to the API server: a tiny JSON client over mTLS, and kubectl with an explicit
kubeconfig."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from metis_dev.process import ControlPlaneError


class KubeApiError(RuntimeError):
    """A non-2xx answer from kube-apiserver (status code and Status body)."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"HTTP {status}: {message}")


class KubeRest:
    """A tiny JSON client for kube-apiserver with the admin client certificate.

    Why not the `kubernetes` package here: the helpers must not depend on the
    generated client's model and content-type quirks, which change between
    its major versions; plain JSON over mTLS does not."""

    def __init__(self, server: str, ctx: ssl.SSLContext, timeout: float = 15.0) -> None:
        self.server = server
        self.ctx = ctx
        self.timeout = timeout

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.ctx) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise KubeApiError(exc.code, exc.read().decode(errors="replace")) from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        """A JSON merge patch (lists are replaced, null deletes a field)."""
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)

    def gone(self, path: str) -> bool:
        """True once GET `path` answers 404."""
        try:
            self.get(path)
        except KubeApiError as exc:
            if exc.status == 404:
                return True
            raise
        return False


def run_kubectl(
    kubectl: Path | str,
    kubeconfig: Path | str,
    *args: str,
    input: str | None = None,
    check: bool = True,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run kubectl with an explicit kubeconfig (never the user's own)."""
    cmd = [str(kubectl), f"--kubeconfig={kubeconfig}", *args]
    proc = subprocess.run(
        cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise ControlPlaneError(
            f"kubectl {' '.join(args)} failed (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()}\n{proc.stdout.strip()}".rstrip()
        )
    return proc
