"""Plug points: import strings and objects in place of built-ins, and the errors they give."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedlink.client import TrainPlan
from fedlink.client.lazy import LazyTrainer
from fedlink.client.torch_trainer import TorchTrainer
from fedlink.data import FederatedData, load_federated
from fedlink.data.torch_data import TorchFederatedData
from fedlink.errors import ConfigError
from fedlink.experiment.setup import Experiment, Plugs
from fedlink.models import Evaluator
from fedlink.models.training import PlainSGD, build_loss, build_optimizer
from fedlink.plug import load, resolve
from fedlink.registry import Registry
from fedlink.sim import ExperimentConfig

SMALL = {"run": {"seed": 1}, "data": {"dataset": "digits", "clients": 2}}


def _config(**sections: dict[str, object]) -> ExperimentConfig:
    return ExperimentConfig.from_dict({**SMALL, **sections})


def tiny_model() -> nn.Module:
    """A model factory for import strings (``tests.unit.test_plugs:tiny_model``)."""
    return nn.Linear(64, 10)


def not_a_model() -> str:
    return "nope"


def test_import_string_names_module_or_attribute_that_is_missing() -> None:
    with pytest.raises(ConfigError, match=r"cannot import module 'no_such_pkg\.mod'"):
        load("no_such_pkg.mod:attr", "model factory")
    with pytest.raises(ConfigError, match="module 'math' has no attribute 'nope'"):
        load("math:nope", "loss")
    with pytest.raises(ConfigError, match=r"'package\.module:attr'"):
        load("math:", "loss")
    assert resolve("math:sqrt", "f")(9.0) == 3.0
    assert resolve(len, "f") is len


def test_every_registry_accepts_an_import_string() -> None:
    registry: Registry[object] = Registry("thing")
    assert registry.create("collections:OrderedDict", a=1) == {"a": 1}
    with pytest.raises(ConfigError, match="thing 'math:pi' is a float, not callable"):
        registry.create("math:pi")


def test_model_factory_by_import_string_and_its_wrong_type(tmp_path: Path) -> None:
    good = Experiment.build(_config(model={"factory": f"{__name__}:tiny_model"}))
    assert isinstance(good.new_model(), nn.Linear)
    with pytest.raises(ConfigError, match=r"returned a builtins\.str, expected a torch"):
        Experiment.build(_config(model={"factory": f"{__name__}:not_a_model"}))
    with pytest.raises(ConfigError, match=r"model\.factory: must be 'package\.module:attr'"):
        _config(model={"factory": "tiny_model"})


def test_trainer_factory_must_return_a_trainer() -> None:
    experiment = Experiment.build(_config(), Plugs(trainer=lambda model, data, *, seed: 42))  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match=r"returned a int, expected a fedlink\.client\.Trainer"):
        experiment.trainer(0)


def test_trainers_sharing_one_working_model_train_as_fresh_ones_do() -> None:
    # the virtual loop trains its tasks one at a time in one module (no model per task)
    experiment = Experiment.build(_config(data={"dataset": "digits", "clients": 4}))
    assert experiment.may_share_working_model
    shared = experiment.new_model()
    start = experiment.initial_vector()
    plan = TrainPlan(local_epochs=2, batch_size=8, learning_rate=0.2, seed=9)
    for index in (1, 2, 1):
        trainer = experiment.trainer(index, model=shared)
        assert trainer.model is shared  # type: ignore[attr-defined]
        np.testing.assert_array_equal(trainer.train(start, plan).params,
                                      experiment.trainer(index).train(start, plan).params)
    plugged = Experiment.build(_config(model={"factory": f"{__name__}:tiny_model"}))
    assert not plugged.may_share_working_model  # a user's module may hold other state


def test_data_loader_must_return_federated_data() -> None:
    with pytest.raises(ConfigError, match=r"expected a fedlink\.data\.base\.FederatedData"):
        Experiment.build(_config(), Plugs(data=lambda num_clients, seed: [1, 2]))
    # [data] options are checked when the config is parsed (against the dataset and
    # partitioner it names), so an option nobody takes fails before any data is loaded
    with pytest.raises(ConfigError, match=r"data\.options: unknown options \['bogus'\]"):
        Experiment.build(_config(data={"clients": 2, "options": {"bogus": 1}}),
                         Plugs(data=lambda *, num_clients, seed: None))


def test_loader_returning_central_data_is_partitioned_by_fedlink() -> None:
    from fedlink.data import get_dataset

    def loader(*, num_clients: int, seed: int) -> object:
        return get_dataset("digits").build(num_clients, np.random.default_rng(seed))

    config = _config(data={"clients": 3, "partition": "dirichlet", "options": {"alpha": 0.3}})
    data = Experiment.build(config, Plugs(data=loader)).data
    assert isinstance(data, FederatedData)
    assert data.num_clients == 3 and data.partition == "dirichlet"


def test_loss_and_optimizer_by_name_with_options() -> None:
    assert build_loss("mse")(torch.zeros(4, 1), torch.ones(4)).item() == 1.0
    with pytest.raises(ConfigError, match="unknown loss 'msee'"):
        build_loss("msee")
    factory = build_optimizer("sgd", {"momentum": 0.9, "weight_decay": 1e-4})
    optimizer = factory([nn.Parameter(torch.zeros(2))], 0.1)
    assert optimizer.defaults["momentum"] == 0.9  # type: ignore[attr-defined]
    assert build_optimizer("sgd") is PlainSGD  # plain SGD without torch.optim's machinery
    with pytest.raises(ConfigError, match="bad options for optimizer 'sgd'"):
        build_optimizer("sgd", {"momentun": 0.9})
    with pytest.raises(ConfigError, match="bad options for optimizer 'adam'"):
        build_optimizer("adam", {"momentun": 0.9})
    assert isinstance(build_optimizer("torch.optim:Adam")([nn.Parameter(torch.zeros(1))], 0.1),
                      torch.optim.Adam)


def _regression(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, 3, generator=generator)  # 3-D inputs: any shape trains
    return TensorDataset(x, x.sum(dim=(1, 2)))


def _regressor() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 1))


@pytest.mark.parametrize("data", [_regression(), DataLoader(_regression(), batch_size=8)])
def test_torch_dataset_and_loader_train_with_mse(data: object) -> None:
    trainer = TorchTrainer(_regressor(), data, loss="mse", seed=1)  # type: ignore[arg-type]
    assert trainer.num_examples() == 64
    evaluator = Evaluator(_regressor(), _regression(), loss="mse")
    vector = _vector(_regressor())
    before = evaluator(vector)["loss"]
    for seed in range(10):
        result = trainer.train(vector, TrainPlan(local_epochs=1, batch_size=8,
                                                 learning_rate=0.05, seed=seed))
        vector = result.params
    assert result.steps_planned == 8  # 64 examples in batches of 8
    scores = evaluator(vector)
    assert "accuracy" not in scores and scores["loss"] < before / 10


def _vector(model: nn.Module) -> np.ndarray:
    from fedlink.params import to_vector

    return to_vector(model)


def test_keep_local_sends_zero_delta_and_keeps_its_own_values() -> None:
    data = load_federated("digits", 2, 0).clients[0]
    model = nn.Sequential(nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
    trainer = TorchTrainer(model, data, keep_local=["batchnorm"])
    start = _vector(model)
    first = trainer.train(start, TrainPlan(local_steps=3))
    bn = np.zeros(start.size, bool)
    spec = trainer.spec
    for name, offset, numel in zip(spec.names, spec.offsets, spec.numels, strict=True):
        bn[offset:offset + numel] = name.startswith("1.")
    assert np.array_equal(first.params[bn], start[bn])  # delta 0: the server never moves BN
    assert not np.array_equal(first.params[~bn], start[~bn])
    mine = trainer.personalize(first.params)
    assert not np.array_equal(mine[bn], start[bn])  # the client's own BN trained on
    with pytest.raises(ConfigError, match="keep_local pattern 'bnx' matches none"):
        TorchTrainer(model, data, keep_local=["bnx"])


def test_lazy_client_data_loads_on_first_training() -> None:
    calls: list[int] = []

    def client_data() -> TensorDataset:
        calls.append(1)
        return _regression()

    data = TorchFederatedData([client_data, client_data], _regression(), "lazy")
    config = _config(client={"loss": "mse"}, data={"clients": 2})
    experiment = Experiment.build(config, Plugs(data=data, model=_regressor()))
    trainer = experiment.trainer(0)
    assert isinstance(trainer, LazyTrainer) and not calls
    trainer.train(_vector(_regressor()), TrainPlan(local_steps=1))
    assert calls == [1] and trainer.built


def test_resume_from_a_saved_model(tmp_path: Path) -> None:
    experiment = Experiment.build(_config(model={"name": "logreg"}))
    vector = np.arange(experiment.initial_vector().size, dtype=np.float32) / 1000
    experiment.save_model(tmp_path, vector)
    for name in ("model.pt", "model.npy"):
        resumed = Experiment.build(_config(model={"name": "logreg",
                                                  "init": str(tmp_path / name)}))
        assert np.array_equal(resumed.initial_vector(), vector)
    missing = Experiment.build(_config(model={"name": "logreg", "init": str(tmp_path / "x")}))
    with pytest.raises(ConfigError, match="no saved model at"):
        missing.initial_vector()


def my_evaluate(model: nn.Module, test: object) -> dict[str, float]:
    """A user evaluator for import strings: sees the loaded global model and the test set."""
    from fedlink.data import Dataset

    assert isinstance(test, Dataset) and not model.training
    return {"weight_sum": float(sum(p.sum() for p in model.parameters())), "n": len(test)}


def test_evaluator_by_import_string_scores_the_global_model() -> None:
    config = _config(model={"name": "logreg"},
                     coordinator={"evaluator": f"{__name__}:my_evaluate"})
    evaluator = Experiment.build(config).evaluator()
    size = Experiment.build(config).initial_vector().size
    scores = evaluator(np.ones(size, dtype=np.float32))
    assert scores == {"weight_sum": float(size), "n": 360.0}
    broken = Experiment.build(config, Plugs(evaluate=lambda model, test: 0.5)).evaluator()  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match="returned a float, expected a mapping"):
        broken(np.ones(size, dtype=np.float32))


@pytest.mark.parametrize("features, channels", [(64, 1), (784, 1), (3072, 3)])
def test_builtin_cnn_takes_flat_square_images(features: int, channels: int) -> None:
    from fedlink.models import build_model

    model = build_model("cnn", features, 10, channels=channels)
    assert model(torch.zeros(2, features)).shape == (2, 10)
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    with pytest.raises(ConfigError, match="not 3 square channels"):
        build_model("cnn", 100, 10, channels=3)


def test_simulate_with_a_wrong_import_string_fails_at_start_with_a_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedlink.cli import main

    config = tmp_path / "bad.toml"
    config.write_text('[model]\nfactory = "my_models:Net"\n[data]\nclients = 2\n')
    assert main(["simulate", str(config), "--no-progress", "--output-dir",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "fedlink: error:" in err and "cannot import module 'my_models'" in err
    assert "Traceback" not in err and not (tmp_path / "fedlink-run" / "events.jsonl").exists()
