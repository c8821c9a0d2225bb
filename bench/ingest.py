"""Ingest benchmark: read and chunk a whole corpus through the reader pool.

Walks the corpus as a source, reads and chunks every file in a pool of worker
processes (what a pass does before embedding), and prints files/s, MB/s, chunks,
and failures by kind. Target: the perf corpus (about 19,500 files,
144 MB) in under 90 s with 2 workers on a 2-core machine.

    .venv/bin/python bench/ingest.py                      # ../shared/data/perf, 2 workers
    .venv/bin/python bench/ingest.py --record bench/results/ingest.md
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import platform
import resource
import sys
import time
from pathlib import Path

from metis_indexer.documents import Kind, ReadFailed
from metis_indexer.ingest import sources
from metis_indexer.ingest.readers.pool import ReaderPool

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "perf"
TARGET_SECONDS = 90.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=1200)
    parser.add_argument("--overlap", type=int, default=200)
    parser.add_argument("--record", type=Path, help="also write the figures to this Markdown file")
    args = parser.parse_args()

    load_before = os.getloadavg()
    started = time.perf_counter()
    listing = sources.walk(args.corpus)
    walked = time.perf_counter() - started
    files: dict[Kind, int] = collections.Counter()
    size: dict[Kind, int] = collections.Counter()
    chunks: dict[Kind, int] = collections.Counter()
    worker_seconds: dict[Kind, float] = collections.defaultdict(float)
    failures: dict[Kind, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    slowest: list[tuple[float, str]] = []
    with ReaderPool(args.workers) as pool:
        pending = [
            (found, pool.submit_chunks(found.absolute, found.kind, args.size, args.overlap))
            for found in listing.files
        ]
        for found, future in pending:
            done = future.result()
            files[found.kind] += 1
            size[found.kind] += found.size
            worker_seconds[found.kind] += done.seconds
            slowest.append((done.seconds, found.path))
            if isinstance(done.result, ReadFailed):
                failures[found.kind][done.result.reason.name] += 1
            else:
                chunks[found.kind] += len(done.result)
    seconds = time.perf_counter() - started
    cpu = _cpu_seconds()

    report = _report(
        args,
        listing,
        seconds,
        cpu,
        walked,
        load_before,
        files,
        size,
        chunks,
        worker_seconds,
        failures,
        sorted(slowest, reverse=True)[:5],
    )
    print(report)
    if args.record is not None:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(report)
    return 0 if seconds < TARGET_SECONDS else 1


def _report(
    args: argparse.Namespace,
    listing: sources.Listing,
    seconds: float,
    cpu: tuple[float, float],
    walked: float,
    load_before: tuple[float, float, float],
    files: dict[Kind, int],
    size: dict[Kind, int],
    chunks: dict[Kind, int],
    worker_seconds: dict[Kind, float],
    failures: dict[Kind, collections.Counter[str]],
    slowest: list[tuple[float, str]],
) -> str:
    total_files, total_bytes = sum(files.values()), sum(size.values())
    verdict = "under" if seconds < TARGET_SECONDS else "OVER"
    lines = [
        "# Ingest benchmark",
        "",
        f"- Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {_machine()}",
        f"- Load average before the run: {load_before[0]:.2f} (1 min)",
        f"- Corpus: `{args.corpus}` ({total_files:,} files, {total_bytes / 1e6:.1f} MB)",
        f"- Pool: {args.workers} worker processes; chunking size {args.size}, "
        f"overlap {args.overlap}",
        "",
        f"**{seconds:.1f} s** wall ({verdict} the {TARGET_SECONDS:g} s target): "
        f"**{total_files / seconds:,.0f} files/s, {total_bytes / 1e6 / seconds:.2f} MB/s**, "
        f"{sum(chunks.values()):,} chunks. Walking the corpus took {walked:.2f} s of it.",
        "",
        f"CPU time: {cpu[1]:.1f} s in the workers, {cpu[0]:.1f} s in the parent (walking, "
        "dispatching, unpickling chunks). Wall time depends on what else the machine runs; "
        "CPU time does not.",
        "",
        "| kind | files | MB | chunks | s in workers (wall) | failed |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for kind in Kind:
        if not files[kind]:
            continue
        failed = ", ".join(f"{n} {reason}" for reason, n in sorted(failures[kind].items())) or "0"
        lines.append(
            f"| {kind.value} | {files[kind]:,} | {size[kind] / 1e6:.1f} | {chunks[kind]:,} "
            f"| {worker_seconds[kind]:.1f} | {failed} |"
        )
    lines += ["", "Slowest files (wall seconds in a worker):", ""]
    lines += [f"- {s:.1f} s `{path}`" for s, path in slowest]
    if listing.skipped:
        skipped = ", ".join(f"{n} {ext or '(none)'}" for ext, n in sorted(listing.skipped.items()))
        lines += ["", f"Skipped (not a kind Metis reads): {skipped}."]
    return "\n".join(lines) + "\n"


def _cpu_seconds() -> tuple[float, float]:
    """User and system seconds of this process, and of its finished children (the workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    cpu = names[0] if names else model
    python = platform.python_version()
    return f"{platform.node()}, {os.cpu_count()} cores ({cpu}), Python {python}"


if __name__ == "__main__":
    sys.exit(main())
