"""``fedlink simulate``: a coordinator and N SDK clients in one process, over real gRPC.

The coordinator listens on a free loopback port; every client is a real ``ClientSession``
with its own channel. With a ``[network]`` section each client dials the coordinator through
its own ``TcpProxy`` carrying the link profile the fleet gave it. Local training runs either on
the event loop's thread (``run.train_workers = 0``, the default: fastest for many small
simulated clients, see ``ClientSession``) or on a thread pool; stragglers (speed multipliers
from the fleet) always train on threads, so their extra time does not stall the others.
At the end the run folder holds ``events.jsonl``, ``summary.json``, ``report.md`` and the final
global model as ``model.pt`` (a torch ``state_dict``) and ``model.npy`` (the flat vector).
With ``[coordinator.metrics] enabled`` the coordinator serves Prometheus metrics while the run
lasts, as ``fedlink serve`` does; with ``[run] tensorboard`` the run folder holds TensorBoard
scalars too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedlink.aio import cancel_and_wait
from fedlink.client import SessionStats, Trainer
from fedlink.client.retry import Sleep
from fedlink.config import field_default
from fedlink.coordinator.config import CoordinatorConfig, FlushRule
from fedlink.coordinator.lifecycle import target_rules
from fedlink.errors import ConfigError, FedlinkError, RemoteError
from fedlink.experiment.config import ExperimentConfig
from fedlink.metrics import (
    EVENTS_FILENAME,
    SUMMARY_FILENAME,
    EventLog,
    summarize,
    write_report,
    write_summary,
)
from fedlink.metrics.federated import federated_figures
from fedlink.metrics.summary import add_warning, near_chance_warning
from fedlink.netem import ClientLink
from fedlink.privacy.setup import with_run_seed
from fedlink.sim.arrivals import RunOverSleep, start_in_waves
from fedlink.sim.capacity import for_population
from fedlink.sim.network import ClientOutcome, network_summary
from fedlink.sim.stragglers import PacedTrainer, SlowedTrainer
from fedlink.sim.watch import FlushWatch

if TYPE_CHECKING:  # the set-up imports torch: loaded when a simulation runs
    import torch

    from fedlink.client import ClientSession
    from fedlink.coordinator import CoordinatorConfig, CoordinatorServer
    from fedlink.experiment.setup import Experiment
    from fedlink.netem.proxy import TcpProxy

SIM_TOKEN_TTL_S = 7 * 24 * 3600.0  # a simulated client's token outlives any simulation


NEVER_STARTED = "the run finished before this client arrived"
"""A simulated client's outcome when the run was over before its turn to join came."""

GAVE_UP = "gave up: "
"""How a simulated client's ``finished`` starts when its retry policy gave up on a call: it
drops out, as a device whose link stays down past its retry budget would, and the run goes on
with the others."""

END_GRACE_S = 5.0
"""After the run finishes, how long (wall seconds) the simulation lets its clients hear it
before it cuts off those still on the network. A connected client learns within a round trip;
one in a blackout or a reconnect could only retry against a finished coordinator, and nothing
it does then changes the run (a 1,000-client run over a poor fleet spent a third of its wall
on that tail)."""

CUT_OFF = "cut off: the run had finished and this client was still on the network"
"""A simulated client's outcome when ``END_GRACE_S`` passed after the run's end before it
had heard of it (its stats hold what it did until then)."""

CEILING_HINT_CLIENTS = 1000
"""From this many in-process clients, a run that every client gave up on is blamed on the
population (below it, on the emulated links: outages longer than a retry budget)."""


class ClientsGaveUp(FedlinkError):
    """Every client of a real-gRPC simulation ended before the run finished, some giving up on
    a retried call (a missed deadline, a cancelled or unavailable call): the emulated links'
    outages outlast the clients' retry budget."""

    def __init__(self, clients: int, gave_up: int, cause: RemoteError) -> None:
        super().__init__(
            f"real-gRPC simulation of {clients:,} clients: every client ended before the run "
            f"finished, {gave_up:,} of them giving up on a call (the last: {cause})"
            f"{self._why(clients)}")
        self.cause = cause

    @staticmethod
    def _why(clients: int) -> str:
        return ("; their links were down longer than [client.retry] allows (raise max_attempts "
                "or max_elapsed_s, or give the run fewer rounds or a lower flush goal)")


class PopulationCeiling(ClientsGaveUp):
    """``ClientsGaveUp`` in a population this large (``CEILING_HINT_CLIENTS`` or more): in one
    process on loopback that is the event loop saturating under the population, the mode's
    ceiling (a few thousand clients on two cores), not a network fault."""

    @staticmethod
    def _why(clients: int) -> str:
        return (". The coordinator and every client session share one event loop in this mode, "
                f"and {clients:,} of them saturate it (its ceiling is a few thousand clients on "
                'two cores; docs/simulation.md, "Large populations over real gRPC"): use '
                '[run] mode = "virtual" for populations of this size')


@dataclass(frozen=True)
class SimulationResult:
    """What a finished simulation produced."""

    summary: dict[str, Any]
    run_dir: Path
    report: Path | None
    """``report.md`` in the run folder; None when the run was asked for no report."""
    clients: tuple[ClientOutcome, ...]
    model: dict[str, torch.Tensor] = field(default_factory=dict)
    """The final global model as a ``state_dict`` (``module.load_state_dict(result.model)``)."""
    trainers: tuple[Trainer, ...] = ()
    """Each client's trainer, by client index (its local state: FedBN's kept layers, ...)."""

    @property
    def client_stats(self) -> tuple[SessionStats, ...]:
        """Each client's ``SessionStats``, by client index."""
        return tuple(c.stats for c in self.clients)


def run_simulation(config: ExperimentConfig, output_dir: Path | None = None,
                   progress: bool = True, *, model: Any = None, data: Any = None,
                   trainer: Any = None, evaluate: Any = None,
                   loss: Any = None, report: bool = True) -> SimulationResult:
    """Run the experiment to the end and write its run folder; returns the summary and model.

    ``model``, ``data``, ``trainer``, ``evaluate`` and ``loss`` plug your own objects (or import
    strings) in place of what the config names; see ``fedlink.experiment.setup`` for what each
    must be. ``report=False`` writes no ``report.md`` and no plots (the events, summary and
    model are written as always): for sweeps of many runs, where nobody reads each report.
    """
    if config.run.mode == "virtual":  # the discrete-event loop: no sockets
        from fedlink.experiment.setup import Plugs
        from fedlink.sim.virtual.runner import run_virtual

        return run_virtual(config, output_dir, progress, Plugs(
            model=model, data=data, trainer=trainer, evaluate=evaluate, loss=loss),
            report=report)
    if config.coordinator.tls.enabled:
        raise ConfigError("fedlink simulate runs its clients in this process over loopback in "
                          "plaintext: remove [coordinator.tls], or run `fedlink serve` and "
                          "`fedlink client --tls-ca ...` to try TLS")
    if config.coordinator.drain_s != field_default(CoordinatorConfig, "drain_s"):
        raise ConfigError("coordinator.drain_s: fedlink simulate runs its clients in this "
                          "process, so a stop (Ctrl-C) ends them with the coordinator and no "
                          "call is left to drain: nothing would read it. Remove drain_s, or "
                          "run `fedlink serve`, where a stop drains the clients' calls")
    import torch  # deferred, with the set-up: importing fedlink.sim needs neither

    from fedlink.experiment.run_folder import prepare_run_dir
    from fedlink.experiment.setup import Experiment, Plugs

    torch.set_num_threads(config.run.torch_threads)
    plugs = Plugs(model=model, data=data, trainer=trainer, evaluate=evaluate, loss=loss)
    experiment = Experiment.build(config, plugs)
    experiment.check_simulated_trainer_options()
    refuse_rounds_the_fleet_cannot_fill(config.coordinator.flush, experiment.data.num_clients)
    coordinator = coordinator_config(experiment)
    run_dir = prepare_run_dir(config, output_dir)
    with EventLog(run_dir / EVENTS_FILENAME) as events, contextlib.ExitStack() as stack:
        if config.run.tensorboard:
            from fedlink.observe import tensorboard  # an optional extra

            tensorboard.attach(events, run_dir, stack)
        started = time.monotonic()
        outcomes, trainers, final = asyncio.run(
            _simulate(experiment, coordinator, events, progress, stack))
        for outcome in outcomes:
            events.emit(outcome.as_event())
        recorded = events.events  # read back once from events.jsonl: the log keeps none
        summary = summarize(recorded, recorded_config(experiment.recorded_config(),
                                                      coordinator))
    summary.update(_client_figures(outcomes, time.monotonic() - started))
    if config.coordinator.secure.enabled:  # only the clients know: the coordinator sees sums
        summary["secure_values_clipped"] = sum(o.stats.secure_values_clipped for o in outcomes)
    summary.update(experiment.data_figures())
    summary.update(federated_figures(recorded))
    if config.network is not None:
        summary["network"] = network_summary(outcomes)
    final = with_kept_local_filled(experiment, final, trainers, summary)
    say_what_was_measured(summary, experiment)
    write_summary(run_dir / SUMMARY_FILENAME, summary)
    written = write_report(run_dir, recorded, summary) if report else None
    state = experiment.save_model(run_dir, final)
    return SimulationResult(summary, run_dir, written, outcomes, state, trainers)


def coordinator_config(experiment: Experiment) -> CoordinatorConfig:
    """The coordinator config a real-gRPC simulation of ``experiment`` runs: its limits
    raised for a population from one address (``for_population``: pace steering on for a
    large one) and a ``dp_fedavg`` hook's noise seeded from the run's seed (``with_run_seed``).
    It is what ``run_started`` carries and what ``summary.json`` records."""
    return with_run_seed(for_population(experiment.config.coordinator,
                                        experiment.data.num_clients))


def recorded_config(plain: dict[str, Any], coordinator: CoordinatorConfig) -> dict[str, Any]:
    """``plain`` (an experiment's config as a dict, for ``summary.json``) with its
    ``coordinator`` section replaced by the one that ran (as ``run_started`` records it): a
    simulation adjusts the configured one (``coordinator_config``)."""
    return {**plain, "coordinator": coordinator.to_dict()}


def with_kept_local_filled(experiment: Experiment, final: np.ndarray,
                           trainers: tuple[Trainer, ...], summary: dict[str, Any],
                           ) -> np.ndarray:
    """With ``[client] keep_local``: the central model filled from the clients' kept values
    (``Experiment.fill_kept_local``), its record in ``summary["kept_local"]``, and
    ``final_accuracy``/``final_loss`` that model's (the last flush's, scored with the kept
    tensors at their initial values, stay as ``final_accuracy_unfilled``)."""
    filled, record = experiment.fill_kept_local(final, trainers)
    if not record:
        return final
    summary["kept_local"] = record
    summary["final_accuracy_unfilled"] = summary.get("final_accuracy")
    if summary.get("final_accuracy") is not None or summary.get("final_loss") is not None:
        scores = experiment.evaluator()(filled)
        summary["final_accuracy"] = _number(scores.get("accuracy"))
        summary["final_loss"] = _number(scores.get("loss"))
    return filled


def refuse_rounds_the_fleet_cannot_fill(rule: FlushRule, clients: int,
                                        clients_key: str = "[data] clients") -> None:
    """Refuse a flush rule the simulated fleet can never satisfy: the run would wait for ever
    for clients it does not have (a served coordinator, whose clients come and go, waits)."""
    problem = rule.unfillable_by(clients, clients_key)
    if problem:
        raise ConfigError(f"coordinator.flush: {problem}")


def say_what_was_measured(summary: dict[str, Any], experiment: Experiment) -> None:
    """The summary entries that say what its figures measured, in both modes: a warning when
    the final accuracy is near chance, and which examples federated evaluation scored."""
    warn_if_near_chance(summary, experiment)
    if "federated_evaluation" in summary:
        share = experiment.config.coordinator.evaluation.holdout
        summary["federated_evaluation"]["scored_on"] = (
            f"a held-out {share:.0%} of each client's examples, never trained on" if share
            else "each client's training examples (set [coordinator.evaluation] holdout to "
                 "score held-out ones)")


def warn_if_near_chance(summary: dict[str, Any], experiment: Experiment) -> None:
    """Add to ``summary["warning"]`` when the final accuracy is near chance for the data's
    classes (``fedlink.metrics.summary.near_chance_warning``), and print the run's warnings
    on stderr."""
    add_warning(summary, near_chance_warning(
        summary.get("final_accuracy"), int(getattr(experiment.data, "num_classes", 0) or 0)))
    print_warning(summary)


def print_warning(summary: Mapping[str, Any]) -> None:
    """Say ``summary["warning"]`` on stderr, where a script's log keeps it."""
    if summary.get("warning"):
        print(f"fedlink: warning: {summary['warning']}", file=sys.stderr)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _links(experiment: Experiment) -> list[ClientLink | None]:
    fleet = experiment.config.network
    n = experiment.data.num_clients
    return [None] * n if fleet is None else list(fleet.sample(n))


def _trainers(experiment: Experiment, links: list[ClientLink | None]) -> list[Trainer]:
    """One trainer per client: at a device's pace with ``[run] device_step_s``, else with
    stragglers slowed relative to the fastest client (``fedlink.sim.stragglers``).

    With ``[partial_work]`` each trainer also does only part of some tasks
    (``fedlink.experiment.partial_work``); the slow-down applies to the work it does.
    """
    config = experiment.config
    speeds = [1.0 if link is None else link.speed for link in links]
    fastest = min(speeds)
    trainers: list[Trainer] = []
    for index, speed in enumerate(speeds):
        trainer = config.partial_work.trainer(experiment.trainer(index), index, config.run.seed)
        if config.run.device_step_s > 0:
            trainer = PacedTrainer(trainer, config.run.device_step_s * speed,
                                   config.coordinator.training.batch_size)
        elif speed > fastest:
            trainer = SlowedTrainer(trainer, speed / fastest)
        trainers.append(trainer)
    return trainers


async def _simulate(experiment: Experiment, coordinator: CoordinatorConfig, events: EventLog,
                    progress: bool, observers: contextlib.ExitStack,
                    ) -> tuple[tuple[ClientOutcome, ...], tuple[Trainer, ...], np.ndarray]:
    """Run the clients against a coordinator running ``coordinator``; (outcomes, trainers,
    final global vector). With ``[coordinator.metrics]`` its Prometheus endpoint serves
    until ``observers`` closes."""
    # the server's imports (grpc, the token machinery) are loaded by a gRPC run only: a
    # virtual run imports this module without them
    from fedlink.coordinator.server import CoordinatorServer

    config = experiment.config
    links = _links(experiment)
    # Trainers first: building one converts its data and warms torch up, which is set-up
    # cost, not part of the run.
    trainers = _trainers(experiment, links)
    threaded = config.run.train_workers > 0 or any(isinstance(t, (SlowedTrainer, PacedTrainer))
                                                   for t in trainers)
    workers = len(trainers) if threaded and config.run.train_workers == 0 else \
        max(1, config.run.train_workers)
    initial = experiment.initial_vector()
    server = CoordinatorServer(coordinator, initial, events,
                               evaluator=experiment.checked_evaluator(initial),
                               stop_rules=target_rules(config.run.target_accuracy),
                               spec=experiment.spec())
    if coordinator.metrics.enabled:  # before the server starts: it sees run_started
        from fedlink.observe.endpoint import serve_metrics  # an optional extra

        serve_metrics(server, observers, out=sys.stderr)
    with ThreadPoolExecutor(workers, thread_name_prefix="train") as pool:
        async with server, contextlib.AsyncExitStack() as stack:
            upstream = f"127.0.0.1:{server.port}"
            proxies = [await _open_link(stack, link, upstream) for link in links]
            waits = RunOverSleep(events)
            sessions = [
                _session(config, i, trainer, upstream if proxy is None else proxy.address,
                         pool, inline=not threaded, sleep=waits)
                for i, (trainer, proxy) in enumerate(zip(trainers, proxies, strict=True))]
            try:
                stats = await _run_sessions(sessions, server, events,
                                            config.coordinator.rounds, progress, waits.over)
            finally:
                waits.close()
    outcomes = tuple(ClientOutcome(i, link, proxy.counters if proxy else None, s)
                     for i, (link, proxy, s) in enumerate(zip(links, proxies, stats, strict=True)))
    return outcomes, tuple(trainers), server.lifecycle.final_model.copy()


async def _open_link(stack: contextlib.AsyncExitStack, link: ClientLink | None,
                     upstream: str) -> TcpProxy | None:
    if link is None:
        return None
    from fedlink.netem.proxy import TcpProxy

    return await stack.enter_async_context(TcpProxy(link.profile, upstream))


async def _run_sessions(sessions: list[ClientSession], server: CoordinatorServer,
                        events: EventLog, rounds: int, progress: bool,
                        over: asyncio.Event | None = None,
                        end_grace_s: float = END_GRACE_S) -> list[SessionStats]:
    from fedlink.metrics.console import RunProgress  # rich: loaded when a run shows progress

    gave_up: list[RemoteError] = []
    cut_off = asyncio.Event()
    with RunProgress(rounds, enabled=progress) as bar:
        # the flush events move the bar (the target accuracy is the coordinator's stop rule:
        # it ends the run on the flush that reached it); nothing polls the log
        unsubscribe = events.on_flush(FlushWatch(bar))
        grace = asyncio.ensure_future(_end_grace(server, cut_off, end_grace_s))
        try:
            ran = await start_in_waves(
                [functools.partial(_client_part, s, gave_up, cut_off) for s in sessions],
                events, over=over)
            stats = [s if s is not None else SessionStats(finished=NEVER_STARTED) for s in ran]
            if gave_up and not server.lifecycle.finished.is_set():
                failure = PopulationCeiling if len(sessions) >= CEILING_HINT_CLIENTS \
                    else ClientsGaveUp
                raise failure(len(sessions), len(gave_up), gave_up[-1])
            await server.wait_finished()
        finally:
            grace.cancel()
            unsubscribe()
    return list(stats)


async def _end_grace(server: CoordinatorServer, cut_off: asyncio.Event,
                     grace_s: float) -> None:
    """Set ``cut_off`` ``grace_s`` after the run finished."""
    await server.wait_finished()
    await asyncio.sleep(grace_s)
    cut_off.set()


async def _client_part(session: ClientSession, gave_up: list[RemoteError],
                       cut_off: asyncio.Event) -> SessionStats:
    """``session.run()``, ended early (``CUT_OFF``) once ``cut_off`` is set.

    A retried call it gave up on ends its part of the run (``GAVE_UP`` in its stats, its error
    added to ``gave_up``), not the whole simulation; errors that are not retried (a bad token,
    a refused config) still stop the run.
    """
    run = asyncio.ensure_future(session.run())
    cut = asyncio.ensure_future(cut_off.wait())
    try:
        await asyncio.wait((run, cut), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the simulation is stopping: so is this client
        run.cancel()
        raise
    finally:
        cut.cancel()
    if not run.done():
        await cancel_and_wait(run)
        session.stats.finished = session.stats.finished or CUT_OFF
        return session.stats
    try:
        return run.result()
    except RemoteError as exc:
        if not exc.retryable:
            raise
        gave_up.append(exc)
        session.stats.finished = f"{GAVE_UP}{exc}"
        return session.stats


def _session(config: ExperimentConfig, index: int, trainer: Trainer, target: str,
             pool: ThreadPoolExecutor, inline: bool, sleep: Sleep | None = None,
             ) -> ClientSession:
    from fedlink.client import ClientOptions, ClientSession  # grpc: a gRPC run's only

    name = f"sim-{index}"
    options = ClientOptions(name=name, token=_token(config, name),
                            seed=config.run.seed * 1_000_003 + index,
                            retry=config.client.retry, liveness=config.client.liveness,
                            download_connections=config.client.download_connections or 1)
    pipeline = config.client.pipeline()
    return ClientSession(target, trainer, options, pipeline, executor=pool, sleep=sleep,
                         inline_training=inline)


def _token(config: ExperimentConfig, name: str) -> str:
    """What simulated client ``name`` presents: with ``[coordinator.auth]`` its own token
    (the simulation holds the coordinator's secret, so it issues one), else the shared
    ``join_token`` (empty when there is none)."""
    coordinator = config.coordinator
    if not coordinator.auth.enabled:
        return coordinator.join_token
    from fedlink.coordinator.auth import issue_token, load_secret

    secret = load_secret(coordinator.auth.secret_file, coordinator.auth.secret_env)
    return issue_token(secret, name, ttl_s=SIM_TOKEN_TTL_S)




def _client_figures(outcomes: tuple[ClientOutcome, ...], wall: float) -> dict[str, Any]:
    """Client-side totals that only the clients know."""
    return {
        "client_retries": sum(o.stats.retries for o in outcomes),
        "clients_gave_up": sum(o.stats.finished.startswith(GAVE_UP) for o in outcomes),
        "clients_cut_off": sum(o.stats.finished == CUT_OFF for o in outcomes),
        "client_train_seconds": sum(o.stats.train_seconds for o in outcomes),
        "client_network_seconds": sum(o.stats.network_seconds for o in outcomes),
        "simulation_seconds": wall,
    }
