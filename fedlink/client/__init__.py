"""The client SDK: session loop, update pipeline, transport, retries, transfers and outbox.

Imports without torch; ``fedlink.client.torch_trainer.TorchTrainer`` is the torch-based trainer.
A device with its own training code implements ``Trainer`` over flat float32 vectors.
"""

from fedlink.client.base import Trainer, TrainPlan, TrainResult
from fedlink.client.outbox import DiskOutbox, MemoryOutbox, Outbox, PendingUpdate
from fedlink.client.pipeline import UpdatePipeline
from fedlink.client.retry import RetryPolicy
from fedlink.client.session import ClientOptions, ClientSession, run_client
from fedlink.client.stats import SessionStats
from fedlink.client.transfer import ChunkSizer
from fedlink.client.transport import Timeouts, TLSOptions, Transport

__all__ = [
    "ChunkSizer",
    "ClientOptions",
    "ClientSession",
    "DiskOutbox",
    "MemoryOutbox",
    "Outbox",
    "PendingUpdate",
    "RetryPolicy",
    "SessionStats",
    "TLSOptions",
    "Timeouts",
    "TrainPlan",
    "TrainResult",
    "Trainer",
    "Transport",
    "UpdatePipeline",
    "run_client",
]
