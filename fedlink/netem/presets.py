"""Named link presets: the bad networks fedlink is built for, from a LAN down to 2G and trains.

Latency and jitter are **one-way** (a round trip adds twice them); bandwidths are kbit/s,
``up`` = client -> coordinator. Loss only takes effect in the packet tier; the TCP proxy
ignores it (said once, at info level). Figures are typical measured values, rounded; the presets are
reproducible stand-ins, not a survey.

==========  ==========  ======  =======  =========  ===========  ==============  ======
preset      latency ms  jitter  up kbps  down kbps  loss (each)  blackouts       resets
==========  ==========  ======  =======  =========  ===========  ==============  ======
lan         0.5         0.1     100000   100000     -            -               -
wifi-good   10          3       20000    50000      -            -               -
wifi-lossy  20          15      3000     8000       1% + burst   -               -
4g          30          8       8000     20000      -            -               -
3g          100         20      750      1500       0.5%         -               -
edge-2g     200         50      100      200        1%           -               -
satellite   300         15      2000     15000      0.5%         -               -
flaky       40          20      1500     4000       1%           ~5 s / ~30 s    -
commute     80          40      800      2000       2%           ~1.5 s / ~10 s  ~60 s
==========  ==========  ======  =======  =========  ===========  ==============  ======

``wifi-lossy``'s burst loss is Gilbert-Elliott with p=0.01, r=0.25 (bursts of 4 packets on
average) losing half the packets in a burst: about 2% more, about 3% in all. Blackouts and
resets are exponential around the means shown ("~5 s / ~30 s": a ~5 s blackout every ~30 s).
Every bandwidth is at least 100 kbit/s, so a benchmark can measure it in a few seconds.

``PRESETS`` maps each name to its ``LinkProfile`` (read-only), ``PRESET_RATIONALE`` to its
one-line rationale; ``preset(name)`` looks one up with a clear error, and ``summarize``
describes any profile in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from fedlink.errors import ConfigError
from fedlink.netem.profile import GilbertElliott, LinkProfile

_DEFINITIONS: tuple[tuple[LinkProfile, str], ...] = (
    (LinkProfile(name="lan", latency_ms=0.5, jitter_ms=0.1, up_kbps=100_000, down_kbps=100_000),
     "Switched wired LAN, coordinator on site: ~1 ms RTT; 100 Mbit/s, the Fast "
     "Ethernet port of many edge boards and a typical share of a busy office link."),
    (LinkProfile(name="wifi-good", latency_ms=10, jitter_ms=3, up_kbps=20_000, down_kbps=50_000),
     "Good home Wi-Fi behind broadband to a regional cloud coordinator: ~20 ms RTT, "
     "50/20 Mbit/s down/up as commonly measured on 802.11ac near the access point."),
    (LinkProfile(name="wifi-lossy", latency_ms=20, jitter_ms=15, up_kbps=3_000, down_kbps=8_000,
                 loss_up=0.01, loss_down=0.01,
                 burst_loss=GilbertElliott(p=0.01, r=0.25, loss_good=0.0, loss_bad=0.5)),
     "Congested or distant 2.4 GHz Wi-Fi: contention jitter, a few Mbit/s, and 1-5% residual "
     "loss after MAC retries that comes in bursts (interference, rate adaptation)."),
    (LinkProfile(name="4g", latency_ms=30, jitter_ms=8, up_kbps=8_000, down_kbps=20_000),
     "LTE: 40-70 ms RTT and ~20 Mbit/s down / 5-10 Mbit/s up in crowd-sourced speed "
     "tests; link-layer retransmission (HARQ/RLC) hides nearly all loss."),
    (LinkProfile(name="3g", latency_ms=100, jitter_ms=20, up_kbps=750, down_kbps=1_500,
                 loss_up=0.005, loss_down=0.005),
     "UMTS/HSPA: ~100 ms one-way (~200 ms RTT), 1-2 Mbit/s down, 0.5-1 Mbit/s up, "
     "around 0.5% residual loss."),
    (LinkProfile(name="edge-2g", latency_ms=200, jitter_ms=50, up_kbps=100, down_kbps=200,
                 loss_up=0.01, loss_down=0.01),
     "GSM EDGE: 150-300 ms one-way (300-600 ms RTT), ~200 kbit/s down and ~100 kbit/s up in "
     "practice, ~1% loss: the slowest link that still trains."),
    (LinkProfile(name="satellite", latency_ms=300, jitter_ms=15, up_kbps=2_000, down_kbps=15_000,
                 loss_up=0.005, loss_down=0.005),
     "Geostationary broadband (HughesNet/Viasat class): ~300 ms one-way (550-650 ms RTT), "
     "10-25 Mbit/s down, 1-3 Mbit/s up, ~0.5% loss (weather)."),
    (LinkProfile(name="flaky", latency_ms=40, jitter_ms=20, up_kbps=1_500, down_kbps=4_000,
                 loss_up=0.01, loss_down=0.01, blackout_every_s=30, blackout_s=5),
     "A weak cell or Wi-Fi edge that goes silent for ~5 s about every 30 s while TCP stays "
     "up (dead spots, roaming, power saving): tests keepalive and deadlines."),
    (LinkProfile(name="commute", latency_ms=80, jitter_ms=40, up_kbps=800, down_kbps=2_000,
                 loss_up=0.02, loss_down=0.02, blackout_every_s=10, blackout_s=1.5,
                 reset_every_s=60),
     "A phone on a train: ~1.5 s outages about every 10 s (tunnels, handovers) and a "
     "connection reset about every minute (IP change on a cell switch): tests resumption."),
)

PRESETS: Mapping[str, LinkProfile] = MappingProxyType(
    {profile.name: profile for profile, _ in _DEFINITIONS})
"""Every preset by name (read-only), from the mildest link to the worst."""

PRESET_RATIONALE: Mapping[str, str] = MappingProxyType(
    {profile.name: why for profile, why in _DEFINITIONS})
"""One-line rationale of each preset: what it models and the measured figures behind it."""


def preset_names() -> tuple[str, ...]:
    """The preset names, from the mildest link to the worst."""
    return tuple(PRESETS)


def preset(name: str) -> LinkProfile:
    """The preset ``name`` (``ConfigError`` listing the known names when there is none)."""
    profile = PRESETS.get(name) if isinstance(name, str) else None
    if profile is None:
        raise ConfigError(f"unknown link preset {name!r}; known: {', '.join(PRESETS)}")
    return profile


def _rate(kbps: float | None) -> str:
    """``"750 kbit/s"``, ``"20 Mbit/s"`` or ``"unlimited"``."""
    if kbps is None:
        return "unlimited"
    return f"{kbps / 1000:g} Mbit/s" if kbps >= 1000 else f"{kbps:g} kbit/s"


def _impairments(profile: LinkProfile) -> list[str]:
    """Descriptions of the loss, burst loss, blackouts, resets and data limit that are set."""
    parts: list[str] = []
    if profile.loss_up or profile.loss_down:
        parts.append(f"loss {profile.loss_up:.1%} up / {profile.loss_down:.1%} down")
    if profile.burst_loss is not None:
        parts.append(f"burst loss ~{profile.burst_loss.mean_loss:.1%} "
                     f"(bursts ~{1 / profile.burst_loss.r:g} packets)")
    if profile.blackout_every_s is not None:
        parts.append(f"blackouts ~{profile.blackout_s:g} s every ~{profile.blackout_every_s:g} s")
    if profile.reset_every_s is not None:
        parts.append(f"resets every ~{profile.reset_every_s:g} s")
    if profile.reset_every_kb is not None:
        parts.append(f"resets every ~{profile.reset_every_kb:g} KB")
    if profile.limit_data_kb is not None:
        parts.append(f"cut after {profile.limit_data_kb:g} KB")
    return parts


def summarize(profile: LinkProfile) -> str:
    """One line with a profile's numbers, e.g. ``3g: 100 ms +- 20 ms one-way, ...``."""
    parts = [f"{profile.latency_ms:g} ms +- {profile.jitter_ms:g} ms one-way",
             f"up {_rate(profile.up_kbps)}, down {_rate(profile.down_kbps)}"]
    parts += _impairments(profile)
    return f"{profile.name}: " + "; ".join(parts)


def describe_preset(name: str) -> str:
    """A preset's numbers and its rationale, in one line (for ``--help`` and reports)."""
    return f"{summarize(preset(name))}. {PRESET_RATIONALE[name]}"
