"""LinkProfile and GilbertElliott: validation names the field and its range; dict round trips."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

from fedlink.errors import ConfigError
from fedlink.netem import PRESETS, GilbertElliott, LinkProfile

# field, bad value, fragments the message must contain (field name first, then the range)
BAD_FIELDS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("latency_ms", -1.0, ("latency_ms", "[0.0, 60000.0]", "-1.0")),
    ("latency_ms", 60_001, ("latency_ms", "[0.0, 60000.0]")),
    ("jitter_ms", -0.5, ("jitter_ms", "[0.0, 60000.0]")),
    ("up_kbps", 0, ("up_kbps", "(0.0, inf)")),
    ("down_kbps", -10, ("down_kbps", "(0.0, inf)")),
    ("reset_every_kb", 0, ("reset_every_kb", "(0.0, inf)")),
    ("reset_every_s", -1, ("reset_every_s", "(0.0, inf)")),
    ("limit_data_kb", 0, ("limit_data_kb", "(0.0, inf)")),
    ("loss_up", 1.5, ("loss_up", "[0.0, 1.0]", "1.5")),
    ("loss_down", -0.1, ("loss_down", "[0.0, 1.0]")),
    ("latency_ms", math.nan, ("latency_ms", "[0.0, 60000.0]")),
    ("latency_ms", "fast", ("latency_ms", "expected a number", "'fast'")),
    ("up_kbps", True, ("up_kbps", "expected a number")),
    ("seed", -1, ("seed", ">= 0")),
    ("seed", 1.5, ("seed", "integer")),
    ("seed", True, ("seed", "integer")),
    ("name", "", ("name", "non-empty")),
    ("name", 3, ("name", "string")),
    ("trace_up", 5, ("trace_up", "trace file path")),
    ("trace_down", "", ("trace_down", "trace file path")),
    ("burst_loss", 0.3, ("burst_loss", "p, r")),
]


@pytest.mark.parametrize(("field", "value", "fragments"), BAD_FIELDS,
                         ids=[f"{f}={v!r}" for f, v, _ in BAD_FIELDS])
def test_invalid_field_names_field_and_range(field: str, value: Any,
                                             fragments: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        LinkProfile(**{field: value})
    message = str(info.value)
    assert message.startswith(field), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize(("kwargs", "fragments"), [
    ({"p": 1.2, "r": 0.5}, ("burst_loss.p", "[0.0, 1.0]")),
    ({"p": 0.1, "r": 0.0}, ("burst_loss.r", "(0.0, 1.0]")),
    ({"p": 0.1, "r": 0.5, "loss_good": -0.1}, ("burst_loss.loss_good", "[0.0, 1.0]")),
    ({"p": 0.1, "r": 0.5, "loss_bad": 1.01}, ("burst_loss.loss_bad", "[0.0, 1.0]")),
])
def test_gilbert_elliott_validation(kwargs: dict[str, float],
                                    fragments: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        GilbertElliott(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_blackout_fields_must_come_together() -> None:
    with pytest.raises(ConfigError, match=r"^blackout_s: must be > 0 when blackout_every_s"):
        LinkProfile(blackout_every_s=10)
    with pytest.raises(ConfigError, match=r"^blackout_s: needs blackout_every_s"):
        LinkProfile(blackout_s=2)
    assert LinkProfile(blackout_every_s=10, blackout_s=2).blackout_s == 2


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="latency_ms"):
        LinkProfile(latency_ms=-1)


def test_defaults_mean_no_impairment() -> None:
    profile = LinkProfile()
    assert profile.latency_ms == 0 and profile.jitter_ms == 0
    assert profile.up_kbps is None and profile.down_kbps is None
    assert profile.blackout_every_s is None and profile.reset_every_kb is None
    assert profile.packet_only_fields == ()


def test_profile_is_frozen_and_replace_validates() -> None:
    profile = LinkProfile(latency_ms=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.latency_ms = 5  # type: ignore[misc]
    assert profile.replace(latency_ms=20).latency_ms == 20
    with pytest.raises(ConfigError, match="latency_ms"):
        profile.replace(latency_ms=-20)
    assert profile.with_seed(9).seed == 9
    assert profile.with_seed(9).replace(seed=0) == profile


@pytest.mark.parametrize(("ge", "expected"), [
    (GilbertElliott(p=0.01, r=0.25), 0.01 / 0.26),
    (GilbertElliott(p=0.0, r=0.5, loss_good=0.02), 0.02),
    (GilbertElliott(p=0.1, r=0.1, loss_good=0.0, loss_bad=0.5), 0.25),
    (GilbertElliott(p=1.0, r=1.0, loss_good=0.2, loss_bad=0.6), 0.4),
])
def test_gilbert_elliott_mean_loss_formula(ge: GilbertElliott, expected: float) -> None:
    assert ge.mean_loss == pytest.approx(expected)


def test_gilbert_elliott_mean_loss_matches_the_chain() -> None:
    ge = GilbertElliott(p=0.02, r=0.2, loss_good=0.01, loss_bad=0.7)
    rng, bad, lost, steps = random.Random(1), False, 0, 200_000
    for _ in range(steps):
        lost += rng.random() < (ge.loss_bad if bad else ge.loss_good)
        bad = rng.random() >= ge.r if bad else rng.random() < ge.p
    assert lost / steps == pytest.approx(ge.mean_loss, rel=0.05)


FULL = LinkProfile(name="everything", latency_ms=12.5, jitter_ms=3, up_kbps=500, down_kbps=900,
                   reset_every_kb=256, reset_every_s=30, blackout_every_s=20, blackout_s=2,
                   limit_data_kb=1024, loss_up=0.01, loss_down=0.02,
                   burst_loss=GilbertElliott(p=0.01, r=0.3, loss_good=0.001, loss_bad=0.8),
                   trace_up="up.trace", trace_down="down.trace", seed=42)


@pytest.mark.parametrize("profile", [LinkProfile(), FULL, *PRESETS.values()],
                         ids=lambda p: p.name)
def test_dict_round_trip(profile: LinkProfile) -> None:
    table = profile.to_dict()
    assert LinkProfile.from_dict(table) == profile


def test_to_dict_leaves_out_defaults_and_is_plain() -> None:
    assert LinkProfile().to_dict() == {"name": "custom"}
    table = LinkProfile(name="x", latency_ms=5, burst_loss=GilbertElliott(p=0.1, r=0.5)).to_dict()
    assert table == {"name": "x", "latency_ms": 5,
                     "burst_loss": {"p": 0.1, "r": 0.5, "loss_good": 0.0, "loss_bad": 1.0}}


def test_from_dict_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match=r"unknown link profile keys \['latency'\]"):
        LinkProfile.from_dict({"latency": 5})
    with pytest.raises(ConfigError, match=r"^burst_loss:"):
        LinkProfile.from_dict({"burst_loss": {"p": 0.1}})
    with pytest.raises(ConfigError, match=r"^burst_loss\.p:"):
        LinkProfile.from_dict({"burst_loss": {"p": 2, "r": 0.5}})
    with pytest.raises(ConfigError, match="must be a table"):
        LinkProfile.from_dict([("latency_ms", 5)])  # type: ignore[arg-type]


def test_from_dict_name_argument_is_a_default() -> None:
    assert LinkProfile.from_dict({"latency_ms": 1}, name="a").name == "a"
    assert LinkProfile.from_dict({"name": "b"}, name="a").name == "b"


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, ()),
    ({"latency_ms": 50, "up_kbps": 100, "blackout_every_s": 5, "blackout_s": 1}, ()),
    ({"loss_up": 0.05}, ("loss_up",)),
    ({"loss_down": 0.05}, ("loss_down",)),
    ({"burst_loss": GilbertElliott(p=0.1, r=0.5)}, ("burst_loss",)),
    ({"trace_down": "t.trace"}, ("trace_down",)),
])
def test_packet_only_fields(kwargs: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert LinkProfile(**kwargs).packet_only_fields == expected


def test_packet_only_fields_lists_all_in_field_order() -> None:
    assert FULL.packet_only_fields == ("loss_up", "loss_down", "burst_loss", "trace_up",
                                       "trace_down")
