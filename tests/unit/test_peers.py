"""The pure parts of asking peers for vectors: the passage hash, the vectors' encoding,
what of a peer's answer is used, what is left to the model, and readiness."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from metis_indexer import peers
from metis_indexer.config import IndexerConfig
from metis_indexer.schema import HASHES_MAX, VectorsAnswer, VectorsRequest


def _answer(found: list[int], rows: np.ndarray, model: str = "m", dims: int = 3) -> VectorsAnswer:
    return VectorsAnswer(model=model, dimensions=dims, found=found, vectors=peers.encode_rows(rows))


def test_the_hash_is_of_exactly_the_text_sent() -> None:
    h = peers.passage_hash("search_document: Title\n\ntext")
    assert len(h) == 32 and int(h, 16) >= 0
    assert h == peers.passage_hash("search_document: Title\n\ntext")
    assert h != peers.passage_hash("Title\n\ntext"), "the prefix is part of what is hashed"
    assert peers.passage_hash("\ud800 lone surrogate")  # never fails on what a file holds
    VectorsRequest(model="m", hashes=[h])


def test_rows_go_and_come_back_bit_for_bit() -> None:
    rows = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    back = peers.decode_rows(peers.encode_rows(rows), 4, 5)
    assert back is not None and back.tobytes() == rows.tobytes()
    assert peers.decode_rows(peers.encode_rows(rows), 4, 6) is None
    assert peers.decode_rows("not base64!", 1, 1) is None
    assert peers.decode_rows("", 0, 0) is None


def test_only_an_answer_of_the_asked_model_that_adds_up_is_used() -> None:
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = peers.usable(_answer([0, 2], rows), "m", 3, asked=3)
    assert sorted(got) == [0, 2] and got[2].tolist() == [3.0, 4.0, 5.0]
    assert peers.usable(_answer([0, 2], rows, model="other"), "m", 3, 3) == {}
    assert peers.usable(_answer([0, 2], rows.reshape(3, 2), dims=2), "m", 3, 3) == {}
    assert peers.usable(_answer([0, 3], rows), "m", 3, 3) == {}, "a position past the asked"
    assert peers.usable(_answer([2, 0], rows), "m", 3, 3) == {}, "out of order"
    assert peers.usable(_answer([1, 1], rows), "m", 3, 3) == {}, "repeated"
    assert peers.usable(_answer([0], rows), "m", 3, 3) == {}, "more vectors than positions"
    nan = np.full((1, 3), np.nan, dtype=np.float32)
    assert peers.usable(_answer([0], nan), "m", 3, 3) == {}


def test_the_model_embeds_only_what_no_peer_gave_and_the_order_is_kept() -> None:
    found = {1: np.ones(2, np.float32), 3: np.full(2, 3, np.float32)}
    rest = peers.left_to_embed(4, found)
    assert rest == [0, 2]
    embedded = np.array([[0, 0], [2, 2]], dtype=np.float32)
    out = peers.merged(4, 2, found, rest, embedded)
    assert out[:, 0].tolist() == [0, 1, 2, 3]
    assert peers.merged(2, 2, {0: found[1], 1: found[3]}, [], None)[:, 0].tolist() == [1, 3]


def test_a_resting_peer_is_not_asked_until_its_rest_ends() -> None:
    listed = ["http://a", "http://b"]
    assert peers.askable(listed, {}, 10.0) == listed
    assert peers.askable(listed, {"http://a": 70.0}, 10.0) == ["http://b"]
    assert peers.askable(listed, {"http://a": 70.0}, 70.0) == listed


def test_readiness_waits_for_a_whole_pass_only_with_peers() -> None:
    assert peers.not_ready([], passed=False) is None
    assert peers.not_ready(["http://a"], passed=True) is None
    assert peers.not_ready(["http://a"], passed=False) == peers.NOT_READY


@pytest.mark.parametrize(
    ("loaded", "configured", "held", "changing", "says"),
    [
        (False, "m", "m", False, "not loaded"),
        (True, None, "m", False, "has not answered"),
        (True, "m", None, False, "no vectors yet"),
        (True, "n", "m", False, "changing to n"),
        (True, "m", "m", True, "changing to m"),
        (True, "other", "other", False, "holds the vectors of other, not of m"),
    ],
)
def test_an_index_gives_only_its_own_models_vectors(
    loaded: bool, configured: str | None, held: str | None, changing: bool, says: str
) -> None:
    why = peers.serving_problem("m", loaded, configured, held, changing)
    assert why is not None and says in why
    assert peers.serving_problem("m", True, "m", "m", False) is None


def test_the_request_is_bounded_and_its_hashes_checked() -> None:
    h = "0" * 32
    VectorsRequest(model="m", hashes=[h] * HASHES_MAX)
    for hashes in ([h] * (HASHES_MAX + 1), [], ["0" * 31], ["G" * 32]):
        with pytest.raises(ValidationError):
            VectorsRequest(model="m", hashes=hashes)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://a", "not an http:// or https:// URL"),
        ("http://", "names no host"),
        ("a:7700", "not an http:// or https:// URL"),
        ("http://a:70000", "is not a URL"),
        ("http://a/?x=1", "without a query"),
    ],
)
def test_peers_must_be_http_base_urls(url: str, says: str) -> None:
    base = {"sources": [{"drive": "d", "root": "/d"}], "index_dir": "/i"}
    with pytest.raises(ValidationError) as e:
        IndexerConfig.model_validate({**base, "peers": [url]})
    assert "peers" in str(e.value) and says in str(e.value)
    ok = IndexerConfig.model_validate({**base, "peers": ["https://kb.ns.svc:7700/"]})
    assert ok.peers == ["https://kb.ns.svc:7700"]
    assert IndexerConfig.model_validate(base).peers == []
