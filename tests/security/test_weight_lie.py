"""Finding 1: a commit claiming 2**62 examples must not take the model over.

The weight of an update is the client's word: the coordinator caps it at the size the client
declared at ``Join`` and at ``limits.max_examples_per_update``, and the robust aggregators
count every update once by default.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from _hostile import Raw, events_of
from conftest import CoordinatorFactory, run_async

from fedlink.coordinator import CoordinatorConfig, FlushRule

pytestmark = pytest.mark.timeout(60)

DIM = 32
X0 = np.ones(DIM, np.float32)
HONEST = np.full(DIM, 0.01, np.float32)
TAKEOVER = (np.zeros(DIM, np.float32) - X0) * 0.5  # halfway to the attacker's model (zeros)


def run(coordinator: CoordinatorFactory, config: CoordinatorConfig,
        honest: int, attacker_declares: int) -> tuple[np.ndarray, list[dict[str, object]]]:
    async def scenario() -> tuple[np.ndarray, list[dict[str, object]]]:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            for i in range(honest):
                assert (await raw.deliver(HONEST, f"honest{i}", 10)).code == "OK"
            lie = await raw.deliver(TAKEOVER, "attacker", attacker_declares,
                                    claimed=2**62)
            assert lie.code == "OK", lie
            await server.wait_finished()
            return server.service.engine.model.copy(), events_of(server, "update_accepted")
    return run_async(scenario())


def test_a_claimed_weight_is_capped_at_the_declared_size(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=2, deadline_s=None))
    model, accepted = run(coordinator, config, honest=1, attacker_declares=10)
    assert [e["num_examples"] for e in accepted] == [10, 10]
    # Equal weights, and the flush guard clips the hostile step to 2 x the lower-median norm
    # (the honest one's): the model moves at most that far, not onto the attacker's model
    # (distance 0 before the fix; halfway with equal weights and no norm bound).
    step = np.linalg.norm((model - X0).astype(np.float64))
    assert step <= 2 * np.linalg.norm(HONEST.astype(np.float64)) * (1 + 1e-5)
    assert np.linalg.norm(model) > 0.7 * np.linalg.norm(X0)


def test_a_size_lied_at_join_is_capped_by_max_examples_per_update(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=2, deadline_s=None))
    _, accepted = run(coordinator, config, honest=1, attacker_declares=2**62)
    assert accepted[-1]["num_examples"] == config.limits.max_examples_per_update


def test_the_median_counts_a_liar_once(coordinator: CoordinatorFactory) -> None:
    """Weighted by 2**62 the attacker *was* the median; unweighted, two honest updates win."""
    config = CoordinatorConfig(rounds=1, aggregator="median",
                               flush=FlushRule(goal=3, deadline_s=None))
    model, _ = run(coordinator, config, honest=2, attacker_declares=2**62)
    np.testing.assert_allclose(model, X0 + HONEST, rtol=1e-6)
