"""Runs an external client command against real coordinators and judges what it did.

Each ``Scenario`` starts a coordinator on ``host:port`` (127.0.0.1 and a free port by default;
one client, ``goal = 1``: one update per round), installs a ``Probe`` with the scenario's
faults, runs the client command with ``{server}`` replaced by the coordinator's address (and
``{update_codec}`` by the update codec a lossy scenario asks for), waits for the client to exit,
and applies the scenario's checks. The client trains whatever it trains: the coordinator's
model is a flat vector of ``num_parameters`` values, which it must match (``clients/edge``
trains logistic regression, 64 features x 10 classes: 650).

Scenarios: ``faults`` (cut transfers, a lost commit reply, a corrupted upload),
``behaviours`` (a corrupted model, a slow commit, an overload refusal with a retry hint, a
forgotten client, evaluation tasks, the run's end), one per downlink codec, one per lossy
update codec; and, asked for (``secure``, or a secure check in ``only``), ``secure`` (two
groups, a lost ``SecureMasked`` reply), ``secure-dropout`` (a member vanishes after sharing
its keys) and ``secure-options`` (SecAgg+, group random-k and distributed DP):
coordinators with ``[coordinator.secure]`` whose groups the runner fills with fedlink clients
of its own (``fedlink.conformance.peers``), so that the client under test can complete them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedlink.aggregate import RobustConfig
from fedlink.conformance.checks import CHECKS, RunRecord, Verdict, judge
from fedlink.conformance.probe import CallLog, FaultPlan, Probe
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.coordinator.config import EvaluationConfig, SecureConfig, TrainingConfig
from fedlink.errors import ConfigError
from fedlink.metrics import EventLog

DOWNLINK_CODECS: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp32-zlib")
LOSSY_CODECS: tuple[str, ...] = ("qsgd", "sign", "topk+q4", "randk+q8")
"""Update codecs the lossy scenarios ask for by default: each lossy format of
``docs/protocol.md`` section 6 a client may write. A coordinator sees a rule broken where it
changes what it decodes (the ``qsgd`` decode rounding, the ``randk`` SplitMix64 indices: the
``values_checksum`` no longer matches); the ``sign`` scale and which ``topk`` values are kept
travel in the payload, so any choice decodes as sent and only the golden vectors hold a
client to them."""
SERVER_PLACEHOLDER = "{server}"
CODEC_PLACEHOLDER = "{update_codec}"
SECURE_GROUP = 4
"""Members of a secure group in the secure scenario: the client under test and three peers.
With four, every secret has a threshold of 2 among 3 neighbours, so when no member drops the
peers' answers alone unmask a group: the coordinator flushes whether or not the client under
test answers, and only its own calls show whether it did."""
SECURE_PHASE_S = 5.0
"""Each secure phase's deadline: the phases close as soon as every member has answered, so
this bounds only how long a slow or silent client under test holds its group up."""


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
    heartbeat_interval_s: float = 5.0
    evaluate: bool = False
    """Send every client an evaluation task for every version."""
    update_codec: str = ""
    """The update codec the client command is asked for (``{update_codec}``)."""
    prefix: str = ""
    """Put before each check's name in the report (say, the codec)."""
    secure: bool = False
    """Secure aggregation on: groups of ``SECURE_GROUP``, the runner's peers filling them."""
    vanishing_peers: int = 0
    """Peers that vanish after sharing their keys in their first group."""
    secure_settings: tuple[tuple[str, Any], ...] = ()
    """``[coordinator.secure]`` settings beyond the defaults, as ``(key, value)`` pairs."""

    def coordinator_config(self) -> CoordinatorConfig:
        """The coordinator of this scenario: one update per round (a secure group's sum per
        round when ``secure``), short long-polls."""
        config = CoordinatorConfig(
            run_name=f"conformance-{self.name}", rounds=self.rounds,
            flush=FlushRule(goal=SECURE_GROUP if self.secure else 1, deadline_s=None),
            downlink_codec=self.downlink_codec,
            server_optimizer_options={"lr": self.server_lr},
            training=TrainingConfig(local_epochs=1, batch_size=32, learning_rate=0.1),
            evaluation=EvaluationConfig(fraction=1.0 if self.evaluate else 0.0),
            limits=LimitsConfig(chunk_bytes=self.chunk_bytes, inline_bytes=self.inline_bytes,
                                long_poll_s=1.0, retry_after_s=0.2,
                                heartbeat_interval_s=self.heartbeat_interval_s))
        if not self.secure:
            return config
        # off what needs individual updates: a secure coordinator refuses it
        secure = SecureConfig(enabled=True, phase_s=SECURE_PHASE_S, **dict(self.secure_settings))
        return dataclasses.replace(config, secure=secure, robust=RobustConfig(enabled=False),
                                   norm_bound_adaptive=False)

    @property
    def peers(self) -> int:
        """How many clients of its own the runner adds (the rest of a secure group)."""
        return SECURE_GROUP - 1 if self.secure else 0


FAULTS = Scenario(
    "faults", ("join", "task", "resume_download", "resume_upload", "idempotent_commit",
               "delta", "refusal", "new_upload_id"),
    FaultPlan(cut_download=True, cut_upload=True, lose_commit_reply=True, corrupt_upload=2),
    rounds=3, chunk_bytes=512, inline_bytes=0)
"""Streamed transfers in 512-byte chunks, with every fault injected once."""

BEHAVIOURS = Scenario(
    "behaviours", ("verify_model", "heartbeat", "retry_hint", "rejoin", "evaluate", "metrics",
                   "leave"),
    FaultPlan(corrupt_model=True, slow_commit_s=1.0, overload_s=1.5, forget_client=True),
    rounds=3, inline_bytes=0, heartbeat_interval_s=0.25, evaluate=True)
"""Streamed models; the first corrupted, the first commit held for four heartbeat intervals,
the first ``GetTask`` refused for overload, the first after an update refused as from a
coordinator that forgot the client; an evaluation task for every version."""


SECURE = Scenario("secure", ("secure_round", "secure_retry"),
                  FaultPlan(lose_masked_reply=True), secure=True)
"""Two secure groups, each the client under test and the runner's three peers; the reply to
the client's first ``SecureMasked`` lost."""

SECURE_DROPOUT = Scenario("secure-dropout", ("secure_dropout",), secure=True, rounds=1,
                          vanishing_peers=1)
"""One secure group, a peer of which shares its keys and vanishes: the group goes on once the
masked phase's deadline passes, and the client's unmask must hold a share of its mask key."""


SECURE_OPTIONS = Scenario(
    "secure-options", ("secure_options",), secure=True,
    secure_settings=(("neighbours", 2), ("density", 0.5), ("noise_multiplier", 1.0),
                     ("clip_norm", 1.0)))
"""Two secure groups with SecAgg+ (2 neighbours each: a member masks and shares with half of
its group, by the protocol's graph), group random-k (half the coordinates, by the protocol's
index rule and ``k``) and distributed DP (Skellam noise shares, no weight in the masked
vector): a client that gets any of them wrong is refused or its group unmasks to a sum the
coordinator does not flush."""

SECURE_SCENARIOS = (SECURE, SECURE_DROPOUT, SECURE_OPTIONS)
"""The scenarios that ``--secure`` (or a secure check in ``only``) asks for."""


def codec_scenario(codec: str) -> Scenario:
    """Two rounds with the model broadcast in ``codec``, inline; the second version arrives as
    a delta (the server's step is scaled down so that the delta is smaller than the model
    and is offered, whatever the codec)."""
    return Scenario(f"codec-{codec}", ("codec", "inline"), downlink_codec=codec,
                    server_lr=1e-4, prefix=f"{codec}: ")


def lossy_scenario(codec: str) -> Scenario:
    """Two rounds whose updates the client is asked to send with the lossy ``codec``."""
    return Scenario(f"lossy-{codec}", ("lossy_update",), update_codec=codec,
                    prefix=f"{codec}: ")


@dataclass(frozen=True)
class ConformanceOptions:
    """What to run: the client command (with ``{server}``, and ``{update_codec}`` for the
    lossy scenarios), the model size, the codecs, where the coordinators listen,
    ``only``: check names (without a codec prefix) to run alone (empty: all), and ``secure``:
    add the secure scenarios (a client without secure aggregation fails them, so they are
    asked for: by this or by naming a secure check in ``only``)."""

    client_cmd: str
    num_parameters: int = 650
    codecs: tuple[str, ...] = DOWNLINK_CODECS
    update_codecs: tuple[str, ...] = LOSSY_CODECS
    timeout_s: float = 120.0
    host: str = "127.0.0.1"
    port: int = 0
    only: tuple[str, ...] = ()
    secure: bool = False

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
        not_lossy = [c for c in self.update_codecs if not _lossy(c)]
        if not_lossy:
            raise ConfigError(f"update codec(s) {not_lossy} are not lossy update codecs "
                              f"registered in fedlink.compress (e.g. {', '.join(LOSSY_CODECS)})")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        unknown_checks = set(self.only) - set(CHECKS)
        if unknown_checks:
            raise ConfigError(f"unknown check(s) {sorted(unknown_checks)}; "
                              f"known: {', '.join(CHECKS)}")
        if self._runs_secure() and importlib.util.find_spec("cryptography") is None:
            raise ConfigError("the secure scenarios need the secagg extra (cryptography): "
                              "pip install 'fedlink[secagg]'")
        if (any(s.name == SECURE_OPTIONS.name for s in self.scenarios())
                and importlib.util.find_spec("dp_accounting") is None):
            raise ConfigError("the secure-options scenario runs distributed DP, whose "
                              "accounting needs the privacy extra: pip install "
                              "'fedlink[secagg,privacy]' (or leave secure_options out with "
                              "--only)")

    def _runs_secure(self) -> bool:
        """Whether the secure scenarios are asked for."""
        return self.secure or bool(set(self.only) & {c for s in SECURE_SCENARIOS
                                                     for c in s.checks})

    def scenarios(self) -> list[Scenario]:
        """The fault scenarios, then one per downlink codec and one per lossy update codec,
        then the secure ones when asked for (those holding a check of ``only``, when it is
        given)."""
        every = [FAULTS, BEHAVIOURS, *(codec_scenario(c) for c in self.codecs),
                 *(lossy_scenario(c) for c in self.update_codecs)]
        if self.secure or self.only:
            every += SECURE_SCENARIOS
        if not self.only:
            return every
        return [dataclasses.replace(s, checks=tuple(c for c in s.checks if c in self.only))
                for s in every if set(s.checks) & set(self.only)]

    def address(self, port: int) -> str:
        """``host:port`` as a gRPC target (an IPv6 literal in brackets)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") \
            else self.host
        return f"{host}:{port}"


LOSSLESS = ("fp32", "fp32-zlib")


def _lossy(name: str) -> bool:
    """A registered update codec that does not give back every bit."""
    from fedlink.compress import CODECS

    return name in CODECS.names() and name not in LOSSLESS


@dataclass(frozen=True)
class ScenarioResult:
    """The verdicts of one scenario and the client's output (for a failing check)."""

    scenario: str
    verdicts: list[Verdict]
    client_output: str
    exit_text: str = ""
    """The client's exit, as the report shows it."""


async def run_conformance(options: ConformanceOptions) -> list[ScenarioResult]:
    """Every scenario of ``options``, one after the other."""
    return [await run_scenario(s, options) for s in options.scenarios()]


async def run_scenario(scenario: Scenario, options: ConformanceOptions) -> ScenarioResult:
    """Serve one run to the client command and judge it."""
    if scenario.update_codec and CODEC_PLACEHOLDER not in options.client_cmd:
        detail = (f"the client command has no {CODEC_PLACEHOLDER} placeholder to ask for "
                  f"{scenario.update_codec} updates (pass --update-codecs '' to check none)")
        return ScenarioResult(scenario.name, [Verdict(scenario.prefix + name, False, detail)
                                              for name in scenario.checks], "", "not run")
    initial = np.random.default_rng(0).normal(scale=0.01, size=options.num_parameters)
    events = EventLog(None)
    server = CoordinatorServer(scenario.coordinator_config(), initial.astype(np.float32),
                               events, address=options.address(options.port))
    async with server:
        command = options.client_cmd.replace(SERVER_PLACEHOLDER, options.address(server.port))
        command = command.replace(CODEC_PLACEHOLDER, scenario.update_codec or "fp32")
        ran = await _serve(scenario, server, shlex.split(command), options.timeout_s,
                           options.address(server.port))
    record = RunRecord(ran.log, list(events.events), ran.exit_code, scenario.rounds,
                       ran.killed and not ran.stopped, scenario.update_codec,
                       scenario.faults.slow_commit_s, ran.stopped)
    return ScenarioResult(scenario.name, judge(scenario.checks, record, scenario.prefix),
                          ran.output, record.exit_text)


@dataclass
class _Run:
    """What serving one client run left: its calls and how the client ended."""

    log: CallLog
    exit_code: int | None
    killed: bool
    output: str
    stopped: str = ""


PLAIN_IN_SECURE = ("it sent a plain Commit, which a secure run refuses (updates travel masked "
                   "through the Secure* calls, docs/protocol.md section 14)")


async def _serve(scenario: Scenario, server: CoordinatorServer, argv: Sequence[str],
                 timeout_s: float, target: str) -> _Run:
    """Probe ``server`` and run the client; in a secure run beside the runner's peers, and
    stopped at its first plain ``Commit`` (it cannot take part: waiting would only wait
    for the timeout)."""
    if not scenario.secure:
        log = Probe(server.service, scenario.faults).install()
        return _Run(log, *await _run_client(argv, timeout_s))
    from fedlink.conformance.peers import Peers, peer_names  # needs the secagg extra

    probe = Probe(server.service, scenario.faults, peers=peer_names(scenario.peers))
    log = probe.install()
    plain = asyncio.Event()
    log.watchers.append(lambda call: plain.set() if call.name == "Commit" else None)
    assert server.service.secure is not None
    async with Peers(target, scenario.peers, server.service.secure,
                     probe.is_peer, scenario.vanishing_peers):
        code, killed, output = await _run_client(argv, timeout_s, plain)
    return _Run(log, code, killed, output, PLAIN_IN_SECURE if plain.is_set() and killed else "")


async def _run_client(argv: Sequence[str], timeout_s: float,
                      stop: asyncio.Event | None = None) -> tuple[int | None, bool, str]:
    """Run the client until it exits (killed at ``timeout_s``, or once ``stop`` is set): its
    exit status, whether it was killed, and its output."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    reading = asyncio.ensure_future(_read_all(process))
    killed = False
    try:
        await asyncio.wait_for(_exit_or(process, stop), timeout_s)
    except TimeoutError:
        killed = True
    if process.returncode is None:
        killed = True
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
    output = await reading
    return process.returncode, killed, output


async def _exit_or(process: asyncio.subprocess.Process, stop: asyncio.Event | None) -> None:
    """Until the process exits or ``stop`` is set."""
    waits = [asyncio.ensure_future(process.wait())]
    if stop is not None:
        waits.append(asyncio.ensure_future(stop.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _read_all(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    return (await process.stdout.read()).decode(errors="replace")


def format_report(results: Sequence[ScenarioResult]) -> str:
    """A table of every behaviour: PASS/FAIL and what was seen."""
    lines = []
    for result in results:
        lines.append(f"-- {result.scenario} ({result.exit_text})")
        for verdict in result.verdicts:
            mark = "PASS" if verdict.passed else "FAIL"
            lines.append(f"{mark}  {verdict.name:<24} {verdict.detail}")
        if not all(v.passed for v in result.verdicts):
            lines += _output_tail(result)
    passed = sum(v.passed for r in results for v in r.verdicts)
    total = sum(len(r.verdicts) for r in results)
    lines.append(f"{passed}/{total} behaviours passed")
    return "\n".join(lines)


def _output_tail(result: ScenarioResult) -> list[str]:
    """The last lines the client printed in a scenario with a failed check."""
    tail = result.client_output.strip().splitlines()[-15:]
    if not tail:
        return [f"      client output ({result.scenario}): nothing printed"]
    return [f"      client output ({result.scenario}, last lines):",
            *(f"      | {line}" for line in tail)]
