"""Writing a run's report in a helper process that got ready while the run went on.

Most of what a small run's report costs is getting ready to draw: importing matplotlib and
rendering a first figure (fonts, the Agg canvas) take longer than drawing the plots. A
``ReportWriter`` made with ``background=True`` starts a helper process at once
(``python -m fedlink.metrics.report_worker``), which does that work on another core while the
run imports torch and trains, then waits. When the run has written ``events.jsonl`` and
``summary.json``, ``write`` hands the helper the run folder and returns at once; the helper reads
both and writes ``report.md`` and the plots with :func:`fedlink.metrics.report.write_report`, the
same function and the same files as writing the report in the run's process, while the run
saves its model and prints its summary. ``wait`` (or leaving the ``with`` block) waits for it.
If the helper cannot be started or fails, the report is written in this process instead (and a
warning logged), so a report is written either way.

The helper takes one line on its standard input, a JSON object ``{"run_dir": ...}``, and
answers one line, ``{"report": PATH}`` or ``{"error": TEXT}``; it exits when its input closes.
"""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fedlink.metrics.events import Event, read_events
from fedlink.metrics.report import REPORT_FILENAME, write_report
from fedlink.metrics.summary import SUMMARY_FILENAME

logger = logging.getLogger(__name__)

class ReportWriter:
    """Writes ``report.md`` and its plots for a finished run (see the module docstring).

    ``background=False`` writes in this process (what ``run_simulation`` does by default);
    ``background=True`` starts the helper process now. Use as a context manager, or call
    ``close``: it waits for a report the helper is drawing, and stops a helper never used.
    """

    def __init__(self, background: bool = False) -> None:
        self._helper: subprocess.Popen[str] | None = None
        self._drawing: _Drawing | None = None
        if background:
            self._helper = _start_helper()

    def write(self, run_dir: Path, events: list[Event], summary: Mapping[str, Any]) -> Path:
        """The path of the report of the run in ``run_dir`` (its events and summary are on
        disk): written now, or, with a helper, handed to it (``wait`` for it to be done)."""
        helper, self._helper = self._helper, None
        if helper is not None and _send(helper, run_dir):
            self._drawing = _Drawing(helper, run_dir, events, summary)
            return run_dir / REPORT_FILENAME
        if helper is not None:
            _finish(helper)
        return write_report(run_dir, events, summary)

    def wait(self) -> None:
        """Wait for the report the helper is drawing (drawn here if the helper failed)."""
        drawing, self._drawing = self._drawing, None
        if drawing is not None and _answer(drawing.helper) is None:
            write_report(drawing.run_dir, drawing.events, drawing.summary)

    def close(self) -> None:
        """Wait for a report being drawn; stop a helper that was started and not used."""
        self.wait()
        helper, self._helper = self._helper, None
        if helper is not None:
            _finish(helper)

    def __enter__(self) -> ReportWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_run_report(report: bool | ReportWriter, run_dir: Path, events: list[Event],
                     summary: Mapping[str, Any]) -> Path | None:
    """The report a run was asked for: none (``False``), in this process (``True``), or by
    the given ``ReportWriter``; its path, or None."""
    if report is False:
        return None
    writer = report if isinstance(report, ReportWriter) else ReportWriter()
    return writer.write(run_dir, events, summary)


def _start_helper() -> subprocess.Popen[str] | None:
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "fedlink.metrics.report_worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError as exc:
        logger.warning("report helper not started (%s): the report is drawn in this process",
                       exc)
        return None


@dataclass(frozen=True)
class _Drawing:
    """A run the helper was handed, with what drawing it here needs if the helper fails."""

    helper: subprocess.Popen[str]
    run_dir: Path
    events: list[Event]
    summary: Mapping[str, Any]


def _send(helper: subprocess.Popen[str], run_dir: Path) -> bool:
    """Hand ``run_dir`` to the helper; False (logged) when it cannot take it."""
    assert helper.stdin is not None
    try:
        helper.stdin.write(json.dumps({"run_dir": str(run_dir)}) + "\n")
        helper.stdin.flush()
    except OSError as exc:
        logger.warning("report helper failed (%s): the report is drawn in this process", exc)
        return False
    return True


def _answer(helper: subprocess.Popen[str]) -> Path | None:
    """The helper's report of the run it was handed, or None (logged) when it failed."""
    assert helper.stdout is not None
    try:
        answer = json.loads(helper.stdout.readline() or "{}")
    except (OSError, ValueError) as exc:
        answer = {"error": str(exc)}
    finally:
        _finish(helper)
    if "report" in answer:
        return Path(answer["report"])
    logger.warning("report helper failed (%s): the report is drawn in this process",
                   answer.get("error", f"exit code {helper.returncode}"))
    return None


def _finish(helper: subprocess.Popen[str]) -> None:
    """Close the helper's input (it exits on end of input) and reap it."""
    for stream in (helper.stdin, helper.stdout):
        if stream is not None:
            stream.close()
    try:
        helper.wait(timeout=30)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()


def _warm_up() -> None:
    """Import the plotting library and render one small line plot as the report draws them
    (fonts, the Agg canvas)."""
    import io

    from fedlink.metrics.canvas import line_axes

    fig, ax = line_axes(2.0, 1.5)
    ax.plot([0, 1], [0, 1], marker="o")
    ax.set(title="t", xlabel="x", ylabel="y")
    fig.savefig(io.BytesIO(), format="png", dpi=50)


def serve(requests: IO[str], answers: IO[str]) -> None:
    """The helper's loop: warm up, then write the report of each run folder it is given."""
    from fedlink.metrics import EVENTS_FILENAME
    _warm_up()
    for line in requests:
        try:
            run_dir = Path(json.loads(line)["run_dir"])
            summary = json.loads((run_dir / SUMMARY_FILENAME).read_text(encoding="utf-8"))
            path = write_report(run_dir, read_events(run_dir / EVENTS_FILENAME), summary)
            answer: dict[str, str] = {"report": str(path)}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
    # the run waits for this process to end: what matplotlib made is left to the exit rather
    # than walked by the interpreter's final garbage collections
    gc.freeze()
