"""The link-following timeouts (``fedlink.client.liveness``): the rule and its bounds."""

from __future__ import annotations

import pytest

from fedlink.client.liveness import LinkEstimate, LivenessConfig, is_no_reply
from fedlink.errors import ConfigError

CFG = LivenessConfig(min_ping_timeout_s=5.0, max_ping_timeout_s=120.0, rtt_multiple=4.0,
                     widen_factor=3.0, max_deadline_s=300.0)


def test_a_short_link_keeps_the_minimum_so_silence_is_noticed_fast() -> None:
    link = LinkEstimate(CFG, queued_bytes=2 << 20)
    for _ in range(5):
        link.observe_rtt(0.05)
    link.observe_transfer(8 << 20, 0.1)  # 80 MB/s: draining a chunk is instant
    assert link.ping_timeout_s() == 5.0
    assert link.unary_deadline_s(30.0) == 30.0


def test_a_long_link_gets_a_few_round_trips_and_the_deadlines_follow() -> None:
    link = LinkEstimate(CFG)
    link.observe_rtt(15.0)  # a Join over a 10 s RTT link (connection set-up included)
    assert link.ping_timeout_s() == 60.0
    assert link.unary_deadline_s(30.0) == 60.0


def test_a_busy_slow_downlink_adds_the_time_to_drain_what_is_queued() -> None:
    link = LinkEstimate(CFG, queued_bytes=2 << 20)
    link.observe_rtt(0.2)
    link.observe_transfer(1_200_000, 9.6)  # 1 Mbit/s
    # 4 x 0.2 s + 2 MiB at 125 kB/s: the ack may wait behind that much data
    assert link.ping_timeout_s() == pytest.approx(0.8 + (2 << 20) / 125_000)


def test_no_reply_widens_within_bounds_and_success_shrinks_it_back() -> None:
    link = LinkEstimate(CFG)
    widened = []
    for _ in range(5):
        link.no_reply()
        widened.append(link.ping_timeout_s())
    assert widened == [15.0, 45.0, 120.0, 120.0, 120.0]  # capped at max_ping_timeout_s
    assert link.unary_deadline_s(30.0) <= 300.0
    for _ in range(4):
        link.succeeded()
    assert link.ping_timeout_s() == 5.0


def test_no_reply_means_a_ping_timeout_or_a_missed_deadline() -> None:
    assert is_no_reply("UNAVAILABLE", "Stream removed (ping timeout)")
    assert is_no_reply("DEADLINE_EXCEEDED", "Deadline Exceeded")
    assert not is_no_reply("UNAVAILABLE", "failed to connect to all addresses")


def test_bounds_are_checked_at_the_edge() -> None:
    with pytest.raises(ConfigError, match="max_ping_timeout_s"):
        LivenessConfig(min_ping_timeout_s=10.0, max_ping_timeout_s=5.0)
    with pytest.raises(ConfigError, match="tcp_user_timeout_s"):
        LivenessConfig(max_ping_timeout_s=60.0, tcp_user_timeout_s=30.0)
    with pytest.raises(ConfigError, match="unknown keys"):
        LivenessConfig.from_dict({"ping": 1})


def test_a_channel_gets_the_timeout_rounded_up_to_a_power_of_two_step() -> None:
    cfg = LivenessConfig(min_ping_timeout_s=5.0, max_ping_timeout_s=120.0, rtt_multiple=4.0)
    link = LinkEstimate(cfg)
    assert link.channel_ping_timeout_s() == 5.0  # nothing learned: the minimum
    link.observe_rtt(1.6)  # asks for 6.4 s
    assert link.ping_timeout_s() == pytest.approx(6.4)
    assert link.channel_ping_timeout_s() == 10.0
    other = LinkEstimate(cfg)
    other.observe_rtt(2.4)  # asks for 9.6 s: a similar link, the same channel options
    assert other.channel_ping_timeout_s() == link.channel_ping_timeout_s()
    link.observe_rtt(100.0)
    assert link.channel_ping_timeout_s() == 120.0  # capped at the maximum, not 160


def test_the_rounded_timeout_never_undercuts_what_the_link_asks_for() -> None:
    cfg = LivenessConfig()
    for rtt in (0.01, 0.3, 1.25, 1.26, 2.5, 7.0, 19.9, 29.0):
        link = LinkEstimate(cfg)
        link.observe_rtt(rtt)
        assert link.ping_timeout_s() <= link.channel_ping_timeout_s() <= cfg.max_ping_timeout_s
