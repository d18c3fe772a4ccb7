"""The one way fedlink validates configuration: frozen dataclasses checked against their own
type hints, so every error names the full key path and what was expected.

Three primitives, used by every config section (``run``, ``data`` and ``data.options``,
``model``, ``client`` and its sub-tables, ``coordinator`` and its sub-tables, ``sim``'s
sections, links) and by the plain option values that reach datasets and partitioners:

- ``from_table(cls, table, "data")``: a TOML table to dataclass ``cls``; unknown keys and
  values whose type does not fit the field's annotation are refused before the dataclass is
  built (``data.clients: expected an integer, got str '10'``);
- ``check_fields(self, "coordinator.flush")`` at the top of a ``__post_init__``: the same type
  check for objects built from Python, and ``check_values`` for a function's keyword options
  against its signature (``data.options.alpha``);
- ``require(condition, "run.seed", "must be >= 0")`` for ranges and relations, and
  ``check_int``/``check_positive``/... for values checked where they are used.

Why not a validation library: the client SDK imports this module, and a device should not pay
the import time or install size of one for the handful of rules fedlink needs; the standard
library's type reflection already reads the annotations the dataclasses carry.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import Any, TypeVar

from fedlink.errors import ConfigError

C = TypeVar("C")

_NAMES: dict[Any, str] = {
    int: "an integer", float: "a number", bool: "true or false", str: "a string",
    type(None): "nothing", tuple: "a list", list: "a list", collections.abc.Sequence: "a list",
    collections.abc.Mapping: "a table", dict: "a table",
}
"""How an expected type is said in an error (TOML's words, not Python's)."""


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file (``ConfigError`` naming the file on a missing file or bad syntax)."""
    import tomllib  # deferred: a device configured in code never parses TOML

    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def key_path(section: str, key: str) -> str:
    """``section.key`` (just ``key`` at the top level)."""
    return f"{section}.{key}" if section else key


def from_table(cls: type[C], table: Mapping[str, Any], section: str) -> C:
    """Build dataclass ``cls`` from a TOML table; unknown keys are an error, not ignored.

    Lists become tuples, so frozen configs stay hashable. Each value is checked against its
    field's type hint first (the error names ``section.key`` and the expected type); ranges
    are the dataclass's own ``__post_init__``.
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
    check_values(cls, values, section)
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"[{section}]: {exc}") from exc


def field_default(cls: type, key: str) -> Any:
    """The default of the dataclass ``cls``'s field ``key`` (made by its factory if it has
    one): what a config section holds when the key was not set."""
    field = {f.name: f for f in dataclasses.fields(cls)}[key]  # type: ignore[arg-type]
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def changed_fields(section: object) -> list[str]:
    """The fields of the config section ``section`` (a dataclass) that differ from their
    defaults: the keys a refusal of settings that cannot take effect looks at."""
    return [f.name for f in dataclasses.fields(section)  # type: ignore[arg-type]
            if getattr(section, f.name) != field_default(type(section), f.name)]


def check_fields(config: object, section: str) -> None:
    """``ConfigError`` naming ``section.field`` when a dataclass field's value does not fit its
    type hint (for configs built from Python rather than through ``from_table``)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    check_values(type(config), values, section)


def check_values(owner: Callable[..., Any] | type, values: Mapping[str, Any],
                 section: str) -> None:
    """Check ``values`` against the type hints of ``owner`` (a dataclass, or a function whose
    keyword parameters are options); names without a readable hint are left alone."""
    try:
        hints = typing.get_type_hints(owner)
    except (NameError, TypeError):  # an annotation that cannot be resolved is not checked
        return
    for name, value in values.items():
        hint = hints.get(name)
        if hint is not None and not fits(value, hint):
            raise ConfigError(f"{key_path(section, name)}: expected {describe_type(hint)}, "
                              f"got {type(value).__name__} {value!r}")


def fits(value: object, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` says (TOML's view: a bool is not a number,
    an integer is a float, a list is a tuple or sequence)."""
    origin = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (types.UnionType, typing.Union):
        return any(fits(value, option) for option in args)
    if origin is type(None):
        return value is None
    if origin in (int, float) and isinstance(value, bool):
        return False
    if origin is int:
        return isinstance(value, Integral)
    if origin is float:
        return isinstance(value, Real)
    if origin in (tuple, collections.abc.Sequence):
        return _fits_sequence(value, origin, args)
    if origin is typing.Literal:
        return value in args
    if isinstance(origin, type):
        return isinstance(value, origin)
    return True  # a typing construct this checker does not read: not refused


def _fits_sequence(value: object, origin: Any, args: tuple[Any, ...]) -> bool:
    if isinstance(value, str | bytes) or not isinstance(value, tuple | list):
        return False
    if origin is tuple and args and args[-1] is not Ellipsis:
        return len(value) == len(args) and all(map(fits, value, args))
    return not args or all(fits(item, args[0]) for item in value)


def describe_type(hint: Any) -> str:
    """``hint`` in words: ``"an integer"``, ``"a number or nothing"``, ``"a list"``, ..."""
    origin = typing.get_origin(hint) or hint
    if origin in (types.UnionType, typing.Union):
        return " or ".join(describe_type(option) for option in typing.get_args(hint))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in _NAMES:
        return _NAMES[origin]
    return f"a {getattr(origin, '__name__', str(origin))}"


def require(condition: bool, field: str, message: str) -> None:
    """Raise ``ConfigError("<field>: <message>")`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{field}: {message}")


def check_int(field: str, value: object, minimum: int) -> int:
    """``value`` as an ``int`` >= ``minimum`` (``ConfigError`` naming ``field`` otherwise)."""
    require(fits(value, int), field, f"must be an integer, got {value!r}")
    require(value >= minimum, field, f"must be >= {minimum}, got {value}")  # type: ignore[operator]
    return int(value)  # type: ignore[call-overload]


def check_positive(field: str, value: object) -> float:
    """``value`` as a finite ``float`` > 0."""
    number = _real(field, value)
    require(number > 0, field, f"must be > 0, got {value!r}")
    return number


def check_non_negative(field: str, value: object) -> float:
    """``value`` as a finite ``float`` >= 0."""
    number = _real(field, value)
    require(number >= 0, field, f"must be >= 0, got {value!r}")
    return number


def check_fraction(field: str, value: object) -> float:
    """``value`` as a ``float`` strictly between 0 and 1."""
    number = _real(field, value)
    require(0 < number < 1, field, f"must be in (0, 1), got {value!r}")
    return number


def check_bool(field: str, value: object) -> bool:
    """``value`` when it is a ``bool``."""
    require(isinstance(value, bool), field, f"must be true or false, got {value!r}")
    return bool(value)


def _real(field: str, value: object) -> float:
    """``value`` as a finite ``float`` (booleans are refused)."""
    require(fits(value, float), field, f"must be a number, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    require(math.isfinite(number), field, f"must be finite, got {value!r}")
    return number
