"""The only place where protobuf meets fedlink's own types; plus payload packing and chunking."""

from fedlink.wire.convert import (
    from_proto,
    task_reply_from_proto,
    task_reply_to_proto,
    to_json,
    to_proto,
)
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
