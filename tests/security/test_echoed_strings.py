"""Finding 7: attacker-sized strings are refused at the edge and never echoed whole.

``encoding``, ``dtype``, ``checksum`` and ``shape`` escaped ``max_string_bytes``; the refusal
details echoed them (200-689 KB), were remembered as the commit's answer and written as events.
"""

from __future__ import annotations

import dataclasses
import json

import grpc
import numpy as np
import pytest
from _hostile import FP32, Raw
from conftest import CoordinatorFactory, run_async

from fedlink.coordinator import CoordinatorConfig
from fedlink.errors import MAX_DETAIL_CHARS
from fedlink.wire import pack

pytestmark = pytest.mark.timeout(60)

DIM = 8
HUGE = "x" * 700_000


@pytest.mark.parametrize("field", ["encoding", "dtype", "checksum", "shape", "codec_params"])
def test_a_huge_header_field_is_refused_briefly(coordinator: CoordinatorFactory,
                                                field: str) -> None:
    payload = pack(np.zeros(DIM, np.float32), FP32)
    value: object = {"shape": tuple(range(100_000)), "codec_params": {"k": HUGE}}.get(field,
                                                                                    HUGE)
    header = dataclasses.replace(payload.header, **{field: value})

    async def scenario() -> tuple[str, str, int]:
        async with (coordinator(CoordinatorConfig(), np.zeros(DIM, np.float32)) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            client = await raw.client()
            task = await raw.task(client)
            answer = await raw.commit(client, task, payload, 10, "up", header=header,
                                      inline=True)
            logged = len(json.dumps([dict(e) for e in server.events.events]))
            return answer.code, answer.detail, logged
    code, detail, logged = run_async(scenario())
    assert code == "INVALID_ARGUMENT"
    assert len(detail) < 200, detail
    assert logged < 20_000  # nothing of the attacker's size was logged


def test_a_refusal_quoting_client_input_is_cut(coordinator: CoordinatorFactory) -> None:
    payload = pack(np.zeros(DIM, np.float32), FP32)
    header = dataclasses.replace(payload.header, encoding="y" * 1000)  # within the limit

    async def scenario() -> str:
        async with (coordinator(CoordinatorConfig(), np.zeros(DIM, np.float32)) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            client = await raw.client()
            task = await raw.task(client)
            answer = await raw.commit(client, task, payload, 10, "up", header=header,
                                      inline=True)
            assert answer.code == "INVALID_ARGUMENT"
            return answer.detail
    assert len(run_async(scenario())) <= MAX_DETAIL_CHARS + 64
