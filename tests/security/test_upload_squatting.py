"""Finding 7 (upload ids): an upload id means something only for the client that chose it.

Upload ids were global and first-come: a client that knew (or guessed) another's next upload id
could start an upload under it first, and the owner's own upload was then refused
``PERMISSION_DENIED`` (a third-party client's predictable ids could be squatted). Now the
coordinator keys uploads by ``(client_id, upload_id)``.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from _hostile import FP32, Raw
from conftest import CoordinatorFactory, run_async

from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.wire import pack

pytestmark = pytest.mark.timeout(60)


def test_a_squatted_upload_id_does_not_stop_its_owner_or_mix_their_bytes(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(rounds=2, flush=FlushRule(goal=2, deadline_s=None))
    delta = np.full(8, 0.5, np.float32)

    async def scenario() -> tuple[str, str, str, np.ndarray]:
        async with (coordinator(config, np.zeros(8, np.float32)) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            victim, squatter = await raw.client("victim"), await raw.client("squatter")
            task = await raw.task(victim)
            predictable = "victim-next-update"  # whatever a client names its uploads by
            squatted = await raw.upload(squatter, predictable, b"\xff" * 32)
            committed = await raw.commit(victim, task, pack(delta, FP32), 10, predictable)
            # the squatter cannot read the victim's bytes back through the shared id either
            held = server.service.uploads.status(squatter, predictable)
            return squatted.code, committed.code, str(held), server.service.engine.model

    squatted, committed, held, _ = run_async(scenario())
    assert squatted == "OK"  # its own upload, harmlessly named
    assert committed == "OK", committed
    assert held == "32"  # its own 32 bytes, nothing of the victim's
