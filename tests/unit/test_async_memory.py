"""Async (FedBuff) aggregation streams: memory does not grow with the number of updates.

A 1M-parameter model (4 MB of float32) and 200 updates through the ``RoundEngine`` directly,
with the ``async`` preset: 30 tasks in flight, a flush every 10 updates, updates delivered in
random order (so with staleness). The engine's fixed holdings (the float64 accumulator, the
payloads of the versions a stale client may still download, the delta history) are set up by
a warm-up that fills those windows; after it, aggregating 200 more updates must raise the peak
of traced memory by less than 3x the model size and leave nothing behind. The benchmark
``benchmarks/async_memory.py`` prints the same figures for 1,000 updates.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.coordinator import CoordinatorConfig, RoundEngine
from fedlink.coordinator.config import FlushRule
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.errors import UpdateRefused
from fedlink.messages import Task
from fedlink.metrics import EventLog

PARAMS = 1_000_000
MODEL_BYTES = 4 * PARAMS


class Stream:
    """Clients that take a task whenever they are free and finish in random order."""

    def __init__(self, engine: RoundEngine, deltas: list[np.ndarray], seed: int = 0) -> None:
        self.engine = engine
        self.deltas = deltas
        self.rng = np.random.default_rng(seed)
        self.clients = [f"c{i}" for i in range(engine.rule.cohort)]
        self.in_flight: dict[str, Task] = {}
        self.sent = 0
        self.refused = 0
        self.max_staleness_seen = 0

    def refill(self) -> None:
        for client in self.clients:
            if client not in self.in_flight:
                reply = self.engine.issue(client)
                if isinstance(reply, Task):
                    self.in_flight[client] = reply

    def run(self, updates: int) -> None:
        self.refill()
        for _ in range(updates):
            names = sorted(self.in_flight)
            client = names[int(self.rng.integers(len(names)))]
            task = self.in_flight.pop(client)
            delta = self.deltas[self.sent % len(self.deltas)]
            self.sent += 1
            try:
                accepted = self.engine.submit(ReceivedUpdate(
                    client, task.task_id, task.model_version, delta, 10, 5, 5, MODEL_BYTES))
            except UpdateRefused:  # unlucky: more than max_staleness versions late
                self.refused += 1
            else:
                self.max_staleness_seen = max(self.max_staleness_seen, accepted.staleness)
            self.refill()


@pytest.mark.parametrize("guard", [False, True])
def test_async_aggregation_peak_growth_under_three_model_sizes(fake_clock: FakeClock,
                                                              guard: bool) -> None:
    """Streaming (``robust.enabled = false``): under 3 model sizes. The default flush guard
    keeps a copy of each update of a flush until it is folded (order-free statistics): under
    ``goal + 3`` model sizes, and still nothing accumulates across flushes."""
    rule = FlushRule.from_preset("async", goal=10)
    config = CoordinatorConfig(rounds=10**6, flush=rule, staleness_weight="polynomial",
                               robust=RobustConfig(enabled=guard))
    rng = np.random.default_rng(0)
    deltas = [rng.normal(scale=1e-3, size=PARAMS).astype(np.float32) for _ in range(3)]
    tracemalloc.start()
    try:
        engine = RoundEngine(config, np.zeros(PARAMS, np.float32), EventLog(None),
                             clock=fake_clock)
        stream = Stream(engine, deltas)
        windows = rule.max_staleness + config.limits.delta_history + 2
        stream.run(windows * rule.goal)  # warm-up: fills the served-version windows
        steady, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        stream.run(200)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert engine.version == (stream.sent - stream.refused) // rule.goal
    assert stream.max_staleness_seen >= 2  # really asynchronous
    buffered = rule.goal if guard else 0  # the guard's copies of one flush, at most
    assert (peak - steady) / MODEL_BYTES < 3.0 + buffered
    held = (stream.sent - stream.refused) % rule.goal if guard else 0  # waiting for a flush
    assert (current - steady) / MODEL_BYTES < 0.25 + held  # nothing accumulates per update
