"""Finding 8 (and 7 of the next review): run files and state are private, and secrets are
never written to them.

``join_token`` was written in plaintext to ``events.jsonl`` and ``summary.json`` (0644);
``state.sqlite`` (+ ``-wal``, ``-shm``), holding every pending raw update, was 0644; a 0644
secret file was accepted silently. Later, ``fedlink serve`` still wrote ``model.npy`` and
``model.pt`` 0644: this test had checked a helper ``serve`` does not call; it now checks the
method ``serve`` writes the model with (``Experiment.save_model``), under a permissive umask.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from _hostile import Raw
from conftest import run_async

from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
from fedlink.coordinator.auth import load_secret
from fedlink.experiment.config import ExperimentConfig
from fedlink.experiment.setup import Experiment
from fedlink.metrics import EventLog
from fedlink.metrics.events import read_events
from fedlink.metrics.summary import summarize, write_summary

pytestmark = pytest.mark.timeout(60)

TOKEN = "a-shared-join-token-nobody-may-read"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The usual 022: a file fedlink does not make private comes out 0644."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_run_files_and_state_are_private_and_hold_no_token(tmp_path: Path) -> None:
    run_dir, state = tmp_path / "runs" / "r1", tmp_path / "state"
    config = CoordinatorConfig(rounds=1, join_token=TOKEN, state_dir=str(state),
                               flush=FlushRule(goal=1, deadline_s=None))

    async def scenario() -> np.ndarray:
        with EventLog(run_dir / "events.jsonl") as events:
            server = CoordinatorServer(config, np.zeros(8, np.float32), events,
                                       address="127.0.0.1:0")
            async with server:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                    raw = Raw(channel)
                    client = await raw.client(token=TOKEN)
                    assert (await raw.upload(client, "pending", b"x" * 100)).code == "OK"
                    assert (await raw.join("no-token")).code == "UNAUTHENTICATED"
                return server.service.engine.model.copy()

    model = run_async(scenario())
    events = read_events(run_dir / "events.jsonl")
    write_summary(run_dir / "summary.json", summarize(events, config.to_dict()))
    experiment = Experiment.build(ExperimentConfig.from_dict(
        {"data": {"dataset": "digits", "clients": 2}, "model": {"name": "logreg"}}))
    experiment.save_model(run_dir, experiment.initial_vector())  # what `fedlink serve` calls
    assert {"model.npy", "model.pt"} <= {p.name for p in run_dir.iterdir()}
    assert model.shape == (8,)
    for folder in (run_dir, state, state / "checkpoints"):
        assert mode(folder) == 0o700, folder
    files = [p for p in (*run_dir.iterdir(), *state.rglob("*")) if p.is_file()]
    assert any(p.name == "state.sqlite" for p in files)
    for path in files:
        assert mode(path) & 0o077 == 0, (path, oct(mode(path)))
    for name in ("events.jsonl", "summary.json"):
        assert TOKEN not in (run_dir / name).read_text(), name


def test_a_secret_file_others_can_read_is_warned_about_with_the_fix(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = tmp_path / "token.secret"
    secret.write_text("0123456789abcdef0123456789abcdef")
    secret.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        load_secret(str(secret))
    assert f"chmod 600 {secret}" in caplog.text
    caplog.clear()
    secret.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        load_secret(str(secret))
    assert "INSECURE" not in caplog.text
