"""The latency/loss injector: link profiles, presets, fleets, and the links that apply them.

- ``LinkProfile`` / ``GilbertElliott`` (``profile``): what a bad link does, validated.
- ``Link`` / ``LinkCounters`` (``base``): the contract every link tier implements.
- ``PRESETS``, ``preset`` (``presets``): ``lan`` ... ``commute``, documented with their numbers.
- ``load_profile``, ``load_profiles_file`` (``config``): profiles written in TOML.
- ``Fleet``, ``parse_network`` (``fleet``): a seeded mix of profiles and compute speeds
  over a fleet of simulated clients, from a ``[network]`` table.
"""

from fedlink.netem.base import Link, LinkCounters
from fedlink.netem.config import (
    PROFILE_KEYS,
    ProfileSpec,
    load_profile,
    load_profiles_file,
    profile_from_table,
    resolve_profiles,
)
from fedlink.netem.fleet import (
    SPEEDS,
    ChoiceSpeed,
    ClientLink,
    ConstantSpeed,
    Fleet,
    LognormalSpeed,
    SpeedDistribution,
    allocate,
    derive_seed,
    parse_network,
    speed_from_dict,
)
from fedlink.netem.presets import (
    PRESET_RATIONALE,
    PRESETS,
    describe_preset,
    preset,
    preset_names,
    summarize,
)
from fedlink.netem.profile import GilbertElliott, LinkProfile

__all__ = [
    "PRESETS",
    "PRESET_RATIONALE",
    "PROFILE_KEYS",
    "SPEEDS",
    "ChoiceSpeed",
    "ClientLink",
    "ConstantSpeed",
    "Fleet",
    "GilbertElliott",
    "Link",
    "LinkCounters",
    "LinkProfile",
    "LognormalSpeed",
    "ProfileSpec",
    "SpeedDistribution",
    "allocate",
    "derive_seed",
    "describe_preset",
    "load_profile",
    "load_profiles_file",
    "parse_network",
    "preset",
    "preset_names",
    "profile_from_table",
    "resolve_profiles",
    "speed_from_dict",
    "summarize",
]
