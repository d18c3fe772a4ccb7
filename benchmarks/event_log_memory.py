"""Event log memory: RSS growth while a coordinator's log takes 1,000,000 events.

The event log streams each event to ``events.jsonl`` and keeps only a count per kind in memory,
so a long-running coordinator's memory should not grow with its events (issue 13: under 20 MB
per million events). Each mode runs in a fresh child process: it writes a warm-up of events,
reads its RSS (``/proc/self/statm``), writes ``N`` more (a coordinator's mix: per update a
``task_issued``, a ``download_finished`` and an ``update_accepted`` with client metrics, and
a ``flush`` every 10 updates), collects garbage and reads its RSS again.

Modes: ``streaming`` (the log as it is) and ``in_memory_list`` (the baseline: the same log with
a subscriber that keeps every event in a list, as the log itself did before issue 13).

Figures: ``events`` (N; ``--quick``: 100,000, the growth extrapolated linearly to a million),
``rss_growth_mb_per_million_events`` (streaming; target <= 20),
``baseline_rss_growth_mb_per_million_events`` (the in-memory list),
``growth_ratio_vs_in_memory_list`` (streaming over baseline growth: lower is better),
``streaming_us_per_event`` and ``baseline_us_per_event`` (wall time per emit), and
``file_mb_per_million_events`` (what the stream put on disk instead).

Run: ``python benchmarks/event_log_memory.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

MILLION = 1_000_000
WARMUP = 20_000
MODES = ("streaming", "in_memory_list")


def rss_bytes() -> int:
    """This process's resident set size, from ``/proc/self/statm``."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_events(log: Any, count: int, start: int = 0) -> None:
    """``count`` events of a coordinator's mix (``start`` numbers the first update)."""
    i = start
    written = 0
    while written < count:
        version = i // 10
        client, task = f"client-{i % 1000:04d}", f"t{i}-v{version}"
        log.emit("task_issued", client_id=client, task_id=task, model_version=version)
        log.emit("download_finished", client_id=client, task_id=task, bytes=40_000, offset=0,
                 delta=False, bytes_saved=0)
        log.emit("update_accepted", client_id=client, task_id=task, base_version=version,
                 staleness=0, num_examples=50, steps_completed=5, bytes_up=10_000,
                 weight=50.0, retries=0, train_seconds=0.25, network_seconds=0.5)
        written += 3
        if i % 10 == 9:
            log.emit("flush", model_version=version + 1, num_updates=10, total_weight=500.0,
                     round_seconds=2.0, bytes_up=100_000, bytes_down=400_000,
                     updates=[f"t{j}-v{version}" for j in range(i - 9, i + 1)], accuracy=0.5)
            written += 1
        i += 1


def measure(mode: str, count: int, folder: str) -> dict[str, float]:
    """In a child process: RSS growth and time per event for ``count`` events in ``mode``."""
    from fedlink.metrics import EventLog

    path = Path(folder) / f"{mode}.jsonl"
    kept: list[dict[str, Any]] = []
    with EventLog(path) as log:
        if mode == "in_memory_list":
            log.subscribe(lambda event: kept.append(dict(event)))
        write_events(log, WARMUP)
        gc.collect()
        before, size = rss_bytes(), path.stat().st_size
        started = time.perf_counter()
        write_events(log, count, start=WARMUP)
        seconds = time.perf_counter() - started
        gc.collect()
        after = rss_bytes()
        written = log.count() - WARMUP
    return {"growth_bytes": float(after - before), "seconds": seconds,
            "events": float(written), "file_bytes": float(path.stat().st_size - size)}


def _child(mode: str, count: int, folder: str, queue: Any) -> None:
    queue.put(measure(mode, count, folder))


def run_mode(mode: str, count: int, folder: str) -> dict[str, float]:
    """``measure`` in a fresh process, so one mode's memory never counts against another."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_child, args=(mode, count, folder, queue))
    child.start()
    result: dict[str, float] = queue.get()
    child.join()
    return result


def figures(count: int) -> dict[str, Any]:
    """Both modes, side by side."""
    with tempfile.TemporaryDirectory() as folder:
        streaming = run_mode("streaming", count, folder)
        baseline = run_mode("in_memory_list", count, folder)
    scale = MILLION / streaming["events"]
    growth = streaming["growth_bytes"] * scale / 2**20
    base_growth = baseline["growth_bytes"] * MILLION / baseline["events"] / 2**20
    return {
        "events": int(streaming["events"]),
        "rss_growth_mb_per_million_events": growth,
        "baseline_rss_growth_mb_per_million_events": base_growth,
        "growth_ratio_vs_in_memory_list": growth / base_growth if base_growth > 0 else 0.0,
        "streaming_us_per_event": streaming["seconds"] / streaming["events"] * 1e6,
        "baseline_us_per_event": baseline["seconds"] / baseline["events"] * 1e6,
        "file_mb_per_million_events": streaming["file_bytes"] * scale / 2**20,
    }


def main() -> None:
    """Run both modes and print (and optionally save) the figures."""
    args = parse_args(__doc__.splitlines()[0])
    report(figures(100_000 if args.quick else MILLION), args.json)


if __name__ == "__main__":
    main()
