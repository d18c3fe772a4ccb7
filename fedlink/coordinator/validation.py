"""Request validation at the edge: every string, map and header field a client chooses is
bounded here, once, before any other part of the coordinator reads or quotes it.

``RequestChecks`` has one method per call that carries client-chosen fields; each raises
``InvalidArgument`` naming the first field over its limit (``[coordinator.limits]``
``max_string_bytes``, ``max_metadata_entries``, ``max_metadata_bytes``; a header's shape has
at most ``MAX_SHAPE_DIMS`` dimensions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedlink.coordinator.config import LimitsConfig
from fedlink.errors import InvalidArgument
from fedlink.messages import (
    CommitRequest,
    DownloadRequest,
    EvaluationReport,
    HeartbeatRequest,
    JoinRequest,
    LeaveRequest,
    SecureMaskedRequest,
    TensorHeader,
)

MAX_SHAPE_DIMS = 32


class RequestChecks:
    """Bounds the client-chosen fields of each request (see the module docstring)."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits

    # -- one per call ---------------------------------------------------------------------

    def join(self, request: JoinRequest) -> None:
        """``Join``: name, token, metadata, instance key."""
        self.strings(client_name=request.client_name, token=request.token)
        self.mapping("metadata", request.metadata)
        self.strings(instance_key=request.instance_key)
        self.sequence("capabilities", request.capabilities)

    def download(self, request: DownloadRequest) -> None:
        """``Download``: the task id, offsets not negative."""
        self.strings(task_id=request.task_id)
        if request.offset < 0 or request.max_chunk_bytes < 0 or request.end_offset < 0:
            raise InvalidArgument("offset, end_offset and max_chunk_bytes must be >= 0")

    def commit(self, request: CommitRequest) -> None:
        """``Commit``: ids, metrics and the update's header (its counts: ``counts``)."""
        self.strings(upload_id=request.upload_id, task_id=request.task_id)
        self.mapping("metrics", request.metrics)
        self.header(request.update)

    def evaluation(self, request: EvaluationReport) -> None:
        """``ReportEvaluation``: the task id and the metrics (their values:
        ``fedlink.coordinator.evaluations``), like a commit's."""
        self.strings(task_id=request.task_id)
        self.mapping("metrics", request.metrics)

    def heartbeat(self, request: HeartbeatRequest) -> None:
        """``Heartbeat``: the task id."""
        self.strings(task_id=request.task_id)

    def leave(self, request: LeaveRequest) -> None:
        """``Leave``: the reason and the reported metrics."""
        self.strings(reason=request.reason)
        self.mapping("metrics", request.metrics)

    # -- the rules ------------------------------------------------------------------------

    def strings(self, **fields: str) -> None:
        """``InvalidArgument`` naming the first field longer than ``max_string_bytes``."""
        limit = self.limits.max_string_bytes
        for name, value in fields.items():
            if len(value) > limit:
                raise InvalidArgument(f"{name} is {len(value)} characters long; the limit is "
                                      f"{limit}")

    def header(self, header: TensorHeader) -> None:
        """Bound every client-chosen field of a payload header before anything quotes it."""
        self.strings(encoding=header.encoding, dtype=header.dtype, checksum=header.checksum)
        self.mapping("codec_params", header.codec_params)
        if len(header.shape) > MAX_SHAPE_DIMS:
            raise InvalidArgument(f"shape has {len(header.shape)} dimensions; the limit is "
                                  f"{MAX_SHAPE_DIMS}")

    def sequence(self, name: str, values: Sequence[str]) -> None:
        """A repeated string field: at most ``max_metadata_entries`` entries, each bounded."""
        limit = self.limits.max_metadata_entries
        if len(values) > limit:
            raise InvalidArgument(f"{name} has {len(values)} entries; the limit is {limit}")
        for value in values:
            self.strings(**{f"{name} entry": value})

    def mapping(self, name: str, mapping: Mapping[str, Any]) -> None:
        """``InvalidArgument`` for a map with too many entries, or too long keys or values."""
        limit = self.limits.max_metadata_entries
        if len(mapping) > limit:
            raise InvalidArgument(f"{name} has {len(mapping)} entries; the limit is {limit}")
        size = sum(len(k) + (len(v) if isinstance(v, str) else 8) for k, v in mapping.items())
        cap = self.limits.max_metadata_bytes
        if cap and size > cap:
            raise InvalidArgument(f"{name} holds {size} characters in all; the limit is {cap}")
        for key, value in mapping.items():
            self.strings(**{f"{name} key": key})
            if isinstance(value, str):
                self.strings(**{f"{name}[{key[:32]!r}]": value})


def check_counts(request: CommitRequest | SecureMaskedRequest) -> None:
    """An update's example and step counts are coherent (a ``Commit``'s or a masked one's)."""
    if request.num_examples < 1:
        raise InvalidArgument(f"num_examples must be >= 1, got {request.num_examples}")
    if request.steps_completed < 0 or request.steps_planned < 0:
        raise InvalidArgument("steps_completed and steps_planned must be >= 0")
    if request.steps_completed > request.steps_planned > 0:
        raise InvalidArgument(f"steps_completed {request.steps_completed} exceeds "
                              f"steps_planned {request.steps_planned}")
