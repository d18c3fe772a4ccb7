"""The client SDK: session loop, update pipeline, transport and retries.

Imports without torch; ``fedlink.client.torch_trainer.TorchTrainer`` is the torch-based trainer.
A device with its own training code implements ``Trainer`` over flat float32 vectors.
"""

from fedlink.client.base import Trainer, TrainPlan, TrainResult
from fedlink.client.pipeline import UpdatePipeline
from fedlink.client.retry import RetryPolicy
from fedlink.client.session import ClientOptions, ClientSession, SessionStats, run_client
from fedlink.client.transport import Timeouts, Transport

__all__ = [
    "ClientOptions",
    "ClientSession",
    "RetryPolicy",
    "SessionStats",
    "Timeouts",
    "TrainPlan",
    "TrainResult",
    "Trainer",
    "Transport",
    "UpdatePipeline",
    "run_client",
]
