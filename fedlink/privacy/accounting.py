"""Privacy accounting for the sampled Gaussian mechanism, with Opacus's analysis and no torch.

Both DP-SGD (one step = one noisy minibatch gradient, each example sampled with probability
``q``) and DP-FedAvg (one step = one flush, each client sampled with probability ``q``) are
compositions of Poisson-subsampled Gaussian mechanisms with noise multiplier ``z``. An
``Accountant`` records ``(z, q, steps)`` and turns them into epsilon at a given delta with one
of Opacus's accountants:

- ``"rdp"``: Rényi DP (Mironov et al.), Opacus's ``RDPAccountant``: a valid upper bound, a
  little loose.
- ``"prv"``: numerical composition of privacy loss random variables (Gopi et al.), Opacus's
  ``PRVAccountant``: tighter; returns the upper end of its error interval.

The numbers are Opacus's own: the analysis is Opacus 1.6.0's, vendored in
``fedlink.privacy._vendor_opacus`` because importing anything from ``opacus`` imports torch
and the coordinator (which enforces the budget) must not. The history is merged exactly as
Opacus's accountants merge it (consecutive steps with equal ``(z, q)`` become one entry), so
``epsilon`` equals what ``opacus.accountants.RDPAccountant``/``PRVAccountant`` return for the
same steps (tested).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fedlink.errors import ConfigError
from fedlink.privacy._vendor_opacus import rdp as _rdp
from fedlink.privacy._vendor_opacus.prv import (
    Domain,
    PoissonSubsampledGaussianPRV,
    TruncatedPrivacyRandomVariable,
    compose_heterogeneous,
    compute_safe_domain_size,
    discretize,
)

RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)]
                                      + [float(a) for a in range(12, 64)])
"""The Rényi orders Opacus's ``RDPAccountant`` searches (its ``DEFAULT_ALPHAS``)."""

History = list[tuple[float, float, int]]
"""``(noise_multiplier, sample_rate, steps)`` entries, oldest first."""


@functools.lru_cache(maxsize=64)
def _rdp_per_step(q: float, z: float) -> np.ndarray:
    """RDP of one step at every order in ``RDP_ORDERS`` (slow to compute: cached)."""
    return np.asarray(_rdp.compute_rdp(q=q, noise_multiplier=z, steps=1,
                                       orders=list(RDP_ORDERS)), dtype=np.float64)


def _rdp_epsilon(history: History, delta: float) -> float:
    """``RDPAccountant.get_epsilon(delta)`` for ``history``.

    Opacus computes ``compute_rdp(q, z, steps)`` as the one-step RDP times ``steps``; the
    one-step vector is cached per ``(q, z)``, which gives the same numbers.
    """
    total: Any = sum(_rdp_per_step(q, z) * n for z, q, n in history)
    eps, _ = _rdp.get_privacy_spent(orders=list(RDP_ORDERS), rdp=total, delta=delta)
    return float(eps)


def _prv_epsilon(history: History, delta: float, eps_error: float = 0.01) -> float:
    """``PRVAccountant.get_epsilon(delta)`` (upper bound) for ``history``."""
    delta_error = delta / 1000
    prvs = [PoissonSubsampledGaussianPRV(q, z) for z, q, _ in history]
    counts = [n for _, _, n in history]
    size = compute_safe_domain_size(prvs=prvs, max_self_compositions=counts,
                                    eps_error=eps_error, delta_error=delta_error)
    mesh = eps_error / np.sqrt(sum(counts) * np.log(12 / delta_error) / 2)
    domain = Domain.create_aligned(-size, size, mesh)
    truncated = [TruncatedPrivacyRandomVariable(p, domain.t_min, domain.t_max) for p in prvs]
    composed = compose_heterogeneous(dprvs=[discretize(t, domain) for t in truncated],
                                     num_self_compositions=counts)
    _, _, eps_upper = composed.compute_epsilon(delta, delta_error, eps_error)
    return float(eps_upper)


_EPSILON: dict[str, Callable[[History, float], float]] = {"rdp": _rdp_epsilon,
                                                          "prv": _prv_epsilon}
ACCOUNTANTS: tuple[str, ...] = tuple(sorted(_EPSILON))
"""Names of the selectable accountants."""


def check_accountant(name: str, what: str = "accountant") -> str:
    """``name`` if it is a known accountant, else ``ConfigError``."""
    if name not in _EPSILON:
        raise ConfigError(f"{what}: unknown accountant {name!r}; known: {', '.join(ACCOUNTANTS)}")
    return name


def check_mechanism(noise_multiplier: float, sample_rate: float, delta: float) -> None:
    """``ConfigError`` unless ``z > 0``, ``0 < q <= 1`` and ``0 < delta < 1``."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ConfigError(f"noise_multiplier: must be finite and > 0, got {noise_multiplier}")
    if not (0 < sample_rate <= 1):
        raise ConfigError(f"sample_rate: must be in (0, 1], got {sample_rate}")
    if not (0 < delta < 1):
        raise ConfigError(f"delta: must be in (0, 1), got {delta}")


class Accountant:
    """Composition of Poisson-subsampled Gaussian mechanisms; epsilon at any delta.

    ``step`` records one mechanism invocation (or ``n``); ``epsilon(delta)`` is the privacy
    spent so far (0 before any step). ``epsilon_after(n, z, q, delta)`` is what it would be
    after ``n`` more steps, without recording them (budget checks).
    """

    def __init__(self, kind: str = "rdp") -> None:
        self.kind = check_accountant(kind)
        self.history: History = []

    @property
    def steps(self) -> int:
        """Number of steps recorded."""
        return sum(n for _, _, n in self.history)

    def step(self, noise_multiplier: float, sample_rate: float, n: int = 1) -> None:
        """Record ``n`` steps with noise multiplier ``z`` and sampling rate ``q``."""
        self.history = _merged(self.history, noise_multiplier, sample_rate, n)

    def epsilon(self, delta: float) -> float:
        """Epsilon spent so far at ``delta`` (0.0 before the first step)."""
        return _EPSILON[self.kind](self.history, delta) if self.history else 0.0

    def epsilon_after(self, n: int, noise_multiplier: float, sample_rate: float,
                      delta: float) -> float:
        """Epsilon at ``delta`` after ``n`` more steps of ``(z, q)`` (nothing recorded)."""
        history = _merged(self.history, noise_multiplier, sample_rate, n)
        return _EPSILON[self.kind](history, delta) if history else 0.0

    def state_dict(self) -> dict[str, Any]:
        """The accountant's kind and history (JSON-ready)."""
        return {"kind": self.kind, "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.kind = check_accountant(str(state["kind"]))
        self.history = [(float(z), float(q), int(n)) for z, q, n in state["history"]]


def _merged(history: History, z: float, q: float, n: int) -> History:
    """``history`` plus ``n`` steps of ``(z, q)``, merged into the last entry as Opacus does."""
    if n <= 0:
        return list(history)
    if history and history[-1][0] == z and history[-1][1] == q:
        return [*history[:-1], (z, q, history[-1][2] + n)]
    return [*history, (float(z), float(q), int(n))]


def epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
            accountant: str = "rdp") -> float:
    """Epsilon at ``delta`` after ``steps`` steps of the sampled Gaussian mechanism."""
    check_mechanism(noise_multiplier, sample_rate, delta)
    acc = Accountant(accountant)
    acc.step(noise_multiplier, sample_rate, steps)
    return acc.epsilon(delta)
