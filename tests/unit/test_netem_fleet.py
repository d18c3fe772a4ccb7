"""Fleets, speed distributions, [network] tables and TOML profile files."""

from __future__ import annotations

import statistics
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fedlink.errors import ConfigError
from fedlink.netem import (
    PRESETS,
    ChoiceSpeed,
    ConstantSpeed,
    Fleet,
    LinkProfile,
    LognormalSpeed,
    allocate,
    load_profile,
    load_profiles_file,
    parse_network,
    preset,
    speed_from_dict,
)

MIX = {"4g": 0.5, "3g": 0.3, "flaky": 0.2}


# ----------------------------------------------------------------------------- allocation


@pytest.mark.parametrize(("weights", "total", "expected"), [
    ([0.5, 0.3, 0.2], 10, [5, 3, 2]),
    ([5, 3, 2], 10, [5, 3, 2]),
    ([0.5, 0.3, 0.2], 7, [4, 2, 1]),
    ([1, 1, 1], 10, [4, 3, 3]),      # ties go to the first listed
    ([1, 1, 1], 2, [1, 1, 0]),
    ([0.1, 0.2, 0.7], 10, [1, 2, 7]),
    ([1, 0, 1], 5, [3, 0, 2]),
    ([0.3, 0.1, 0.6], 5, [2, 0, 3]),  # an exact tie (1.5 vs 0.5), not decided by rounding
    ([0.1, 0.3, 0.6], 5, [1, 1, 3]),
    ([1], 0, [0]),
])
def test_allocate_largest_remainder(weights: list[float], total: int,
                                    expected: list[int]) -> None:
    assert allocate(weights, total) == expected


@pytest.mark.parametrize("total", [1, 3, 10, 99, 1000])
def test_allocate_sums_to_total_and_stays_within_one(total: int) -> None:
    weights = [0.37, 0.21, 0.29, 0.13]
    counts = allocate(weights, total)
    assert sum(counts) == total
    assert all(abs(c - w * total) < 1 for c, w in zip(counts, weights, strict=True))


# ----------------------------------------------------------------------------- sampling


def test_exact_proportions() -> None:
    fleet = Fleet(mix=MIX, seed=1)
    assert fleet.counts(10) == {"4g": 5, "3g": 3, "flaky": 2}
    clients = fleet.sample(10)
    assert Counter(c.profile_name for c in clients) == {"4g": 5, "3g": 3, "flaky": 2}
    assert [c.index for c in clients] == list(range(10))


def test_sampling_is_reproducible_with_a_seed() -> None:
    speed = LognormalSpeed(sigma=0.5)
    assert Fleet(mix=MIX, speed=speed, seed=7).sample(50) == \
        Fleet(mix=MIX, speed=speed, seed=7).sample(50)


def test_different_seeds_differ() -> None:
    speed = LognormalSpeed(sigma=0.5)
    a = Fleet(mix=MIX, speed=speed, seed=1).sample(50)
    b = Fleet(mix=MIX, speed=speed, seed=2).sample(50)
    assert [c.profile_name for c in a] != [c.profile_name for c in b]
    assert [c.speed for c in a] != [c.speed for c in b]
    assert {c.profile.seed for c in a}.isdisjoint(c.profile.seed for c in b)


def test_each_client_gets_its_own_link_seed_and_the_preset_otherwise() -> None:
    clients = Fleet(mix=MIX, seed=3).sample(20)
    assert len({c.profile.seed for c in clients}) == 20
    for client in clients:
        assert client.profile.with_seed(0) == preset(client.profile_name)


def test_speed_distribution_does_not_change_the_assignment() -> None:
    plain = Fleet(mix=MIX, seed=5).sample(30)
    slow = Fleet(mix=MIX, speed=LognormalSpeed(sigma=1.0), seed=5).sample(30)
    assert [c.profile for c in plain] == [c.profile for c in slow]


def test_zero_clients_and_bad_counts() -> None:
    fleet = Fleet(mix=MIX)
    assert fleet.sample(0) == []
    for bad in (-1, 2.5, True):
        with pytest.raises(ConfigError, match="num_clients"):
            fleet.sample(bad)  # type: ignore[arg-type]


def test_custom_profiles_in_the_mix() -> None:
    slow = LinkProfile(name="slow", latency_ms=500, up_kbps=100, down_kbps=100)
    fleet = Fleet(mix={"slow": 1, "lan": 3}, profiles={"slow": slow}, seed=0)
    clients = fleet.sample(8)
    assert Counter(c.profile_name for c in clients) == {"lan": 6, "slow": 2}
    assert all(c.profile.latency_ms == 500 for c in clients if c.profile_name == "slow")


def test_ties_follow_the_listed_order_after_normalising() -> None:
    assert Fleet(mix={"3g": 3, "4g": 1, "lan": 6}).counts(5) == {"3g": 2, "4g": 0, "lan": 3}
    assert Fleet(mix={"4g": 1, "3g": 3, "lan": 6}).counts(5) == {"4g": 1, "3g": 1, "lan": 3}


def test_mix_is_normalised_and_read_only() -> None:
    fleet = Fleet(mix={"4g": 5, "3g": 3, "flaky": 2})
    assert dict(fleet.mix) == pytest.approx(MIX)
    assert sum(fleet.mix.values()) == pytest.approx(1.0)
    with pytest.raises(TypeError):
        fleet.mix["lan"] = 1.0  # type: ignore[index]


# ----------------------------------------------------------------------------- speeds


def test_constant_speed_by_default() -> None:
    assert {c.speed for c in Fleet(mix={"3g": 1}).sample(5)} == {1.0}
    assert {c.speed for c in Fleet(mix={"3g": 1}, speed=ConstantSpeed(2.0)).sample(5)} == {2.0}


def test_lognormal_speeds_are_positive_with_median_one() -> None:
    speeds = [c.speed for c in Fleet(mix={"4g": 1}, speed=LognormalSpeed(0.5), seed=11)
              .sample(4000)]
    assert min(speeds) > 0
    assert statistics.median(speeds) == pytest.approx(1.0, abs=0.05)
    assert max(speeds) > 2 > 0.5 > min(speeds)  # stragglers and fast clients both appear
    assert {c.speed for c in Fleet(mix={"4g": 1}, speed=LognormalSpeed(0.0)).sample(5)} == {1.0}


def test_choice_speeds_come_in_exact_proportion() -> None:
    speed = ChoiceSpeed(values=(1.0, 4.0), weights=(0.8, 0.2))
    speeds = [c.speed for c in Fleet(mix={"4g": 1}, speed=speed, seed=2).sample(10)]
    assert Counter(speeds) == {1.0: 8, 4.0: 2}
    assert Counter(c.speed for c in Fleet(mix={"4g": 1}, speed=ChoiceSpeed(values=(1, 2)))
                   .sample(4)) == {1.0: 2, 2.0: 2}


@pytest.mark.parametrize(("table", "fragment"), [
    ({"kind": "constant", "value": 0}, "speed.value: must be a finite number > 0"),
    ({"kind": "lognormal", "sigma": -1}, "speed.sigma"),
    ({"kind": "lognormal", "sigma": 9}, "speed.sigma: must be in [0, 5]"),
    ({"kind": "choice", "values": []}, "speed.values: must list at least one"),
    ({"kind": "choice", "values": [1, -2]}, "speed.values[1]"),
    ({"kind": "choice", "values": [1, 2], "weights": [1]}, "expected 2 weights"),
    ({"kind": "choice", "values": [1, 2], "weights": [0, 0]}, "sum to more than 0"),
    ({"kind": "choice", "values": [1, 2], "weights": [1, -1]}, "speed.weights[1]"),
    ({"kind": "gamma"}, "unknown speed distribution 'gamma'; known: choice, constant"),
    ({"kind": "lognormal", "sigmaa": 1}, "sigmaa"),
    ({"sigma": 1}, "kind is required"),
])
def test_bad_speed_tables(table: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        speed_from_dict(table)
    assert str(info.value).startswith("[network.speed]: ")
    assert fragment in str(info.value)


@pytest.mark.parametrize("speed", [ConstantSpeed(1.5), LognormalSpeed(0.3),
                                   ChoiceSpeed(values=(1, 3), weights=(2, 1)),
                                   ChoiceSpeed(values=(1, 3))])
def test_speed_dict_round_trip(speed: Any) -> None:
    assert speed_from_dict(speed.to_dict()) == speed


# ----------------------------------------------------------------------------- Fleet checks


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"mix": {}}, "fleet: expected a non-empty table"),
    ({"mix": {"3g": -1}}, "fleet.3g: must be a finite number >= 0"),
    ({"mix": {"3g": "lots"}}, "fleet.3g: expected a number"),
    ({"mix": {"3g": 0, "4g": 0}}, "fleet: weights must sum to more than 0"),
    ({"mix": {"5g": 1}}, "fleet: unknown profile '5g'; presets: lan, wifi-good"),
    ({"mix": {"3g": 1}, "seed": -1}, "seed: must be an integer >= 0"),
    ({"mix": {"3g": 1}, "profiles": {"4g": LinkProfile()}}, "'4g' is a preset name"),
    ({"mix": {"3g": 1}, "speed": 2.0}, "speed: expected a speed distribution"),
])
def test_bad_fleets(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        Fleet(**kwargs)
    assert fragment in str(info.value)


def test_single_and_dict_round_trip() -> None:
    custom = LinkProfile(name="mine", latency_ms=42, up_kbps=300, down_kbps=600)
    assert Counter(c.profile_name for c in Fleet.single("3g").sample(4)) == {"3g": 4}
    assert {c.profile.latency_ms for c in Fleet.single(custom).sample(3)} == {42}
    fleet = Fleet(mix={"4g": 0.5, "mine": 0.5}, profiles={"mine": custom},
                  speed=ChoiceSpeed(values=(1, 2)), seed=9)
    assert Fleet.from_dict(fleet.to_dict()) == fleet


# ----------------------------------------------------------------------------- [network]


def _network(text: str) -> dict[str, Any]:
    table: dict[str, Any] = tomllib.loads(text)["network"]
    return table


def test_network_preset_puts_everyone_on_it() -> None:
    fleet = parse_network(_network('[network]\npreset = "edge-2g"'), seed=4)
    assert {c.profile_name for c in fleet.sample(5)} == {"edge-2g"}
    assert fleet.seed == 4


def test_network_profile_table_with_a_base() -> None:
    fleet = parse_network(_network("""
        [network]
        profile = { base = "3g", loss_up = 0.02, name = "lossy-3g" }
    """))
    (client,) = fleet.sample(1)
    assert client.profile_name == "lossy-3g"
    assert client.profile.with_seed(0) == preset("3g").replace(name="lossy-3g", loss_up=0.02)


def test_network_profile_without_a_name_is_custom() -> None:
    (client,) = parse_network({"profile": {"latency_ms": 5}}).sample(1)
    assert client.profile_name == "custom"
    assert client.profile.latency_ms == 5


def test_network_profile_from_a_relative_file(tmp_path: Path) -> None:
    (tmp_path / "slow.toml").write_text('base = "edge-2g"\nlatency_ms = 400\n')
    fleet = parse_network({"profile": "slow.toml"}, base_dir=tmp_path)
    (client,) = fleet.sample(1)
    assert (client.profile_name, client.profile.latency_ms) == ("slow", 400)


def test_network_fleet_with_custom_profiles_and_speed() -> None:
    fleet = parse_network(_network("""
        [network]
        tier = "proxy"
        seed = 12
        fleet = { "4g" = 0.5, "3g" = 0.3, slow-wifi = 0.2 }

        [network.speed]
        kind = "lognormal"
        sigma = 0.5

        [network.profiles.slow-wifi]
        base = "wifi-lossy"
        down_kbps = 800
    """), seed=99)
    assert fleet.seed == 12  # the table's seed wins over the run's
    assert fleet.speed == LognormalSpeed(0.5)
    assert fleet.counts(10) == {"4g": 5, "3g": 3, "slow-wifi": 2}
    slow = fleet.profile("slow-wifi")
    assert slow.down_kbps == 800 and slow.burst_loss == PRESETS["wifi-lossy"].burst_loss


def test_network_inline_speed_equals_speed_table() -> None:
    inline = _network('[network]\npreset = "4g"\nspeed = { kind = "choice", values = [1, 2] }')
    table = _network('[network]\npreset = "4g"\n[network.speed]\nkind = "choice"\n'
                     'values = [1, 2]')
    assert parse_network(inline) == parse_network(table)


def test_network_preset_may_name_a_custom_profile() -> None:
    fleet = parse_network({"preset": "mine", "profiles": {"mine": {"latency_ms": 3}}})
    assert fleet.sample(1)[0].profile.latency_ms == 3


@pytest.mark.parametrize(("table", "fragment"), [
    ({"preset": "3h"}, "[network] preset: unknown preset '3h'; known: lan, wifi-good"),
    ({}, "set exactly one of preset, profile, fleet (got none)"),
    ({"preset": "3g", "fleet": {"3g": 1}}, "exactly one of preset, profile, fleet (got preset"),
    ({"preset": "3g", "tier": "packet"}, "not supported in simulate yet"),
    ({"preset": "3g", "tier": "kernel"}, "unknown tier 'kernel'; supported: proxy"),
    ({"preset": "3g", "latency_ms": 5}, "[network]: unknown keys ['latency_ms']"),
    ({"fleet": {"3g": -0.5}}, "[network] fleet.3g: must be a finite number >= 0"),
    ({"fleet": {"3g": 1, "5g": 1}}, "[network] fleet: unknown profile '5g'"),
    ({"fleet": {"3g": 1}, "seed": "x"}, "[network] seed: must be an integer"),
    ({"profile": {"latency_ms": -5}},
     "[network.profile]: latency_ms: must be in [0.0, 60000.0], got -5"),
    ({"profile": {"base": "3g", "loss_down": 1.2}},
     "[network.profile]: loss_down: must be in [0.0, 1.0], got 1.2"),
    ({"profile": {"base": "5g"}}, "[network.profile]: base: unknown profile '5g'"),
    ({"profile": {"latency": 5}}, "[network.profile]: unknown link profile keys ['latency']"),
    ({"profile": {"name": "3g"}}, "name '3g' is taken by a preset"),
    ({"profile": 5}, "[network] profile: expected a table or a .toml path"),
    ({"preset": "3g", "profiles": {"a": {"jitter_ms": -1}}},
     "[network.profiles.a]: jitter_ms: must be in [0.0, 60000.0]"),
    ({"preset": "3g", "profiles": {"3g": {}}}, "[network.profiles.3g]: '3g' is a preset name"),
    ({"preset": "3g", "speed": {"kind": "lognormal", "sigma": -1}}, "[network.speed]"),
])
def test_bad_network_tables(table: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_network(table)
    assert fragment in str(info.value)


def test_network_file_end_to_end(tmp_path: Path) -> None:
    path = tmp_path / "sim.toml"
    path.write_text("""
        rounds = 3

        [network]
        fleet = { lan = 1, commute = 1 }
        speed = { kind = "constant", value = 1.5 }
    """)
    with path.open("rb") as fh:
        config = tomllib.load(fh)
    clients = parse_network(config["network"], seed=1).sample(4)
    assert Counter(c.profile_name for c in clients) == {"lan": 2, "commute": 2}
    assert {c.speed for c in clients} == {1.5}


# ----------------------------------------------------------------------------- TOML profiles


def test_load_profile_from_each_kind_of_spec(tmp_path: Path) -> None:
    assert load_profile("satellite") == preset("satellite")
    assert load_profile("3g", name="phone").name == "phone"
    assert load_profile({"base": "4g"}) == preset("4g")
    assert load_profile({"latency_ms": 5}).name == "custom"
    path = tmp_path / "rural.toml"
    path.write_text('base = "3g"\ndown_kbps = 400\nburst_loss = { p = 0.01, r = 0.5 }\n')
    rural = load_profile(path)
    assert (rural.name, rural.down_kbps, rural.latency_ms) == ("rural", 400, 100)
    assert rural.burst_loss is not None and rural.burst_loss.r == 0.5
    assert load_profile(str(path)) == rural


def test_load_profile_errors_name_the_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown link preset '5g'; known: lan"):
        load_profile("5g")
    with pytest.raises(ConfigError, match="config file not found"):
        load_profile(tmp_path / "missing.toml")
    bad_syntax = tmp_path / "syntax.toml"
    bad_syntax.write_text("latency_ms = = 5\n")
    with pytest.raises(ConfigError, match=r"syntax\.toml: invalid TOML"):
        load_profile(bad_syntax)
    bad_value = tmp_path / "value.toml"
    bad_value.write_text("loss_up = 1.5\n")
    with pytest.raises(ConfigError) as info:
        load_profile(bad_value)
    assert str(info.value) == f"{bad_value}: loss_up: must be in [0.0, 1.0], got 1.5"
    with pytest.raises(ConfigError, match=r"expected a preset name, a table or a \.toml path"):
        load_profile(42)  # type: ignore[arg-type]


def test_load_profiles_file_with_chained_bases(tmp_path: Path) -> None:
    path = tmp_path / "links.toml"
    path.write_text("""
        [profiles.slower-wifi]
        base = "slow-wifi"
        up_kbps = 200

        [profiles.slow-wifi]
        base = "wifi-lossy"
        down_kbps = 800
    """)
    profiles = load_profiles_file(path)
    assert set(profiles) == {"slow-wifi", "slower-wifi"}
    slower = profiles["slower-wifi"]
    assert (slower.name, slower.up_kbps, slower.down_kbps) == ("slower-wifi", 200, 800)
    assert slower.latency_ms == preset("wifi-lossy").latency_ms
    with pytest.raises(ConfigError, match="load_profiles_file"):
        load_profile(path)


@pytest.mark.parametrize(("text", "fragment"), [
    ("[profiles.a]\nlatency_ms = -1\n", "[profiles.a]: latency_ms: must be in [0.0, 60000.0]"),
    ("[profiles.a]\nbase = \"b\"\n[profiles.b]\nbase = \"a\"\n", "base cycle a -> b -> a"),
    ("[profiles.a]\nbase = \"zzz\"\n", "[profiles.a]: base: unknown profile 'zzz'"),
    ("[profiles.lan]\nlatency_ms = 1\n", "[profiles.lan]: 'lan' is a preset name"),
    ("[profiles]\na = 5\n", "[profiles.a]: expected a table"),
    ("[network]\npreset = \"3g\"\n", "unknown top-level keys ['network']"),
    ("title = \"x\"\n[profiles.a]\n", "unknown top-level keys ['title']"),
    ("", "no [profiles.NAME] tables"),
])
def test_bad_profiles_files(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_profiles_file(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert fragment in message
