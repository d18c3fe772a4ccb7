"""Writing a run's report in a helper process that got ready while the run went on.

Most of what a small run's report costs is getting ready to draw: importing matplotlib and
rendering a first figure (fonts, the Agg canvas) take longer than drawing the plots. A
``ReportWriter`` made with ``background=True`` starts a helper process at once
(``python -m fedlink.metrics.report_worker``), which does that work on another core while the
run imports torch and trains, then waits. When the run has written ``events.jsonl`` and
``summary.json``, ``write`` hands the helper the run folder; it reads both and writes
``report.md`` and the plots with :func:`fedlink.metrics.report.write_report`, the same function
and the same files as writing the report in the run's process. If the helper cannot be started
or fails, the report is written in this process instead (and a warning logged), so a report is
written either way.

The helper takes one line on its standard input, a JSON object ``{"run_dir": ...}``, and
answers one line, ``{"report": PATH}`` or ``{"error": TEXT}``; it exits when its input closes.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from fedlink.metrics.events import Event, read_events
from fedlink.metrics.summary import SUMMARY_FILENAME

logger = logging.getLogger(__name__)

class ReportWriter:
    """Writes ``report.md`` and its plots for a finished run (see the module docstring).

    ``background=False`` writes in this process (what ``run_simulation`` does by default);
    ``background=True`` starts the helper process now. Use as a context manager, or call
    ``close`` to stop a helper that was never used.
    """

    def __init__(self, background: bool = False) -> None:
        self._helper: subprocess.Popen[str] | None = None
        if background:
            self._helper = _start_helper()

    def write(self, run_dir: Path, events: list[Event], summary: Mapping[str, Any]) -> Path:
        """Write the report of the run in ``run_dir`` (its events and summary are on disk)."""
        helper, self._helper = self._helper, None
        if helper is not None:
            written = _ask(helper, run_dir)
            if written is not None:
                return written
        from fedlink.metrics.report import write_report

        return write_report(run_dir, events, summary)

    def close(self) -> None:
        """Stop a helper that was started and not used."""
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


def _ask(helper: subprocess.Popen[str], run_dir: Path) -> Path | None:
    """The helper's report of ``run_dir``, or None (logged) when it failed."""
    assert helper.stdin is not None and helper.stdout is not None
    try:
        helper.stdin.write(json.dumps({"run_dir": str(run_dir)}) + "\n")
        helper.stdin.flush()
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
    """Import the plotting library and render one small figure (fonts, the Agg canvas)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    import fedlink.metrics.report  # noqa: F401  (its imports, ready for the real call)

    fig = Figure(figsize=(2.0, 1.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], marker="o")
    ax.set(title="t", xlabel="x", ylabel="y")
    fig.savefig(io.BytesIO(), format="png", dpi=50)


def serve(requests: IO[str], answers: IO[str]) -> None:
    """The helper's loop: warm up, then write the report of each run folder it is given."""
    from fedlink.metrics import EVENTS_FILENAME
    from fedlink.metrics.report import write_report

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
