"""Own CNN with BatchNorm, data and loss over emulated 4G/3G links. Run: python THIS_FILE"""

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

from fedlink.data.torch_data import TorchFederatedData
from fedlink.sim import ExperimentConfig, run_simulation


class SmallCNN(nn.Module):  # any nn.Module: its BatchNorm statistics travel with the weights
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def my_data(num_clients: int, seed: int) -> TorchFederatedData:
    digits = load_digits()  # kept as (n, 1, 8, 8) images: torch datasets of any shape train
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16
    y = torch.tensor(digits.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test, shards = order[:360], order[360:].chunk(num_clients)
    return TorchFederatedData([TensorDataset(x[s], y[s]) for s in shards],
                              TensorDataset(x[test], y[test]), "my-digits")


def my_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target, label_smoothing=0.05)


config = ExperimentConfig.from_dict({
    "run": {"name": "custom-model", "seed": 0}, "data": {"clients": 8},
    "coordinator": {"rounds": 10, "flush": {"goal": 8, "deadline_s": 60.0},
                    "training": {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.05}},
    "network": {"fleet": {"4g": 0.5, "3g": 0.5}},  # every client on its own emulated link
})

if __name__ == "__main__":
    result = run_simulation(config, model=SmallCNN(), data=my_data, loss=my_loss, progress=False)
    print(f"accuracy {result.summary['final_accuracy']:.3f}; report {result.report}")
    SmallCNN().load_state_dict(result.model)  # the trained model, BatchNorm stats included
