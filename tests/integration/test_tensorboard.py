"""``[run] tensorboard = true``: a simulation writes TensorBoard scalars beside its JSONL log,
and they say what the log says (read back with TensorBoard's own event-file loader)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation

loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader",
                             reason="the tensorboard extra reads the event files back")
event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")


@pytest.mark.timeout(120)
def test_simulation_writes_scalars_that_match_its_event_log(tmp_path: Path) -> None:
    config = ExperimentConfig.from_dict({
        "run": {"name": "tb", "seed": 1, "tensorboard": True},
        "data": {"dataset": "digits", "clients": 4},
        "model": {"name": "logreg"},
        "coordinator": {"rounds": 3, "flush": {"goal": 4, "min_updates": 4},
                        "training": {"local_steps": 3, "learning_rate": 0.5}},
    })
    result = run_simulation(config, tmp_path, progress=False)

    files = sorted((result.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert files
    scalars: dict[str, dict[int, float]] = {}
    for path in files:
        for record in loader.RawEventFileLoader(str(path)).Load():
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    flushes = [e for e in read_events(result.run_dir / "events.jsonl") if e["kind"] == "flush"]
    assert {step: pytest.approx(acc) for step, acc in scalars["eval/accuracy"].items()} == \
        {f["model_version"]: f["accuracy"] for f in flushes}
    assert scalars["updates/accepted"][3] == result.summary["updates_accepted"] == 12
    assert scalars["traffic/bytes_up"][3] == result.summary["bytes_up"]
    assert set(scalars["eval/loss"]) == {1, 2, 3}
