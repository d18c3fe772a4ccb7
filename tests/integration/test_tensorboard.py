"""``[run] tensorboard = true``: a simulation writes TensorBoard scalars beside its JSONL log,
and they say what the log says (read back with TensorBoard's own event-file loader), over
real gRPC and on the virtual clock (where their times are model seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation

loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader",
                             reason="the tensorboard extra reads the event files back")
event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")


def _config(mode: str) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": "tb", "seed": 1, "tensorboard": True, "mode": mode},
        "data": {"dataset": "digits", "clients": 4},
        "model": {"name": "logreg"},
        "coordinator": {"rounds": 3, "flush": {"goal": 4, "min_updates": 4},
                        "training": {"local_steps": 3, "learning_rate": 0.5}},
    })


def _scalars(run_dir: Path) -> tuple[dict[str, dict[int, float]], dict[int, float]]:
    """(tag -> step -> value, step -> wall time) of the run's TensorBoard event files."""
    files = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert files
    scalars: dict[str, dict[int, float]] = {}
    times: dict[int, float] = {}
    for path in files:
        for record in loader.RawEventFileLoader(str(path)).Load():
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
                times[event.step] = event.wall_time
    return scalars, times


@pytest.mark.timeout(120)
def test_simulation_writes_scalars_that_match_its_event_log(tmp_path: Path) -> None:
    result = run_simulation(_config("grpc"), tmp_path, progress=False)

    scalars, _ = _scalars(result.run_dir)
    flushes = [e for e in read_events(result.run_dir / "events.jsonl") if e["kind"] == "flush"]
    assert {step: pytest.approx(acc) for step, acc in scalars["eval/accuracy"].items()} == \
        {f["model_version"]: f["accuracy"] for f in flushes}
    assert scalars["updates/accepted"][3] == result.summary["updates_accepted"] == 12
    assert scalars["traffic/bytes_up"][3] == result.summary["bytes_up"]
    assert set(scalars["eval/loss"]) == {1, 2, 3}


@pytest.mark.timeout(120)
def test_virtual_run_writes_scalars_timed_in_model_seconds(tmp_path: Path) -> None:
    result = run_simulation(_config("virtual"), tmp_path, progress=False, report=False)

    scalars, times = _scalars(result.run_dir)
    events = read_events(result.run_dir / "events.jsonl")
    flushes = [e for e in events if e["kind"] == "flush"]
    assert {step: pytest.approx(acc) for step, acc in scalars["eval/accuracy"].items()} == \
        {f["model_version"]: f["accuracy"] for f in flushes}
    assert set(scalars["eval/loss"]) == {1, 2, 3}
    assert scalars["updates/accepted"][3] == result.summary["updates_accepted"] == 12
    assert scalars["traffic/bytes_up"][3] == result.summary["bytes_up"]
    # no download_finished events on the virtual clock: the flushes' counts add up
    assert scalars["traffic/bytes_down"][3] == result.summary["bytes_down"] > 0
    assert scalars["round/seconds"] == {
        f["model_version"]: pytest.approx(f["round_seconds"]) for f in flushes}
    # each flush at the run's start plus its elapsed model seconds (not the wall seconds the
    # simulation took)
    start = events[0]["t"] - events[0]["elapsed"]
    assert times == {f["model_version"]: pytest.approx(start + f["elapsed"], abs=1e-6)
                     for f in flushes}
    assert times[3] - times[1] == pytest.approx(flushes[2]["elapsed"] - flushes[0]["elapsed"])
    assert flushes[-1]["elapsed"] == pytest.approx(result.summary["model_seconds"])
