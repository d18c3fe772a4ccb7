"""FedBN's central model says how its kept-local tensors were filled, and is that model.

With ``[client] keep_local`` the coordinator never sees the kept tensors, so the global vector
holds their initial values: ``result.model``, ``model.pt`` and the central accuracy used to be
those of a model nobody trained (0.79 and 0.54 where federated evaluation gave 0.99), without
a word. Now they are filled with the example-weighted mean of what the clients kept, the
summary and report say so, and the per-flush accuracy stays apart as ``_unfilled``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlink.client.torch_trainer import TorchTrainer, local_mask
from fedlink.errors import ConfigError
from fedlink.experiment.config import ClientSection
from fedlink.experiment.setup import Experiment
from fedlink.models import evaluate
from fedlink.params import spec_of, to_vector
from fedlink.sim import ExperimentConfig, run_simulation
from fedlink.sim.combinations import cnn_bn


def _config(name: str, mode: str = "grpc", **client: object) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": name, "seed": 2, "mode": mode},
        "data": {"dataset": "digits", "clients": 4, "partition": "iid"},
        "model": {"factory": "fedlink.sim.combinations:cnn_bn"},
        "client": dict(client),
        "coordinator": {"rounds": 4, "flush": {"goal": 4, "min_updates": 4, "deadline_s": 0},
                        "training": {"local_epochs": 1, "batch_size": 16,
                                     "learning_rate": 0.1}},
    })


@pytest.mark.timeout(300)
def test_the_central_model_of_fedbn_is_filled_with_the_clients_mean(tmp_path: Path) -> None:
    config = _config("fedbn", keep_local=["batchnorm"])
    result = run_simulation(config, tmp_path, progress=False)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    kept = summary["kept_local"]
    assert kept["clients"] == 4 and "mean" in kept["filled_with"]
    assert kept["tensors"] == ["2.weight", "2.bias", "2.running_mean", "2.running_var",
                               "2.num_batches_tracked"]
    # the saved model is the filled one: its BatchNorm is the clients' weighted mean ...
    experiment = Experiment.build(config)
    model = experiment.new_model()
    mask = local_mask(spec_of(model), ("batchnorm",), model)
    trainers = [t for t in result.trainers if isinstance(t, TorchTrainer)]
    final = np.load(result.run_dir / "model.npy")
    kept_values = np.stack([t.personalize(final)[mask] for t in trainers])
    weights = [t.num_examples() for t in trainers]
    mean = np.average(kept_values, axis=0, weights=weights)
    counter = np.array([n.endswith("num_batches_tracked") for n, k in zip(
        spec_of(model).names, spec_of(model).numels, strict=True) for _ in range(k)])[mask]
    np.testing.assert_allclose(final[mask][~counter], mean[~counter], rtol=1e-5, atol=1e-6)
    assert not np.allclose(final[mask], to_vector(cnn_bn())[mask])  # ... not the initial one
    assert (result.model["2.running_var"] > 0).all()
    # ... and final_accuracy scores it; the unfilled flush's figure is kept apart
    model.load_state_dict(torch.load(result.run_dir / "model.pt"))
    assert evaluate(model, experiment.data.test)["accuracy"] == pytest.approx(
        summary["final_accuracy"], abs=1e-9)
    assert summary["final_accuracy"] >= 0.8
    assert "final_accuracy_unfilled" in summary
    report = result.report.read_text()
    assert "Kept-local tensors" in report and "mean" in report


def test_a_module_prefix_pattern_reads_as_its_glob() -> None:
    assert ClientSection(keep_local=("1.", "head.*", "batchnorm")).keep_local == (
        "1.*", "head.*", "batchnorm")
    model = cnn_bn()
    spec = spec_of(model)
    prefix = local_mask(spec, ClientSection(keep_local=("1.",)).keep_local, model)
    assert np.array_equal(prefix, local_mask(spec, ("1.*",), model))
    assert prefix.sum() == sum(p.numel() for p in model[1].parameters())  # the conv layer


def test_keep_local_in_virtual_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="mode = 'virtual'") as refused:
        _config("lost", mode="virtual", keep_local=["batchnorm"])
    assert "[client] keep_local" in str(refused.value)


def test_a_coordinator_alone_says_its_kept_tensors_are_the_initial_ones() -> None:
    experiment = Experiment.build(_config("serve-side", keep_local=["batchnorm"]))
    start = experiment.initial_vector()
    vector, record = experiment.fill_kept_local(start, ())  # what fedlink serve records
    assert np.array_equal(vector, start) and record["clients"] == 0
    assert "initial values" in record["filled_with"]
    plain = Experiment.build(_config("no-keep"))
    assert plain.fill_kept_local(start, ())[1] == {}  # nothing kept: nothing to say
