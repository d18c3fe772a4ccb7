"""Shared fixtures: a loopback coordinator factory, numpy trainers, and an asyncio driver.

pytest-asyncio is not used: sync tests drive async code with ``run_async`` (``asyncio.run``
bounded by a timeout), and start a coordinator inside that loop with the ``coordinator``
fixture::

    def test_x(coordinator):
        async def scenario():
            async with coordinator(config, np.zeros(8, np.float32)) as server:
                ...
        run_async(scenario())
"""

from __future__ import annotations

import os

# The suite runs several pytest workers, each starting coordinator and client processes, on a
# machine with few cores: one math thread per process (numpy's BLAS, torch's OpenMP) instead of
# one per core, else their spinning threads oversubscribe the cores and every test slows down.
# Set before numpy or torch is imported; inherited by the processes the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import asyncio
import random
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import settings

from fedlink.client import TrainPlan, TrainResult
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer
from fedlink.coordinator.service import Evaluator
from fedlink.metrics import EventLog

T = TypeVar("T")

# Deterministic property tests by default; HYPOTHESIS_PROFILE=explore searches afresh each run.
settings.register_profile("deterministic", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

LOOPBACK = "127.0.0.1:0"


def run_async(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run ``coro`` to completion in a fresh event loop, failing after ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0,
                     what: str = "condition") -> None:
    """Poll ``condition`` on the event loop until it holds (``AssertionError`` on timeout)."""
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def block_until(condition: Callable[[], bool], timeout: float = 10.0,
                what: str = "condition") -> None:
    """Like ``wait_until`` but blocking: for trainer threads (never for backoff)."""
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


class TowardTrainer:
    """A numpy ``Trainer``: moves the parameters ``rate`` of the way toward ``target``.

    ``before_train`` (called with the 0-based task count, in the training thread) lets a test
    hold a client back until the coordinator reaches some state.
    """

    def __init__(self, target: np.ndarray, examples: int = 10, rate: float = 0.5,
                 before_train: Callable[[int], None] | None = None) -> None:
        self.target = np.asarray(target, dtype=np.float32)
        self.examples = examples
        self.rate = rate
        self.before_train = before_train
        self.calls = 0
        self._lock = threading.Lock()

    def num_examples(self) -> int:
        """Local dataset size."""
        return self.examples

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """One "step" toward the target."""
        with self._lock:
            call = self.calls
            self.calls += 1
        if self.before_train is not None:
            self.before_train(call)
        new = (params + self.rate * (self.target - params)).astype(np.float32)
        return TrainResult(new, self.examples, 1, 1, {"train_seconds": 0.25, "loss": 1.0})

    def step(self, params: np.ndarray) -> np.ndarray:
        """The delta this trainer produces from ``params`` (for hand-computed results)."""
        return self.rate * (self.target.astype(np.float64) - params)


CoordinatorFactory = Callable[..., CoordinatorServer]


@pytest.fixture
def coordinator() -> CoordinatorFactory:
    """Factory of (not yet started) coordinators on 127.0.0.1, each with an in-memory log.

    Use ``async with coordinator(config, initial_vector) as server``; ``server.events`` is the
    log, ``server.service.engine`` the round engine, ``server.port`` the bound port.
    """

    def make(config: CoordinatorConfig, initial: np.ndarray,
             evaluator: Evaluator | None = None) -> CoordinatorServer:
        return CoordinatorServer(config, np.asarray(initial, dtype=np.float32),
                                 EventLog(None), evaluator=evaluator, address=LOOPBACK)

    return make


def target_of(server: CoordinatorServer) -> str:
    """The ``host:port`` a client dials for ``server``."""
    return f"127.0.0.1:{server.port}"


class FakeClock:
    """A monotonic clock a test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


@pytest.fixture
def fake_clock() -> FakeClock:
    """A fresh ``FakeClock``."""
    return FakeClock()


async def gather_bounded(*aws: Awaitable[T], timeout: float = 20.0) -> list[T]:
    """``asyncio.gather`` with a timeout."""
    return list(await asyncio.wait_for(asyncio.gather(*aws), timeout))


def virtual_backend_config(workers: int, name: str, backend: str | None = None,
                           client: dict[str, Any] | None = None,
                           hooks: list[dict[str, Any]] | None = None) -> Any:
    """A small virtual run (12 digits clients on 3g and lan links, 3 elastic rounds) trained
    by ``workers`` of ``backend`` (``[run] backend``; default: the default backend), with
    ``client`` as its ``[client]`` section (default: the default pipeline) and the
    coordinator's ``hooks``."""
    from fedlink.experiment.config import (
        ExperimentConfig,  # torch-free, but not needed by every test
    )

    run: dict[str, Any] = {"name": name, "seed": 5, "mode": "virtual"}
    if backend is not None:
        run["backend"] = backend
    return ExperimentConfig.from_dict({
        "run": run,
        "data": {"dataset": "digits", "clients": 12},
        "model": {"name": "mlp"},
        "network": {"fleet": {"3g": 0.5, "lan": 0.5}},
        "coordinator": {"rounds": 3, "flush": {"goal": 4, "over_selection": 1.5,
                                               "deadline_s": 30.0},
                        "training": {"local_epochs": 1, "batch_size": 16},
                        "hooks": hooks or []},
        "virtual": {"workers": workers, "step_cost_s": 0.5},
        "client": client or {},
    })


def accepted_updates(run_dir: Any) -> list[tuple[Any, ...]]:
    """``(client_id, task_id, base_version)`` of each accepted update, in the log's order."""
    import json

    lines = (run_dir / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    return [(e["client_id"], e["task_id"], e["base_version"]) for e in events
            if e["kind"] == "update_accepted"]


def fixed_port() -> int:
    """A free port below the kernel's ephemeral range, for a coordinator restarted on the
    same address (a crash and restart, or another run taking the address over).

    While the address has no server, a port the kernel hands out (``bind(0)``) could go to
    another test's server, and the clients would reconnect to that run (seen under load: a
    model of another size). Other tests bind port 0, so they never get this one.
    """
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        ephemeral = int(f.read().split()[0])
    for port in random.Random().sample(range(max(1024, ephemeral - 12_000), ephemeral), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")
