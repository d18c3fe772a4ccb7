"""The engine's task indexes (by client, places held by version) agree with a full scan.

Issuing a task used to scan every task (O(cohort) per call, O(cohort^2) per round, what a
virtual run of cohort 1,000 spent most of its time on); the indexes must change nothing. Random
sequences of issue / submit / poll / release are checked, after every step, against the scan
the engine used to do over all of its tasks.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest

from fedlink.coordinator.config import CoordinatorConfig
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.records import ReceivedUpdate
from fedlink.errors import RemoteError
from fedlink.messages import Task
from fedlink.metrics import EventLog

CLIENTS = 7


def _scanned_free(engine: RoundEngine) -> int:
    in_flight = sum(1 for t in engine._tasks.values() if t.state.holds_place and engine.is_open(t))
    delivered = 0 if engine.rule.continuous else engine._accumulator.count + engine._dropped
    return max(0, engine.rule.cohort - delivered - in_flight)


def _scanned_open(engine: RoundEngine, client_id: str) -> object:
    return next((r for r in engine._tasks.values()
                 if r.client_id == client_id and engine.is_open(r)), None)


def _engine(rnd: random.Random, now: list[float]) -> RoundEngine:
    flush = {"goal": rnd.randint(1, 4), "over_selection": rnd.choice([1.0, 1.5, 2.0]),
             "deadline_s": rnd.choice([0, 5]), "max_staleness": rnd.randint(0, 2),
             "continuous": rnd.random() < 0.4}
    config = CoordinatorConfig.from_dict({
        "rounds": 6, "flush": flush, "drop_partial": rnd.random() < 0.3,
        "limits": {"liveness_timeout_s": 6, "max_task_s": 12}})
    return RoundEngine(config, np.zeros(4, np.float32), EventLog(None), clock=lambda: now[0])


def _step(engine: RoundEngine, rnd: random.Random, now: list[float],
          held: dict[str, Task]) -> None:
    client, op = f"c{rnd.randrange(CLIENTS)}", rnd.random()
    now[0] += rnd.random()
    if op < 0.4:
        reply = engine.issue(client)
        if isinstance(reply, Task):
            held[client] = reply
    elif op < 0.75 and held:
        client = rnd.choice(sorted(held))
        task = held.pop(client)
        with contextlib.suppress(RemoteError):  # refusals are part of the sequence
            engine.submit(ReceivedUpdate(
                client_id=client, task_id=task.task_id, base_version=task.model_version,
                delta=np.ones(4, np.float32), num_examples=3,
                steps_completed=rnd.choice([1, 2]), steps_planned=2, bytes_up=16, metrics={}))
    elif op < 0.85:
        engine.poll()
    elif op < 0.95:
        engine.release_silent(lambda _: now[0] - rnd.random() * 10)
    else:
        engine.release_client(client)


@pytest.mark.parametrize("seed", range(40))
def test_indexes_agree_with_a_full_scan(seed: int) -> None:
    rnd, now, held = random.Random(seed), [0.0], {}
    engine = _engine(rnd, now)
    engine.start()
    for _ in range(150):
        _step(engine, rnd, now, held)
        if engine.finished:  # no places once the run is over
            assert engine.free_places() == 0
            break
        assert engine.free_places() == _scanned_free(engine)
        for k in range(CLIENTS):
            assert engine._open_task_of(f"c{k}") is _scanned_open(engine, f"c{k}")
