"""Accounting: fedlink's torch-free epsilon (dp-accounting) agrees with Opacus's accountants
where Opacus is installed (RDP to 1e-4 relative, PRV/PLD to 1%); the budget stops runs."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from fedlink.aggregate import FlushInfo, UpdateInfo
from fedlink.coordinator import CoordinatorConfig, FlushRule, RoundEngine
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.errors import ConfigError
from fedlink.messages import Finished, Task
from fedlink.metrics import EventLog
from fedlink.privacy import Accountant, DPFedAvgHook, epsilon

TOLERANCE = {"rdp": 1e-4, "prv": 0.01}
"""Relative agreement with Opacus: dp-accounting's RDP differs only at fractional orders, and
only upwards (3.2e-6 in the reference setting; see the fractional-order test below); its PLD
and Opacus's PRV are two numerical methods (0.13% in the reference setting)."""


def opacus_accountant(kind: str) -> Any:
    """A fresh Opacus accountant of ``kind`` (the test is skipped without Opacus)."""
    accountants = pytest.importorskip("opacus.accountants")
    return {"rdp": accountants.RDPAccountant, "prv": accountants.PRVAccountant}[kind]()


@pytest.mark.parametrize("kind", ["rdp", "prv"])
def test_epsilon_equals_opacus_for_the_reference_setting(kind: str) -> None:
    opacus = opacus_accountant(kind)
    for _ in range(10_000):
        opacus.step(noise_multiplier=1.1, sample_rate=0.01)

    ours = epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=10_000, delta=1e-5,
                   accountant=kind)

    assert ours == pytest.approx(opacus.get_epsilon(delta=1e-5), rel=TOLERANCE[kind])
    assert ours == pytest.approx({"rdp": 5.63, "prv": 5.20}[kind], abs=0.01)


@pytest.mark.parametrize(("kind", "expected"), [("rdp", 5.632), ("prv", 5.196)])
def test_epsilon_of_the_reference_setting_without_opacus(kind: str, expected: float) -> None:
    ours = epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=10_000, delta=1e-5,
                   accountant=kind)
    assert ours == pytest.approx(expected, abs=0.001)


@pytest.mark.parametrize("kind", ["rdp", "prv"])
def test_mixed_histories_match_opacus(kind: str) -> None:
    ours, opacus = Accountant(kind), opacus_accountant(kind)
    for z, q, n in [(1.0, 0.1, 20), (2.0, 0.1, 5), (1.0, 0.2, 30)]:
        ours.step(z, q, n)
        for _ in range(n):
            opacus.step(noise_multiplier=z, sample_rate=q)
    assert ours.history == opacus.history
    assert ours.epsilon(1e-6) == pytest.approx(opacus.get_epsilon(delta=1e-6),
                                               rel=TOLERANCE[kind])


def _both(history: list[tuple[float, float, int]], delta: float) -> tuple[float, float, float]:
    """(ours, Opacus's, Opacus's optimal order) for ``history`` under RDP at ``delta``."""
    ours, opacus = Accountant("rdp"), opacus_accountant("rdp")
    for z, q, n in history:
        ours.step(z, q, n)
        for _ in range(n):
            opacus.step(noise_multiplier=z, sample_rate=q)
    theirs, order = opacus.get_privacy_spent(delta=delta)
    return ours.epsilon(delta), float(theirs), float(order)


@pytest.mark.parametrize("history", [[(1.0, 0.2, 30)], [(2.0, 0.1, 5)],
                                     [(1.0, 0.1, 20), (2.0, 0.1, 5), (1.0, 0.2, 30)]])
def test_rdp_equals_opacus_when_the_optimal_order_is_an_integer(
        history: list[tuple[float, float, int]]) -> None:
    ours, theirs, order = _both(history, 1e-6)
    assert order.is_integer()
    assert ours == pytest.approx(theirs, rel=1e-12)


@pytest.mark.parametrize(("z", "q", "steps", "delta", "above"), [
    (1.1, 0.01, 10_000, 1e-5, 1e-5),   # the reference setting: order 4.7, 3.2e-6 above
    (1.5, 0.02, 3_000, 1e-6, 1e-7),    # order 6.5, 1.9e-8 above
    (0.8, 0.05, 200, 1e-5, 2e-3),      # order 2.9, 1.3e-3 above
])
def test_rdp_at_a_fractional_optimal_order_is_never_below_opacus(
        z: float, q: float, steps: int, delta: float, above: float) -> None:
    # dp-accounting sums the magnitudes of the series' terms where Opacus keeps their signs
    ours, theirs, order = _both([(z, q, steps)], delta)
    assert not order.is_integer()
    assert theirs <= ours <= theirs * (1 + above)


def test_accountant_state_round_trips_and_peeks_without_recording() -> None:
    acc = Accountant("rdp")
    assert acc.epsilon(1e-5) == 0.0
    acc.step(1.0, 0.5, 3)
    after = acc.epsilon_after(2, 1.0, 0.5, 1e-5)
    assert acc.steps == 3 and after > acc.epsilon(1e-5)
    restored = Accountant()
    restored.load_state_dict(acc.state_dict())
    restored.step(1.0, 0.5, 2)
    assert restored.epsilon(1e-5) == pytest.approx(after)


def test_the_coordinator_side_imports_no_torch() -> None:
    code = ("import sys, fedlink.coordinator, fedlink.privacy, fedlink.privacy.accounting; "
            "from fedlink.aggregate import FLUSH_HOOKS; assert 'dp_fedavg' in FLUSH_HOOKS; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'opacus')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def _engine(max_epsilon: float, rounds: int = 50, accountant: str = "rdp") -> RoundEngine:
    hook = {"name": "dp_fedavg", "clip_norm": 1.0, "noise_multiplier": 1.5,
            "sample_rate": 0.2, "delta": 1e-5, "max_epsilon": max_epsilon,
            "accountant": accountant}
    config = CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=1, deadline_s=None),
                               hooks=(hook,))
    return RoundEngine(config, np.zeros(4, np.float32), EventLog(None), clock=lambda: 0.0)


def _run_until_finished(engine: RoundEngine) -> tuple[list[dict[str, object]], str]:
    reports = []
    while True:
        reply = engine.issue("a")
        if isinstance(reply, Finished):
            return reports, reply.reason
        assert isinstance(reply, Task)
        acceptance = engine.submit(ReceivedUpdate("a", reply.task_id, reply.model_version,
                                                  np.full(4, 0.1, np.float32), 1, 1, 1, 16))
        assert acceptance.flush is not None
        reports.append(dict(acceptance.flush.hook_report))


@pytest.mark.parametrize("kind", ["rdp", "prv"])
def test_a_small_budget_stops_the_run_at_the_last_affordable_flush(kind: str) -> None:
    max_epsilon = 2.0
    opacus = opacus_accountant(kind)
    affordable = 0
    while True:  # Opacus's own answer: how many flushes fit under max_epsilon
        opacus.step(noise_multiplier=1.5, sample_rate=0.2)
        if opacus.get_epsilon(delta=1e-5) > max_epsilon:
            break
        affordable += 1
    assert 1 <= affordable < 50

    reports, reason = _run_until_finished(_engine(max_epsilon, accountant=kind))

    assert len(reports) == affordable
    epsilons = [float(r["epsilon"]) for r in reports]  # type: ignore[arg-type]
    assert epsilons == sorted(epsilons) and epsilons[-1] <= max_epsilon
    assert "privacy budget exhausted" in reason
    privacy = reports[-1]["privacy"]
    assert isinstance(privacy, dict)
    assert privacy["steps"] == affordable and privacy["accountant"] == kind
    assert privacy["mode"] == "user_central" and privacy["sample_rate"] == 0.2


def test_a_budget_too_small_for_one_flush_issues_no_task() -> None:
    reports, reason = _run_until_finished(_engine(max_epsilon=1.0))
    assert reports == [] and "privacy budget exhausted" in reason


def test_a_flush_past_the_budget_releases_nothing() -> None:
    hook = DPFedAvgHook(noise_multiplier=1.0, sample_rate=0.5, max_epsilon=3.0)
    flush = FlushInfo(1, 1, 1.0)
    while not hook.stop_reason():
        hook.on_flush(np.ones(4, np.float32), flush)
    spent = hook.epsilon
    out = hook.on_flush(np.ones(4, np.float32), flush)  # an update already in flight
    np.testing.assert_array_equal(out, np.zeros(4, np.float32))
    assert hook.epsilon == spent <= 3.0
    assert hook.privacy_record()["flushes_withheld"] == 1


def test_adaptive_clipping_moves_s_toward_the_target_quantile() -> None:
    hook = DPFedAvgHook(clip_norm=1.0, noise_multiplier=0.5, sample_rate=0.1,
                        target_quantile=0.5, cohort=100, population=1000, seed=0)
    assert hook.update_noise_multiplier > hook.noise_multiplier  # the count takes a share
    norms = np.random.default_rng(0).lognormal(mean=1.0, sigma=0.3, size=100)  # median e
    for version in range(1, 80):
        for i, norm in enumerate(norms):
            hook.on_update(UpdateInfo(f"c{i}", 0, 1.0, 1, {
                "dp_clipped": float(norm > hook.clip_norm), "dp_clip_norm": hook.clip_norm}))
        hook.on_flush(np.zeros(2, np.float32), FlushInfo(version, 100, 100.0))
    assert hook.clip_norm == pytest.approx(np.median(norms), rel=0.15)
    assert hook.task_options() == {"dp_clip_norm": repr(hook.clip_norm)}


def test_adaptive_clipping_without_reported_bits_keeps_s() -> None:
    hook = DPFedAvgHook(clip_norm=2.0, noise_multiplier=0.5, sample_rate=0.1,
                        target_quantile=0.5, cohort=100, population=1000)
    hook.on_update(UpdateInfo("c", 0, 1.0, 1, {}))
    hook.on_flush(np.zeros(2, np.float32), FlushInfo(1, 1, 1.0))
    assert hook.clip_norm == 2.0


@pytest.mark.parametrize("options", [
    {},  # no sampling rate
    {"sample_rate": 0.1, "noise_multiplier": 0.0},
    {"sample_rate": 1.5},
    {"sample_rate": 0.1, "delta": 0.0},
    {"sample_rate": 0.1, "accountant": "gdp"},
    {"sample_rate": 0.1, "noise": "server"},
    {"population": 10, "cohort": 20},
    {"sample_rate": 0.1, "target_quantile": 0.5, "cohort": 2, "noise_multiplier": 1.0},
])
def test_bad_hook_options_are_config_errors(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        DPFedAvgHook(**options)  # type: ignore[arg-type]


HISTORIES = [[(1.1, 0.01, 10_000)], [(1.0, 0.0156, 50)], [(0.8, 0.05, 200)],
             [(1.5, 0.02, 3000), (0.7, 0.1, 20), (1.5, 0.02, 7)], [(3.0, 0.5, 8)]]
"""Single and mixed histories, integer and fractional optimal orders, small and large q."""


def fresh_dp_accounting_epsilon(kind: str, history: list[tuple[float, float, int]],
                                delta: float) -> float:
    """The epsilon a fresh dp-accounting accountant gives for ``history`` (the computation
    ``Accountant`` made before it cached anything)."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    from fedlink.privacy.accounting import PLD_GRID, RDP_ORDERS

    accountant = (RdpAccountant(list(RDP_ORDERS)) if kind == "rdp"
                  else PLDAccountant(value_discretization_interval=PLD_GRID))
    accountant.compose(dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), n)
        for z, q, n in history]))
    return float(accountant.get_epsilon(delta))


@pytest.mark.parametrize("kind", ["rdp", "prv"])
@pytest.mark.parametrize("history", HISTORIES)
def test_the_cached_epsilon_is_a_fresh_accountants(
        kind: str, history: list[tuple[float, float, int]]) -> None:
    acc = Accountant(kind)
    for z, q, n in history:
        acc.step(z, q, n)
    for delta in (1e-5, 1e-3):
        expected = fresh_dp_accounting_epsilon(kind, history, delta)
        assert acc.epsilon(delta) == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert acc.epsilon(delta) == pytest.approx(expected, rel=1e-9, abs=1e-9)  # cached


def test_rdp_computes_the_one_step_rdp_once_per_mechanism(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from fedlink.privacy import accounting

    calls: list[tuple[float, float]] = []
    original = rdp._compute_rdp_poisson_subsampled_gaussian

    def counting(q: float, noise_multiplier: float, orders: Any) -> Any:
        calls.append((q, noise_multiplier))
        return original(q=q, noise_multiplier=noise_multiplier, orders=orders)

    monkeypatch.setattr(rdp, "_compute_rdp_poisson_subsampled_gaussian", counting)
    accounting._one_step_rdp.cache_clear()
    acc = Accountant("rdp")
    for _ in range(20):  # a client's tasks: steps, then a report
        acc.step(1.0, 0.03, 50)
        acc.epsilon(1e-5)
        acc.epsilon_after(50, 1.0, 0.03, 1e-5)
    acc.step(0.9, 0.03, 5)
    acc.epsilon(1e-5)
    assert calls == [(0.03, 1.0), (0.03, 0.9)]
