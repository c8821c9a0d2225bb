"""Fixtures for the local model server: one in-process encoder, one real server process.

Both share a session-private cache home, so the first load builds the ONNX graph
and the server process reuses it (which also exercises the cache).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metis_indexer.models.localmodel.encoder import Encoder
from tests.support.model_server import running_model_server


@pytest.fixture(scope="session")
def model_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XDG_CACHE_HOME of this session's own: no test reads or writes the user's cache."""
    return tmp_path_factory.mktemp("cache-home")


@pytest.fixture(scope="session")
def encoder(model_cache_home: Path) -> Encoder:
    return Encoder.load(cache_dir=model_cache_home / "metis" / "models")


@pytest.fixture(scope="session")
def model_server(model_cache_home: Path, encoder: Encoder) -> Iterator[str]:
    """The base URL of a running `python -m metis_indexer.models.localmodel` (started after
    `encoder`, so the graph is already cached)."""
    with running_model_server(cache_home=model_cache_home) as server:
        yield server.base_url
