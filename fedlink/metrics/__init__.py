"""Run metrics: the event log, run summaries, the Markdown/PNG report and console output.

Typical use by a run driver::

    with EventLog(run_dir / "events.jsonl") as log, RunProgress(rounds) as progress:
        log.on_flush(show)  # show(flush) moves the progress bar on each new version
        log.emit(RunStarted(config=config))
        ...
        log.emit(Flush(model_version=v, num_updates=n, accuracy=acc, loss=loss,
                       bytes_up=up, bytes_down=down, round_seconds=secs))
    events = read_events(run_dir / "events.jsonl")
    summary = summarize(events, config)
    write_summary(run_dir / SUMMARY_FILENAME, summary)
    write_report(run_dir, events, summary)
    print_summary(summary, run_dir)

The event types are in :mod:`fedlink.metrics.kinds`, the log in :mod:`fedlink.metrics.events`,
the summary fields in :mod:`fedlink.metrics.summary`.
"""

from typing import Any

from fedlink.metrics.events import (
    CLIENT_JOINED,
    CLIENT_LEFT,
    CLIENT_TIMEOUT,
    DOWNLOAD_FINISHED,
    DOWNLOAD_USED,
    EVENT_KINDS,
    FLUSH,
    RUN_FINISHED,
    RUN_STARTED,
    TASK_ISSUED,
    UPDATE_ACCEPTED,
    UPDATE_REFUSED,
    EventLog,
    iter_events,
    read_events,
)
from fedlink.metrics.formatting import human_bytes, human_seconds, key_figures
from fedlink.metrics.kinds import (
    EVENT_TYPES,
    ClientExpired,
    ClientJoined,
    ClientLeft,
    ClientNetwork,
    ClientTimeout,
    CoordinatorRestored,
    DownloadFinished,
    DownloadUsed,
    Event,
    Flush,
    FlushRefused,
    RunFinished,
    RunStarted,
    SecureAnswerLate,
    SecureGroupLost,
    TaskIssued,
    UpdateAccepted,
    UpdateLimited,
    UpdateRefused,
)
from fedlink.metrics.report import REPORT_FILENAME, write_report
from fedlink.metrics.summary import SUMMARY_FILENAME, summarize, write_summary

_CONSOLE = frozenset({"RunProgress", "print_summary"})


def __getattr__(name: str) -> Any:
    """``RunProgress`` and ``print_summary`` on first use: they need ``rich`` (the
    ``metrics`` extra), which a coordinator or device that writes no console output lacks."""
    if name in _CONSOLE:
        from fedlink.metrics import console

        return getattr(console, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

EVENTS_FILENAME = "events.jsonl"
"""The conventional file name of the event log inside a run folder."""

__all__ = [
    "CLIENT_JOINED",
    "CLIENT_LEFT",
    "CLIENT_TIMEOUT",
    "DOWNLOAD_FINISHED",
    "DOWNLOAD_USED",
    "EVENTS_FILENAME",
    "EVENT_KINDS",
    "EVENT_TYPES",
    "FLUSH",
    "REPORT_FILENAME",
    "RUN_FINISHED",
    "RUN_STARTED",
    "SUMMARY_FILENAME",
    "TASK_ISSUED",
    "UPDATE_ACCEPTED",
    "UPDATE_REFUSED",
    "ClientExpired",
    "ClientJoined",
    "ClientLeft",
    "ClientNetwork",
    "ClientTimeout",
    "CoordinatorRestored",
    "DownloadFinished",
    "DownloadUsed",
    "Event",
    "EventLog",
    "Flush",
    "FlushRefused",
    "RunFinished",
    "RunProgress",
    "RunStarted",
    "SecureAnswerLate",
    "SecureGroupLost",
    "TaskIssued",
    "UpdateAccepted",
    "UpdateLimited",
    "UpdateRefused",
    "human_bytes",
    "human_seconds",
    "iter_events",
    "key_figures",
    "print_summary",
    "read_events",
    "summarize",
    "write_report",
    "write_summary",
]
