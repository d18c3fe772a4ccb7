"""Fuzzing every call of a real coordinator on loopback with malformed, adversarial messages.

For each call of ``fedlink.v1.Coordinator``, hypothesis builds 2,000 requests mixing valid ids
(a joined client, its real task, an upload it started) with garbage (unknown or huge ids,
versions from the future, offsets past the end, malformed tensor headers, NaN/Inf and huge
values, too many metadata entries). Every answer must be OK or a status code listed in
``fedlink.errors``' table, must come within a per-call deadline, must never be ``INTERNAL``,
and the global model must stay finite throughout.

Speed: one coordinator per module, running on its own event loop in a thread; a sync gRPC
channel; ``long_poll_s = 0`` so ``GetTask`` answers at once; small models and payloads; the
rate limit off (a limit refusal is a documented answer, but would hide the handlers behind it).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedlink.errors
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
from fedlink.coordinator.config import LimitsConfig
from fedlink.messages import TensorHeader
from fedlink.metrics import EventLog
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import checksum, pack, to_proto

pytestmark = pytest.mark.timeout(240)

DIM = 16
DEADLINE_S = 60.0
"""A cap, not a wait: a call answers at once (``long_poll_s = 0``) and returns as soon as it
does; only one still unanswered after a minute is a hang. On a machine at load 10 a call
once waited over 5 s for the starved loop thread."""
STOP_CAP_S = 60.0
"""The most the module's coordinator may take to stop."""
EXAMPLES = settings(max_examples=2000, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
CONFIG = CoordinatorConfig(
    rounds=1_000_000, flush=FlushRule(goal=1, deadline_s=None, max_staleness=2),
    # rates off, as the request rate: examples join from one address as fast as the machine
    # runs them (over 20 a second made Join, inside an example, fail RESOURCE_EXHAUSTED)
    limits=LimitsConfig(long_poll_s=0.0, requests_per_s=0.0, max_clients=0,
                        join_per_peer_per_s=0.0, join_global_per_s=0.0,
                        max_update_bytes=1 << 16, max_chunk_bytes=1 << 12, chunk_bytes=1 << 10,
                        max_metadata_entries=8, max_string_bytes=256))


def documented_codes() -> set[str]:
    """The status codes in ``fedlink.errors``' table (the coordinator's documented answers)."""
    doc = fedlink.errors.__doc__ or ""
    codes = set(re.findall(r"^``([A-Z_]+)``", doc, flags=re.MULTILINE))
    assert {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"} <= codes, codes
    return codes


ALLOWED = documented_codes() - {"INTERNAL"}


@dataclass
class Fuzzed:
    """A coordinator serving on a background event loop, a sync stub and a joined client."""

    server: CoordinatorServer
    stub: pb_grpc.CoordinatorStub
    client_id: str
    task_id: str
    version: int

    def model(self) -> np.ndarray:
        return self.server.service.engine.model


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Fuzzed]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = CoordinatorServer(CONFIG, np.linspace(-1, 1, DIM, dtype=np.float32),
                               EventLog(None), address="127.0.0.1:0")
    port = asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.CoordinatorStub(channel)
    client_id = stub.Join(pb.JoinRequest(client_name="fuzz", num_examples=5),
                          timeout=DEADLINE_S).client_id
    reply = stub.GetTask(pb.GetTaskRequest(client_id=client_id, held_version=-1),
                         timeout=DEADLINE_S)
    try:
        yield Fuzzed(server, stub, client_id, reply.task.task_id, reply.task.model_version)
    finally:
        channel.close()
        # a cap, not a wait: at load 10 the stop (calls cancelled after 0.5 s, the service
        # closed) once took over 10 s on the starved loop thread
        asyncio.run_coroutine_threadsafe(server.stop(0.5), loop).result(STOP_CAP_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def call(fuzzed: Fuzzed, fn: object) -> bool:
    """Run one call (True if it succeeded); a failure must be a documented status code, never
    INTERNAL or a hang."""
    ok = False
    try:
        result = fn() if callable(fn) else None  # type: ignore[operator]
        if isinstance(result, Iterator):
            for _ in result:
                pass
        ok = True
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        assert code != grpc.StatusCode.DEADLINE_EXCEEDED, "the coordinator hung"
        assert code.name in ALLOWED, (code, exc.details())  # type: ignore[attr-defined]
        assert "Traceback" not in (exc.details() or "")  # type: ignore[attr-defined]
    assert np.isfinite(fuzzed.model()).all(), "the global model went non-finite"
    return ok


# -- strategies ---------------------------------------------------------------------------------

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT64 = st.integers(0, (1 << 64) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
SMALL_INT = st.integers(-3, 40)
# Long strings are repeats of a short one: drawing hundreds of characters one by one is where
# hypothesis would spend most of this file's time.
LONG_TEXT = st.builds(lambda s, n: (s or "x") * n, st.text(max_size=3), st.integers(40, 700))
TEXT = st.one_of(st.text(max_size=10), LONG_TEXT,
                 st.sampled_from(["", ".", "..", "../etc", "a/b", "x" * 5000, "\x00", "é"]))
UPLOAD_ID = st.integers(0, 999_999).map(lambda i: f"u{i}")
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)


def ids(valid: str) -> st.SearchStrategy[str]:
    return st.one_of(st.just(valid), TEXT)


@st.composite
def vectors(draw: st.DrawFn) -> np.ndarray:
    kind = draw(st.sampled_from(["normal", "huge", "nonfinite", "any"]))
    if kind == "normal":
        return np.asarray(draw(st.lists(st.floats(-1, 1, width=32), min_size=DIM,
                                        max_size=DIM)), dtype=np.float32)
    if kind == "huge":
        return np.full(DIM, draw(st.sampled_from([3e38, -3e38, 1e30, 1e6])), dtype=np.float32)
    if kind == "nonfinite":
        vec = np.zeros(DIM, dtype=np.float32)
        vec[draw(st.integers(0, DIM - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        return vec
    size = draw(st.sampled_from([0, 1, DIM - 1, DIM, DIM + 1]))
    return np.asarray(draw(st.lists(FLOATS, min_size=size, max_size=size)), dtype=np.float32)


@st.composite
def headers(draw: st.DrawFn, data: bytes) -> TensorHeader:
    return TensorHeader(
        encoding=draw(st.one_of(st.sampled_from(["fp32", "fp16", "topk", "qsgd", "sign",
                                                 "zlib", "xor-zlib"]), TEXT)),
        shape=tuple(draw(st.one_of(st.just([DIM]), st.lists(INT64, max_size=3)))),
        dtype=draw(st.one_of(st.just("float32"), TEXT)),
        num_bytes=draw(st.one_of(st.just(len(data)), UINT64)),
        checksum=draw(st.one_of(st.just(checksum(data)), st.just("sha256:"), TEXT)),
        codec_params=draw(st.dictionaries(TEXT, TEXT, max_size=3)),
    )


# -- one test per call --------------------------------------------------------------------------

@EXAMPLES
@given(name=TEXT, token=TEXT, num_examples=INT64,
       metadata=st.dictionaries(TEXT, TEXT, max_size=12))
def test_join(fuzzed: Fuzzed, name: str, token: str, num_examples: int,
              metadata: dict[str, str]) -> None:
    request = pb.JoinRequest(client_name=name, token=token, num_examples=num_examples,
                             metadata=metadata)
    call(fuzzed, lambda: fuzzed.stub.Join(request, timeout=DEADLINE_S))


@EXAMPLES
@given(data=st.data())
def test_get_task(fuzzed: Fuzzed, data: st.DataObject) -> None:
    request = pb.GetTaskRequest(client_id=data.draw(ids(fuzzed.client_id)),
                                held_version=data.draw(st.one_of(SMALL_INT, INT64)))
    call(fuzzed, lambda: fuzzed.stub.GetTask(request, timeout=DEADLINE_S))


@EXAMPLES
@given(data=st.data())
def test_download(fuzzed: Fuzzed, data: st.DataObject) -> None:
    request = pb.DownloadRequest(
        client_id=data.draw(ids(fuzzed.client_id)), task_id=data.draw(ids(fuzzed.task_id)),
        offset=data.draw(st.one_of(st.integers(0, 4 * DIM + 2), UINT64)),
        max_chunk_bytes=data.draw(st.one_of(st.integers(0, 64), st.integers(0, (1 << 32) - 1))),
        delta=data.draw(st.booleans()),
        end_offset=data.draw(st.one_of(st.integers(0, 4 * DIM + 2), UINT64)))
    call(fuzzed, lambda: fuzzed.stub.Download(request, timeout=DEADLINE_S))


@EXAMPLES
@given(data=st.data())
def test_upload(fuzzed: Fuzzed, data: st.DataObject) -> None:
    upload_id = data.draw(st.one_of(UPLOAD_ID, TEXT))
    chunks = [pb.UploadChunk(client_id=data.draw(ids(fuzzed.client_id)),
                             upload_id=data.draw(st.one_of(st.just(upload_id), TEXT)),
                             offset=data.draw(st.one_of(st.integers(0, 80), UINT64)),
                             data=data.draw(st.one_of(st.binary(max_size=80),
                                                      st.just(b"\0" * 5000))))
              for _ in range(data.draw(st.integers(0, 4)))]
    call(fuzzed, lambda: fuzzed.stub.Upload(iter(chunks), timeout=DEADLINE_S))


@EXAMPLES
@given(data=st.data())
def test_upload_status(fuzzed: Fuzzed, data: st.DataObject) -> None:
    request = pb.UploadStatusRequest(client_id=data.draw(ids(fuzzed.client_id)),
                                     upload_id=data.draw(st.one_of(
                                         UPLOAD_ID, TEXT)))
    call(fuzzed, lambda: fuzzed.stub.UploadStatus(request, timeout=DEADLINE_S))


@EXAMPLES
@given(data=st.data())
def test_commit(fuzzed: Fuzzed, data: st.DataObject) -> None:
    """Often a real upload of an adversarial vector, then a commit with fuzzed fields."""
    engine = fuzzed.server.service.engine
    task_id = fuzzed.task_id
    payload = pack(data.draw(vectors()), get_codec(data.draw(st.sampled_from(["fp32", "fp16"]))))
    upload_id = f"c{data.draw(st.integers(0, 10**9))}"
    if data.draw(st.booleans()):  # refused when the id was drawn (and committed) before
        chunk = pb.UploadChunk(client_id=fuzzed.client_id, upload_id=upload_id, offset=0,
                               data=payload.data)
        call(fuzzed, lambda: fuzzed.stub.Upload(iter([chunk]), timeout=DEADLINE_S))
    header = payload.header if data.draw(st.booleans()) else data.draw(headers(payload.data))
    request = pb.CommitRequest(
        client_id=data.draw(ids(fuzzed.client_id)),
        upload_id=data.draw(st.one_of(st.just(upload_id), TEXT)),
        task_id=data.draw(st.one_of(st.just(task_id), TEXT)),
        base_version=data.draw(st.one_of(st.just(engine.version), SMALL_INT, INT64)),
        num_examples=data.draw(st.one_of(st.integers(1, 100), INT64)),
        steps_completed=data.draw(st.one_of(st.integers(0, 3), INT32)),
        steps_planned=data.draw(st.one_of(st.integers(0, 3), INT32)),
        update=to_proto(header),
        metrics=data.draw(st.dictionaries(TEXT, st.floats(), max_size=10)))
    if call(fuzzed, lambda: fuzzed.stub.Commit(request, timeout=DEADLINE_S)):
        # accepted: the model moved on (goal = 1); hold the next version's task
        task = fuzzed.stub.GetTask(pb.GetTaskRequest(client_id=fuzzed.client_id,
                                                     held_version=-1), timeout=DEADLINE_S)
        if task.WhichOneof("outcome") == "task":
            fuzzed.task_id = task.task.task_id


@EXAMPLES
@given(data=st.data())
def test_heartbeat(fuzzed: Fuzzed, data: st.DataObject) -> None:
    request = pb.HeartbeatRequest(client_id=data.draw(ids(fuzzed.client_id)),
                                  task_id=data.draw(st.one_of(st.just(fuzzed.task_id), TEXT)))
    call(fuzzed, lambda: fuzzed.stub.Heartbeat(request, timeout=DEADLINE_S))


@EXAMPLES
@given(data=st.data())
def test_leave(fuzzed: Fuzzed, data: st.DataObject) -> None:
    """Half the time a fresh client leaves (with a fuzzed reason); else a fuzzed id does."""
    client_id = data.draw(TEXT)
    if data.draw(st.booleans()):
        client_id = fuzzed.stub.Join(pb.JoinRequest(client_name="leaver", num_examples=1),
                                     timeout=DEADLINE_S).client_id
    request = pb.LeaveRequest(client_id=client_id, reason=data.draw(TEXT))
    call(fuzzed, lambda: fuzzed.stub.Leave(request, timeout=DEADLINE_S))
