"""Differential privacy: update clipping and noise, accounting and budgets, DP-SGD via Opacus.

- ``UpdatePrivacy`` stages (``PRIVACY_STAGES``: ``"none"``, ``"dp_fedavg"``) privatise a
  client's delta before compression (``fedlink.client.pipeline``).
- The ``dp_fedavg`` flush hook (``fedlink.privacy.hooks``, registered in
  ``fedlink.aggregate.FLUSH_HOOKS`` on import) adds DP-FedAvg's noise on the coordinator,
  adapts the clip norm, accounts epsilon and enforces ``max_epsilon``.
- ``fedlink.privacy.accounting``: epsilon of the sampled Gaussian mechanism through Google's
  ``dp-accounting`` (RDP, and PLD for ``"prv"``), torch-free (the ``privacy`` extra).
- ``fedlink.privacy.dp_sgd.DPSGDTrainer``: sample-level DP-SGD in local training through
  Opacus (with ``fedlink.privacy.ghost_clipping`` for its default ``ghost`` mode). Import it
  explicitly: those two are the only modules here that import torch, and nothing in this
  package's ``__init__`` imports them, so that a coordinator can import ``fedlink.privacy``
  (for the hook) without torch.
"""

from fedlink.privacy import hooks as _hooks  # noqa: F401  (registers the dp_fedavg hook)
from fedlink.privacy.accounting import ACCOUNTANTS, Accountant, epsilon
from fedlink.privacy.base import PRIVACY_STAGES, NoPrivacy, UpdatePrivacy
from fedlink.privacy.clipping import NOISE_MODES, ClipAndNoise, clip_to_norm
from fedlink.privacy.hooks import DPFedAvgHook

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
