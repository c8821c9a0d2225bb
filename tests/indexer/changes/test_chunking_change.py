"""A new chunking costs no quality dip: its index is built beside the one that answers, in
a folder of its own, and answers in its place once complete; a kill mid-build resumes it.
`metis serve` and a real model (all-MiniLM-L6-v2's first three layers, `layered_model`,
whose requests can be held mid-build) as real processes over loopback."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metis_indexer.ingest.chunking import chunk_document
from metis_indexer.ingest.readers import kind_of, read_document
from tests.indexer.changes.test_model_change import allow, counts, served
from tests.indexer.service.test_faults import mount_tmpfs
from tests.indexer.service.test_live_damage import damage_chunk_pages
from tests.support import layered_model
from tests.support.model_server import ModelServer
from tests.support.processes import Process, free_port, running, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
PEPS = ROOT.parent / "shared" / "data" / "perf" / "python-peps" / "peps"
EVALS = [json.loads(line) for line in (HANDBOOK / ".metis" / "evals.jsonl").open()]
OLD, NEW = {"size": 1200, "overlap": 200}, {"size": 700, "overlap": 100}


def sources(tmp_path: Path) -> dict[str, Path]:
    """The handbook (whose questions have known answers) and six PEPs."""
    handbook = tmp_path / "handbook"
    shutil.copytree(HANDBOOK, handbook)
    peps = tmp_path / "peps"
    peps.mkdir()
    for path in sorted(PEPS.glob("pep-0*.rst"))[:6]:
        shutil.copyfile(path, peps / path.name)
    return {"handbook": handbook, "peps": peps}


def configure(
    path: Path,
    drives: dict[str, Path],
    index: Path,
    url: str,
    port: int,
    chunking: dict[str, int],
    generation: int | None = None,
) -> None:
    """The indexer's configuration file; `generation` (as the operator writes it) lets a test
    see in the status that the indexer took it."""
    config = {
        "sources": [{"drive": d, "root": str(root)} for d, root in drives.items()],
        "embedding": {"url": url, "name": "layered"},
        "index_dir": str(index),
        "port": port,
        "chunking": chunking,
        "rescan_seconds": 0,
        **({} if generation is None else {"generation": generation}),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config))
    tmp.replace(path)  # whole, as a ConfigMap's mount changes


def cut(drives: dict[str, Path], chunking: dict[str, int]) -> list[tuple[str, int, str]]:
    """Every chunk the sources' documents are cut into (hidden folders are not read), as
    (document, headings, text)."""
    chunks = []
    for root in drives.values():
        for path in sorted(root.rglob("*")):
            hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
            kind = kind_of(path.name)
            if hidden or kind is None or not path.is_file():
                continue
            for c in chunk_document(
                read_document(path, kind), chunking["size"], chunking["overlap"]
            ):
                chunks.append((str(path), hash(c.headings), c.text))
    return chunks


def assert_by_meaning(p: Process) -> None:
    """Every question of the handbook answered by meaning and words, its document in the
    top 5."""
    for case in EVALS:
        answer = p.post("/v1/search", {"query": case["question"], "top_k": 5}).json()
        assert answer["mode"] == "hybrid" and answer["warnings"] == [], (case, answer["warnings"])
        cited = [
            f"{r['citation']['source']}/{r['citation']['document']}" for r in answer["results"]
        ]
        assert case["expected"][0] in cited, (case["question"], cited)
        assert any(r["scores"].get("dense") is not None for r in answer["results"])


def building(s: dict[str, Any]) -> bool:
    chunking = s.get("chunking") or {}
    return chunking.get("next") == NEW and chunking["done"] > 0


@dataclasses.dataclass
class Change:
    """A running indexer whose chunking changed from OLD to NEW, the build held mid-way."""

    p: Process
    model: ModelServer
    drives: dict[str, Path]
    config: Path
    index: Path
    port: int
    first: dict[str, Any]
    """The status once the index of OLD chunks was ready."""
    during: dict[str, Any]
    """The status once the build was held."""

    def configure(self, chunking: dict[str, int], generation: int | None = None) -> None:
        configure(
            self.config,
            self.drives,
            self.index,
            self.model.base_url,
            self.port,
            chunking,
            generation,
        )


@contextlib.contextmanager
def held_mid_build(
    tmp_path: Path, until: Callable[[dict[str, Any]], bool] = building
) -> Iterator[Change]:
    """The handbook and six PEPs indexed in chunks of OLD, then changed to NEW, the build
    held at the model after a few more passages (once `until` holds): the handbook's
    documents are built (their passages keep their vectors), the PEPs' wait."""
    drives = sources(tmp_path)
    config, index = tmp_path / "config.json", tmp_path / "index"
    model = layered_model.start(tmp_path / "layered")
    port = free_port()
    try:
        configure(config, drives, index, model.base_url, port, OLD)
        p = served(config, port)
        with running(p):
            first = wait_ready(p)
            allow(model, counts(model)["passages"] + 30)
            configure(config, drives, index, model.base_url, port, NEW)
            during = p.wait_status("the new index built in part", until)
            yield Change(p, model, drives, config, index, port, first, during)
    finally:
        model.stop()


def stored(folder: Path) -> tuple[int, int]:
    """(chunks, chunks with a vector) of the index in `folder`."""
    db = sqlite3.connect(folder / "index.sqlite3")
    try:
        return db.execute("SELECT COUNT(*), COUNT(vector) FROM chunks").fetchone()
    finally:
        db.close()


def test_a_new_chunking_answers_from_the_old_index_until_built_and_a_kill_resumes_it(tmp_path):
    drives = sources(tmp_path / "expected")
    want = len(cut(drives, NEW))
    same = len(set(cut(drives, OLD)) & set(cut(drives, NEW)))
    assert same > 0, "some passages (the handbook's short sections) are cut the same"
    with held_mid_build(tmp_path, lambda s: building(s) and s["vectors_kept"] >= same) as c:
        p, first, during, index = c.p, c.first, c.during, c.index
        assert first["chunking"] == {"answering": OLD, "next": None, "done": 0, "total": 0}
        assert during["vectors_kept"] == same, "passages cut the same keep their vectors"
        assert f"metis_vectors_kept_total {float(same)}" in p.get("/metrics").text
        assert during["phase"] == "indexing" and "beside" in during["reason"], during
        assert during["chunking"]["answering"] == OLD
        assert during["chunking"]["total"] == first["documents"] + first["failed"]
        assert (during["chunks"], during["documents"]) == (first["chunks"], first["documents"])
        assert_by_meaning(p)  # from the old index, by meaning, throughout
        assert (index / "index-1" / "index.sqlite3").exists()
        assert not (index / "live-index").exists(), "the old index still answers"
        built_before_kill = p.status()["chunking"]["done"]
        p.kill()

        with running(p):
            resumed = p.wait_status("answering while the build resumes", building)
            assert resumed["chunks"] == first["chunks"], "the old index answers after a kill"
            assert_by_meaning(p)
            allow(c.model)
            ready = new_index_answering(p)
            assert ready["documents"] == first["documents"]
            assert ready["chunks"] == want > first["chunks"]
            assert ready["last_pass"]["read"] <= ready["documents"] - built_before_kill, (
                "what was built before the kill is not read again"
            )
            assert_by_meaning(p)
            again = p.post("/v1/reindex", {})
            assert again.status_code == 202
            settled = wait_ready(p)
            assert settled["passes"] > ready["passes"] and settled["chunks"] == want

    assert (index / "live-index").read_text().strip() == "index-1"
    assert not (index / "index.sqlite3").exists(), "the old index is removed"
    assert stored(index / "index-1") == (want, want), "every chunk once, each with a vector"


def test_a_chunking_change_back_before_the_build_ends_keeps_the_index_that_answers(tmp_path):
    """Changed, then changed back while built: the build is given up, its folder removed,
    and the index that answered answers on, read by nothing again."""
    with held_mid_build(tmp_path) as c:
        c.configure(OLD, generation=2)
        # Let the model go only once the indexer took the change back (it looks every 5 s):
        # else the held build may end first, and the new chunking answers.
        c.p.wait_status("the change back taken", lambda s: s["generation"] == 2)
        allow(c.model)
        back = c.p.wait_status(
            "the old chunking kept",
            lambda s: s["phase"] == "ready" and s["passes"] > c.first["passes"],
        )
        assert back["chunking"] == {"answering": OLD, "next": None, "done": 0, "total": 0}
        assert back["chunks"] == c.first["chunks"] and back["last_pass"]["read"] == 0
        assert not (c.index / "index-1").exists(), "the build given up is removed"
        assert_by_meaning(c.p)


def test_a_build_that_does_not_fit_on_the_drive_waits_while_the_old_index_answers(tmp_path):
    """The index drive a tmpfs of 32 MB: the handbook's index fits, a second one beside it
    with the write-ahead log's room does not. The base waits, saying what the build needs,
    and answers from the index it has; given room, the build goes on."""
    drives = {"handbook": sources(tmp_path)["handbook"]}
    config, index = tmp_path / "config.json", tmp_path / "index"
    index.mkdir()
    try:
        mount_tmpfs(index, "32m")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    model = layered_model.start(tmp_path / "layered")
    port = free_port()
    try:
        configure(config, drives, index, model.base_url, port, OLD)
        p = served(config, port)
        with running(p):
            first = wait_ready(p)
            configure(config, drives, index, model.base_url, port, NEW)
            waiting = p.wait_status("no room beside", lambda s: s["phase"] == "waiting")
            assert re.fullmatch(
                r"the index of chunks of 700 characters \(overlap 100\) needs about \d+ MB more "
                r"beside the one that answers and \d+ MB are free on the index drive: the index "
                r"of chunks of 1200 characters \(overlap 200\) goes on answering until there is "
                r"room",
                waiting["reason"],
            ), waiting["reason"]
            assert waiting["chunking"]["answering"] == OLD and waiting["chunks"] == first["chunks"]
            assert_by_meaning(p)
            subprocess.run(["mount", "-o", "remount,size=256m", str(index)], check=True)
            ready = new_index_answering(p)
            assert ready["documents"] == first["documents"]
            assert_by_meaning(p)
    finally:
        model.stop()
        subprocess.run(["umount", "-l", str(index)], check=False)


def test_a_build_left_damaged_is_built_anew_and_the_index_that_answers_is_kept(tmp_path):
    """Killed mid-build, the build's file then damaged (random bytes over its chunks'
    pages): the next start answers from the old index, removes the damaged build and builds
    it anew; the old index is not moved aside nor rebuilt, the damage not being its."""
    with held_mid_build(tmp_path) as c:
        c.p.kill()
        assert damage_chunk_pages(c.index / "index-1" / "index.sqlite3", pages=3)
        allow(c.model)
        with running(c.p):
            ready = new_index_answering(c.p)
            assert ready["documents"] == c.first["documents"]
            assert ready["last_pass"]["read"] == c.first["documents"] + c.first["failed"]
            assert "is damaged" in c.p.log() and "building it anew" in c.p.log()
            assert_by_meaning(c.p)
    assert not list(c.index.glob("*.damaged*")), "the answering index was not moved aside"
    assert (c.index / "live-index").read_text().strip() == "index-1"


def test_an_indexer_standing_by_follows_the_switch_to_the_index_built_beside(tmp_path):
    """Two indexers on one index folder (a replacement beside the pod it replaces): the
    writer builds the new chunking and switches; the one standing by answers from the new
    index from then on, before it takes over."""
    drives = sources(tmp_path)
    index = tmp_path / "index"
    model = layered_model.start(tmp_path / "layered")
    ports = free_port(), free_port()
    configs = tmp_path / "writer.json", tmp_path / "standby.json"
    try:
        for config, port in zip(configs, ports, strict=True):
            configure(config, drives, index, model.base_url, port, OLD)
        writer, standby = (served(c, port) for c, port in zip(configs, ports, strict=True))
        with running(writer):
            first = wait_ready(writer)
            with running(standby):
                standby.wait_status("standby", lambda s: s["phase"] == "standby")
                for config, port in zip(configs, ports, strict=True):
                    configure(config, drives, index, model.base_url, port, NEW)
                switched = new_index_answering(writer)
                assert switched["chunks"] != first["chunks"]
                followed = standby.wait_status(
                    "the standby answering from the new index",
                    lambda s: s["chunks"] == switched["chunks"],
                )
                assert followed["phase"] == "standby"
                assert_by_meaning(standby)
                writer.stop()
                took_over = standby.wait_status(
                    "the standby taking over",
                    lambda s: s["phase"] == "ready" and s["passes"] >= 1,
                )
                assert took_over["chunking"]["answering"] == NEW
                assert took_over["chunks"] == switched["chunks"]
                assert took_over["last_pass"]["read"] == 0
    finally:
        model.stop()


def new_index_answering(p: Process) -> dict[str, Any]:
    return p.wait_status(
        "the new index answering",
        lambda s: s["phase"] == "ready" and (s.get("chunking") or {}).get("answering") == NEW,
    )
