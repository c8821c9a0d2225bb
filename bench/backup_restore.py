"""A base's backup to S3-compatible object storage and its restore into a new, empty
index: seconds each way, the objects' bytes, the passages the restore sent to the model
(goal 0), and whether 100 questions are answered the same before and after.

A base of about 100,000 chunks (synthetic Markdown: 1,000 documents of 100 sections,
words drawn from the perf corpus's Python PEPs) is indexed by `metis serve` at an instant
embedding server (`pipeline.instant_server`), and 200 notes written. It is backed up
(`POST /v1/backups`) to versitygw, the real S3 server the tests run, on loopback; a second
`metis serve` on an empty index folder restores it at start. Backup seconds: from the
POST to the backup Completed; restore seconds: from the second indexer's start to ready
(its first pass over the restored index included).

    .venv/bin/python bench/backup_restore.py [--documents 1000] [--sections 100]
        [--out bench/results/backup-restore.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for bench.pipeline and tests.support, when run as a script

from bench.pipeline import instant_server  # noqa: E402
from tests.support.processes import Process, free_port, served, wait_ready  # noqa: E402
from tests.support.s3_server import s3_server  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "perf" / "python-peps"
DIM = 384
BUCKET = "backups"
NOTES = 200
QUESTIONS = 100


def vocabulary() -> list[str]:
    words: set[str] = set()
    for path in sorted(CORPUS.rglob("*"))[:400]:
        if path.is_file():
            words.update(re.findall(r"[a-z]{4,12}", path.read_text(errors="replace").lower()))
    if len(words) < 1000:
        raise SystemExit(f"the corpus at {CORPUS} has too few words ({len(words)})")
    return sorted(words)


def write_documents(folder: Path, documents: int, sections: int, words: list[str]) -> None:
    rng = random.Random(7)
    for d in range(documents):
        parts = [f"# Document {d}\n"]
        for s in range(sections):
            text = " ".join(rng.choice(words) for _ in range(120))
            parts.append(f"## Section {d}.{s}\n\n{text}.\n")
        path = folder / f"part-{d // 100:02d}" / f"doc-{d:04d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(parts))


def configure(folder: Path, docs: Path, url: str, **extra: Any) -> Process:
    port = free_port()
    config = {
        "name": "bench",
        "sources": [{"drive": "docs", "root": str(docs)}],
        "embedding": {"url": url, "name": "instant"},
        "index_dir": str(folder / "index"),
        "rescan_seconds": 0,
        "drain_seconds": 0,
        "port": port,
        **extra,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return served(folder / "config.json", port, folder / "indexer.log")


def answers(p: Process, questions: list[str]) -> list[list[tuple[str, str, float]]]:
    found = []
    for q in questions:
        body = p.post("/v1/search", {"query": q, "top_k": 10, "rerank": False}).json()
        found.append(
            [(r["citation"]["document"], r["text"][:40], r["score"]) for r in body["results"]]
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--sections", type=int, default=100)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "backup-restore.md"
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    words = vocabulary()
    with tempfile.TemporaryDirectory(prefix="metis-backup-bench-") as tmp:
        folder = Path(tmp)
        docs = folder / "docs"
        write_documents(docs, args.documents, args.sections, words)
        rng = random.Random(11)
        questions = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(QUESTIONS)]
        with instant_server(DIM, True) as (url, _), s3_server(folder / "s3") as s3:
            s3.make_bucket(BUCKET)
            store = {
                "endpoint": s3.url,
                "bucket": BUCKET,
                "prefix": "bench",
                "secret_dir": str(s3.write_keys(folder / "keys")),
            }
            a = configure(folder / "a", docs, url, backup_store=store).start()
            try:
                started = time.monotonic()
                status = wait_ready(a, timeout=3600)
                indexed = time.monotonic() - started
                for i in range(NOTES):
                    text = " ".join(rng.choice(words) for _ in range(40))
                    assert a.post("/v1/notes", {"text": text, "id": f"n{i}"}).status_code == 201
                status = wait_ready(a)
                before = answers(a, questions)
                started = time.monotonic()
                assert a.post("/v1/backups", {"name": "bench-1"}).status_code == 202
                backup = a.wait_for(
                    "the backup",
                    lambda: (
                        (b := a.get("/v1/backups/bench-1").json())["phase"] == "Completed" and b
                    ),
                    timeout=3600,
                )
                backed = time.monotonic() - started
            finally:
                a.stop()
            restore = {"store": store, "backup": "bench-1"}
            b = configure(folder / "b", docs, url, restore=restore).start()
            try:
                started = time.monotonic()
                restored = wait_ready(b, timeout=3600)
                seconds = time.monotonic() - started
                after = answers(b, questions)
            finally:
                b.stop()
    same = sum(x == y for x, y in zip(before, after, strict=True))
    rows = {
        "chunks": f"{status['chunks']:,} ({status['documents']:,} documents, {NOTES} notes)",
        "indexing at the instant model (for scale)": f"{indexed:.1f} s",
        "backup: POST to Completed": f"{backed:.1f} s",
        "bytes uploaded (index.sqlite3 + notes.tar)": f"{backup['bytes']:,}",
        "restore: start to ready (download, check, unpack, load, first pass)": f"{seconds:.1f} s",
        "chunks restored": f"{restored['chunks']:,}",
        "passages sent to the model by the restored indexer": f"{restored['vectors_from_model']}",
        "files read again by its first pass": f"{restored['last_pass']['read']}",
        f"questions answered the same (top 10, hybrid) of {QUESTIONS}": f"{same}",
    }
    write(args.out, rows, load)


def write(out: Path, rows: dict[str, str], load: float) -> None:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()})"
    lines = [
        f"# Backup and restore — {now} on {machine}",
        "",
        "A synthetic base (Markdown, words of the perf corpus's PEPs) indexed by `metis serve` "
        "at an instant embedding server, with notes; backed up with `POST /v1/backups` to "
        "versitygw on loopback, then restored at start by a second `metis serve` on an empty "
        f"index folder (`bench/backup_restore.py`). Load average before: {load:.2f}.",
        "",
        "| what | measured |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows.items()),
    ]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
