"""Plug points: user code named by an import string ``"package.module:attr"`` or given as an object.

Every name a config accepts (a model factory, a data loader, a trainer, a loss, an evaluator, a
server optimizer, ...) may instead be ``"package.module:attr"``; the Python API takes the object
itself. ``resolve`` turns either into the object, and ``expect`` checks what a factory returned,
so a wrong string or a factory of the wrong thing fails at start, naming what is missing or what
was expected, never inside the first round. Torch-free: nothing here imports user code until
asked to.

>>> from fedlink.plug import resolve
>>> resolve("math:sqrt", "function")(4.0)
2.0
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from fedlink.errors import ConfigError

SEPARATOR = ":"


def is_import_string(value: object) -> bool:
    """Whether ``value`` looks like ``"package.module:attr"`` (and not a registered name)."""
    return isinstance(value, str) and SEPARATOR in value


def load(spec: str, kind: str) -> Any:
    """The attribute ``spec = "package.module:attr.sub"`` names (``ConfigError`` saying what is
    missing: the module, or the attribute inside it)."""
    module_name, _, attr_path = spec.partition(SEPARATOR)
    if not module_name or not attr_path:
        raise ConfigError(f"{kind} {spec!r}: an import string is 'package.module:attr'")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{kind} {spec!r}: cannot import module {module_name!r} ({exc}); is it installed "
            f"or on PYTHONPATH?"
        ) from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(
                f"{kind} {spec!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    return target


def resolve(value: object, kind: str) -> Any:
    """``value`` itself, or the object its import string names."""
    return load(value, kind) if is_import_string(value) else value  # type: ignore[arg-type]


def expect(value: object, expected: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is an instance of ``expected``; else ``ConfigError`` naming both."""
    if isinstance(value, expected):
        return value
    names = expected if isinstance(expected, tuple) else (expected,)
    wanted = " or ".join(f"{t.__module__}.{t.__qualname__}" for t in names)
    raise ConfigError(f"{what} returned a {type(value).__module__}.{type(value).__qualname__}, "
                      f"expected a {wanted}")


def describe(value: object) -> str:
    """How a plugged object is named in a run's config record: its import path when it has
    one, else its type."""
    if isinstance(value, str):
        return value
    module = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None)
    if module and name:
        return f"{module}{SEPARATOR}{name}"
    return f"<{type(value).__module__}.{type(value).__qualname__} object>"


def keyword_names(function: Callable[..., Any],
                  exclude: Iterable[str] = ()) -> frozenset[str] | None:
    """The names ``function`` takes by keyword, less ``exclude`` (``None`` when it takes
    ``**kwargs`` or has no signature to read): what a plugged factory can be given."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in parameters if p.kind in keyword) - set(exclude)
