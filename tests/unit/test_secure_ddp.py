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


def spent(*sums: int) -> float:
    """Epsilon after ``sums`` (each a sum's noise shares)."""
    hook = SecureDDPHook(**SETTINGS)
    for shares in sums:
        hook.account(shares)
    return hook.epsilon


def test_sums_withheld_twice_in_a_row_end_the_run_and_a_sum_accounted_resets_the_count(
        ) -> None:
    """Groups that keep closing short of shares (a fleet smaller than the group, dropouts)
    are withheld while a full sum still fits: the second in a row ends the run. Before, such
    a run trained groups it could never unmask, for ever."""
    hook = SecureDDPHook(**SETTINGS, max_epsilon=(spent(8, 8, 8) + spent(8, 8, 6)) / 2)
    for _ in range(2):
        hook.account(8)
        hook.settled()
    assert hook.admits(8) and not hook.admits(6)
    hook.refuse(6)
    assert hook.stop_reason() == "" and hook.wait_reason() == ""  # one can be a dropout
    restored = FLUSH_HOOKS.create("secure_ddp", **SETTINGS, max_epsilon=hook.max_epsilon)
    restored.load_state_dict(hook.state_dict())
    restored.refuse(6)
    assert "the last 2 sums were short of noise shares and withheld" in restored.stop_reason()
    assert restored.privacy_record()["sums_withheld"] == 2
    hook.account(8)  # a sum accounted: the count in a row starts again
    assert hook.state_dict()["withheld_in_a_row"] == 0


def test_a_run_whose_groups_close_at_a_quorum_stops_when_such_a_sum_would_not_fit() -> None:
    """With ``closing_shares`` 6 (a quorum of 0.75 of 8) the run ends once a sum of 6 shares
    would exceed the budget, though a full one of 8 would still fit: it does not train
    groups whose sums it would withhold."""
    one = SecureDDPHook(**SETTINGS)
    one.account(8)
    hook = SecureDDPHook(**SETTINGS, max_epsilon=one.epsilon * 1.001, closing_shares=6)
    assert hook.admits(8) and not hook.admits(6)
    assert "with a sum of 6 noise shares" in hook.stop_reason()
    with pytest.raises(ConfigError, match="closing_shares"):
        SecureDDPHook(**SETTINGS, closing_shares=9)


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
