"""Fleets: a seeded mix of link profiles over many clients, plus per-client compute speeds.

A simulation config describes its clients' network in one ``[network]`` table::

    [network]
    tier = "proxy"        # optional; "proxy" (default) is the only tier simulate supports yet
    seed = 7              # optional; default: the seed given to parse_network (the run's)
    # exactly one of:
    preset = "3g"                                    # every client on one preset (or custom)
    profile = { base = "3g", loss_up = 0.02 }        # every client on one custom profile
    fleet = { "4g" = 0.5, "3g" = 0.3, flaky = 0.2 }  # a mix: profile name -> weight

    [network.speed]       # optional compute-speed multipliers (default: constant 1)
    kind = "lognormal"    # "constant" (value), "lognormal" (sigma) or "choice" (values, weights)
    sigma = 0.5

    [network.profiles.slow-wifi]   # optional custom profiles, usable by name above
    base = "wifi-lossy"
    down_kbps = 800

Names in ``fleet`` and ``preset`` are presets (``fedlink.netem.presets``) or keys of
``[network.profiles]``; custom names must not be preset names. ``profile`` is a profile table
(see ``fedlink.netem.config``) or a path to a ``.toml`` file holding one.

Sampling is deterministic for a seed: the counts per profile come from a largest-remainder
allocation of the weights (50/30/20 over 10 clients is exactly 5/3/2; ties go to the profile
listed first), then a seeded shuffle assigns them to client indices. Each client's link gets
its own seed, derived from the fleet seed and its index. Speed multipliers scale compute
time: a multiplier of 2 means the client computes twice as slowly (a straggler).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, runtime_checkable

from fedlink.errors import ConfigError
from fedlink.netem.config import load_profile, profile_from_table, resolve_profiles
from fedlink.netem.presets import PRESETS
from fedlink.netem.profile import LinkProfile
from fedlink.registry import Registry

TIERS_SUPPORTED = ("proxy",)
"""Values of ``[network] tier`` that simulation supports ("packet" is reserved)."""

NETWORK_KEYS = ("tier", "seed", "preset", "profile", "fleet", "profiles", "speed")
"""Keys allowed in a ``[network]`` table."""

_MODES = ("preset", "profile", "fleet")


def derive_seed(seed: int, *labels: object) -> int:
    """A stable 63-bit seed for the stream ``labels`` of ``seed`` (same on every platform)."""
    text = ":".join(str(part) for part in (seed, *labels))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _check_number(where: str, value: object, *, positive: bool) -> float:
    """``value`` as a float if it is a finite number > 0 (or >= 0), else ``ConfigError``."""
    bound = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: expected a number {bound}, got {value!r}")
    low_ok = value > 0 if positive else value >= 0
    if not math.isfinite(value) or not low_ok:
        raise ConfigError(f"{where}: must be a finite number {bound}, got {value}")
    return float(value)


def allocate(weights: Sequence[float], total: int) -> list[int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder).

    Counts sum to ``total``; leftover units go to the largest fractional parts, ties to the
    earliest weight. Each weight is taken as the decimal it prints as (0.1 is exactly 1/10), and
    the arithmetic is exact, so binary rounding never decides a tie.
    """
    exact = [_decimal(w) for w in weights]
    whole = sum(exact)
    quotas = [w * total / whole for w in exact]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts


def _decimal(value: float) -> Fraction:
    """``value`` as the exact fraction of its shortest decimal form (``0.1`` -> ``1/10``)."""
    return Fraction(str(value)) if isinstance(value, float) else Fraction(value)


def _spread(labels: Sequence[str], weights: Sequence[float], count: int,
            rng: random.Random) -> list[str]:
    """``count`` labels in exact proportion to ``weights``, in a seeded random order."""
    drawn = [label for label, n in zip(labels, allocate(weights, count), strict=True)
             for _ in range(n)]
    rng.shuffle(drawn)
    return drawn


@runtime_checkable
class SpeedDistribution(Protocol):
    """Per-client compute-speed multipliers: 2 means the client computes twice as slowly."""

    def sample(self, count: int, rng: random.Random) -> list[float]:
        """``count`` multipliers (each > 0), drawn from ``rng``."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The TOML table that rebuilds this distribution (with its ``kind``)."""
        ...


@dataclass(frozen=True)
class ConstantSpeed:
    """Every client computes at the same speed (``value``, default 1: no stragglers)."""

    KIND: ClassVar[str] = "constant"
    value: float = 1.0

    def __post_init__(self) -> None:
        _check_number("speed.value", self.value, positive=True)

    def sample(self, count: int, rng: random.Random) -> list[float]:
        """``count`` copies of ``value``."""
        return [float(self.value)] * count

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "constant", "value": ...}``."""
        return {"kind": self.KIND, "value": self.value}


@dataclass(frozen=True)
class LognormalSpeed:
    """Multipliers ``exp(sigma * N(0, 1))``: median 1, a long tail of slow clients.

    ``sigma`` 0.5 puts about one client in six above 1.65x (and one in six below 0.6x).
    """

    KIND: ClassVar[str] = "lognormal"
    sigma: float = 0.5

    def __post_init__(self) -> None:
        sigma = _check_number("speed.sigma", self.sigma, positive=False)
        if sigma > 5:
            raise ConfigError(f"speed.sigma: must be in [0, 5], got {sigma}")

    def sample(self, count: int, rng: random.Random) -> list[float]:
        """``count`` lognormal multipliers with median 1."""
        return [rng.lognormvariate(0.0, self.sigma) for _ in range(count)]

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "lognormal", "sigma": ...}``."""
        return {"kind": self.KIND, "sigma": self.sigma}


@dataclass(frozen=True)
class ChoiceSpeed:
    """Multipliers picked from ``values`` in exact proportion to ``weights`` (default equal).

    ``values = [1, 4], weights = [0.8, 0.2]`` makes exactly a fifth of the clients (rounded
    by largest remainder) four times slower, in a seeded random order.
    """

    KIND: ClassVar[str] = "choice"
    values: tuple[float, ...]
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        values = self._as_tuple("speed.values", self.values)
        if not values:
            raise ConfigError("speed.values: must list at least one multiplier")
        for i, value in enumerate(values):
            _check_number(f"speed.values[{i}]", value, positive=True)
        object.__setattr__(self, "values", values)
        if self.weights is not None:
            object.__setattr__(self, "weights", self._checked_weights(len(values)))

    @staticmethod
    def _as_tuple(where: str, value: object) -> tuple[Any, ...]:
        """A list or tuple as a tuple (``ConfigError`` otherwise)."""
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(value)

    def _checked_weights(self, count: int) -> tuple[float, ...]:
        """``weights`` validated: one per value, each >= 0, summing to more than 0."""
        weights = self._as_tuple("speed.weights", self.weights)
        if len(weights) != count:
            raise ConfigError(f"speed.weights: expected {count} weights (one per value), "
                              f"got {len(weights)}")
        checked = tuple(_check_number(f"speed.weights[{i}]", w, positive=False)
                        for i, w in enumerate(weights))
        if sum(checked) <= 0:
            raise ConfigError("speed.weights: must sum to more than 0")
        return checked

    def sample(self, count: int, rng: random.Random) -> list[float]:
        """``count`` multipliers in exact proportion, shuffled by ``rng``."""
        weights = self.weights or (1.0,) * len(self.values)
        labels = [str(i) for i in range(len(self.values))]
        return [float(self.values[int(i)]) for i in _spread(labels, weights, count, rng)]

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "choice", "values": [...], "weights": [...]}``."""
        table: dict[str, Any] = {"kind": self.KIND, "values": list(self.values)}
        if self.weights is not None:
            table["weights"] = list(self.weights)
        return table


SPEEDS: Registry[SpeedDistribution] = Registry("speed distribution")
"""Speed distributions by ``kind``."""
for _speed_cls in (ConstantSpeed, LognormalSpeed, ChoiceSpeed):
    SPEEDS.register(_speed_cls.KIND)(_speed_cls)


def speed_from_dict(table: Mapping[str, Any], where: str = "[network.speed]") -> SpeedDistribution:
    """A speed distribution from ``{kind = ..., <its parameters>}``."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table with a kind, got {table!r}")
    options = dict(table)
    kind = options.pop("kind", None)
    if kind is None:
        raise ConfigError(f"{where}: kind is required; one of {', '.join(SPEEDS.names())}")
    try:
        return SPEEDS.create(str(kind), **options)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


@dataclass(frozen=True)
class ClientLink:
    """One simulated client's network and compute speed.

    ``profile_name`` is the fleet entry it was drawn from; ``profile`` carries a seed of
    its own; ``speed`` multiplies compute time (2 = twice as slow).
    """

    index: int
    profile_name: str
    profile: LinkProfile
    speed: float


@dataclass(frozen=True)
class Fleet:
    """A seeded distribution of link profiles and compute speeds over a fleet of clients.

    - ``mix``: profile name -> weight; names are presets or keys of ``profiles``; weights are
      >= 0 with a positive sum and are normalised on construction (they then sum to 1).
    - ``profiles``: custom profiles by name (names must not be preset names).
    - ``speed``: the distribution of compute-speed multipliers (default: constant 1).
    - ``seed``: drives the assignment, the speeds and every client's link seed.
    """

    mix: Mapping[str, float]
    profiles: Mapping[str, LinkProfile] = field(default_factory=dict)
    speed: SpeedDistribution = field(default_factory=ConstantSpeed)
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed: must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.speed, SpeedDistribution):
            raise ConfigError(f"speed: expected a speed distribution, got {self.speed!r}")
        object.__setattr__(self, "profiles", MappingProxyType(self._checked_profiles()))
        object.__setattr__(self, "mix", MappingProxyType(self._normalised_mix()))

    def __reduce__(self) -> tuple[Any, ...]:
        # read-only views do not pickle; a fleet travels to worker processes as plain tables
        return (Fleet, (dict(self.mix), dict(self.profiles), self.speed, self.seed))

    def _checked_profiles(self) -> dict[str, LinkProfile]:
        """A copy of ``profiles`` after checking names and types."""
        if not isinstance(self.profiles, Mapping):
            raise ConfigError(f"profiles: expected a table, got {self.profiles!r}")
        for name, profile in self.profiles.items():
            if name in PRESETS:
                raise ConfigError(f"profiles.{name}: {name!r} is a preset name; pick another")
            if not isinstance(profile, LinkProfile):
                raise ConfigError(f"profiles.{name}: expected a LinkProfile, got {profile!r}")
        return dict(self.profiles)

    def _normalised_mix(self) -> dict[str, float]:
        """``mix`` with known names and valid weights, scaled to sum to 1."""
        if not isinstance(self.mix, Mapping) or not self.mix:
            raise ConfigError(f"fleet: expected a non-empty table of name = weight, "
                              f"got {self.mix!r}")
        for name in self.mix:
            self.profile(name)
        weights = {name: _check_number(f"fleet.{name}", w, positive=False)
                   for name, w in self.mix.items()}
        total = sum(_decimal(w) for w in weights.values())
        if total <= 0:
            raise ConfigError("fleet: weights must sum to more than 0")
        return {name: float(_decimal(w) / total) for name, w in weights.items()}

    def profile(self, name: str) -> LinkProfile:
        """The custom profile or preset ``name`` (``ConfigError`` listing known names)."""
        if name in self.profiles:
            return self.profiles[name]
        if name in PRESETS:
            return PRESETS[name]
        custom = f"; custom: {', '.join(self.profiles)}" if self.profiles else ""
        raise ConfigError(f"fleet: unknown profile {name!r}; presets: "
                          f"{', '.join(PRESETS)}{custom}")

    def counts(self, num_clients: int) -> dict[str, int]:
        """How many of ``num_clients`` clients get each profile (largest remainder)."""
        _check_count(num_clients)
        return dict(zip(self.mix, allocate(list(self.mix.values()), num_clients), strict=True))

    def sample(self, num_clients: int) -> list[ClientLink]:
        """Each client's profile (with its own seed) and speed; the same for the same seed."""
        names, speeds = self.assign(num_clients)
        return [ClientLink(index=i, profile_name=name, speed=speed,
                           profile=self.client_profile(name, i))
                for i, (name, speed) in enumerate(zip(names, speeds, strict=True))]

    def assign(self, num_clients: int) -> tuple[list[str], list[float]]:
        """Each client's profile name and speed, as ``sample`` draws them, without building a
        profile per client (the virtual-clock simulation keeps them compactly)."""
        _check_count(num_clients)
        assign = random.Random(derive_seed(self.seed, "assign"))
        names = _spread(list(self.mix), list(self.mix.values()), num_clients, assign)
        speeds = self.speed.sample(num_clients, random.Random(derive_seed(self.seed, "speed")))
        return names, speeds

    def client_profile(self, name: str, index: int) -> LinkProfile:
        """Client ``index``'s profile: ``name``'s, with the seed ``sample`` gives it."""
        return self.profile(name).with_seed(derive_seed(self.seed, "link", index))

    @classmethod
    def single(cls, profile: str | LinkProfile, *, speed: SpeedDistribution | None = None,
               seed: int = 0) -> Fleet:
        """Every client on one preset (by name) or one custom profile."""
        speed = speed if speed is not None else ConstantSpeed()
        if isinstance(profile, str):
            return cls(mix={profile: 1.0}, speed=speed, seed=seed)
        return cls(mix={profile.name: 1.0}, profiles={profile.name: profile},
                   speed=speed, seed=seed)

    @classmethod
    def from_dict(cls, table: Mapping[str, Any], *, seed: int = 0) -> Fleet:
        """Build from ``{fleet = {name = weight}, profiles = {...}, speed = {...}, seed = N}``.

        That is a ``[network]`` table in fleet mode, without ``tier``; ``seed`` is used when
        the table has none.
        """
        _check_keys(table, ("fleet", "profiles", "speed", "seed"), "[network]")
        if "fleet" not in table:
            raise ConfigError("[network]: fleet is required (a table of profile name = weight)")
        return _in_network(cls, table["fleet"], _custom_profiles(table), _speed(table),
                           table.get("seed", seed))

    def to_dict(self) -> dict[str, Any]:
        """The table ``from_dict`` rebuilds this fleet from."""
        return {"fleet": dict(self.mix),
                "profiles": {name: p.to_dict() for name, p in self.profiles.items()},
                "speed": self.speed.to_dict(), "seed": self.seed}


def _in_network(cls: type[Fleet], mix: Any, profiles: dict[str, LinkProfile],
                speed: SpeedDistribution, seed: Any) -> Fleet:
    """``cls(...)``, its errors prefixed with ``[network]``."""
    try:
        return cls(mix=mix, profiles=profiles, speed=speed, seed=seed)
    except ConfigError as exc:
        raise ConfigError(f"[network] {exc}") from exc


def _check_count(num_clients: int) -> None:
    """``ConfigError`` unless ``num_clients`` is an integer >= 0."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 0:
        raise ConfigError(f"num_clients: must be an integer >= 0, got {num_clients!r}")


def _check_keys(table: object, allowed: Sequence[str], where: str) -> None:
    """``ConfigError`` unless ``table`` is a table whose keys are all in ``allowed``."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(table).__name__}")
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; allowed: {', '.join(allowed)}")


def _custom_profiles(table: Mapping[str, Any]) -> dict[str, LinkProfile]:
    """The ``[network.profiles.NAME]`` tables as profiles."""
    return resolve_profiles(table.get("profiles", {}), section="network.profiles")


def _speed(table: Mapping[str, Any]) -> SpeedDistribution:
    """The ``[network.speed]`` distribution (constant 1 when absent)."""
    return speed_from_dict(table["speed"]) if "speed" in table else ConstantSpeed()


def _check_tier(tier: object) -> None:
    """``ConfigError`` unless ``tier`` is one simulation supports."""
    if tier == "packet":
        raise ConfigError('[network] tier = "packet": not supported in simulate yet; '
                          'use tier = "proxy"')
    if tier not in TIERS_SUPPORTED:
        raise ConfigError(f"[network] tier: unknown tier {tier!r}; supported: "
                          f"{', '.join(TIERS_SUPPORTED)}")


def _single_mode(table: Mapping[str, Any]) -> str:
    """Which one of preset / profile / fleet the table uses (``ConfigError`` unless one)."""
    modes = [mode for mode in _MODES if mode in table]
    if len(modes) != 1:
        found = f"got {', '.join(modes)}" if modes else "got none"
        raise ConfigError(f"[network]: set exactly one of preset, profile, fleet ({found})")
    return modes[0]


def _everyone_on(spec: object, customs: Mapping[str, LinkProfile],
                 base_dir: Path | None) -> tuple[str, LinkProfile | None]:
    """``[network] profile``: the name everyone uses, and the new custom profile if any."""
    if isinstance(spec, str) and (spec in PRESETS or spec in customs):
        return spec, None
    if isinstance(spec, Mapping):
        profile = profile_from_table(spec, name="custom", known=customs,
                                     where="[network.profile]")
    elif isinstance(spec, str | Path):
        path = Path(spec)
        profile = load_profile(base_dir / path if base_dir and not path.is_absolute() else path)
    else:
        raise ConfigError(f"[network] profile: expected a table or a .toml path, got {spec!r}")
    if profile.name in PRESETS or profile.name in customs:
        raise ConfigError(f"[network] profile: name {profile.name!r} is taken by a preset or "
                          "a [network.profiles] entry; give the profile another name")
    return profile.name, profile


def _mix(table: Mapping[str, Any], customs: dict[str, LinkProfile],
         base_dir: Path | None) -> Mapping[str, Any]:
    """The fleet mix of a ``[network]`` table; ``profile`` mode adds its profile to ``customs``."""
    mode = _single_mode(table)
    if mode == "fleet":
        mix: Mapping[str, Any] = table["fleet"]
        return mix
    if mode == "preset":
        return {_preset_name(table["preset"], customs): 1.0}
    name, profile = _everyone_on(table["profile"], customs, base_dir)
    if profile is not None:
        customs[name] = profile
    return {name: 1.0}


def parse_network(table: Mapping[str, Any], *, seed: int = 0,
                  base_dir: str | Path | None = None) -> Fleet:
    """The ``Fleet`` that a ``[network]`` table describes (see the module docstring).

    ``seed`` is used when the table has none; relative ``profile`` paths are taken from
    ``base_dir`` (the config file's folder) when given. Any mistake is one ``ConfigError``.
    """
    _check_keys(table, NETWORK_KEYS, "[network]")
    _check_tier(table.get("tier", "proxy"))
    customs = _custom_profiles(table)
    mix = _mix(table, customs, Path(base_dir) if base_dir is not None else None)
    return _in_network(Fleet, mix, customs, _speed(table), table.get("seed", seed))


def _preset_name(name: object, customs: Mapping[str, LinkProfile]) -> str:
    """``name`` if it names a preset or custom profile (``ConfigError`` listing them)."""
    if isinstance(name, str) and (name in PRESETS or name in customs):
        return name
    custom = f"; custom: {', '.join(customs)}" if customs else ""
    raise ConfigError(f"[network] preset: unknown preset {name!r}; known: "
                      f"{', '.join(PRESETS)}{custom}")
