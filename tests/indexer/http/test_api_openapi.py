"""The OpenAPI document and the API agree: schemathesis (its CLI, every check) against
a live `metis serve` with the local embedding model, without and with the operator's
token. A bounded number of examples per operation and a fixed seed keep it the same
run every time; a failure prints the case and a curl line to reproduce it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import indexer, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
EXAMPLES = 25
"""Cases per operation and phase: about 40 s for both runs on two cores."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


@pytest.mark.parametrize("token", [None, "schemathesis-operator-token"], ids=["open", "token"])
def test_schemathesis_finds_no_disagreement(
    models: ModelServer, tmp_path: Path, token: str | None
) -> None:
    p = indexer({"handbook": HANDBOOK}, tmp_path / "index", models.base_url)
    with pytest.MonkeyPatch.context() as env:
        if token:
            env.setenv("METIS_API_TOKEN", token)
        else:
            env.delenv("METIS_API_TOKEN", raising=False)
        p.start()
    try:
        wait_ready(p)
        args = [
            str(SCHEMATHESIS),
            "run",
            f"{p.base_url}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            "0",
            "--workers",
            "1",
            "--request-timeout",
            "60",
        ]
        if token:
            args += ["--header", f"Authorization: Bearer {token}"]
        run = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "SCHEMATHESIS_HOOKS": "tests.indexer.http.schemathesis_hooks",
            },
        )
        assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-4000:]
        assert "No issues found" in run.stdout
        assert " 13 selected / 13 total" in run.stdout, run.stdout[:2000]
    finally:
        p.stop()
