"""TensorBoard scalars of a run, written beside its ``events.jsonl`` (``[run] tensorboard``).

:class:`TensorBoardScalars` is an event-log subscriber. Each ``flush`` writes, at step = the
model version and at the run's start time plus when its version was made (``made_elapsed``:
a served run logs the flush after its central evaluation) (so TensorBoard plots
them against version, and against time with its "relative" or "wall" axis): ``eval/accuracy``,
``eval/loss``, ``traffic/bytes_up``, ``traffic/bytes_down`` (totals so far),
``updates/accepted``, ``updates/refused`` (totals so far), ``round/seconds`` and, for DP runs,
``privacy/epsilon``. The JSON-lines log stays the source of truth; these are a view of it.

Over gRPC (``fedlink serve``, ``fedlink simulate``) a flush's time is its wall time. In a
virtual run (``[run] mode = "virtual"``) ``elapsed`` and ``round/seconds`` are model seconds:
the "relative" axis is model time, as in the run's summary and report, not the seconds the
simulation took. Such a run logs no ``download_finished`` event; its ``traffic/bytes_down``
adds up the ``bytes_down`` each flush carries (the bytes sent since the previous one).

``tensorboard`` is an optional extra (``pip install 'fedlink[tensorboard]'``), imported only
here; only its event-file writer is used (no TensorFlow).
"""

from __future__ import annotations

import contextlib
import math
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from fedlink.errors import ConfigError
from fedlink.experiment.run_folder import TENSORBOARD_DIRNAME
from fedlink.metrics.events import Event, EventLog
from fedlink.metrics.summary import made_elapsed

try:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigError("[run] tensorboard = true needs the tensorboard package: "
                      "pip install 'fedlink[tensorboard]'") from exc



class TensorBoardScalars:
    """Writes a run's scalars into ``log_dir`` as the events arrive; ``close`` flushes."""

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(log_dir))
        self._lock = threading.Lock()
        self._totals = {"bytes_up": 0.0, "bytes_down": 0.0, "accepted": 0.0, "refused": 0.0,
                        "flushed_down": 0.0}
        self._downloads = False  # whether the log has download_finished events
        self._origin: float | None = None  # the run's start in wall time: t - elapsed

    def observe(self, event: Event) -> None:
        """Count traffic and outcomes; write the scalars at each flush (a subscriber)."""
        kind = event.get("kind")
        with self._lock:
            if self._origin is None and _finite(event.get("t")) and _finite(event.get("elapsed")):
                self._origin = float(event["t"]) - float(event["elapsed"])
            if kind in ("update_accepted", "update_refused"):
                self._totals["bytes_up"] += _number(event.get("bytes_up"))
                self._totals["accepted" if kind == "update_accepted" else "refused"] += 1
            elif kind == "download_finished":
                self._downloads = True
                self._totals["bytes_down"] += _number(event.get("bytes"))
            elif kind == "flush":
                self._totals["flushed_down"] += _number(event.get("bytes_down"))
                self._write_flush(event)

    def _write_flush(self, event: Event) -> None:
        privacy = event.get("privacy")
        epsilon = privacy.get("epsilon") if isinstance(privacy, dict) else event.get("epsilon")
        scalars = {"eval/accuracy": event.get("accuracy"), "eval/loss": event.get("loss"),
                   "round/seconds": event.get("round_seconds"), "privacy/epsilon": epsilon,
                   "traffic/bytes_up": self._totals["bytes_up"],
                   "traffic/bytes_down": self._totals["bytes_down" if self._downloads
                                                      else "flushed_down"],
                   "updates/accepted": self._totals["accepted"],
                   "updates/refused": self._totals["refused"]}
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
                  for tag, value in scalars.items()
                  if _finite(value)]
        self._writer.add_event(event_pb2.Event(
            wall_time=self._time(event), step=int(event.get("model_version") or 0),
            summary=summary_pb2.Summary(value=values)))

    def _time(self, event: Event) -> float:
        """The run's start plus when the flush's version was made (``made_elapsed``; model
        seconds in a virtual run); its ``t`` when it has no ``elapsed``."""
        if self._origin is not None and _finite(event.get("elapsed")):
            return self._origin + made_elapsed(event)
        return float(event.get("t") or 0.0)

    def close(self) -> None:
        """Write everything out and close the event file."""
        self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def attach(events: EventLog, run_dir: Path, stack: contextlib.ExitStack) -> Path:
    """Write ``events``' scalars under ``run_dir/tensorboard`` until ``stack`` closes."""
    log_dir = run_dir / TENSORBOARD_DIRNAME
    events.subscribe(stack.enter_context(TensorBoardScalars(log_dir)).observe)
    return log_dir


def _finite(value: Any) -> bool:
    """Whether an event field is a finite number."""
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def _number(value: Any) -> float:
    """A finite float from an event field (missing or odd values count as 0)."""
    return float(value) if _finite(value) else 0.0
