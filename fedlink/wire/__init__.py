"""The only place where protobuf meets fedlink's own types; plus payload packing and chunking.

The protobuf conversions (``fedlink.wire.convert``) load when one of their names is first read
(PEP 562): packing and unpacking payloads, all a virtual simulation does with the wire format,
does not import protobuf.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedlink.wire.payload import (
    DEFAULT_CHUNK_BYTES,
    Payload,
    check_header,
    checksum,
    iter_chunks,
    pack,
    unpack,
    values_checksum,
)

if TYPE_CHECKING:
    from fedlink.wire.convert import (
        from_proto,
        task_reply_from_proto,
        task_reply_to_proto,
        to_json,
        to_proto,
    )

_CONVERT = frozenset({"from_proto", "task_reply_from_proto", "task_reply_to_proto", "to_json",
                      "to_proto"})
"""The names of ``fedlink.wire.convert``, imported when first read."""

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "Payload",
    "check_header",
    "checksum",
    "from_proto",
    "iter_chunks",
    "pack",
    "task_reply_from_proto",
    "task_reply_to_proto",
    "to_json",
    "to_proto",
    "unpack",
    "values_checksum",
]


def __getattr__(name: str) -> Any:
    """A protobuf conversion's function, from ``fedlink.wire.convert`` (imported now)."""
    if name not in _CONVERT:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("fedlink.wire.convert"), name)
