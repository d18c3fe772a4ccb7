"""Link profiles written in TOML: a preset name, a table (optionally based on a preset), or a file.

A profile table holds ``LinkProfile`` fields, plus an optional ``base`` naming a preset (or, in
a file of several profiles, another profile of that file) to start from::

    base = "3g"          # start from the 3g preset ...
    loss_up = 0.02       # ... and override what differs
    burst_loss = { p = 0.01, r = 0.25 }

A file of several profiles holds one ``[profiles.NAME]`` table per profile::

    [profiles.slow-wifi]
    base = "wifi-lossy"
    down_kbps = 800

    [profiles.slower-wifi]
    base = "slow-wifi"
    up_kbps = 200

Custom names must not be preset names (start from a preset with ``base`` instead). A
profile's name is its ``name`` key, else the name it is given (its ``[profiles.NAME]`` key,
the ``name`` argument, a file's stem), else its base's name, else ``"custom"``. Every error
is one ``ConfigError`` naming the file and the table or field at fault.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedlink.config import load_toml
from fedlink.errors import ConfigError
from fedlink.netem.presets import PRESETS, preset
from fedlink.netem.profile import LinkProfile

PROFILE_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LinkProfile))
"""The fields a profile table may set (besides ``base``)."""

ProfileSpec = str | Path | Mapping[str, Any]
"""What ``load_profile`` accepts: a preset name, a ``.toml`` path, or a profile table."""


def _context(where: str, exc: ConfigError) -> ConfigError:
    """``exc`` with ``where`` (a file, a table) put in front of its message."""
    return ConfigError(f"{where}: {exc}") if where else exc


def _as_table(value: object, where: str) -> Mapping[str, Any]:
    """``value`` if it is a table, else a ``ConfigError`` naming ``where``."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(value).__name__} {value!r}")
    return value


def profile_from_table(table: Mapping[str, Any], *, name: str | None = None,
                       known: Mapping[str, LinkProfile] | None = None,
                       where: str = "") -> LinkProfile:
    """Build a profile from a TOML table, applying it over ``base`` when the table names one.

    ``base`` may name a preset or a profile in ``known``; ``where`` (a file or table name)
    prefixes any error message.
    """
    table = _as_table(table, where or "link profile")
    values = dict(table)
    base_name = values.pop("base", None)
    try:
        _check_keys(values)
        base = _base_profile(base_name, known or {})
        merged = {**base.to_dict(), **values} if base is not None else values
        fallback = name or (base_name if base is not None else None)
        if fallback is not None and "name" not in values:
            merged["name"] = fallback
        return LinkProfile.from_dict(merged)
    except ConfigError as exc:
        raise _context(where, exc) from exc


def _check_keys(values: Mapping[str, Any]) -> None:
    """``ConfigError`` naming the keys that are neither ``LinkProfile`` fields nor ``base``."""
    unknown = sorted(set(values) - set(PROFILE_KEYS))
    if unknown:
        raise ConfigError(f"unknown link profile keys {unknown}; allowed: "
                          f"{', '.join(sorted([*PROFILE_KEYS, 'base']))}")


def _base_profile(base: object, known: Mapping[str, LinkProfile]) -> LinkProfile | None:
    """The profile that ``base`` names (``None`` when there is no base)."""
    if base is None:
        return None
    if isinstance(base, str) and base in known:
        return known[base]
    if not isinstance(base, str) or base not in PRESETS:
        names = ", ".join([*PRESETS, *known])
        raise ConfigError(f"base: unknown profile {base!r}; known: {names}")
    return preset(base)


def _looks_like_path(spec: str) -> bool:
    """Whether a string names a file rather than a preset."""
    return spec.endswith(".toml") or "/" in spec or "\\" in spec


def load_profile(spec: ProfileSpec, *, name: str | None = None) -> LinkProfile:
    """A ``LinkProfile`` from a preset name, a profile table, or a ``.toml`` file holding one.

    ``name`` names the result unless the table has its own ``name`` key. Unknown presets,
    missing files, bad TOML and invalid fields raise one ``ConfigError`` saying which.
    """
    if isinstance(spec, Mapping):
        return profile_from_table(spec, name=name)
    if isinstance(spec, Path) or (isinstance(spec, str) and _looks_like_path(spec)):
        return _load_profile_file(Path(spec), name)
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ConfigError(f"unknown link preset {spec!r}; known: {', '.join(PRESETS)} "
                              "(or give a table or a path to a .toml file)")
        profile = preset(spec)
        return profile.replace(name=name) if name else profile
    raise ConfigError(f"link profile: expected a preset name, a table or a .toml path, "
                      f"got {type(spec).__name__} {spec!r}")


def _load_profile_file(path: Path, name: str | None) -> LinkProfile:
    """The profile table that makes up the whole of ``path``."""
    table = load_toml(path)
    if "profiles" in table:
        raise ConfigError(f"{path}: holds [profiles.*] tables; load it with load_profiles_file "
                          "or name one of its profiles")
    return profile_from_table(table, name=name or path.stem, where=str(path))


def resolve_profiles(tables: Mapping[str, Any], *, section: str = "profiles",
                     source: str = "") -> dict[str, LinkProfile]:
    """Build named profile tables whose ``base`` may name a preset or another of them.

    Names must not shadow presets; a cycle of ``base`` references is an error. Error
    messages name ``source`` (a file, when there is one) and the table, e.g.
    ``net.toml: [profiles.slow]: latency_ms: must be in [0.0, 60000.0], got -5``.
    """
    prefix = f"{source}: " if source else ""
    tables = _as_table(tables, f"{prefix}[{section}]")
    for key in tables:
        if key in PRESETS:
            raise ConfigError(f"{prefix}[{section}.{key}]: {key!r} is a preset name; pick "
                              f"another name (base = {key!r} starts from the preset)")
    built: dict[str, LinkProfile] = {}
    for key in tables:
        _resolve_one(key, tables, built, f"{prefix}[{section}", ())
    return built


def _resolve_one(key: str, tables: Mapping[str, Any], built: dict[str, LinkProfile],
                 opening: str, chain: tuple[str, ...]) -> LinkProfile:
    """Build ``tables[key]`` after the custom profile it is based on (depth first)."""
    if key in built:
        return built[key]
    here = f"{opening}.{key}]"
    if key in chain:
        raise ConfigError(f"{here}: base cycle {' -> '.join([*chain, key])}")
    table = _as_table(tables[key], here)
    base = table.get("base")
    if base is not None and (not isinstance(base, str)
                             or (base not in tables and base not in PRESETS)):
        names = ", ".join([*PRESETS, *tables])
        raise ConfigError(f"{here}: base: unknown profile {base!r}; known: {names}")
    if isinstance(base, str) and base in tables:
        _resolve_one(base, tables, built, opening, (*chain, key))
    built[key] = profile_from_table(table, name=key, known=built, where=here)
    return built[key]


def load_profiles_file(path: str | Path) -> dict[str, LinkProfile]:
    """Every ``[profiles.NAME]`` table of a TOML file, as profiles named ``NAME``."""
    path = Path(path)
    table = load_toml(path)
    unknown = sorted(set(table) - {"profiles"})
    if unknown:
        raise ConfigError(f"{path}: unknown top-level keys {unknown}; "
                          "expected only [profiles.NAME] tables")
    if "profiles" not in table:
        raise ConfigError(f"{path}: no [profiles.NAME] tables")
    return resolve_profiles(table["profiles"], source=str(path))
