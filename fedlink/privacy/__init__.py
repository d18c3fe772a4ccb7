"""Differential privacy: update clipping and noise, accounting and budgets, DP-SGD via Opacus.

- ``UpdatePrivacy`` stages (``PRIVACY_STAGES``: ``"none"``, ``"dp_fedavg"``) privatise a
  client's delta before compression (``fedlink.client.pipeline``).
- The ``dp_fedavg`` flush hook (``fedlink.privacy.hooks``, registered in
  ``fedlink.aggregate.FLUSH_HOOKS`` when that module is imported: ``fedlink.coordinator``
  does, and so does reading ``fedlink.privacy.DPFedAvgHook``) adds DP-FedAvg's noise on the
  coordinator, adapts the clip norm, accounts epsilon and enforces ``max_epsilon``.
- ``fedlink.privacy.accounting``: epsilon of the sampled Gaussian mechanism through Google's
  ``dp-accounting`` (RDP, and PLD for ``"prv"``), torch-free (the ``privacy`` extra).
- ``fedlink.privacy.dp_sgd.DPSGDTrainer``: sample-level DP-SGD in local training through
  Opacus (with ``fedlink.privacy.ghost_clipping`` for its default ``ghost`` mode). Import it
  explicitly: those two are the only modules here that import torch, and nothing in this
  package's ``__init__`` imports them, so that a coordinator can import ``fedlink.privacy``
  (for the hook) without torch.

A device imports this package for its privacy stage only: the coordinator's half (the hooks,
which import ``fedlink.aggregate``) and the accounting load when one of their names is first
read (PEP 562), so that ``import fedlink.client`` does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedlink.privacy.base import PRIVACY_STAGES, NoPrivacy, UpdatePrivacy
from fedlink.privacy.clipping import NOISE_MODES, ClipAndNoise, clip_to_norm

if TYPE_CHECKING:
    from fedlink.privacy.accounting import ACCOUNTANTS, Accountant, epsilon
    from fedlink.privacy.hooks import DPFedAvgHook

_LAZY = {"ACCOUNTANTS": "fedlink.privacy.accounting", "Accountant": "fedlink.privacy.accounting",
         "epsilon": "fedlink.privacy.accounting", "DPFedAvgHook": "fedlink.privacy.hooks"}
"""Public names loaded on first access, and the module each comes from."""

__all__ = [
    "ACCOUNTANTS",
    "NOISE_MODES",
    "PRIVACY_STAGES",
    "Accountant",
    "ClipAndNoise",
    "DPFedAvgHook",
    "NoPrivacy",
    "UpdatePrivacy",
    "clip_to_norm",
    "epsilon",
]


def __getattr__(name: str) -> Any:
    """Load a coordinator-side name (``_LAZY``) when it is first read."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, loaded or not."""
    return sorted({*globals(), *__all__})
