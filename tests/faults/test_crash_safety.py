"""Crash safety: a coordinator killed with SIGKILL 20 times finishes its run, and every update it
acknowledged is counted exactly once.

The coordinator is ``fedlink serve --state-dir`` in its own process, on a fixed port. Four SDK
clients run in this process, each behind its own throttled TCP proxy (so an upload takes about
a second and most kills land in the middle of one), with a trainer that always adds the same
client-specific vector ``d_c`` to the model it got. The test kills the coordinator 20 times:

- 14 times without a crash point: half at a random moment, 1-5 s after it starts listening
  (uploads in flight, tasks being issued, flushes), half as soon as an upload is seen
  streaming (its spool file grows), so kills mid-upload are arranged, not hoped for;
- 6 times at named moments the coordinator passes (a ``FaultPlan`` the helper
  ``_serve_with_faults.py`` builds from ``--crash-at``): in the middle of
  a flush (before and after its checkpoint is written, before its batch commits), between a
  commit's journal and its events, and while a commit is being accepted.

Each crash point is set for one restart (the coordinator kills itself there; if it does not get
there within 40 s, the test kills it). The coordinator restarts after each kill; the clients
ride through on their retries. At the end, the event log must account for every update the
clients saw acknowledged, each in exactly one flush, and an independent recomputation of the
final model from the event log (the default flush guard's aggregate of the ``d_c`` of each
flush's updates, weighted by the clients' example counts, each update once) must equal the
model the coordinator wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import fixed_port

from fedlink.aggregate.robust import l2_norm
from fedlink.client import ClientOptions, ClientSession, RetryPolicy, SessionStats, TrainPlan
from fedlink.client.base import TrainResult
from fedlink.coordinator import CoordinatorConfig
from fedlink.coordinator.engine import build_accumulator
from fedlink.experiment.config import ExperimentConfig
from fedlink.experiment.setup import Experiment
from fedlink.metrics import read_events
from fedlink.metrics.summary import unique_flushes
from fedlink.netem import LinkProfile
from fedlink.netem.proxy import TcpProxy

pytestmark = pytest.mark.timeout(1500)  # it took 780 s beside two busy loops and other work

CLIENTS = 4
ROUNDS = 24  # enough that every kill lands while the run is still going
RANDOM_KILLS = 14
CRASH_POINTS = [  # (--crash-at MOMENT[:N], what it is in the middle of)
    ("flush.before_checkpoint", "a flush, before its checkpoint is written"),
    ("flush.after_checkpoint", "a flush, its checkpoint written, its batch not committed"),
    ("batch.before_commit:3", "a batch (journal written, not committed)"),
    ("batch.after_commit:4", "a batch committed, its events not yet in the event log"),
    ("commit.before_accept", "a commit, before the update is folded in"),
    ("flush.after_checkpoint:2", "the second flush of a process"),
]
UP_KBPS = 400.0  # a ~66 KB update takes ~1.3 s: kills often land mid-upload
SERVE_STARTUP_S = 180.0  # a bound on waiting, not a timing: a loaded machine imports slowly
SERVE_WITH_FAULTS = Path(__file__).with_name("_serve_with_faults.py")

CONFIG = f"""
[run]
name = "crash"
seed = 3
[data]
dataset = "digits"
clients = {CLIENTS}
[model]
name = "mlp"
options = {{ hidden = [96, 96] }}
[coordinator]
rounds = {ROUNDS}
[coordinator.flush]
goal = 3
min_updates = 1
deadline_s = 30.0
max_staleness = 2
[coordinator.training]
local_steps = 1
[coordinator.limits]
long_poll_s = 2.0
retry_after_s = 0.2
"""


class ConstantStep:
    """A trainer that adds the same vector ``d_c`` to whatever model it is given."""

    def __init__(self, index: int, size: int) -> None:
        self.examples = 10 + 7 * index  # distinct weights: a double count shows in the mean
        self.step = np.random.default_rng(100 + index).normal(0, 0.01, size).astype(np.float32)

    def num_examples(self) -> int:
        return self.examples

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        return TrainResult(params + self.step, self.examples, 1, 1)


@dataclass
class Fleet:
    """The clients, running on their own event loop in a thread."""

    port: int
    trainers: dict[str, ConstantStep]
    stats: dict[str, SessionStats] = field(default_factory=dict)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="clients", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self.error = exc

    async def _main(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            sessions = []
            for name, trainer in self.trainers.items():
                proxy = await stack.enter_async_context(
                    TcpProxy(LinkProfile(up_kbps=UP_KBPS), f"127.0.0.1:{self.port}"))
                options = ClientOptions(name=name, retry=RetryPolicy(
                    initial_backoff_s=0.1, max_backoff_s=1.0, max_attempts=10_000,
                    budget_s=900.0))  # outlasts slow restarts on a loaded machine
                sessions.append((name, ClientSession(proxy.address, trainer, options)))
            results = await asyncio.gather(*(s.run() for _, s in sessions))
        self.stats = {name: stats for (name, _), stats in zip(sessions, results, strict=True)}


class CoordinatorProcess:
    """``fedlink serve --state-dir`` on a fixed port; restartable."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.config = tmp / "run.toml"
        self.config.write_text(CONFIG)
        self.state_dir = tmp / "state"
        self.output_dir = tmp / "runs"
        self.port = port
        self.log = tmp / "coordinator.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, crash_at: str = "") -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        faults = ["--crash-at", crash_at] if crash_at else []
        with self.log.open("ab") as log:
            log.write(f"--- start (crash_at={crash_at!r})\n".encode())
            self.popen = subprocess.Popen(
                [sys.executable, str(SERVE_WITH_FAULTS), *faults, "--config", str(self.config),
                 "--port", str(self.port), "--state-dir", str(self.state_dir),
                 "--output-dir", str(self.output_dir)],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + SERVE_STARTUP_S
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                return  # died while starting (a crash point can be reached that early)
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        pytest.fail(f"the coordinator did not listen within {SERVE_STARTUP_S} s:\n"
                    f"{self.log.read_text()[-3000:]}")

    def kill(self) -> int:
        """SIGKILL (if still running) and reap; the exit code."""
        assert self.popen is not None
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGKILL)
        return self.popen.wait(timeout=30)

    def wait_exit(self, timeout_s: float) -> int | None:
        assert self.popen is not None
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def spool_sizes(self) -> dict[Path, int]:
        """Bytes received so far by each upload in progress."""
        sizes = {}
        for path in (self.state_dir / "uploads").glob("*/*.spool"):
            with contextlib.suppress(FileNotFoundError):  # settled meanwhile
                sizes[path] = path.stat().st_size
        return sizes

    def receiving(self, before: dict[Path, int]) -> bool:
        """Whether an upload received bytes since ``before`` (one is streaming right now)."""
        return any(size > before.get(path, 0) for path, size in self.spool_sizes().items())

    def wait_receiving(self, timeout_s: float) -> bool:
        """Wait until an upload's spool grows between two looks (one is streaming now)."""
        deadline = time.monotonic() + timeout_s
        before = self.spool_sizes()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if self.receiving(before):
                return True
            before = self.spool_sizes()
        return False


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[CoordinatorProcess]:
    """The coordinator process; never left running after the test, whatever happened."""
    process = CoordinatorProcess(tmp_path, fixed_port())
    yield process
    if process.popen is not None and process.popen.poll() is None:
        process.kill()


def test_coordinator_killed_20_times_finishes_and_counts_every_update_once(
        coordinator: CoordinatorProcess) -> None:
    experiment = Experiment.build(ExperimentConfig.from_toml(coordinator.config))
    initial = experiment.initial_vector().astype(np.float64)
    trainers = {f"client-{i}": ConstantStep(i, initial.size) for i in range(CLIENTS)}
    fleet = Fleet(coordinator.port, trainers)
    rng = random.Random(20261129)
    plan = [("", None)] * RANDOM_KILLS + CRASH_POINTS
    rng.shuffle(plan)

    timeline: list[str] = []
    began = time.monotonic()
    coordinator.start(plan[0][0])
    fleet.start()
    mid_upload = self_killed = 0
    for i, (crash_at, _) in enumerate(plan):
        if crash_at:
            code = coordinator.wait_exit(timeout_s=40)
            if code is None:  # not reached in time: a random moment after all
                coordinator.kill()
            self_killed += code == -signal.SIGKILL
        elif i % 2:
            # arranged, not hoped for: wait until an upload is seen streaming, then kill
            assert coordinator.wait_receiving(timeout_s=60), \
                f"no upload streamed within 60 s:\n{timeline}"
            mid_upload += 1
            coordinator.kill()
        else:
            time.sleep(rng.uniform(0.7, 4.7))  # a random moment: whatever is in flight
            coordinator.kill()
        timeline.append(f"{time.monotonic() - began:6.1f}s kill {i + 1} ({crash_at or 'random'})")
        assert fleet.error is None, fleet.error
        coordinator.start(plan[i + 1][0] if i + 1 < len(plan) else "")
    code = coordinator.wait_exit(timeout_s=240)
    timeline.append(f"{time.monotonic() - began:6.1f}s run finished; {mid_upload} kills while "
                    f"an upload streamed, {self_killed} at crash points")
    print("\n".join(timeline))
    assert code == 0, coordinator.log.read_text()[-4000:]
    assert fleet.thread is not None
    fleet.thread.join(timeout=120)
    assert fleet.error is None, fleet.error
    assert self_killed >= 4, f"the crash points were not reached:\n{timeline}"
    assert mid_upload >= 3, f"only {mid_upload} kills were made while an upload was streaming"

    run_dir = coordinator.output_dir / "crash"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finish_reason"] == f"completed {ROUNDS} rounds"
    events = read_events(run_dir / "events.jsonl")
    resumed_mid_run = [e for e in events if e["kind"] == "coordinator_restored"
                       and e["model_version"] < ROUNDS]
    assert len(resumed_mid_run) == len(plan), "some kills came after the run was over"
    _check_each_update_counted_once(events, fleet, trainers)
    expected = _recompute_model(initial, events, trainers, experiment.config.coordinator)
    np.testing.assert_allclose(np.load(run_dir / "model.npy"), expected, rtol=0, atol=2e-5)


def _check_each_update_counted_once(events: list[dict], fleet: Fleet,
                                    trainers: dict[str, ConstantStep]) -> None:
    flushes = unique_flushes(events)
    assert [f["model_version"] for f in flushes] == list(range(1, ROUNDS + 1))
    counted = [task for f in flushes for task in f["updates"]]
    assert len(counted) == len(set(counted)), "an update was counted in two flushes"
    assert all(f["num_updates"] == len(f["updates"]) for f in flushes)
    accepted = [e["task_id"] for e in events if e["kind"] == "update_accepted"]
    assert len(accepted) == len(set(accepted)), "an update was accepted twice"
    assert set(accepted) == set(counted)
    acknowledged = sum(stats.accepted for stats in fleet.stats.values())
    assert set(fleet.stats) == set(trainers)
    assert acknowledged == len(counted), (acknowledged, len(counted))


def _recompute_model(initial: np.ndarray, events: list[dict],
                     trainers: dict[str, ConstantStep], config: CoordinatorConfig) -> np.ndarray:
    """The default aggregation (the flush guard: weights capped, norms clipped, a trimmed mean;
    server lr 1) of each flush's updates, each once, from the event log alone. One guard runs
    through the flushes in order, as the coordinator's does (small flushes' norm statistics
    take in the norms of earlier ones)."""
    names = {e["client_id"]: e["name"] for e in events if e["kind"] == "client_joined"}
    owner = {e["task_id"]: names[e["client_id"]] for e in events
             if e["kind"] == "update_accepted"}
    model = initial.copy()
    guard = build_accumulator(config, lambda: l2_norm(model.astype(np.float32)))
    for flush in unique_flushes(events):
        for task in flush["updates"]:
            client = trainers[owner[task]]
            guard.add(client.step, float(client.examples), 1)
        model += guard.mean()
        guard.reset()
    return model
