"""The one name -> implementation registry, so configs can name implementations.

Datasets, partitioners, models, losses, optimizers, trainers, codecs, privacy stages, flush
hooks, aggregators, server optimizers, staleness weights and state stores each keep one
``Registry``; built-ins and user code register the same way::

    from fedlink.compress import CODECS

    @CODECS.register("my-codec")
    def my_codec(*, bits: int = 4) -> Codec: ...

    CODECS.register("alias", my_codec)   # or called with the item

A name of the form ``"package.module:attr"`` is not looked up: it is imported
(``fedlink.plug``), so user code plugs in wherever a built-in does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from fedlink.errors import ConfigError
from fedlink.plug import is_import_string, load

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[T]):
    """Maps names to callables that make one kind of component (``T``).

    A name is registered once: registering a taken name is a ``ConfigError`` unless
    ``replace=True`` (two plug-ins must not silently shadow each other).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Callable[..., T]] = {}

    @overload
    def register(self, name: str, *, replace: bool = False) -> Callable[[F], F]: ...

    @overload
    def register(self, name: str, item: F, *, replace: bool = False) -> F: ...

    def register(self, name: str, item: Callable[..., T] | None = None, *,
                 replace: bool = False) -> Any:
        """Make ``item`` available as ``name``; without ``item``, a decorator that does so
        and hands the decorated object back unchanged."""

        def add(target: F) -> F:
            self.add(name, target, replace=replace)
            return target

        return add if item is None else add(item)  # type: ignore[type-var]

    def add(self, name: str, item: Callable[..., T], *, replace: bool = False) -> None:
        """Register ``item`` as ``name`` (``ConfigError`` on a bad or taken name)."""
        if not isinstance(name, str) or not name or is_import_string(name):
            raise ConfigError(f"{self.kind} name must be a non-empty string without ':', "
                              f"got {name!r}")
        if not callable(item):
            raise ConfigError(f"{self.kind} {name!r}: a {type(item).__name__} is not callable")
        if name in self._items and not replace:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item

    def get(self, name: str) -> Callable[..., T]:
        """What ``name`` names: a registered item, or the object an import string names
        (``ConfigError`` listing the known names, or saying what is not callable)."""
        if is_import_string(name):
            item = load(name, self.kind)
            if not callable(item):
                raise ConfigError(f"{self.kind} {name!r} is a {type(item).__name__}, "
                                  f"not callable")
            return item  # type: ignore[no-any-return]
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ConfigError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}"
            ) from None

    def create(self, name: str, **options: Any) -> T:
        """Build the component ``name`` with ``options`` (``ConfigError`` on a bad name/option).

        ``name`` may be an import string ``"package.module:attr"`` naming the factory itself.
        """
        factory = self.get(name)
        try:
            return factory(**options)
        except TypeError as exc:
            raise ConfigError(f"bad options for {self.kind} {name!r}: {exc}") from exc

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._items))

    def registered(self, name: object) -> bool:
        """Whether ``name`` is a registered name (an import string is not)."""
        return isinstance(name, str) and name in self._items

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` can be looked up: registered, or an import string."""
        return self.registered(name) or is_import_string(name)
