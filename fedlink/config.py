"""Helpers for building frozen config dataclasses from TOML tables, validated at the edge."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from fedlink.errors import ConfigError

C = TypeVar("C")


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file (``ConfigError`` naming the file on a missing file or bad syntax)."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def from_table(cls: type[C], table: Mapping[str, Any], section: str) -> C:
    """Build dataclass ``cls`` from a TOML table; unknown keys are an error, not ignored.

    Lists become tuples, so frozen configs stay hashable. Field validation is the dataclass's
    own ``__post_init__``; its ``ConfigError`` messages name the field.
    """
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{section}] must be a table, got {type(table).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"[{section}] has unknown keys {unknown}; allowed: {sorted(known)}"
        )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"[{section}]: {exc}") from exc


def require(condition: bool, field: str, message: str) -> None:
    """Raise ``ConfigError("<field>: <message>")`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{field}: {message}")
