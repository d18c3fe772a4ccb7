"""Distributed DP in secure runs: the accountant of the Skellam noise the clients add.

With ``[coordinator.secure] noise_multiplier > 0`` each member of a secure group clips its
update to L2 norm ``clip_norm`` and adds its share of Skellam noise before masking
(``fedlink.secagg.ddp.SkellamConfig``): ``noise_shares`` (``flush.goal``) shares make noise of
standard deviation ``noise_multiplier * clip_norm`` on the sum, the noise of central DP-FedAvg
at the same multiplier. The coordinator adds none and sees only the noised sum.

``SecureDDPHook`` (flush hook ``secure_ddp``, which the coordinator installs itself: it is
not listed in ``[[coordinator.hooks]]``) accounts every sum the coordinator asks its members
to unmask, with the noise that sum really carries: a group whose masked phase closes with
``n`` of ``noise_shares`` members carries ``n / noise_shares`` of the variance, and is
accounted so (Agarwal et al. 2021's Skellam RDP bound, composed over sums, converted by
``dp-accounting``; no sampling amplification is claimed). The secure desk accounts a sum
before it asks for it, not once it is unmasked: the members' answers would let the
coordinator compute it whatever it then did, so a sum that would push epsilon past
``max_epsilon`` is never asked for (the desk loses its group), and ``stop_reason`` ends the
run once one more sum of ``closing_shares`` would (the shares a full group closes its masked
phase with: ``secure.quorum`` of ``noise_shares``), or once ``WITHHELD_TO_STOP`` sums in a
row were withheld (the groups do not come full enough for what the budget has left: a fleet
smaller than ``flush.goal``, dropouts; without it such a run would train groups it can never
unmask, for ever), and every sum asked for has flushed (meanwhile ``wait_reason`` holds new
tasks back). The desk journals ``state_dict`` at each change, ahead of the checkpoints that
also carry it.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

import numpy as np

from fedlink.aggregate import FLUSH_HOOKS, FlushHook, FlushInfo, UpdateInfo
from fedlink.errors import ConfigError

log = logging.getLogger(__name__)

ACCOUNTANT = "skellam_rdp"
"""The name the privacy record gives this accounting."""

WITHHELD_TO_STOP = 2
"""Sums withheld for the budget in a row, with none accounted between, that end the run: one
can be a group a dropout left short, two say the groups do not come full enough."""


@FLUSH_HOOKS.register("secure_ddp")
class SecureDDPHook(FlushHook):
    """Accounts the Skellam noise of each unmasked secure sum and enforces ``max_epsilon``
    (module docstring). ``size``: the values each member sends (the group's kept
    coordinates); ``closing_shares``: the noise shares a full group's sum carries when its
    masked phase closes at the quorum (``noise_shares`` when not given); the others are
    ``SkellamConfig``'s fields."""

    def __init__(self, noise_multiplier: float, clip_norm: float, noise_shares: int,
                 size: int, granularity_bits: int = 16, modulus_bits: int = 24,
                 max_clients: int | None = None, delta: float = 1e-5,
                 max_epsilon: float = 0.0, closing_shares: int | None = None) -> None:
        from fedlink.secagg.ddp import SkellamConfig  # deferred: cryptography is an extra

        try:  # accounted from the first task on: a missing extra fails the start, not the run
            import dp_accounting  # noqa: F401
        except ImportError as exc:
            raise ConfigError("coordinator.secure.noise_multiplier: distributed DP's "
                              "accounting needs the privacy extra (pip install "
                              "'fedlink[privacy]')") from exc
        if not (math.isfinite(delta) and 0 < delta < 1):
            raise ConfigError(f"coordinator.secure.delta: a fraction in (0, 1), got {delta}")
        if not (math.isfinite(max_epsilon) and max_epsilon >= 0):
            raise ConfigError(f"coordinator.secure.max_epsilon: must be >= 0 (0: no budget), "
                              f"got {max_epsilon}")
        try:
            self.skellam = SkellamConfig(clip_norm, noise_multiplier, noise_shares, size,
                                         granularity_bits, modulus_bits, max_clients)
        except ConfigError as exc:
            raise ConfigError(f"coordinator.secure: {exc}") from exc
        self.closing_shares = noise_shares if closing_shares is None else closing_shares
        if not 1 <= self.closing_shares <= noise_shares:
            raise ConfigError(f"secure_ddp closing_shares: 1..{noise_shares}, got "
                              f"{self.closing_shares}")
        self.delta = float(delta)
        self.max_epsilon = float(max_epsilon)
        self._sums: Counter[int] = Counter()  # noise shares in a sum -> sums unmasked
        self._refused = 0
        self._refused_in_a_row = 0
        self._pending = 0  # sums accounted whose group has not flushed or been lost yet
        self._epsilon = 0.0
        self._peeked: dict[int, float] = {}  # shares -> epsilon after one more such sum

    # -- accounting -------------------------------------------------------------------------

    @property
    def epsilon(self) -> float:
        """Epsilon spent so far at ``delta``."""
        return self._epsilon

    @property
    def sums(self) -> int:
        """Sums accounted so far."""
        return sum(self._sums.values())

    def epsilon_with(self, shares: int) -> float:
        """Epsilon once one more sum of ``shares`` noise shares is unmasked (asked before
        every task is issued: remembered until the next sum is accounted)."""
        if shares not in self._peeked:
            self._peeked[shares] = self._epsilon_of(self._sums + Counter({shares: 1}))
        return self._peeked[shares]

    def admits(self, shares: int) -> bool:
        """Whether a sum of ``shares`` noise shares may be unmasked within the budget."""
        return not self.max_epsilon or self.epsilon_with(shares) <= self.max_epsilon

    def refuse(self, shares: int) -> str:
        """Count a sum left masked for the budget; why, for the group's refusal."""
        self._refused += 1
        self._refused_in_a_row += 1
        return (f"privacy budget: unmasking a sum of {shares} noise shares would take epsilon "
                f"from {self._epsilon:.4g} to {self.epsilon_with(shares):.4g} > max_epsilon "
                f"{self.max_epsilon:g}")

    def settled(self) -> None:
        """A sum ``account`` recorded was flushed, or its group lost: it is spent either way,
        and the run no longer waits for it before ending on the budget."""
        self._pending = max(0, self._pending - 1)

    def account(self, shares: int) -> None:
        """Record one sum, about to be unmasked, that carries ``shares`` clients' noise (until
        ``settled``, the run waits for it before ending on the budget)."""
        if not 1 <= shares <= self.skellam.clients:
            raise ValueError(f"a sum carries 1..{self.skellam.clients} noise shares, "
                             f"got {shares}")
        self._sums[shares] += 1
        self._refused_in_a_row = 0
        self._pending += 1
        self._epsilon = self._epsilon_of(self._sums)
        self._peeked = {}
        log.info("secure sum of %d noise shares: epsilon %.4g at delta %g after %d sums",
                 shares, self._epsilon, self.delta, self.sums)

    def _epsilon_of(self, sums: Counter[int]) -> float:
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        from fedlink.secagg.ddp import RDP_ORDERS, skellam_rdp

        if not sums:
            return 0.0
        s = self.skellam
        rdp = np.zeros(len(RDP_ORDERS))
        for shares, count in sums.items():
            variance = s.variance * shares / s.clients
            rdp += count * np.array([skellam_rdp(a, s.norm_bound, s.l1_bound, variance)
                                     for a in RDP_ORDERS])
        return float(compute_epsilon(RDP_ORDERS, rdp, self.delta)[0])

    # -- FlushHook --------------------------------------------------------------------------

    def on_update(self, update: UpdateInfo) -> None:
        """Nothing: the secure desk accounts each sum as it asks for its unmasking."""

    def on_flush(self, mean_delta: np.ndarray, flush: FlushInfo) -> np.ndarray:
        """The mean, unchanged: the clients' noise is already in it."""
        return mean_delta

    def _spent(self) -> bool:
        """No more sums: one of ``closing_shares`` would exceed the budget, or the last
        ``WITHHELD_TO_STOP`` were withheld."""
        return (not self.admits(self.closing_shares)
                or self._refused_in_a_row >= WITHHELD_TO_STOP)

    def stop_reason(self) -> str:
        """Non-empty once the budget is spent (``_spent``) and no sum accounted is still
        being unmasked (it is spent: the run waits for its flush)."""
        if not self._spent() or self._pending:
            return ""
        if self.admits(self.closing_shares):
            return (f"privacy budget exhausted: epsilon {self._epsilon:.4g} after {self.sums} "
                    f"secure sums; the last {self._refused_in_a_row} sums were short of noise "
                    f"shares and withheld, each past max_epsilon {self.max_epsilon:g} (groups "
                    f"do not deliver full enough for the budget left; delta {self.delta:g}, "
                    f"{ACCOUNTANT})")
        return (f"privacy budget exhausted: epsilon {self._epsilon:.4g} after {self.sums} "
                f"secure sums would reach {self.epsilon_with(self.closing_shares):.4g} with a "
                f"sum of {self.closing_shares} noise shares > max_epsilon "
                f"{self.max_epsilon:g} (delta {self.delta:g}, {ACCOUNTANT})")

    def wait_reason(self) -> str:
        """Non-empty while the budget is spent but a sum accounted is still being unmasked:
        no new task could be summed, and the run ends once that sum flushes."""
        if not self._spent() or not self._pending:
            return ""
        return (f"privacy budget spent: waiting for {self._pending} secure sum(s) being "
                f"unmasked before the run ends")

    def report(self) -> dict[str, Any]:
        """``epsilon`` and the ``privacy`` record, on each flush event."""
        return {"epsilon": self._epsilon, "privacy": self.privacy_record()}

    def privacy_record(self) -> dict[str, Any]:
        """The guarantee so far, in ``summary.json``'s ``privacy`` shape."""
        s = self.skellam
        return {"epsilon": self._epsilon, "delta": self.delta,
                "noise_multiplier": s.noise_multiplier, "sample_rate": 1.0,
                "steps": self.sums, "accountant": ACCOUNTANT, "clip_norm": s.clip_norm,
                "mode": "user_distributed", "max_epsilon": self.max_epsilon or None,
                "noise_shares": s.clients, "sums_short_of_shares": self.sums - self._sums[
                    s.clients], "sums_withheld": self._refused}

    def state_dict(self) -> dict[str, Any]:
        """The sums accounted (by their noise shares) and those withheld (in all, and in a
        row since the last sum accounted)."""
        return {"sums": {str(k): v for k, v in self._sums.items()}, "withheld": self._refused,
                "withheld_in_a_row": self._refused_in_a_row}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self._sums = Counter({int(k): int(v) for k, v in state["sums"].items()})
        self._refused = int(state["withheld"])
        self._refused_in_a_row = int(state.get("withheld_in_a_row", 0))
        self._epsilon = self._epsilon_of(self._sums)
        self._peeked = {}
