"""A recorded session: the messages of one task, inline and streamed, for the golden files.

The session is played against a real ``CoordinatorService`` (no network: the messages are
what the servicer would put on the wire), with a fixed model and update, so that the recording
is the same on every run. The client id the coordinator draws at random is replaced by
``CLIENT_ID`` in the recording.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np

from fedlink.clock import ManualClock
from fedlink.compress import get_codec
from fedlink.conformance.golden import VECTOR
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.coordinator.service import CoordinatorService
from fedlink.messages import (
    CommitRequest,
    DownloadRequest,
    GetTaskRequest,
    JoinRequest,
    LeaveRequest,
    Task,
    UploadChunk,
    UploadStatusRequest,
)
from fedlink.metrics import EventLog
from fedlink.wire import iter_chunks, pack, to_json

CLIENT_ID = "CLIENT_ID"
STREAM_CHUNK_BYTES = 16
"""Chunk size of the streamed session: the 48-byte model and update travel in 3 chunks."""


def record_sessions() -> dict[str, list[dict[str, Any]]]:
    """``{"inline": [...], "streamed": [...]}``: each a list of ``{call, request, reply}``."""
    return {"inline": asyncio.run(_session(inline=True)),
            "streamed": asyncio.run(_session(inline=False))}


class Recorder:
    """The calls of a recorded session, as ``{call, request, reply}`` in proto3 JSON."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def add(self, call: str, request: Any, reply: Any) -> None:
        """Record one call (a streamed side: a list of messages)."""
        def encode(message: Any) -> Any:
            if isinstance(message, list):
                return [to_json(m) for m in message]
            return to_json(message)

        self.messages.append({"call": call, "request": encode(request),
                              "reply": encode(reply)})

    def normalised(self, names: Mapping[str, str]) -> list[dict[str, Any]]:
        """The messages with each random client id replaced by its name in ``names``."""
        text = json.dumps(self.messages)
        for client_id, name in names.items():
            text = text.replace(client_id, name)
        result: list[dict[str, Any]] = json.loads(text)
        return result


def _service(inline: bool) -> CoordinatorService:
    limits = LimitsConfig(inline_bytes=1024 if inline else 0,
                          chunk_bytes=1024 if inline else STREAM_CHUNK_BYTES, long_poll_s=0.0)
    config = CoordinatorConfig(run_name="golden", rounds=1,
                               flush=FlushRule(goal=1, deadline_s=None), limits=limits)
    return CoordinatorService(config, VECTOR, EventLog(None), clock=ManualClock())


async def _session(inline: bool) -> list[dict[str, Any]]:
    service, rec = _service(inline), Recorder()
    join = JoinRequest(client_name="golden-client", num_examples=10)
    joined = await service.join(join)
    rec.add("Join", join, joined)
    cid = joined.client_id
    ask = GetTaskRequest(cid, held_version=-1)
    task = await service.get_task(ask)
    rec.add("GetTask", ask, task)
    assert isinstance(task, Task)
    update = pack(np.full(VECTOR.size, 0.125, np.float32), get_codec("fp32"))
    upload_id = f"{cid}-golden-upload-1"
    if not inline:
        await _stream(service, rec, cid, task, upload_id, update.data)
    commit = CommitRequest(cid, upload_id, task.task_id, task.model_version, num_examples=10,
                           steps_completed=1, steps_planned=1, update=update.header,
                           metrics={"train_seconds": 0.5},
                           update_data=update.data if inline else b"")
    rec.add("Commit", commit, await service.commit(commit))
    ask = GetTaskRequest(cid, held_version=task.model_version)
    rec.add("GetTask", ask, await service.get_task(ask))
    leave = LeaveRequest(cid, reason="run finished")
    rec.add("Leave", leave, await service.leave(leave))
    service.close()
    return rec.normalised({cid: CLIENT_ID})


async def _stream(service: CoordinatorService, rec: Recorder, cid: str, task: Task,
                  upload_id: str, data: bytes) -> None:
    """Download the model, upload the update in chunks, ask the upload's status."""
    download = DownloadRequest(cid, task.task_id, offset=0, max_chunk_bytes=STREAM_CHUNK_BYTES)
    rec.add("Download", download, [c async for c in service.download(download)])
    chunks = [UploadChunk(cid, upload_id, offset, piece)
              for offset, piece in iter_chunks(data, STREAM_CHUNK_BYTES)]

    async def stream() -> AsyncIterator[UploadChunk]:
        for chunk in chunks:
            yield chunk

    rec.add("Upload", chunks, await service.upload(stream()))
    status = UploadStatusRequest(cid, upload_id)
    rec.add("UploadStatus", status, await service.upload_status(status))
