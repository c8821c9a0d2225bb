"""The pure parts of asking peers for vectors: the passage hash, the vectors' encoding,
what of a peer's answer is used, what is left to the model, and readiness."""

from __future__ import annotations

import time

import numpy as np
import pytest
from pydantic import ValidationError

from metis_indexer.changes import peers
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
    rows = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    got = peers.usable(_answer([0, 2], rows), "m", 3, asked=3)
    assert isinstance(got, dict) and sorted(got) == [0, 2] and got[2].tolist() == [4.0, 5.0, 6.0]
    assert peers.usable(_answer([], rows[:0]), "m", 3, 3) == {}, "a peer may hold none"
    for answer, says in (
        (_answer([0, 2], rows, model="other"), "vectors of other"),
        (_answer([0, 2], rows.reshape(3, 2), dims=2), "in 2 dimensions"),
        (_answer([0, 3], rows), "positions"),  # past the asked
        (_answer([2, 0], rows), "positions"),  # out of order
        (_answer([1, 1], rows), "positions"),  # repeated
        (_answer([0], rows), "not as many"),  # more vectors than positions
        (_answer([0], np.full((1, 3), np.nan, dtype=np.float32)), "not finite"),
        (_answer([0, 1], np.zeros((2, 3), dtype=np.float32)), "zeros"),
    ):
        why = peers.usable(answer, "m", 3, 3)
        assert isinstance(why, str) and says in why, (why, says)


def test_every_vector_of_a_new_peer_is_checked_then_a_sixteenth_drawn() -> None:
    never, always = (lambda: 0.99), (lambda: 0.0)
    assert peers.to_check(range(100), 0, never) == list(range(peers.NEW_CHECKS))
    assert peers.to_check(range(10), peers.NEW_CHECKS - 3, never) == [0, 1, 2]
    assert peers.to_check(range(10), peers.NEW_CHECKS, never) == []
    assert peers.to_check(range(10), peers.NEW_CHECKS, always) == list(range(10))
    draws = iter([0.5, peers.CHECK_RATE - 1e-9, peers.CHECK_RATE])
    assert peers.to_check([7, 8, 9], 1000, lambda: next(draws)) == [8]


def test_a_vector_unlike_the_models_is_named_with_its_cosine() -> None:
    rng = np.random.default_rng(1)
    model = rng.standard_normal((4, 384)).astype(np.float32)
    assert peers.unlike(model * 3.0, model) is None, "the length of a vector is not its meaning"
    near = model + 0.05 * rng.standard_normal((4, 384)).astype(np.float32)
    assert peers.unlike(near, model) is None
    shifted = np.roll(model, 1, axis=0)
    why = peers.unlike(shifted, model)
    assert why is not None and why.startswith("4 of the 4 of its vectors checked")
    one = model.copy()
    one[2] = rng.standard_normal(384)
    why = peers.unlike(one, model)
    assert why is not None and why.startswith("1 of the 4") and f"{peers.AGREE}" in why
    assert peers.cosines(np.zeros((1, 3), np.float32), np.ones((1, 3), np.float32)).tolist() == [
        0.0
    ]


def test_an_answer_may_be_as_large_as_every_vector_asked_and_no_larger() -> None:
    hashes = [f"{i:032x}" for i in range(HASHES_MAX)]
    rows = np.ones((HASHES_MAX, 1024), dtype=np.float32)
    whole = VectorsAnswer(
        model="org/" + "m" * 200,
        dimensions=1024,
        found=list(range(HASHES_MAX)),
        vectors=peers.encode_rows(rows),
    ).model_dump_json()
    limit = peers.answer_limit(len(hashes), 1024)
    assert len(whole) <= limit < 1.01 * len(whole)


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


def test_a_refused_peer_is_named_in_words_that_do_not_change_at_each_look() -> None:
    """The status is written when it changes: a countdown would write it at every poll."""
    asking = peers.PeerVectors(None)
    asking._distrust("http://a", peers.Refused("too_slow", "its answer took over 5 s, whole"))
    now = time.monotonic()
    [said] = asking.warnings(now)
    assert asking.warnings(now + 5) == [said]
    assert said.startswith("the vectors of peer http://a are not used until ") and "UTC" in said
    assert said.endswith(": its answer took over 5 s, whole")
    assert asking.warnings(now + peers.DISTRUST_SECONDS + 1) == []
    assert peers.askable(["http://a"], asking._resting, now) == []
