"""Runs an external client command against real coordinators and judges what it did.

Each ``Scenario`` starts a coordinator on 127.0.0.1 (one client, ``goal = 1``: one update per
round), installs a ``Probe`` with the scenario's faults, runs the client command with
``{server}`` replaced by the coordinator's address, waits for the run to finish and the client
to exit, and applies the scenario's checks. The client trains whatever it trains: the
coordinator's model is a flat vector of ``num_parameters`` values, which it must match
(``clients/edge`` trains logistic regression, 64 features x 10 classes: 650).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedlink.conformance.checks import RunRecord, Verdict, judge
from fedlink.conformance.probe import FaultPlan, Probe
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.coordinator.config import TrainingConfig
from fedlink.errors import ConfigError
from fedlink.metrics import EventLog

DOWNLINK_CODECS: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp32-zlib")
SERVER_PLACEHOLDER = "{server}"


@dataclass(frozen=True)
class Scenario:
    """One coordinator run: its settings, the faults to inject and the checks to apply."""

    name: str
    checks: tuple[str, ...]
    faults: FaultPlan = field(default_factory=FaultPlan)
    downlink_codec: str = "fp32"
    rounds: int = 2
    chunk_bytes: int = 1 << 20
    inline_bytes: int = 64 << 10
    server_lr: float = 1.0

    def coordinator_config(self) -> CoordinatorConfig:
        """The coordinator of this scenario: one update per round, short long-polls."""
        return CoordinatorConfig(
            run_name=f"conformance-{self.name}", rounds=self.rounds,
            flush=FlushRule(goal=1, deadline_s=None), downlink_codec=self.downlink_codec,
            server_optimizer_options={"lr": self.server_lr},
            training=TrainingConfig(local_epochs=1, batch_size=32, learning_rate=0.1),
            limits=LimitsConfig(chunk_bytes=self.chunk_bytes, inline_bytes=self.inline_bytes,
                                long_poll_s=1.0, retry_after_s=0.2))


FAULTS = Scenario(
    "faults", ("join", "task", "resume_download", "resume_upload", "idempotent_commit",
               "delta", "refusal"),
    FaultPlan(cut_download=True, cut_upload=True, lose_commit_reply=True, corrupt_upload=2),
    rounds=3, chunk_bytes=512, inline_bytes=0)
"""Streamed transfers in 512-byte chunks, with every fault injected once."""


def codec_scenario(codec: str) -> Scenario:
    """Two rounds with the model broadcast in ``codec``, inline; the second version arrives as
    a delta (the server's step is scaled down so that the delta is smaller than the model
    and is offered, whatever the codec)."""
    return Scenario(f"codec-{codec}", ("codec", "inline"), downlink_codec=codec,
                    server_lr=1e-4)


@dataclass(frozen=True)
class ConformanceOptions:
    """What to run: the client command (with ``{server}``), the model size, the codecs."""

    client_cmd: str
    num_parameters: int = 650
    codecs: tuple[str, ...] = DOWNLINK_CODECS
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if SERVER_PLACEHOLDER not in self.client_cmd:
            raise ConfigError(f"--client-cmd must contain {SERVER_PLACEHOLDER} (the "
                              f"coordinator's address), got {self.client_cmd!r}")
        if self.num_parameters < 1:
            raise ConfigError(f"num_parameters must be >= 1, got {self.num_parameters}")
        unknown = set(self.codecs) - set(DOWNLINK_CODECS)
        if unknown:
            raise ConfigError(f"unknown downlink codec(s) {sorted(unknown)}; "
                              f"known: {', '.join(DOWNLINK_CODECS)}")

    def scenarios(self) -> list[Scenario]:
        """The fault scenario, then one per codec."""
        return [FAULTS, *(codec_scenario(c) for c in self.codecs)]


@dataclass(frozen=True)
class ScenarioResult:
    """The verdicts of one scenario and the client's output (for a failing check)."""

    scenario: str
    verdicts: list[Verdict]
    client_output: str


async def run_conformance(options: ConformanceOptions) -> list[ScenarioResult]:
    """Every scenario of ``options``, one after the other."""
    return [await run_scenario(s, options) for s in options.scenarios()]


async def run_scenario(scenario: Scenario, options: ConformanceOptions) -> ScenarioResult:
    """Serve one run to the client command and judge it."""
    initial = np.random.default_rng(0).normal(scale=0.01, size=options.num_parameters)
    events = EventLog(None)
    server = CoordinatorServer(scenario.coordinator_config(), initial.astype(np.float32),
                               events, address="127.0.0.1:0")
    async with server:
        log = Probe(server.service, scenario.faults).install()
        command = options.client_cmd.replace(SERVER_PLACEHOLDER, f"127.0.0.1:{server.port}")
        exit_code, output = await _run_client(shlex.split(command), server, options.timeout_s)
    record = RunRecord(log, list(events.events), exit_code, scenario.rounds)
    prefix = "" if scenario is FAULTS else f"{scenario.downlink_codec}: "
    return ScenarioResult(scenario.name, judge(scenario.checks, record, prefix), output)


async def _run_client(argv: Sequence[str], server: CoordinatorServer,
                      timeout_s: float) -> tuple[int | None, str]:
    """Run the client until it exits after the run finished (killed at ``timeout_s``)."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    reading = asyncio.ensure_future(_read_all(process))
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
    output = await reading
    finished = server.lifecycle.finished.is_set()
    return (process.returncode if finished else None), output


async def _read_all(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    return (await process.stdout.read()).decode(errors="replace")


def format_report(results: Sequence[ScenarioResult]) -> str:
    """A table of every behaviour: PASS/FAIL and what was seen."""
    lines = []
    for result in results:
        for verdict in result.verdicts:
            mark = "PASS" if verdict.passed else "FAIL"
            lines.append(f"{mark}  {verdict.name:<24} {verdict.detail}")
        if not all(v.passed for v in result.verdicts):
            tail = result.client_output.strip().splitlines()[-15:]
            lines += [f"      client output ({result.scenario}, last lines):",
                      *(f"      | {line}" for line in tail)]
    passed = sum(v.passed for r in results for v in r.verdicts)
    total = sum(len(r.verdicts) for r in results)
    lines.append(f"{passed}/{total} behaviours passed")
    return "\n".join(lines)
