"""A BatchNorm model through lossy compression and through user-level DP, end to end (issue 24:
the client's pipeline by kind). Each run learns with sane running statistics, or is refused
before it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedlink.errors import ConfigError
from fedlink.sim import ExperimentConfig
from fedlink.sim.runner import run_simulation


def bn_cnn() -> nn.Module:
    """A small CNN with BatchNorm2d for the 8x8 digits (which arrive flat)."""
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, 10))


def run_config(name: str, client: dict[str, Any], mode: str = "virtual",
               **coordinator: Any) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": name, "seed": 4, "mode": mode},
        "data": {"dataset": "digits", "clients": 4},
        "client": client,
        "coordinator": {"rounds": 8, "flush": {"goal": 4, "min_updates": 4},
                        "training": {"local_steps": 20, "batch_size": 32,
                                     "learning_rate": 0.1}, **coordinator},
    })


@pytest.mark.parametrize("codec", [("sign", {}), ("topk", {"density": 0.1}),
                                   ("qsgd", {"bits": 2})])
def test_a_batchnorm_model_learns_through_a_lossy_codec(tmp_path: Path,
                                                        codec: tuple[str, Any]) -> None:
    name, options = codec
    config = run_config(f"bn-{name}", {"compression": name, "compression_options": options})
    result = run_simulation(config, tmp_path, progress=False, model=bn_cnn)
    assert result.summary["final_accuracy"] >= 0.7
    assert torch.all(result.model["2.running_var"] > 0)
    assert float(result.model["2.num_batches_tracked"]) == pytest.approx(8 * 20)


DP_HOOK = [{"name": "dp_fedavg", "clip_norm": 2.0, "noise_multiplier": 0.1}]


def test_user_level_dp_with_batchnorm_is_refused_before_the_run(tmp_path: Path) -> None:
    config = run_config("bn-dp", {"privacy": "dp_fedavg"}, hooks=DP_HOOK)
    with pytest.raises(ConfigError, match=r"keep_local = \[\"batchnorm\"\]"):
        run_simulation(config, tmp_path, progress=False, model=bn_cnn)
    assert not (tmp_path / "bn-dp" / "summary.json").exists()


def test_user_level_dp_with_batchnorm_kept_local_releases_weights_only(tmp_path: Path) -> None:
    # keep_local needs each client's own trainer across tasks: real gRPC clients (virtual mode
    # builds a trainer per task and refuses keep_local)
    config = run_config("bn-dp-local", {"privacy": "dp_fedavg", "keep_local": ["batchnorm"]},
                        mode="grpc", hooks=DP_HOOK)
    result = run_simulation(config, tmp_path, progress=False, model=bn_cnn)
    # every update was accepted: the DP pipeline refuses one that moves a buffer, so no
    # client's running statistics left it
    assert result.summary["updates_accepted"] == 8 * 4
    assert all(torch.all(torch.isfinite(t)) for t in result.model.values())
    kept = result.summary["kept_local"]
    assert {"2.running_mean", "2.running_var"} <= set(kept["tensors"])
    torch.manual_seed(4)  # the run's seed: the run's initial model
    initial = bn_cnn()
    assert not torch.equal(result.model["1.weight"], initial[1].weight.detach())
