"""The run's lifecycle, with one owner: starting, running, finishing, finished.

::

    STARTING ──begin──► RUNNING ──the run ends──► FINISHING ──close──► FINISHED
        └──────────(a restart of a run that had ended)──────┘

Every way a run ends comes here: its rounds are done or a flush hook stops it (the engine
says so, and the lifecycle notices at the next flush report or call), a stop rule says so
about a reported flush (a target accuracy: the run ends on exactly that flush), an operator's
signal or the simulation calls ``end``, or a restarted coordinator finds the run over. While
``FINISHING`` the clients hear ``Finished``; ``run_finished`` is emitted exactly once, by
``_announce``, once the flush the run ended on is reported; then the server drains and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fedlink.coordinator.engine import RoundEngine
from fedlink.metrics import EventLog, kinds

StopRule = Callable[[Mapping[str, Any]], str]
"""A ``flush`` event's fields -> why the run should end on that flush ("" to go on)."""


def target_accuracy(target: float) -> StopRule:
    """End the run on the first flush whose ``accuracy`` reaches ``target``."""

    def rule(flush: Mapping[str, Any]) -> str:
        accuracy = flush.get("accuracy")
        reached = isinstance(accuracy, int | float) and accuracy >= target
        return f"reached the target accuracy {target}" if reached else ""

    return rule


def target_rules(target: float) -> tuple[StopRule, ...]:
    """The stop rules of ``[run] target_accuracy = target`` (none for 0: every round runs)."""
    return (target_accuracy(target),) if target > 0 else ()


class Phase(enum.Enum):
    """Where the run stands (see the module docstring)."""

    STARTING = "starting"
    RUNNING = "running"
    FINISHING = "finishing"
    FINISHED = "finished"


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.FINISHING}),
    Phase.RUNNING: frozenset({Phase.FINISHING, Phase.FINISHED}),
    Phase.FINISHING: frozenset({Phase.FINISHED}),
    Phase.FINISHED: frozenset(),
}


class RunLifecycle:
    """Owns the run's phase, its end and its one ``run_started``/``run_finished`` pair.

    ``durably()`` journals what a change did (the service's durable-commit context) and
    ``wake()`` wakes callers waiting for a change (long-polling ``GetTask``). ``holds()``
    says whether the end must still wait (the final version's evaluation tasks,
    ``EvaluationDesk.final_pending``); whoever ends the wait calls ``check`` again.
    """

    def __init__(self, engine: RoundEngine, events: EventLog,
                 durably: Callable[[], contextlib.AbstractContextManager[None]],
                 wake: Callable[[], None], stop_rules: Sequence[StopRule] = (),
                 holds: Callable[[], bool] = lambda: False) -> None:
        self.phase = Phase.STARTING
        self.finished = asyncio.Event()
        """Set once ``run_finished`` was emitted (the server then drains)."""
        self._engine = engine
        self._events = events
        self._durably = durably
        self._wake = wake
        self._stop_rules = tuple(stop_rules)
        self._holds = holds
        self._reported = engine.version  # the last version whose flush was reported
        self.ended_on: int | None = None
        """The version a stop rule ended the run on (later flushes are not reported)."""
        self._ended_model: np.ndarray | None = None

    @property
    def final_model(self) -> np.ndarray:
        """The run's result: the model a stop rule ended it on, else the current one."""
        return self._engine.model if self._ended_model is None else self._ended_model

    def resume(self, reported_version: int) -> None:
        """A restart: flushes after ``reported_version`` are still to be reported."""
        self._reported = reported_version

    def begin(self, **run_started: Any) -> None:
        """Serving: the first round's clock starts (``RoundEngine.start``); emit
        ``run_started`` (with ``run_started`` as its fields)."""
        self._engine.start()
        self._events.emit(kinds.RunStarted.build(**run_started))
        self._enter(Phase.RUNNING)
        self.check()  # a restart of a run that had ended

    def end(self, reason: str, durable: bool = True) -> None:
        """End the run now: no more tasks or updates; waiting clients hear ``Finished``.

        ``durable=False`` (a signal's stop) ends it for this process only: a coordinator
        restarted on the same ``state_dir`` goes on with the run.
        """
        with self._durably():
            self._engine.finish(reason, durable=durable)
        self._wake()
        self.check()

    def reports(self, version: int) -> bool:
        """Whether the flush that made ``version`` is to be reported (not one made after a
        stop rule ended the run on an earlier flush)."""
        return self.ended_on is None or version <= self.ended_on

    def flush_reported(self, version: int, flush: Mapping[str, Any],
                       model: np.ndarray) -> None:
        """The ``flush`` event of ``version`` (whose model is ``model``) was written: apply
        the stop rules, then see whether the run is over."""
        self._reported = version
        if not self._engine.finished:
            reason = next((r for r in (rule(flush) for rule in self._stop_rules) if r), "")
            if reason:
                self.ended_on, self._ended_model = version, model
                self.end(reason)
                return
        self.check()

    def check(self) -> None:
        """Announce the run's end once the engine is finished and the flush it ended on is
        reported (a hook's stop between flushes, a restart, the last round)."""
        if not self._engine.finished:
            return
        if self.phase is Phase.RUNNING:
            self._enter(Phase.FINISHING)
        last = self._engine.version if self.ended_on is None else self.ended_on
        if self._reported >= last and not self._holds():
            self._announce(last)

    def recheck(self) -> None:
        """What ``holds()`` depends on changed (a final-version evaluation reported, its
        client left, or its time ran out): the run's end may be due, and long-polls hear of
        the change."""
        self.check()
        self._wake()

    def close(self) -> None:
        """The server stopped serving."""
        if self.phase is not Phase.FINISHED:
            self._enter(Phase.FINISHED)

    def _announce(self, version: int) -> None:
        """Emit ``run_finished`` once and wake whoever waits for the end of the run."""
        if self.finished.is_set():
            return
        if self.phase is Phase.STARTING:  # ended before this process served a call
            self._enter(Phase.FINISHING)
        self._events.emit(kinds.RunFinished.build(reason=self._engine.finished_reason,
                                                  model_version=version,
                                                  privacy=self._engine.privacy_record()))
        self.finished.set()
        self._wake()

    def _enter(self, phase: Phase) -> None:
        if phase not in _NEXT[self.phase]:
            raise RuntimeError(f"the run cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase
