"""Privacy accounting for the sampled Gaussian mechanism, with Google's ``dp-accounting``.

Both DP-SGD (one step = one noisy minibatch gradient, each example sampled with probability
``q``) and DP-FedAvg (one step = one flush, each client sampled with probability ``q``) are
compositions of Poisson-subsampled Gaussian mechanisms with noise multiplier ``z``. An
``Accountant`` records ``(z, q, steps)`` and turns them into epsilon at a given delta:

- ``"rdp"``: Rényi DP (Mironov et al.), ``dp_accounting.rdp.RdpAccountant`` over the orders
  Opacus's ``RDPAccountant`` searches (its ``DEFAULT_ALPHAS``), with the same RDP-to-(epsilon,
  delta) conversion (Balle et al. 2020, Theorem 21: ``rdp + log1p(-1/a) - log(delta a)/(a-1)``;
  dp-accounting's ``compute_epsilon`` and Opacus's ``get_privacy_spent`` evaluate the same
  expression). A valid upper bound, a little loose. Equal to Opacus's when the optimal order
  is an integer (to 1e-13). At a fractional order the two libraries evaluate the series for
  ``log A_alpha`` (Mironov et al. 2019, Sec. 3.3) differently: Opacus sums it with the signs of
  the binomial coefficients ``binom(alpha, i)``, which alternate from ``i = floor(alpha) + 2``;
  dp-accounting adds every term's magnitude, a larger upper bound. So the epsilon is never
  below Opacus's, and above it when the optimum is fractional: 3.2e-6 relative in the
  reference setting below (order 4.7; its RDP 5.8e-6 above), 1.9e-8 for z = 1.5, q = 0.02,
  3,000 steps (order 6.5), but 1.3e-3 for z = 0.8, q = 0.05, 200 steps (order 2.9, where the
  negative terms weigh more). Matching Opacus there to 1e-6 would mean evaluating the signed
  series here, i.e. vendoring that part of Opacus again.
- ``"prv"``: numerical composition of privacy loss distributions,
  ``dp_accounting.pld.PLDAccountant`` (pessimistic estimate, value grid 1e-3): the same
  kind of tight numerical answer as Opacus's ``PRVAccountant`` (Gopi et al.), within 1% of it.

Cached: the RDP of a history is the sum of ``steps * one-step RDP`` over its entries, and the
one-step RDP of each ``(z, q)`` at the orders is computed once per process (the 151-order
series is what costs, tens of ms); a PLD entry is the one-step PLD (cached) self-convolved
``steps`` times (cached per ``(z, q, steps)``), and an unchanged history's PRV epsilon is
memoised. Both perform the same float operations as a fresh dp-accounting accountant, so
the epsilon is bit-for-bit the same; only the repeated work is gone.

``dp-accounting`` needs numpy and scipy but not torch, so the coordinator (which enforces the
budget) accounts without torch; it is imported when an epsilon is first asked for, so that
``import fedlink.privacy`` stays light. The history is merged exactly as Opacus's accountants
merge it (consecutive steps with equal ``(z, q)`` become one entry). Reference: q = 0.01,
z = 1.1, 10,000 steps, delta = 1e-5 gives 5.632 (rdp; Opacus 5.632) and 5.196 (prv; Opacus
5.20).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

from fedlink.errors import ConfigError

RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)]
                                      + [float(a) for a in range(12, 64)])
"""The Rényi orders Opacus's ``RDPAccountant`` searches (its ``DEFAULT_ALPHAS``)."""

PLD_GRID = 1e-3
"""``value_discretization_interval`` of the PLD accountant: epsilon within 1% of Opacus's PRV
in about 0.1 s for 10,000 steps (1e-4 moves it by under 0.1% and costs ten times as long)."""

History = list[tuple[float, float, int]]
"""``(noise_multiplier, sample_rate, steps)`` entries, oldest first."""


class _SkippedOrders(logging.Filter):
    """Drops dp-accounting's note that a fractional order did not converge and was skipped
    (expected for small orders at large ``q``; it would repeat at every flush)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


def _quiet_skipped_orders() -> None:
    """Install ``_SkippedOrders`` on absl's logger once."""
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _SkippedOrders) for f in absl.filters):
        absl.addFilter(_SkippedOrders())


@functools.lru_cache(maxsize=256)
def _one_step_rdp(noise_multiplier: float, sample_rate: float,
                  orders: tuple[float, ...]) -> Any:
    """RDP at ``orders`` of one Poisson-sampled Gaussian step (read-only numpy vector).

    The expensive part of an RDP epsilon (the ``log A_alpha`` series at 151 orders, about
    40 ms); a client's history has one or a few distinct ``(z, q)``, so it is computed once.
    """
    import numpy as np
    from dp_accounting.rdp.rdp_privacy_accountant import (
        _compute_rdp_poisson_subsampled_gaussian,
    )

    _quiet_skipped_orders()
    rdp = _compute_rdp_poisson_subsampled_gaussian(
        q=sample_rate, noise_multiplier=noise_multiplier, orders=np.array(list(orders)))
    rdp = np.asarray(rdp, dtype=np.float64)
    rdp.setflags(write=False)  # shared by every caller: nobody may add into it
    return rdp


def _composed_rdp(history: History, orders: tuple[float, ...]) -> Any:
    """RDP of ``history``: the sum of ``steps * one-step RDP`` over its entries.

    The same float operations, in the same order, as ``dp_accounting``'s ``RdpAccountant``
    composing ``ComposedDpEvent([SelfComposedDpEvent(PoissonSampledDpEvent(q, Gaussian(z)),
    n), ...])`` (it starts from zeros and adds ``count * rdp`` per entry), so the epsilon is
    bit-for-bit the one a fresh accountant gives.
    """
    import numpy as np

    rdp = np.zeros(len(orders), dtype=np.float64)
    for z, q, n in history:
        rdp += n * _one_step_rdp(float(z), float(q), orders)
    return rdp


def _rdp_epsilon(history: History, delta: float) -> float:
    """Epsilon at ``delta`` of ``history`` under RDP (orders ``RDP_ORDERS``)."""
    import numpy as np
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rdp = _composed_rdp(history, RDP_ORDERS)
    return float(compute_epsilon(np.array(list(RDP_ORDERS)), rdp, delta)[0])


@functools.lru_cache(maxsize=64)
def _one_step_pld(noise_multiplier: float, sample_rate: float, grid: float) -> Any:
    """PLD of one Poisson-sampled Gaussian step (pessimistic, value grid ``grid``)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(standard_deviation=noise_multiplier,
                                       value_discretization_interval=grid,
                                       sampling_prob=sample_rate)


@functools.lru_cache(maxsize=64)
def _self_composed_pld(noise_multiplier: float, sample_rate: float, steps: int,
                       grid: float) -> Any:
    """PLD of ``steps`` steps: the one-step PLD self-convolved ``steps`` times (PLDs are
    immutable, so the cached object is shared safely)."""
    return _one_step_pld(noise_multiplier, sample_rate, grid).self_compose(steps)


@functools.lru_cache(maxsize=256)
def _prv_epsilon_of(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """``_prv_epsilon`` of a hashable history (memoised: an unchanged history is not
    recomposed, e.g. a budget check followed by the report)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    # As dp-accounting's PLDAccountant: identity, then compose each entry's self-composition
    # (entries with q == 0 are no-ops there too).
    composed = pld.identity(value_discretization_interval=PLD_GRID)
    for z, q, n in history:
        if q == 0:
            continue
        if z == 0:  # no noise: not private at all
            return math.inf
        composed = composed.compose(_self_composed_pld(z, q, n, PLD_GRID))
    return float(composed.get_epsilon_for_delta(delta))


def _prv_epsilon(history: History, delta: float) -> float:
    """Epsilon at ``delta`` of ``history`` by numerical PLD composition (an upper bound)."""
    return _prv_epsilon_of(tuple((float(z), float(q), int(n)) for z, q, n in history), delta)


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
