"""pfl-research's side of ``vs_pfl_ratio``: the ``task`` of this folder with pfl's simulator.

Run by ``benchmarks/sim_scale.py`` with a python where ``pfl`` (and its PyTorch backend) is
installed, not fedlink's::

    PYTHON benchmarks/vs_pfl/run_pfl.py DATA.npz USERS COHORT ROUNDS OUT.json [--per-user-eval]

``DATA.npz`` holds the digits arrays (``x_train``, ``y_train``, ``x_test``, ``y_test``) the
fedlink side uses; with ``offsets`` as well, user ``u`` holds rows ``offsets[u]:offsets[u+1]``
of the training arrays (a split fedlink made: ``benchmarks/small_run.py``), else the rows
``task.user_indices`` draws. Users' data is lazy (``FederatedDataset`` with a per-user make-data
function, users drawn at random), FedAvg weighted by data points, central accuracy on the test
set after every round.

Like for like by default: the same work as the fedlink side, which trains each sampled user
and evaluates the central model on the test set once per round. pfl's ``FederatedAveraging``
also evaluates every sampled user's data before and after its local training in every round
whose ``evaluation_frequency`` divides the iteration, iteration 0 always included; that is
work the fedlink side does not do, so ``LikeForLikeFedAvg`` turns it off in every round.
``--per-user-eval`` restores pfl's ``evaluation_frequency = 1`` (the comparison's old,
unequal configuration, kept as a named extra figure).

pfl draws its cohorts from numpy's global generator, which it does not seed; it is seeded here
(``task.SEED``) so that a run's accuracy is the same every time, as the fedlink side's is.

Writes ``{"wall_s", "accuracy", "rounds"}``: ``wall_s`` runs from building the model to the
end of the last round (imports and loading the arrays excluded, as on the fedlink side).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import task  # this folder's: the same users as the fedlink side
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.central_evaluation import CentralEvaluationCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Weighted
from pfl.model.pytorch import PyTorchModel


class LikeForLikeFedAvg(FederatedAveraging):
    """pfl's FedAvg without its per-user evaluation before and after local training.

    ``evaluation_frequency`` alone cannot turn it off: iteration 0 always evaluates. The central
    evaluation callback (the test set, every round) is unaffected, as on the fedlink side.
    """

    def get_next_central_contexts(self, *args: Any, **kwargs: Any) -> Any:
        contexts, model, metrics = super().get_next_central_contexts(*args, **kwargs)
        if contexts is not None:
            contexts = tuple(dataclasses.replace(c, do_evaluation=False) for c in contexts)
        return contexts, model, metrics


class DigitsMLP(nn.Module):
    """The task's MLP, with the ``loss`` and ``metrics`` methods pfl's PyTorch model calls."""

    def __init__(self) -> None:
        super().__init__()
        widths = [task.FEATURES, *task.HIDDEN]
        layers: list[nn.Module] = []
        for fan_in, fan_out in itertools.pairwise(widths):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(widths[-1], task.CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        self.train(not eval)
        return nn.functional.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict[str, Any]:
        self.train(not eval)
        logits = self(x)
        return {"loss": Weighted(float(nn.functional.cross_entropy(logits, y,
                                                                   reduction="sum")), len(y)),
                "accuracy": Weighted(float((logits.argmax(1) == y).sum()), len(y))}


def main() -> None:
    data_path, users, cohort, rounds, out = sys.argv[1:6]
    per_user_eval = "--per-user-eval" in sys.argv[6:]
    torch.set_num_threads(1)
    arrays = np.load(data_path)
    x_train = torch.from_numpy(arrays["x_train"])
    y_train = torch.from_numpy(arrays["y_train"])
    test = Dataset((torch.from_numpy(arrays["x_test"]), torch.from_numpy(arrays["y_test"])))

    offsets = arrays["offsets"] if "offsets" in arrays.files else None

    def make_user(user: int) -> Dataset:
        rows = torch.from_numpy(
            task.user_indices(user, len(y_train)) if offsets is None
            else np.arange(offsets[user], offsets[user + 1]))
        return Dataset((x_train[rows], y_train[rows]), user_id=str(user))

    started = time.perf_counter()
    np.random.seed(task.SEED)  # pfl's user sampler draws from numpy's global generator
    torch.manual_seed(task.SEED)
    module = DigitsMLP()
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    training = FederatedDataset(make_user, get_user_sampler("random", list(range(int(users)))))
    backend = SimulatedBackend(training_data=training, val_data=None,
                               postprocessors=[WeightByDatapoints()])
    evaluation = CentralEvaluationCallback(test, NNEvalHyperParams(local_batch_size=None),
                                           frequency=1)
    params = NNAlgorithmParams(central_num_iterations=int(rounds), evaluation_frequency=1,
                               train_cohort_size=int(cohort), val_cohort_size=0)
    train = NNTrainHyperParams(local_learning_rate=task.LEARNING_RATE, local_num_epochs=1,
                               local_batch_size=task.BATCH_SIZE)
    algorithm = FederatedAveraging() if per_user_eval else LikeForLikeFedAvg()
    algorithm.run(algorithm_params=params, backend=backend, model=model,
                             model_train_params=train,
                             model_eval_params=NNEvalHyperParams(local_batch_size=None),
                             callbacks=[evaluation])
    wall = time.perf_counter() - started
    with torch.no_grad():  # the central model is the module pfl trained in place
        guesses = module(torch.from_numpy(arrays["x_test"])).argmax(1).numpy()
    accuracy = float(np.mean(guesses == arrays["y_test"]))
    Path(out).write_text(json.dumps({"wall_s": wall, "accuracy": accuracy,
                                     "rounds": int(rounds)}))


if __name__ == "__main__":
    main()
