"""``fedlink compare RUN...``: one report overlaying several runs.

Each run folder holds ``events.jsonl`` and ``summary.json`` (any ``fedlink simulate`` or
``serve`` run). The report (``compare.md`` plus SVG plots in the output folder) shows accuracy
against time, model version and bytes sent, a time-to-target table, and refusals by reason.
The first run is the baseline: every other run's **speed-up** is the baseline's time to the
target accuracy over its own (``None`` when either never reached it, or one is virtual and
the other not). The default target is the best accuracy every run reached, leaving out runs
that learned nothing; each run's summary ``warning`` is repeated in the report and on stderr.

A run's versions count as made when they were made, not when central evaluation reported
them: a served run's ``flush`` event carries both (``made_elapsed``).

A run's times count from its first task, as its ``wall_seconds`` does (the wait for clients
to start is not the run's). A virtual run's are model seconds (its events' clock, which
charges training at a device's pace), and so is its run time in the table; the report says
which runs are virtual, since their times and a real run's measure different things.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlink.errors import ConfigError
from fedlink.metrics.events import UPDATE_ACCEPTED, UPDATE_REFUSED, Event, read_events
from fedlink.metrics.formatting import human_bytes, human_seconds
from fedlink.metrics.summary import (
    SUMMARY_FILENAME,
    first_task_elapsed,
    made_elapsed,
    of_kind,
    unique_flushes,
)
from fedlink.metrics.svg import Series, line_plot, write_svg

COMPARE_FILENAME = "compare.md"
PLOTS = (("accuracy_vs_time.svg", "Accuracy against time",
          "seconds from the first task (model seconds in a virtual run)", "seconds"),
         ("accuracy_vs_version.svg", "Accuracy against model version", "model version",
          "version"),
         ("accuracy_vs_bytes.svg", "Accuracy against bytes sent by clients", "MB sent up",
          "megabytes_up"))


@dataclass(frozen=True)
class RunCurve:
    """One run's accuracy curve and headline figures, as the comparison needs them."""

    name: str
    seconds: tuple[float, ...]
    version: tuple[float, ...]
    megabytes_up: tuple[float, ...]
    accuracy: tuple[float, ...]
    summary: Mapping[str, Any]

    def reach(self, target: float) -> int | None:
        """Index of the first point at or above ``target`` (None if never)."""
        return next((i for i, a in enumerate(self.accuracy) if a >= target), None)

    @property
    def virtual(self) -> bool:
        """Whether the run ran on the virtual clock (its times are model seconds)."""
        return self.summary.get("mode") == "virtual"

    @property
    def run_seconds(self) -> float | None:
        """The run's length on its own clock: model seconds for a virtual run, else wall
        seconds from its first task."""
        return self.summary.get("model_seconds" if self.virtual else "wall_seconds")

    def seconds_to(self, target: float) -> float | None:
        """Seconds from the run's first task to its first flush at ``target``."""
        index = self.reach(target)
        return None if index is None else self.seconds[index]


def load_run(run_dir: Path) -> RunCurve:
    """Read a run folder (``ConfigError`` when it is not one)."""
    events_path, summary_path = run_dir / "events.jsonl", run_dir / SUMMARY_FILENAME
    if not events_path.is_file() or not summary_path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (needs events.jsonl and summary.json)")
    events = read_events(events_path)
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    return _curve(str(summary.get("run_name") or run_dir.name), events, summary)


def _curve(name: str, events: list[Event], summary: Mapping[str, Any]) -> RunCurve:
    """Accuracy per evaluated flush with the time, version and upload bytes so far."""
    start = first_task_elapsed(events)
    uploads = sorted((float(e["elapsed"]), int(e.get("bytes_up") or 0))
                     for e in of_kind(events, UPDATE_ACCEPTED) + of_kind(events, UPDATE_REFUSED))
    times = [t for t, _ in uploads]
    sent = list(itertools.accumulate((b for _, b in uploads), initial=0))
    made = [(made_elapsed(f), f) for f in unique_flushes(events) if f.get("accuracy") is not None]
    points = [(at - start, float(f.get("model_version") or 0),
               sent[bisect.bisect_right(times, at)] / 1e6, float(f["accuracy"]))
              for at, f in made]
    points.sort()
    return RunCurve(name, seconds=tuple(p[0] for p in points),
                    version=tuple(p[1] for p in points),
                    megabytes_up=tuple(p[2] for p in points),
                    accuracy=tuple(p[3] for p in points), summary=summary)


def learned_nothing(run: RunCurve) -> bool:
    """Whether no flush of the run moved its model (every one empty or its step refused):
    its accuracy is its initial model's, and no target should be set by it."""
    summary = run.summary
    rounds = int(summary.get("rounds") or 0)
    still = int(summary.get("empty_flushes") or 0) + int(summary.get("flushes_refused") or 0)
    return rounds > 0 and still >= rounds


def default_target(runs: Sequence[RunCurve]) -> float:
    """The highest accuracy every run reached (so that each has a time to it), leaving out
    the runs that learned nothing (``learned_nothing``), which would set it at their initial
    model's accuracy."""
    if any(not run.accuracy for run in runs):
        raise ConfigError("a run has no evaluated flush: give --target")
    bests = [max(run.accuracy) for run in runs if not learned_nothing(run)]
    if not bests:
        raise ConfigError("no run learned anything (every flush left its model as it was): "
                          "give --target")
    return min(bests)


def comparable(base: RunCurve, run: RunCurve) -> bool:
    """Whether two runs' times are on the same clock: a virtual run's model seconds and a
    real run's wall seconds measure different things, so no speed-up joins them."""
    return base.virtual == run.virtual


def speedups(runs: Sequence[RunCurve], target: float) -> list[float | None]:
    """Per run: the first run's time to ``target`` over its own (1.0 for the first; None
    when either never reached it, or their clocks differ: ``comparable``)."""
    base = runs[0].seconds_to(target)
    result: list[float | None] = []
    for run in runs:
        mine = run.seconds_to(target)
        result.append(None if base is None or mine is None or mine <= 0
                      or not comparable(runs[0], run) else base / mine)
    return result


def warnings_of(runs: Sequence[RunCurve]) -> list[tuple[str, str]]:
    """``(run name, its summary's warning)`` for each run that has one."""
    return [(run.name, str(run.summary["warning"])) for run in runs
            if run.summary.get("warning")]


def write_comparison(runs: Sequence[RunCurve], output: Path, target: float) -> Path:
    """Write ``compare.md`` and its plots into ``output``; returns the report's path."""
    if not runs:
        raise ConfigError("compare needs at least one run")
    output.mkdir(parents=True, exist_ok=True)
    for filename, title, xlabel, attribute in PLOTS:
        _plot(output / filename, runs, title, xlabel, attribute, target)
    path = output / COMPARE_FILENAME
    path.write_text(_markdown(runs, target), encoding="utf-8")
    return path


def _markdown(runs: Sequence[RunCurve], target: float) -> str:
    parts = [f"# Comparison: {', '.join(run.name for run in runs)}",
             f"Target accuracy: **{target:.3f}**. Baseline: **{runs[0].name}** (the first run)."]
    virtual = [run.name for run in runs if run.virtual]
    if virtual:
        parts.append(f"Virtual runs ({', '.join(virtual)}): their times are model seconds on "
                     f"the virtual clock, which charges training at a device's pace; a real "
                     f"run's are this machine's wall seconds, and no speed-up joins the two.")
    warned = warnings_of(runs)
    if warned:
        parts.append("## Warnings\n\n" + "\n".join(f"- **{name}**: {text}"
                                                  for name, text in warned))
    parts.append("## Time to target\n\n" + _table(
        ["Run", "Time to target", "Versions to target", "MB up to target", "Speed-up",
         "Best accuracy", "Run time"], [_target_row(run, target, s)
                                         for run, s in zip(runs, speedups(runs, target),
                                                           strict=True)]))
    parts.append("## Traffic and work\n\n" + _table(
        ["Run", "Bytes up", "Bytes down", "Updates accepted", "Updates wasted (refused)",
         "Comm share"], [_traffic_row(run) for run in runs]))
    parts.append(_refusals(runs))
    parts.append("## Plots\n\n" + "\n\n".join(f"![{title}]({filename})"
                                              for filename, title, _, _ in PLOTS))
    return "\n\n".join(parts) + "\n"


def _target_row(run: RunCurve, target: float, speedup: float | None) -> list[str]:
    index = run.reach(target)
    return [run.name,
            "not reached" if index is None else human_seconds(run.seconds[index]),
            "-" if index is None else f"{run.version[index]:g}",
            "-" if index is None else f"{run.megabytes_up[index]:.2f}",
            "-" if speedup is None else f"{speedup:.2f}x",
            "-" if not run.accuracy else f"{max(run.accuracy):.3f}",
            human_seconds(run.run_seconds)]


def _traffic_row(run: RunCurve) -> list[str]:
    s = run.summary
    share = s.get("comm_share")
    return [run.name, human_bytes(s.get("bytes_up") or 0), human_bytes(s.get("bytes_down") or 0),
            str(s.get("updates_accepted", 0)), str(s.get("updates_refused", 0)),
            "-" if share is None else f"{float(share):.0%}"]


def _refusals(runs: Sequence[RunCurve]) -> str:
    tallies = [_refusal_tally(run.summary) for run in runs]
    reasons = sorted({reason for tally in tallies for reason in tally})
    if not reasons:
        return "## Refused updates\n\nNo run refused an update."
    rows = [[reason, *(str(tally.get(reason, 0)) for tally in tallies)] for reason in reasons]
    coded = any(run.summary.get("refusals_by_code") for run in runs)
    return "## Refused updates\n\n" + _table(["Code" if coded else "Reason",
                                                *(run.name for run in runs)], rows)


def _refusal_tally(summary: Mapping[str, Any]) -> dict[str, int]:
    """A run's refusal counts by code; for an older summary without codes, by kind of
    reason."""
    by_code = summary.get("refusals_by_code")
    if by_code:
        return {str(code): int(entry.get("count", 0)) for code, entry in by_code.items()}
    return _reason_kinds(summary.get("refusal_reasons") or {})


def _reason_kinds(reasons: Mapping[str, int]) -> dict[str, int]:
    """Refusal counts by kind of reason: task ids and numbers blanked out, so that one row
    stands for every "too stale: task 't45-v4' was for version 4 ..." refusal."""
    kinds: dict[str, int] = {}
    for reason, count in reasons.items():
        kind = re.sub(r"\d+(\.\d+)?", "N", re.sub(r"'[^']*'", "'...'", reason))
        kinds[kind] = kinds.get(kind, 0) + int(count)
    return kinds


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join([":---"] + ["---:"] * (len(header) - 1)) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _plot(path: Path, runs: Sequence[RunCurve], title: str, xlabel: str, attribute: str,
          target: float) -> None:
    """One overlay plot: a line per run and the target accuracy dashed (SVG)."""
    write_svg(path, line_plot(
        [Series(getattr(run, attribute), run.accuracy, label=run.name) for run in runs],
        title=title, xlabel=xlabel, ylabel="test accuracy", hlines=[(target, "target")]))
