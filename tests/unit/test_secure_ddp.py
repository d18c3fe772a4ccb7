"""The distributed-DP accountant of secure runs: each unmasked sum accounted with the noise it
carries, the budget checked before a sum is unmasked, and its state surviving a restart."""

from __future__ import annotations

import pytest

pytest.importorskip("cryptography")
pytest.importorskip("dp_accounting")

from fedlink.aggregate import FLUSH_HOOKS
from fedlink.errors import ConfigError
from fedlink.privacy.secure_ddp import SecureDDPHook
from fedlink.secagg import SkellamConfig

SETTINGS = {"noise_multiplier": 1.0, "clip_norm": 1.0, "noise_shares": 8, "size": 500}


def test_full_sums_are_accounted_as_the_skellam_mechanism_composed() -> None:
    hook = SecureDDPHook(**SETTINGS)
    for _ in range(3):
        hook.account(8)
    expected = SkellamConfig(1.0, 1.0, 8, 500, modulus_bits=24).epsilon(3, 1e-5)
    assert hook.epsilon == pytest.approx(expected, rel=1e-12)
    assert hook.privacy_record()["steps"] == 3


def test_a_sum_short_of_shares_carries_less_noise_and_costs_more() -> None:
    full, short = SecureDDPHook(**SETTINGS), SecureDDPHook(**SETTINGS)
    full.account(8)
    short.account(4)
    assert short.epsilon > full.epsilon
    assert short.privacy_record()["sums_short_of_shares"] == 1
    with pytest.raises(ValueError, match="noise shares"):
        full.account(9)  # more shares than the noise was split into: not a sum of this run


def test_the_budget_is_checked_before_a_sum_and_the_run_stops_before_the_next() -> None:
    one = SecureDDPHook(**SETTINGS)
    one.account(8)
    hook = SecureDDPHook(**SETTINGS, max_epsilon=one.epsilon * 1.001)
    assert hook.stop_reason() == ""
    assert not hook.admits(7)  # fewer shares: over the budget
    assert "privacy budget" in hook.refuse(7)
    assert hook.admits(8)
    hook.account(8)
    # spent, but still being unmasked: no new task, and the run waits for its flush
    assert hook.stop_reason() == "" and "waiting for 1 secure sum" in hook.wait_reason()
    hook.settled()
    assert hook.wait_reason() == ""
    assert "privacy budget exhausted" in hook.stop_reason()
    assert hook.privacy_record()["sums_withheld"] == 1


def test_the_accounting_survives_a_restart() -> None:
    hook = SecureDDPHook(**SETTINGS)
    hook.account(8)
    hook.account(5)
    hook.refuse(3)
    restored = FLUSH_HOOKS.create("secure_ddp", **SETTINGS)
    restored.load_state_dict(hook.state_dict())
    assert restored.privacy_record() == hook.privacy_record()


def test_settings_out_of_range_are_refused() -> None:
    with pytest.raises(ConfigError, match="delta"):
        SecureDDPHook(**SETTINGS, delta=0.0)
    with pytest.raises(ConfigError, match="max_epsilon"):
        SecureDDPHook(**SETTINGS, max_epsilon=-1.0)
    with pytest.raises(ConfigError, match="modulus_bits"):
        SecureDDPHook(**SETTINGS, modulus_bits=12)
