"""``LinkProfile``: what a bad network link does, validated on construction.

Directions are named from the client's side: **up** is client -> coordinator, **down** is
coordinator -> client. Latency and jitter apply to each direction (so a round trip adds twice
``latency_ms``). Fields marked *packet tier* only take effect in the packet-level link
(``fedlink.netem.packet``); the TCP proxy (``fedlink.netem.proxy``) cannot drop single
packets, so it ignores them and says so once at info level (see
``LinkProfile.packet_only_fields``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedlink.errors import ConfigError


def _check_range(field: str, value: float | None, low: float, high: float = math.inf,
                 *, low_open: bool = False) -> None:
    """``ConfigError`` naming ``field`` and its allowed range unless ``value`` lies in it."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{field}: expected a number, got {type(value).__name__} {value!r}")
    too_low = value <= low if low_open else value < low
    if math.isnan(value) or too_low or value > high:
        bracket = "(" if low_open else "["
        upper = "inf)" if math.isinf(high) else f"{high}]"
        raise ConfigError(f"{field}: must be in {bracket}{low}, {upper}, got {value}")


@dataclass(frozen=True)
class GilbertElliott:
    """Burst loss (packet tier): a two-state Markov chain evaluated once per packet.

    In the good state a packet is lost with probability ``loss_good``, in the bad state with
    ``loss_bad``; the chain moves good -> bad with probability ``p`` and bad -> good with ``r``
    after each packet. Mean burst (bad-state sojourn) length is ``1 / r`` packets; the
    stationary share of time in the bad state is ``p / (p + r)``.
    """

    p: float
    r: float
    loss_good: float = 0.0
    loss_bad: float = 1.0

    def __post_init__(self) -> None:
        _check_range("burst_loss.p", self.p, 0.0, 1.0)
        _check_range("burst_loss.r", self.r, 0.0, 1.0, low_open=True)
        _check_range("burst_loss.loss_good", self.loss_good, 0.0, 1.0)
        _check_range("burst_loss.loss_bad", self.loss_bad, 0.0, 1.0)

    @property
    def mean_loss(self) -> float:
        """Long-run fraction of packets lost."""
        bad = self.p / (self.p + self.r)
        return bad * self.loss_bad + (1 - bad) * self.loss_good


@dataclass(frozen=True)
class LinkProfile:
    """A link's impairments. Every field defaults to "no impairment".

    - ``latency_ms`` / ``jitter_ms``: one-way delay per direction, and the standard deviation
      of a normal jitter added to it (delays never go below zero; order is kept).
    - ``up_kbps`` / ``down_kbps``: bandwidth in kbit/s (``None``: unlimited).
    - ``reset_every_kb``: mean kilobytes (both directions) between connection resets, drawn
      from an exponential distribution; ``reset_every_s``: the same in seconds.
    - ``blackout_every_s`` / ``blackout_s``: mean time between blackouts and their mean
      duration (both exponential); during a blackout nothing passes and TCP stays up.
    - ``limit_data_kb``: cut each connection after this many kilobytes (both directions).
    - ``loss_up`` / ``loss_down``: independent packet loss probability (packet tier).
    - ``burst_loss``: Gilbert-Elliott burst loss on both directions (packet tier).
    - ``trace_up`` / ``trace_down``: Mahimahi delivery traces (packet tier): a file of
      millisecond timestamps, one per 1500-byte delivery opportunity, replayed in a loop.
    - ``seed``: makes every random draw of the link reproducible.
    """

    name: str = "custom"
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    up_kbps: float | None = None
    down_kbps: float | None = None
    reset_every_kb: float | None = None
    reset_every_s: float | None = None
    blackout_every_s: float | None = None
    blackout_s: float = 0.0
    limit_data_kb: float | None = None
    loss_up: float = 0.0
    loss_down: float = 0.0
    burst_loss: GilbertElliott | None = None
    trace_up: str | None = None
    trace_down: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        _check_range("latency_ms", self.latency_ms, 0.0, 60_000.0)
        _check_range("jitter_ms", self.jitter_ms, 0.0, 60_000.0)
        for field in ("up_kbps", "down_kbps", "reset_every_kb", "reset_every_s",
                      "blackout_every_s", "limit_data_kb"):
            _check_range(field, getattr(self, field), 0.0, low_open=True)
        _check_range("blackout_s", self.blackout_s, 0.0)
        _check_range("loss_up", self.loss_up, 0.0, 1.0)
        _check_range("loss_down", self.loss_down, 0.0, 1.0)
        if self.blackout_every_s is not None and self.blackout_s <= 0:
            raise ConfigError("blackout_s: must be > 0 when blackout_every_s is set")
        if self.blackout_every_s is None and self.blackout_s > 0:
            raise ConfigError("blackout_s: needs blackout_every_s (alone it does nothing)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed: must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"name: must be a non-empty string, got {self.name!r}")
        self._check_types()

    def _check_types(self) -> None:
        """``ConfigError`` for a non-``GilbertElliott`` burst loss or a non-string trace path."""
        if self.burst_loss is not None and not isinstance(self.burst_loss, GilbertElliott):
            raise ConfigError(
                "burst_loss: expected a table with p, r (and optionally loss_good, loss_bad), "
                f"got {type(self.burst_loss).__name__} {self.burst_loss!r}")
        for field in ("trace_up", "trace_down"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{field}: expected a trace file path, got {value!r}")

    @property
    def packet_only_fields(self) -> tuple[str, ...]:
        """Fields set to something only the packet tier can do (loss, traces)."""
        used = [f for f in ("loss_up", "loss_down") if getattr(self, f) > 0]
        used += [f for f in ("burst_loss", "trace_up", "trace_down")
                 if getattr(self, f) is not None]
        return tuple(used)

    def with_seed(self, seed: int) -> LinkProfile:
        """The same profile with another seed (one per client, say)."""
        return dataclasses.replace(self, seed=seed)

    def replace(self, **changes: Any) -> LinkProfile:
        """A validated copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, table: Mapping[str, Any], name: str | None = None) -> LinkProfile:
        """Build from a TOML table (unknown keys are an error naming them)."""
        if not isinstance(table, Mapping):
            raise ConfigError(f"link profile must be a table, got {type(table).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(f"unknown link profile keys {unknown}; allowed: {sorted(known)}")
        values = dict(table)
        if name is not None:
            values.setdefault("name", name)
        burst = values.get("burst_loss")
        if isinstance(burst, Mapping):
            try:
                values["burst_loss"] = GilbertElliott(**burst)
            except TypeError as exc:
                raise ConfigError(f"burst_loss: {exc}") from exc
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form without the fields left at their defaults."""
        defaults = LinkProfile()
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value != getattr(defaults, field.name) or field.name == "name":
                out[field.name] = (dataclasses.asdict(value)
                                   if isinstance(value, GilbertElliott) else value)
        return out
