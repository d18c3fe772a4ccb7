"""Terminal output for a run: a live progress bar and a summary table, drawn with rich.

Both stay silent where they would only make noise: :class:`RunProgress` draws nothing when it
is disabled or when its console is not a terminal (CI logs, pipes, tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from fedlink.metrics.formatting import fmt_metric, human_bytes, key_figures
from fedlink.metrics.report import REPORT_FILENAME
from fedlink.metrics.summary import SUMMARY_FILENAME


class RunProgress:
    """A progress bar over a run's rounds: ``round x/N``, accuracy and traffic so far.

    Use as a context manager and call :meth:`update` after each flush. With
    ``enabled=False``, or a console that is not a terminal, nothing is drawn.
    """

    def __init__(
        self,
        total_rounds: int,
        *,
        enabled: bool = True,
        console: Console | None = None,
        description: str = "training",
    ) -> None:
        if total_rounds < 0:
            raise ValueError(f"total_rounds must be >= 0, got {total_rounds}")
        self.total_rounds = total_rounds
        self.description = description
        self._console = console if console is not None else Console(stderr=True)
        self.enabled = enabled and self._console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Show the bar (a no-op when disabled or already started)."""
        if not self.enabled or self._progress is not None:
            return
        self._progress = _make_progress(self._console)
        self._task = self._progress.add_task(
            self.description, total=self.total_rounds, **_fields(None, 0, 0)
        )
        self._progress.start()

    def update(
        self, round: int, accuracy: float | None, bytes_up: int, bytes_down: int
    ) -> None:
        """Show ``round`` of the total, the latest accuracy and cumulative bytes up/down."""
        if self._progress is None or self._task is None:
            return
        self._progress.update(
            self._task, completed=round, **_fields(accuracy, bytes_up, bytes_down)
        )

    def stop(self) -> None:
        """Stop drawing, leaving the final bar on screen (a no-op when not started)."""
        if self._progress is not None:
            self._progress.stop()
        self._progress = None
        self._task = None


def _make_progress(console: Console) -> Progress:
    """A rich Progress with the run's columns."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("round {task.completed:.0f}/{task.total:.0f}"),
        TextColumn("acc {task.fields[accuracy]}"),
        TextColumn("up {task.fields[up]} down {task.fields[down]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _fields(accuracy: float | None, bytes_up: int, bytes_down: int) -> dict[str, Any]:
    """The formatted custom fields a progress task shows."""
    return {
        "accuracy": fmt_metric(accuracy),
        "up": human_bytes(bytes_up),
        "down": human_bytes(bytes_down),
    }


def print_summary(
    summary: Mapping[str, Any], run_dir: Path, console: Console | None = None
) -> None:
    """Print the run's key figures and the path of its report (or of its summary, for a run
    written without a report) as a rich table."""
    target = console if console is not None else Console()
    name = summary.get("run_name") or run_dir.name
    table = Table(title=f"fedlink run: {name}", show_header=False, title_justify="left")
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    for label, value in key_figures(dict(summary)):
        table.add_row(label, value)
    report = run_dir / REPORT_FILENAME
    if report.is_file():
        table.add_row("Report", str(report))
    else:  # --no-report: the summary is what there is to read
        table.add_row("Summary", str(run_dir / SUMMARY_FILENAME))
    target.print(table)
