"""Virtual-clock mode against real gRPC: the same updates from the same clients, the same model.

Each case is built so that which client's update lands in which flush does not depend on the
real run's timing: every client of the population is in every cohort (cohort = population),
and the one straggler of the elastic case is slowed by a link latency far beyond the fast
clients' work. Within a flush, the real run's arrival order among equally fast clients is the
scheduler's, so flushes are compared as sets of (client, base version); the weighted mean does
not depend on that order beyond float rounding (compared at 1e-6).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedlink.client.pipeline import UpdatePipeline
from fedlink.clock import ManualClock
from fedlink.coordinator.config import CoordinatorConfig
from fedlink.experiment.config import ExperimentConfig
from fedlink.metrics import EventLog
from fedlink.sim.virtual.availability import TraceAvailability
from fedlink.sim.virtual.loop import LoopOptions, VirtualLoop
from fedlink.sim.virtual.population import Links, SyntheticPopulation, SyntheticSpec

pytest.importorskip("torch")


def _config(flush: dict[str, Any], mode: str, rounds: int = 2,
            network: dict[str, Any] | None = None) -> ExperimentConfig:
    table: dict[str, Any] = {
        "run": {"name": f"eq-{mode}", "seed": 3, "mode": mode},
        "data": {"dataset": "digits", "clients": 3},
        "model": {"name": "logreg"},
        "coordinator": {"rounds": rounds, "flush": flush,
                        "training": {"local_steps": 2, "batch_size": 16}},
    }
    if mode == "virtual":  # a gRPC run refuses the [virtual] table
        table["virtual"] = {"deterministic": True, "step_cost_s": 0.0}
    if network is not None:
        table["network"] = network
    return ExperimentConfig.from_dict(table)


def _flushes(run_dir: Path) -> list[set[tuple[str, int]]]:
    """Per flush, the (client name, base version) of every update it folded in."""
    import json

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    names = {e["client_id"]: e["name"] for e in events if e["kind"] == "client_joined"}
    by_task = {e["task_id"]: (names.get(e["client_id"], e["client_id"]), e["base_version"])
               for e in events if e["kind"] == "update_accepted"}
    return [{by_task[t] for t in e["updates"]} for e in events if e["kind"] == "flush"]


def _both(flush: dict[str, Any], tmp_path: Path, **kwargs: Any) -> tuple[Any, Any]:
    from fedlink.sim import run_simulation

    real = run_simulation(_config(flush, "grpc", **kwargs), tmp_path, progress=False)
    virtual = run_simulation(_config(flush, "virtual", **kwargs), tmp_path, progress=False)
    return real, virtual


def _same(real: Any, virtual: Any) -> None:
    assert _flushes(virtual.run_dir) == _flushes(real.run_dir)
    final_real = np.load(real.run_dir / "model.npy")
    final_virtual = np.load(virtual.run_dir / "model.npy")
    np.testing.assert_allclose(final_virtual, final_real, atol=1e-6)


def test_sync_fedavg_same_updates_same_model(tmp_path: Path) -> None:
    real, virtual = _both({"goal": 3, "deadline_s": 0}, tmp_path)
    assert len(_flushes(real.run_dir)) == 2
    _same(real, virtual)


def test_fedbuff_same_updates_same_model(tmp_path: Path) -> None:
    # FedBuff (continuous, buffer K=2, 3 in flight): the LAN client delivers again and again
    # on the latest model while the others' 300 ms one-way latency keeps them out
    network = {"fleet": {"lan": 1, "slow": 2},
               "profiles": {"slow": {"latency_ms": 300.0}}}
    real, virtual = _both({"goal": 2, "over_selection": 1.5, "deadline_s": 0,
                           "continuous": True, "max_staleness": 1}, tmp_path, network=network)
    assert len(_flushes(real.run_dir)) == 2
    _same(real, virtual)


def test_elastic_straggler_same_updates_same_model(tmp_path: Path) -> None:
    # deadline + over-selection (cohort 3 for goal 2) + staleness: two clients on a LAN
    # answer first each round; the third's 1.5 s one-way latency keeps it out of both
    network = {"fleet": {"lan": 2, "slow": 1},
               "profiles": {"slow": {"latency_ms": 1500.0}}}
    real, virtual = _both({"goal": 2, "over_selection": 1.5, "deadline_s": 60,
                           "min_updates": 2, "max_staleness": 1}, tmp_path, network=network)
    _same(real, virtual)


def test_offline_client_resumes_and_is_accepted_stale_in_model_time() -> None:
    """Client 1 goes offline for 10 model minutes mid-task; the run goes on without it and its
    update, resumed when it returns, is accepted stale (rounds of 30 s went on meanwhile) - in
    well under a second of wall time."""

    spec = SyntheticSpec(num_features=8, num_classes=3, seed=0)
    population = SyntheticPopulation(spec, 2, Links(None, 2))
    # client 1 online for its first 0.5 s (the download), then away 600 s
    trace = TraceAvailability({1: [(0.0, 0.5), (600.5, 1e9)]})
    config = CoordinatorConfig.from_dict({
        "rounds": 30, "training": {"local_steps": 4},
        "flush": {"goal": 2, "min_updates": 1, "deadline_s": 30, "max_staleness": 25}})
    clock = ManualClock()
    events = EventLog(None, clock=clock.now)
    loop = VirtualLoop(config, np.zeros(spec.num_parameters, np.float32), population,
                       UpdatePipeline, events, clock, LoopOptions(step_cost_s=0.25, seed=0),
                       availability=trace)
    loop.run()
    late = [e for e in events.of_kind("update_accepted") if e["client_id"] == "sim-1"]
    assert late and late[0]["staleness"] >= 1
    assert late[0]["elapsed"] >= 600.0  # model seconds
    assert loop.engine.finished


@pytest.mark.parametrize("mode", ["virtual", "grpc"])
def test_a_simulation_with_central_dp_is_reproducible(tmp_path: Path, mode: str) -> None:
    """The coordinator's noise follows the run's seed in a simulation (a served coordinator
    draws it from the operating system): the same config gives the same model."""
    from fedlink.sim import run_simulation

    table = {"run": {"name": f"dp-{mode}", "seed": 3, "mode": mode},
             "data": {"dataset": "digits", "clients": 3}, "model": {"name": "logreg"},
             "client": {"privacy": "dp_fedavg"},
             "coordinator": {"rounds": 2, "robust": {"enabled": False},
                             "norm_bound_adaptive": False,
                             "flush": {"goal": 3, "min_updates": 3, "deadline_s": 0},
                             "training": {"local_steps": 2, "batch_size": 16},
                             "hooks": [{"name": "dp_fedavg", "clip_norm": 1.0,
                                        "noise_multiplier": 1.0, "delta": 1e-3}]}}
    if mode == "virtual":  # a gRPC run refuses the [virtual] table
        table["virtual"] = {"deterministic": True, "step_cost_s": 0.0}
    models = [np.load(run_simulation(ExperimentConfig.from_dict(table), tmp_path / name,
                                     progress=False).run_dir / "model.npy")
              for name in ("a", "b")]
    np.testing.assert_array_equal(*models)
    assert np.abs(models[0]).max() > 0


def test_virtual_run_is_reproducible(tmp_path: Path) -> None:
    from fedlink.sim import run_simulation

    config = _config({"goal": 2, "over_selection": 1.5, "deadline_s": 5}, "virtual")
    config = dataclasses.replace(config, virtual=dataclasses.replace(
        config.virtual, deterministic=False, step_cost_s=0.1))
    first = run_simulation(config, tmp_path / "a", progress=False)
    second = run_simulation(config, tmp_path / "b", progress=False)
    np.testing.assert_array_equal(np.load(first.run_dir / "model.npy"),
                                  np.load(second.run_dir / "model.npy"))
    assert first.summary["model_seconds"] == second.summary["model_seconds"] > 0


def test_a_client_holding_a_recent_version_downloads_the_same_delta_in_both_modes(
        tmp_path: Path) -> None:
    """Each client trains every version, so from the second on it holds the previous one and
    is offered the coordinator's exact delta from it: a virtual client takes it, timed and
    counted at its bytes, as a real one does (it once took the whole model each time)."""
    real, virtual = _both({"goal": 3, "deadline_s": 0}, tmp_path, rounds=3)
    _same(real, virtual)
    for summary in (real.summary, virtual.summary):
        assert summary["bytes_down_delta"] > 0
        assert summary["delta_bytes_saved"] > 0
        assert summary["bytes_down"] == sum(summary[f"bytes_down_{kind}"]
                                            for kind in ("model", "delta", "evaluation"))
    # the same downloads of the same versions: xor-zlib deltas of models equal to 1e-6
    for key in ("bytes_down_model", "bytes_down_delta", "delta_bytes_saved"):
        assert virtual.summary[key] == pytest.approx(real.summary[key], rel=0.02), key
