"""``fedlink client``: one SDK client training on one partition of the configured data."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import torch

from fedlink.client import ClientOptions, ClientSession, SessionStats, TLSOptions
from fedlink.errors import ConfigError
from fedlink.sim.config import ExperimentConfig
from fedlink.sim.setup import Experiment


def run_one_client(server: str, config_path: Path, index: int, name: str, token: str,
                   outbox: Path | None = None, tls: TLSOptions | None = None) -> int:
    """Join ``server`` and train until the run ends; prints what this client did.

    With ``outbox``, pending updates are kept in that directory, and a client restarted with
    the same name and directory delivers what its previous process left there. With ``tls``,
    the connection is TLS (mutual when it names a client certificate).
    """
    config = ExperimentConfig.from_toml(config_path)
    if not 0 <= index < config.data.clients:
        raise ConfigError(f"--index must be in [0, {config.data.clients}), got {index}")
    torch.set_num_threads(config.run.torch_threads)
    experiment = Experiment.build(config)
    options = ClientOptions(name=name or f"client-{index}", token=token,
                            seed=config.run.seed * 1_000_003 + index, outbox_dir=outbox,
                            tls=tls)
    pipeline = config.client.pipeline()
    session = ClientSession(server, experiment.trainer(index), options, pipeline)
    stats = asyncio.run(_run_until_signalled(session))
    print(f"tasks {stats.tasks}, accepted {stats.accepted}, refused {stats.refused}, "
          f"recovered {stats.recovered}, retries {stats.retries}, "
          f"up {stats.bytes_up} B, down {stats.bytes_down} B, "
          f"resumed {stats.resumed_bytes} B, offline {stats.offline_seconds:.1f} s", flush=True)
    return 0


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
