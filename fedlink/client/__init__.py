"""The client SDK: session loop, update pipeline, transport, retries, transfers and outbox.

Imports without torch; ``fedlink.client.torch_trainer.TorchTrainer`` is the torch-based trainer.
A device with its own training code implements ``Trainer`` over flat float32 vectors.

Every name below is importable from here as before; each loads its module (and grpc, protobuf
and the wire format behind it) when it is first read (PEP 562), so that ``import fedlink.client``
costs a device nothing it does not use, and ``from fedlink.client import Trainer`` does not load
the transport.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedlink.client.base import Trainer, TrainerWrapper, TrainPlan, TrainResult
    from fedlink.client.outbox import DiskOutbox, MemoryOutbox, Outbox, PendingUpdate
    from fedlink.client.pipeline import UpdatePipeline
    from fedlink.client.retry import RetryPolicy
    from fedlink.client.session import ClientOptions, ClientSession, run_client
    from fedlink.client.stats import SessionStats
    from fedlink.client.transfer import ChunkSizer
    from fedlink.client.transport import Timeouts, TLSOptions, Transport

_LAZY = {
    "ChunkSizer": "transfer",
    "ClientOptions": "session",
    "ClientSession": "session",
    "DiskOutbox": "outbox",
    "MemoryOutbox": "outbox",
    "Outbox": "outbox",
    "PendingUpdate": "outbox",
    "RetryPolicy": "retry",
    "SessionStats": "stats",
    "TLSOptions": "transport",
    "Timeouts": "transport",
    "TrainPlan": "base",
    "TrainResult": "base",
    "Trainer": "base",
    "TrainerWrapper": "base",
    "Transport": "transport",
    "UpdatePipeline": "pipeline",
    "run_client": "session",
}
"""Public name -> the submodule that defines it, imported when the name is first read."""

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
    "TrainerWrapper",
    "Transport",
    "UpdatePipeline",
    "run_client",
]


def __getattr__(name: str) -> Any:
    """Load a public name's module when the name is first read (``AttributeError`` otherwise)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, loaded or not."""
    return sorted({*globals(), *__all__})
