"""``fedlink client``: one SDK client training on one partition of the configured data."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fedlink.cli.notices import say_simulation_sections_ignored
from fedlink.client import ClientOptions, ClientSession, SessionStats, TLSOptions
from fedlink.errors import ConfigError
from fedlink.experiment.config import ExperimentConfig
from fedlink.experiment.setup import Experiment


def run_one_client(server: str, config_path: Path, index: int, name: str, token: str,
                   outbox: Path | None = None, tls: TLSOptions | None = None,
                   retry: Mapping[str, Any] | None = None, seed: int | None = None) -> int:
    """Join ``server`` and train until the run ends; prints what this client did.

    With ``outbox``, pending updates are kept in that directory, and a client restarted with
    the same name and directory delivers what its previous process left there. With ``tls``,
    the connection is TLS (mutual when it names a client certificate). ``retry``: fields of
    ``[client.retry]`` overridden (from ``--retry-...``). ``seed``: the client's randomness,
    privacy noise included, for a reproducible run (``None``: fresh entropy;
    ``ClientOptions.seed``).

    Returns 0 once the coordinator said the run is over. The closing counter line is printed
    however the client stops: the run's end, a signal, or an error it gives up on.
    """
    config = ExperimentConfig.from_toml(config_path)
    say_simulation_sections_ignored(config, "fedlink client",
                                    "this client trains every task in full on its real link")
    if not 0 <= index < config.data.clients:
        raise ConfigError(f"--index must be in [0, {config.data.clients}), got {index}")
    torch.set_num_threads(config.run.torch_threads)
    experiment = Experiment.build(config)
    try:
        policy = dataclasses.replace(config.client.retry, **dict(retry or {}))
    except TypeError as exc:
        raise ConfigError(f"--retry-...: {exc}") from None
    options = ClientOptions(name=name or f"client-{index}", token=token, seed=seed,
                            outbox_dir=outbox, tls=tls, retry=policy,
                            liveness=config.client.liveness)
    if config.client.download_connections is not None:
        options = dataclasses.replace(
            options, download_connections=config.client.download_connections)
    pipeline = config.client.pipeline()
    session = ClientSession(server, experiment.trainer(index), options, pipeline)
    try:
        asyncio.run(_run_until_signalled(session))
    except BaseException as exc:
        outcome = f"stopped by signal {_signal_name(exc)}" if isinstance(exc, SystemExit) \
            else f"stopped by error: {exc}"
        print(closing_line(session.stats, outcome), flush=True)
        raise
    print(closing_line(session.stats, f"run finished: {session.stats.finished}"
                       if session.stats.finished else "stopped after its tasks"), flush=True)
    return 0


def closing_line(stats: SessionStats, outcome: str) -> str:
    """What the client did, in one line (printed however it stops)."""
    return (f"{outcome}; tasks {stats.tasks}, accepted {stats.accepted}, "
            f"refused {stats.refused}, failed {stats.failed}, recovered {stats.recovered}, "
            f"retries {stats.retries}, up {stats.bytes_up} B, down {stats.bytes_down} B, "
            f"resumed {stats.resumed_bytes} B, offline {stats.offline_seconds:.1f} s"
            + (f", secure values clipped {stats.secure_values_clipped}"
               if stats.secure_values_clipped else ""))


def _signal_name(exc: SystemExit) -> str:
    code = exc.code if isinstance(exc.code, int) else 0
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return str(code)


STOP_GRACE_S = 5.0


async def _run_until_signalled(session: ClientSession) -> SessionStats:
    """Run ``session``; SIGINT or SIGTERM cancels it (exit 128 + the signal's number).

    Cancelling unwinds the session (its outbox keeps an update not yet committed). Should the
    cancellation not finish within ``STOP_GRACE_S`` (say it lands inside a library call that
    absorbs it), the process exits at once: a signalled client always
    stops, and the next process delivers from the outbox.
    """
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    caught: list[int] = []

    def stop(signum: int) -> None:
        caught.append(signum)
        main.cancel()
        loop.call_later(STOP_GRACE_S, os._exit, 128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    try:
        return await session.run()
    except asyncio.CancelledError:
        if not caught:
            raise
        raise SystemExit(128 + caught[0]) from None
