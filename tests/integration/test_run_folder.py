"""A run in a folder that holds an earlier run's records replaces them all: nothing of the
earlier run (summary, report, plots, model, TensorBoard files) is left beside the new run's
events to be read as its own; files a run never writes are left alone."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

import pytest

from fedlink.experiment.run_folder import RECORDS, TENSORBOARD_DIRNAME, TENSORBOARD_FILES
from fedlink.sim import ExperimentConfig, run_simulation

pytest.importorskip("tensorboard", reason="the run writes TensorBoard files (tensorboard extra)")

NAME = "again"


def _config(mode: str) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": NAME, "seed": 1, "tensorboard": True, "mode": mode},
        "data": {"dataset": "digits", "clients": 4},
        "model": {"name": "logreg"},
        "coordinator": {"rounds": 2, "flush": {"goal": 4, "min_updates": 4},
                        "training": {"local_steps": 3, "learning_rate": 0.5}},
    })


def _written(run_dir: Path) -> set[str]:
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}


def _a_record(name: str) -> bool:
    """Whether ``clear_records`` removes the file ``name`` (relative to the run folder)."""
    folder, _, file = name.rpartition("/")
    if folder == TENSORBOARD_DIRNAME:
        return fnmatch.fnmatch(file, TENSORBOARD_FILES)
    return not folder and file in RECORDS


@pytest.mark.timeout(180)
def test_a_run_replaces_every_record_an_earlier_run_left_in_its_folder(tmp_path: Path) -> None:
    virtual = run_simulation(_config("virtual"), tmp_path, progress=False)
    first = _written(virtual.run_dir)
    assert {"comm_vs_compute.svg", "model.pt", "summary.json", "report.md"} <= first
    assert all(_a_record(name) for name in first), sorted(n for n in first if not _a_record(n))
    (virtual.run_dir / "notes.txt").write_text("the user's own file")

    grpc = run_simulation(_config("grpc"), tmp_path, progress=False)

    assert grpc.run_dir == virtual.run_dir
    second = _written(grpc.run_dir)
    # a gRPC run draws no model-time plots: the virtual run's are gone, not left as its own
    assert not {"comm_vs_compute.svg", "accuracy_vs_model_time.svg"} & second
    assert len([n for n in second if n.startswith(TENSORBOARD_DIRNAME)]) == 1
    assert (grpc.run_dir / "notes.txt").read_text() == "the user's own file"
    assert all(_a_record(name) for name in second - {"notes.txt"})


@pytest.mark.timeout(120)
def test_a_run_that_fails_leaves_no_earlier_summary_beside_its_events(tmp_path: Path) -> None:
    """A run that stops with an error part way writes no summary and no model: the earlier
    run's must not be there to be read as this one's."""
    run_dir = run_simulation(_config("virtual"), tmp_path, progress=False).run_dir
    assert {"summary.json", "model.npy", "report.md"} <= _written(run_dir)
    from fedlink.client.torch_trainer import TorchTrainer
    calls = []

    class BreaksAtTheSecondVersion(TorchTrainer):
        def train(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) > 4:  # the first version's four tasks train
                raise RuntimeError("the trainer broke")
            return super().train(*args, **kwargs)

    def factory(model: Any, data: Any, *, seed: int) -> BreaksAtTheSecondVersion:
        return BreaksAtTheSecondVersion(model, data, seed=seed)

    with pytest.raises(RuntimeError, match="the trainer broke"):
        run_simulation(_config("virtual"), tmp_path, progress=False, trainer=factory)
    left = _written(run_dir)
    assert "events.jsonl" in left  # this run's, up to the error
    assert not {"summary.json", "model.npy", "model.pt", "report.md"} & left
    assert len([n for n in left if n.startswith(TENSORBOARD_DIRNAME)]) == 1
