"""Finding 4: uploads hold no file descriptors, and a refused chunk creates nothing.

Before, each upload id kept its spool file open until commit, and a chunk refused as a gap
still created one: 1,080 refused Upload calls exhausted the process's descriptors and an
honest commit failed with ``INTERNAL`` (``EMFILE``).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from _hostile import Raw, open_fds
from conftest import CoordinatorFactory, run_async

from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig

pytestmark = pytest.mark.timeout(60)

DIM = 32
X0 = np.zeros(DIM, np.float32)


def test_open_uploads_hold_no_descriptor_and_gaps_create_no_file(
        coordinator: CoordinatorFactory, tmp_path: Path) -> None:
    state = tmp_path / "state"
    # No request rate limit: many sybil ids would get past it anyway (finding 6).
    config = CoordinatorConfig(rounds=1, state_dir=str(state),
                               limits=LimitsConfig(requests_per_s=0),
                               flush=FlushRule(goal=1, deadline_s=None))

    async def scenario() -> str:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            attacker = await raw.client("attacker")
            for i in range(4):
                assert (await raw.upload(attacker, f"open{i}", b"x" * 1000)).code == "OK"
            assert len(list(state.glob("uploads/*/*.spool"))) == 4
            assert open_fds(".spool") == []  # bytes on disk, no descriptor held
            for i in range(300):  # each a gap: refused, and nothing made
                gap = await raw.upload(attacker, f"gap{i}", b"x", offset=10)
                assert gap.code == "INVALID_ARGUMENT", gap
            assert len(list(state.glob("uploads/*/*.spool"))) == 4
            assert open_fds(".spool") == []
            answer = await raw.deliver(np.full(DIM, 0.01, np.float32), "honest")
            return answer.code
    assert run_async(scenario()) == "OK"
