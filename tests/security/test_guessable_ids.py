"""Finding 5: a holder of the shared ``join_token`` cannot guess another client's id.

Ids were ``c<n>-<nonce>`` with one nonce per process: knowing one's own id gave every other.
Now each id carries 128 random bits of its own.
"""

from __future__ import annotations

import re

import grpc
import numpy as np
import pytest
from _hostile import Raw, answer_of
from conftest import CoordinatorFactory, run_async

from fedlink.coordinator import CoordinatorConfig
from fedlink.proto.v1 import coordinator_pb2 as pb

pytestmark = pytest.mark.timeout(60)


def test_a_neighbours_id_cannot_be_derived_from_ones_own(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(join_token="shared-secret-token")

    async def scenario() -> tuple[str, str, str]:
        async with (coordinator(config, np.zeros(8, np.float32)) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            victim = await raw.client("victim", token="shared-secret-token")
            attacker = await raw.client("attacker", token="shared-secret-token")
            # The old scheme: the victim is the attacker's number minus one, same suffix.
            number, suffix = re.fullmatch(r"c(\d+)-(.+)", attacker).groups()  # type: ignore[union-attr]
            guess = f"c{int(number) - 1}-{suffix}"
            heartbeat = await answer_of(raw.stub.Heartbeat(
                pb.HeartbeatRequest(client_id=guess), timeout=10))
            return victim, attacker, heartbeat.code
    victim, attacker, code = run_async(scenario())
    assert code == "UNAUTHENTICATED"
    for client_id in (victim, attacker):
        secret = client_id.split("-", 1)[1]
        assert len(bytes.fromhex(secret)) * 8 >= 128
    assert victim.split("-", 1)[1] != attacker.split("-", 1)[1]
