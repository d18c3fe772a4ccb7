"""A tiny name -> factory registry, so configs can name implementations.

A name of the form ``"package.module:attr"`` is not looked up: it is imported
(``fedlink.plug``), so user code plugs in wherever a built-in does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from fedlink.errors import ConfigError
from fedlink.plug import is_import_string, load

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories of one kind of component."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: make ``factory`` available under ``name``."""

        def add(factory: Callable[..., T]) -> Callable[..., T]:
            self._factories[name] = factory
            return factory

        return add

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._factories))

    def create(self, name: str, **options: Any) -> T:
        """Build the component ``name`` with ``options`` (``ConfigError`` on a bad name/option).

        ``name`` may be an import string ``"package.module:attr"`` naming the factory itself.
        """
        factory = load(name, self.kind) if is_import_string(name) else self._factories.get(name)
        if factory is not None and not callable(factory):
            raise ConfigError(f"{self.kind} {name!r} is a {type(factory).__name__}, not callable")
        if factory is None:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        try:
            return factory(**options)
        except TypeError as exc:
            raise ConfigError(f"bad options for {self.kind} {name!r}: {exc}") from exc

    def __contains__(self, name: object) -> bool:
        return name in self._factories or is_import_string(name)
