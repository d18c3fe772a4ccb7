"""Presets: all nine exist, validate, are documented with their real numbers, and are sane."""

from __future__ import annotations

import pytest

import fedlink.netem.presets as presets_module
from fedlink.errors import ConfigError
from fedlink.netem import (
    PRESET_RATIONALE,
    PRESETS,
    LinkProfile,
    describe_preset,
    preset,
    preset_names,
    summarize,
)

NAMES = ("lan", "wifi-good", "wifi-lossy", "4g", "3g", "edge-2g", "satellite", "flaky",
         "commute")


def test_all_nine_presets_in_order() -> None:
    assert preset_names() == NAMES
    assert tuple(PRESETS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_preset_is_a_valid_named_profile(name: str) -> None:
    profile = preset(name)
    assert isinstance(profile, LinkProfile)
    assert profile.name == name
    assert LinkProfile.from_dict(profile.to_dict()) == profile  # passes validation again
    assert profile.jitter_ms <= profile.latency_ms


@pytest.mark.parametrize("name", NAMES)
def test_preset_bandwidth_is_measurable(name: str) -> None:
    profile = preset(name)
    assert profile.up_kbps is not None and profile.down_kbps is not None
    assert min(profile.up_kbps, profile.down_kbps) >= 100
    assert profile.up_kbps <= profile.down_kbps


def _doc_row(name: str) -> list[str]:
    doc = presets_module.__doc__ or ""
    rows = [line.split() for line in doc.splitlines() if line.split()[:1] == [name]]
    assert len(rows) == 1, f"{name} has no row in the presets module docstring table"
    return rows[0]


@pytest.mark.parametrize("name", NAMES)
def test_preset_is_documented_with_its_numbers(name: str) -> None:
    profile = preset(name)
    row = _doc_row(name)
    assert row[1:5] == [f"{profile.latency_ms:g}", f"{profile.jitter_ms:g}",
                        f"{profile.up_kbps:g}", f"{profile.down_kbps:g}"]
    assert len(PRESET_RATIONALE[name]) > 40
    described = describe_preset(name)
    assert described.startswith(f"{name}: {profile.latency_ms:g} ms")
    assert PRESET_RATIONALE[name] in described


def test_latency_ordering() -> None:
    latency = {name: p.latency_ms for name, p in PRESETS.items()}
    assert latency["lan"] < latency["wifi-good"] < latency["4g"] < latency["3g"]
    assert latency["3g"] < latency["edge-2g"] < latency["satellite"]
    assert latency["satellite"] == max(latency.values())
    assert latency["lan"] == min(latency.values())


def test_bandwidth_ordering() -> None:
    down = {name: p.down_kbps or 0 for name, p in PRESETS.items()}
    assert down["lan"] > down["wifi-good"] > down["4g"] > down["3g"] > down["edge-2g"]
    assert down["edge-2g"] == min(down.values())


def test_loss_lives_only_in_packet_fields() -> None:
    for name in ("lan", "wifi-good", "4g"):
        assert PRESETS[name].packet_only_fields == (), name
    lossy = PRESETS["wifi-lossy"]
    assert lossy.burst_loss is not None
    assert lossy.loss_up + lossy.burst_loss.mean_loss > 0.02
    for name in ("wifi-lossy", "3g", "edge-2g", "flaky", "commute"):
        assert {"loss_up", "loss_down"} <= set(PRESETS[name].packet_only_fields), name
    assert all(p.trace_up is None and p.trace_down is None for p in PRESETS.values())


def test_flaky_has_periodic_blackouts() -> None:
    flaky = preset("flaky")
    assert flaky.blackout_every_s is not None
    assert 20 <= flaky.blackout_every_s <= 60
    assert 2 <= flaky.blackout_s <= 10 < flaky.blackout_every_s


def test_commute_has_frequent_short_outages_and_resets() -> None:
    commute, flaky = preset("commute"), preset("flaky")
    assert commute.blackout_every_s is not None and flaky.blackout_every_s is not None
    assert commute.blackout_every_s < flaky.blackout_every_s
    assert 0 < commute.blackout_s < flaky.blackout_s
    assert commute.blackout_s < commute.blackout_every_s / 4
    assert commute.reset_every_s is not None or commute.reset_every_kb is not None


def test_only_flaky_and_commute_black_out_or_reset() -> None:
    for name, profile in PRESETS.items():
        disrupted = (profile.blackout_every_s is not None or profile.reset_every_s is not None
                     or profile.reset_every_kb is not None or profile.limit_data_kb is not None)
        assert disrupted == (name in ("flaky", "commute")), name


def test_presets_mapping_is_read_only() -> None:
    with pytest.raises(TypeError):
        PRESETS["mine"] = LinkProfile()  # type: ignore[index]
    with pytest.raises(TypeError):
        PRESET_RATIONALE["3g"] = "x"  # type: ignore[index]


def test_unknown_preset_lists_the_known_names() -> None:
    with pytest.raises(ConfigError) as info:
        preset("5g")
    message = str(info.value)
    assert "'5g'" in message
    assert all(name in message for name in NAMES)


def test_summarize_describes_any_profile() -> None:
    line = summarize(LinkProfile(name="mine", latency_ms=7, up_kbps=64_000, limit_data_kb=512,
                                 reset_every_kb=100))
    assert line == ("mine: 7 ms +- 0 ms one-way; up 64 Mbit/s, down unlimited; "
                    "resets every ~100 KB; cut after 512 KB")
    assert "blackouts ~5 s every ~30 s" in summarize(preset("flaky"))
