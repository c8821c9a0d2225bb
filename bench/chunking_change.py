"""What a chunking change costs, built beside the index that answers, against a fresh build
of the new chunking in the same run.

    .venv/bin/python bench/chunking_change.py [--peps 60] [--out bench/results/chunking-change.md]

`metis serve` and `metis models` (all-MiniLM-L6-v2 over HTTP) as real processes on the
example handbook and the first `--peps` Python PEPs. First a fresh build at 1600/200 (the
baseline: its time, the passages the model was sent, its size on the drive). Then an index
at 1200/200, changed to 1600/200 while one client searches the handbook's questions in
turn: the time from the change to the switch, the passages sent to the model and those
that kept their vectors, the most the index drive held and the indexer's most memory
(VmRSS) meanwhile, and every search: failed, by words only, its known document out of the
top 5.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.support, when run as a script

from tests.support.model_server import start_model_server  # noqa: E402
from tests.support.processes import Process, free_port, metis, running, wait_ready  # noqa: E402

HANDBOOK = ROOT / "examples" / "handbook"
PEPS = ROOT.parent / "shared" / "data" / "perf" / "python-peps" / "peps"
OLD, NEW = {"size": 1200, "overlap": 200}, {"size": 1600, "overlap": 200}


def drives(work: Path, peps: int) -> dict[str, Path]:
    handbook = work / "handbook"
    shutil.copytree(HANDBOOK, handbook)
    folder = work / "peps"
    folder.mkdir()
    for path in sorted(PEPS.glob("pep-*.rst"))[:peps]:
        shutil.copyfile(path, folder / path.name)
    return {"handbook": handbook, "peps": folder}


def configure(path: Path, sources: dict[str, Path], index: Path, url: str, port: int, chunking):
    config = {
        "sources": [{"drive": d, "root": str(r)} for d, r in sources.items()],
        "embedding": {"url": url, "name": "minilm"},
        "index_dir": str(index),
        "port": port,
        "chunking": chunking,
        "rescan_seconds": 0,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config))
    tmp.replace(path)


def drive_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size if path.is_file() else 0
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Watch(threading.Thread):
    """Samples the index drive's size and the indexer's memory until stopped."""

    def __init__(self, folder: Path, pid: int) -> None:
        super().__init__(daemon=True)
        self.folder, self.pid = folder, pid
        self.most_bytes, self.most_rss = 0, 0.0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            self.most_bytes = max(self.most_bytes, drive_bytes(self.folder))
            self.most_rss = max(self.most_rss, rss_mb(self.pid))


CASES = [
    json.loads(line)
    for line in (HANDBOOK / ".metis" / "evals.jsonl").read_text().splitlines()
    if line.strip()
]


def asked(client: httpx.Client, base_url: str, case: dict[str, Any]) -> str:
    """How one search fared: failed, words (by words only), missed (its known document
    out of the top 5) or answered."""
    try:
        r = client.post(f"{base_url}/v1/search", json={"query": case["question"], "top_k": 5})
    except httpx.HTTPError:
        return "failed"
    if r.status_code != 200:
        return "failed"
    answer = r.json()
    if answer["mode"] != "hybrid" or answer["warnings"]:
        return "words"
    cited = {f"{x['citation']['source']}/{x['citation']['document']}" for x in answer["results"]}
    return "answered" if case["expected"][0] in cited else "missed"


def missed_once(base_url: str) -> list[str]:
    """The questions whose known document is out of the top 5, each asked once."""
    with httpx.Client(timeout=30) as client:
        return [c["question"] for c in CASES if asked(client, base_url, c) != "answered"]


class Asker(threading.Thread):
    """One client asking the handbook's questions in turn until stopped, counting how
    each search fared in each part of the run (`part`)."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.base_url = base_url
        self.part = "before"
        self.counts: dict[str, dict[str, int]] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        n = 0
        with httpx.Client(timeout=10) as client:
            while not self.stopped.is_set():
                part = self.part
                fared = asked(client, self.base_url, CASES[n % len(CASES)])
                n += 1
                counts = self.counts.setdefault(part, {})
                counts[fared] = counts.get(fared, 0) + 1

    def said(self, part: str) -> str:
        c = self.counts.get(part, {})
        return (
            f"{sum(c.values())}: {c.get('failed', 0)} failed, {c.get('words', 0)} by words "
            f"only, {c.get('missed', 0)} with the known document out of the top 5"
        )


def until(p: Process, check: Any, timeout: float = 1800) -> dict[str, Any]:
    return p.wait_status("the build", check, timeout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/chunking-change.md")
    args = parser.parse_args()
    started = dt.datetime.now(dt.UTC)
    work = Path(tempfile.mkdtemp(prefix="metis-rechunk-"))
    model = start_model_server()
    try:
        sources = drives(work, args.peps)
        port = free_port()

        # The baseline: a fresh build of the new chunking.
        config, fresh = work / "fresh.json", work / "fresh"
        configure(config, sources, fresh, model.base_url, port, NEW)
        p = Process(
            f"http://127.0.0.1:{port}", metis("serve", "--config", str(config)), work / "fresh.log"
        )
        t0 = time.monotonic()
        with running(p):
            base = wait_ready(p, timeout=1800)
            fresh_seconds = time.monotonic() - t0
            fresh_bytes = drive_bytes(fresh)
            fresh_missed = missed_once(p.base_url)

        # The change: 1200/200, then 1600/200 while a client searches.
        config, index = work / "change.json", work / "index"
        configure(config, sources, index, model.base_url, port, OLD)
        p = Process(
            f"http://127.0.0.1:{port}", metis("serve", "--config", str(config)), work / "change.log"
        )
        with running(p):
            first = wait_ready(p, timeout=1800)
            before_bytes = drive_bytes(index)
            old_missed = missed_once(p.base_url)
            assert p.proc is not None
            watch, asker = Watch(index, p.proc.pid), Asker(p.base_url)
            idle_rss = rss_mb(p.proc.pid)
            watch.start()
            asker.start()
            time.sleep(3)  # the load is steady before the change
            asker.part = "during"
            t0 = time.monotonic()
            configure(config, sources, index, model.base_url, port, NEW)
            done = until(
                p,
                lambda s: (
                    s["phase"] == "ready" and (s.get("chunking") or {}).get("answering") == NEW
                ),
            )
            change_seconds = time.monotonic() - t0
            asker.part = "after"
            time.sleep(3)  # searches after the switch, by the new index alone
            asker.stopped.set()
            watch.stopped.set()
            asker.join()
            watch.join()
            after_bytes = drive_bytes(index)
    finally:
        model.stop()
        shutil.rmtree(work, ignore_errors=True)

    sent = done["vectors_from_model"] - first["vectors_from_model"]
    rows = [
        (
            "documents / chunks after",
            f"{base['documents']} / {base['chunks']}",
            f"{done['documents']} / {done['chunks']}",
        ),
        (
            "time",
            f"{fresh_seconds:.1f} s (start to ready)",
            f"{change_seconds:.1f} s (change to switch) = {change_seconds / fresh_seconds:.2f} ×",
        ),
        (
            "passages sent to the model",
            f"{base['vectors_from_model']}",
            f"{sent} = {sent / max(1, base['vectors_from_model']):.2f} × "
            f"({done['vectors_kept']} kept their vectors)",
        ),
        (
            "index drive",
            f"{fresh_bytes / 1e6:.1f} MB",
            f"{before_bytes / 1e6:.1f} MB before, at most {watch.most_bytes / 1e6:.1f} MB during, "
            f"{after_bytes / 1e6:.1f} MB after",
        ),
        (
            "indexer memory (VmRSS)",
            "",
            f"{idle_rss:.0f} MB before, at most {watch.most_rss:.0f} MB",
        ),
        (
            "questions whose known document is out of the top 5, each asked once",
            f"{len(fresh_missed)} of {len(CASES)} {fresh_missed}",
            f"the old index: {len(old_missed)} of {len(CASES)} {old_missed}",
        ),
        ("searches before the change", "", asker.said("before")),
        ("searches during the change", "", asker.said("during")),
        ("searches after the switch", "", asker.said("after")),
    ]
    lines = [
        "# A chunking change built beside the index that answers",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores; "
        f"`bench/chunking_change.py --peps {args.peps}`: the handbook and {args.peps} PEPs, "
        f"{OLD['size']}/{OLD['overlap']} → {NEW['size']}/{NEW['overlap']}, all-MiniLM-L6-v2 "
        "on `metis models`, one client searching in turn.",
        "",
        "| | a fresh build of the new chunking | the change, built beside |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
