"""A new embedding model costs no quality dip: its vectors are made from the stored chunks
beside the ones that answer, and switched to at once. `metis serve`, `metis models`
(all-MiniLM-L6-v2) and a genuinely different model (its first three layers,
`layered_model`) as real processes over loopback."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import layered_model
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process, free_port, running, served, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
PEPS = ROOT.parent / "shared" / "data" / "perf" / "python-peps" / "peps"
OLD_ID = "sentence-transformers/all-MiniLM-L6-v2"
EVALS = [json.loads(line) for line in (HANDBOOK / ".metis" / "evals.jsonl").open()]
PETS = "# Pets\n\n" + "\n\n".join(
    f"Dogs are welcome in the office on Fridays, rule {i}: they stay calm, on a leash, and "
    "away from the kitchen; cats, rabbits and birds stay at home with a neighbour."
    for i in range(16)
)


@pytest.fixture(scope="module")
def old_model() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


def sources(tmp_path: Path) -> dict[str, Path]:
    """The handbook (whose questions have known answers) and a dozen PEPs: 225 chunks."""
    handbook = tmp_path / "handbook"
    shutil.copytree(HANDBOOK, handbook)
    peps = tmp_path / "peps"
    peps.mkdir()
    for path in sorted(PEPS.glob("pep-0*.rst"))[:12]:
        shutil.copyfile(path, peps / path.name)
    return {"handbook": handbook, "peps": peps}


def configure(path: Path, drives: dict[str, Path], index: Path, url: str, **extra: Any) -> None:
    config = {
        "sources": [{"drive": d, "root": str(root)} for d, root in drives.items()],
        "embedding": {"url": url, "name": url},
        "index_dir": str(index),
        "rescan_seconds": 0,
        **extra,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config))
    tmp.replace(path)  # whole, as a ConfigMap's mount changes


def counts(server: ModelServer) -> dict[str, int]:
    return httpx.get(f"{server.base_url}/counts", timeout=10).json()


def allow(server: ModelServer, passages: int | None = None) -> None:
    params = {} if passages is None else {"passages": passages}
    httpx.post(f"{server.base_url}/allow", params=params, timeout=10).raise_for_status()


def ask(p: Process, question: str) -> dict[str, Any]:
    return p.post("/v1/search", {"query": question, "top_k": 5}).json()


def found(answer: dict[str, Any], expected: str) -> list[dict[str, Any]]:
    return [
        r
        for r in answer["results"]
        if f"{r['citation']['source']}/{r['citation']['document']}" == expected
    ]


def assert_by_meaning(p: Process) -> None:
    """Every question of the handbook answered by meaning and words, its document in the
    top 5."""
    for case in EVALS:
        answer = ask(p, case["question"])
        assert answer["mode"] == "hybrid" and answer["warnings"] == [], (case, answer["warnings"])
        hits = found(answer, case["expected"][0])
        assert hits, (case["question"], [r["citation"]["document"] for r in answer["results"]])
        assert any(r["scores"].get("dense") is not None for r in answer["results"])


def stored(index: Path) -> list[tuple[Any, ...]]:
    """Every chunk as (source, path, ord, headings, text, built_with, vector)."""
    db = sqlite3.connect(index / "index.sqlite3")
    try:
        return db.execute(
            "SELECT f.source, f.path, c.ord, c.headings, c.text, f.built_with, c.vector"
            " FROM chunks c JOIN files f ON f.id = c.file_id ORDER BY f.source, f.path, c.ord"
        ).fetchall()
    finally:
        db.close()


def test_a_new_model_answers_once_all_its_vectors_are_made_and_equals_a_fresh_build(
    old_model, tmp_path
):
    drives = sources(tmp_path)
    config, index = tmp_path / "config.json", tmp_path / "index"
    new = layered_model.start(tmp_path / "layered", allow=0)
    try:
        port = free_port()
        configure(config, drives, index, old_model.base_url, port=port, generation=1)
        with running(served(config, port)) as p:
            chunks = wait_ready(p)["chunks"]
            assert chunks > 128, "staged in batches"

            configure(config, drives, index, new.base_url, port=port, generation=2)
            staging = p.wait_status(
                "the new model's vectors being made",
                lambda s: (
                    s["phase"] == "indexing"
                    and (s.get("embedding") or {}).get("next") == layered_model.MODEL_ID
                    and counts(new)["held"] > 0
                ),
            )
            assert staging["embedding"] == {
                "answering": OLD_ID,
                "next": layered_model.MODEL_ID,
                "done": 0,
                "total": chunks,
            }
            assert OLD_ID in staging["reason"] and layered_model.MODEL_ID in staging["reason"]
            assert f"0 of {chunks} chunks" in staging["reason"]
            (drives["handbook"] / "policies" / "pets.md").write_text(PETS)
            assert_by_meaning(p)
            assert counts(new)["passages"] == 0, "no question went to the new model"

            allow(new, chunks)  # every stored chunk, then the pets file's are held
            p.wait_status(
                "the file written meanwhile read with the old model, its staging held",
                lambda s: (
                    s["chunks"] > chunks
                    and s["embedding"]["done"] == chunks
                    and counts(new)["held"] > 0
                ),
            )
            answer = ask(p, "Can I bring my dog to the office?")
            assert answer["mode"] == "hybrid" and answer["warnings"] == []
            [pets] = found(answer, "handbook/policies/pets.md")[:1]
            assert pets["scores"]["dense"] is not None, "answered by the old model's vectors"
            assert_by_meaning(p)

            allow(new)
            done = p.wait_status(
                "the switch",
                lambda s: s["phase"] == "ready" and s["indexed_generation"] == 2,
            )
            total = done["chunks"]
            assert done["embedding"] == {
                "answering": layered_model.MODEL_ID,
                "next": None,
                "done": 0,
                "total": 0,
            }
            assert done["dimensions"] == 384 and done["last_pass"]["read"] == 0
            assert counts(new)["passages"] == total, "each chunk embedded once, no file read"
            assert_by_meaning(p)
            assert counts(new)["passages"] == total + len(EVALS), "questions go to the new model"
            assert f"metis_embedding_staged_chunks_total {float(total)}" in p.get("/metrics").text

        fresh_index = tmp_path / "fresh"
        fresh_config = tmp_path / "fresh.json"
        fresh_port = free_port()
        configure(fresh_config, drives, fresh_index, new.base_url, port=fresh_port)
        with running(served(fresh_config, fresh_port)) as fresh:
            assert wait_ready(fresh)["chunks"] == total
    finally:
        new.stop()
    switched, built = stored(index), stored(fresh_index)
    assert [row[:6] for row in switched] == [row[:6] for row in built], "chunk for chunk"
    a = np.stack([np.frombuffer(row[6], dtype="<f4") for row in switched])
    b = np.stack([np.frombuffer(row[6], dtype="<f4") for row in built])
    assert a.shape == (total, 384) and float((a * b).sum(axis=1).min()) > 0.9999


def test_a_kill_mid_change_resumes_by_meaning_and_embeds_only_what_was_not_staged(tmp_path):
    drives = sources(tmp_path)
    config, index = tmp_path / "config.json", tmp_path / "index"
    old = start_model_server()
    new = layered_model.start(tmp_path / "layered", allow=168)
    try:
        port = free_port()
        configure(config, drives, index, old.base_url, port=port)
        with running(served(config, port)) as p:
            chunks = wait_ready(p)["chunks"]
        configure(config, drives, index, new.base_url, port=port)
        with running(served(config, port)) as p:
            p.wait_status(
                "a first batch staged, the next held",
                lambda s: (
                    (s.get("embedding") or {}).get("done", 0) >= 128 and counts(new)["held"] > 0
                ),
            )
            p.kill()
        db = sqlite3.connect(index / "index.sqlite3")
        staged = db.execute("SELECT COUNT(*) FROM staged").fetchone()[0]
        db.close()
        assert staged == 128, "what a kill loses is the batch in flight"
        before = counts(new)["passages"]
        assert before > staged

        with running(served(config, port)) as p:
            resumed = p.wait_status(
                "the change resumed, held again",
                lambda s: s["phase"] == "indexing" and (s.get("embedding") or {}).get("next"),
            )
            assert resumed["embedding"]["answering"] == OLD_ID
            assert resumed["embedding"]["done"] == staged
            assert_by_meaning(p)

            old.stop()
            answer = ask(p, "How many holidays do I get each year?")
            assert answer["mode"] == "keyword" and answer["results"]
            [warning] = answer["warnings"]
            assert warning.startswith(f"the old embedding model {old.base_url} (its vectors ")
            assert f"until those of embedding model {layered_model.MODEL_ID} are made" in warning
            assert warning.endswith("results by keywords only"), warning

            allow(new)
            done = wait_ready(p)
            assert done["embedding"]["answering"] == layered_model.MODEL_ID
            assert counts(new)["passages"] - before == chunks - staged, "none embedded twice"
            assert_by_meaning(p)
    finally:
        old.stop()
        new.stop()
