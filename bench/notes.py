"""What writing a base's notes costs: 1,000 notes written one after another, each searched
for the moment its write returns, and the searches of another client meanwhile against the
same searches with no write (the baseline, in the same run).

    .venv/bin/python bench/notes.py [--notes 1000] [--peps 60] [--out bench/results/notes.md]

`metis serve` and `metis models` (all-MiniLM-L6-v2 over HTTP) as real processes on the
example handbook and the first `--peps` Python PEPs. Each note carries a code of its own
(`zq0042`): a keyword search for it right after the write says whether the note was found
by words when its write returned, and a hybrid search for its text whether it was found by
meaning (a dense score). Meanwhile a second client asks the handbook's questions in turn.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.support, when run as a script

from tests.support.model_server import start_model_server  # noqa: E402
from tests.support.processes import indexer, wait_ready  # noqa: E402

HANDBOOK = ROOT / "examples" / "handbook"
PEPS = ROOT.parent / "shared" / "data" / "perf" / "python-peps" / "peps"
QUESTIONS = [json.loads(line)["question"] for line in (HANDBOOK / ".metis" / "evals.jsonl").open()]
TEAMS = ["payments", "search", "platform", "billing", "identity", "storage", "mobile", "data"]
THINGS = ["on-call lead", "release day", "planning meeting", "staging cluster", "budget owner"]


def note_text(i: int) -> str:
    team, thing = TEAMS[i % len(TEAMS)], THINGS[(i // len(TEAMS)) % len(THINGS)]
    return (
        f"The {team} team's {thing} changed in week {i % 52 + 1}: it is now handled as "
        f"agreed in the retrospective (code zq{i:04d})."
    )


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Asker(threading.Thread):
    """Asks the handbook's questions in turn until stopped; each search's milliseconds."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.took, self.failed = url, [], 0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=60) as http:
            i = 0
            while not self.stop.is_set():
                body = {"query": QUESTIONS[i % len(QUESTIONS)], "top_k": 5}
                started = time.perf_counter()
                r = http.post(f"{self.url}/v1/search", json=body)
                self.took.append((time.perf_counter() - started) * 1000)
                self.failed += r.status_code != 200
                i += 1


def searched(asker: Asker, seconds: float) -> tuple[list[float], int]:
    asker.start()
    time.sleep(seconds)  # a fixed window of searches: the measurement, not a wait for state
    asker.stop.set()
    asker.join()
    return asker.took, asker.failed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--notes", type=int, default=1000)
    ap.add_argument("--peps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "notes.md")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="metis-notes-"))
    model = start_model_server()
    handbook, peps = work / "handbook", work / "peps"
    shutil.copytree(HANDBOOK, handbook)
    peps.mkdir()
    for path in sorted(PEPS.glob("pep-*.rst"))[: args.peps]:
        shutil.copyfile(path, peps / path.name)
    p = indexer({"handbook": handbook, "peps": peps}, work / "index", model.base_url).start()
    try:
        wait_ready(p, timeout=900)
        base_status = p.status()
        assert p.proc is not None
        pid = p.proc.pid
        rss_before = rss_mb(pid)
        baseline, baseline_failed = searched(Asker(p.base_url), 30.0)

        asker = Asker(p.base_url)
        asker.start()
        writes: list[float] = []
        by_words = by_meaning = 0
        with httpx.Client(timeout=60) as http:
            started = time.perf_counter()
            for i in range(args.notes):
                t = time.perf_counter()
                r = http.post(f"{p.base_url}/v1/notes", json={"text": note_text(i)})
                writes.append((time.perf_counter() - t) * 1000)
                r.raise_for_status()
                note_id = r.json()["id"]
                words = http.post(
                    f"{p.base_url}/v1/search",
                    json={"query": f"zq{i:04d}", "mode": "keyword", "top_k": 1},
                ).json()
                by_words += any(
                    x["citation"].get("note", {}).get("id") == note_id for x in words["results"]
                )
                if i % 10 == 0:  # by meaning: a model call each, so one note in ten
                    meaning = http.post(
                        f"{p.base_url}/v1/search",
                        json={"query": note_text(i), "mode": "dense", "top_k": 3},
                    ).json()
                    by_meaning += any(
                        x["citation"].get("note", {}).get("id") == note_id
                        for x in meaning["results"]
                    )
            elapsed = time.perf_counter() - started
        asker.stop.set()
        asker.join()
        during, during_failed = asker.took, asker.failed
        status = p.status()
        rss_after = rss_mb(pid)
        notes_bytes = sum(
            f.stat().st_size for f in (work / "index" / "notes").rglob("*") if f.is_file()
        )
    finally:
        p.stop()
        model.stop()
        shutil.rmtree(work, ignore_errors=True)

    n = args.notes
    checked = len(range(0, n, 10))
    rows = [
        ("notes written", f"{n} (one client, one after another)"),
        ("writes per second", f"{n / sum(writes) * 1000:.1f} (write time only)"),
        (
            "write latency p50 / p99",
            f"{percentile(writes, 50):.1f} / {percentile(writes, 99):.1f} ms",
        ),
        ("all writes and checks", f"{elapsed:.1f} s"),
        ("found by words when the write returned", f"{by_words} of {n}"),
        ("found by meaning when the write returned", f"{by_meaning} of {checked} checked"),
        (
            "other client's search p50 / p99, no writes (baseline)",
            f"{percentile(baseline, 50):.1f} / {percentile(baseline, 99):.1f} ms "
            f"({len(baseline)} searches, {baseline_failed} failed)",
        ),
        (
            "other client's search p50 / p99, while writing",
            f"{percentile(during, 50):.1f} / {percentile(during, 99):.1f} ms "
            f"({len(during)} searches, {during_failed} failed); p50 "
            f"{statistics.median(during) / statistics.median(baseline):.2f}× the baseline",
        ),
        (
            "status: documents / notes / chunks",
            f"{status['documents']} / {status['notes']} / {status['chunks']} (before: "
            f"{base_status['documents']} documents, {base_status['chunks']} chunks)",
        ),
        ("notes on the drive", f"{notes_bytes / 1e6:.2f} MB"),
        ("indexer RSS before / after", f"{rss_before:.0f} / {rss_after:.0f} MB"),
    ]
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    text = "\n".join(
        [
            "# Notes: 1,000 writes, each searchable when it returns",
            "",
            f"`bench/notes.py --notes {n} --peps {args.peps}`, {when}, on {machine}; the "
            "local model (all-MiniLM-L6-v2) over HTTP, the handbook and "
            f"{args.peps} PEPs indexed first.",
            "",
            "| | |",
            "|---|---|",
            *[f"| {a} | {b} |" for a, b in rows],
            "",
        ]
    )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
