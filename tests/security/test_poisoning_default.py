"""Finding 2: with no defence configured, a huge update is bounded and no version is non-finite.

Norm bounding is on by default (an adaptive bound from recent update norms), and every new
model version is checked finite (and not an explosion) before it is published: a refused step
leaves the model at its last good version and logs ``flush_refused``.
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
RNG = np.random.default_rng(3)
X0 = RNG.normal(size=DIM).astype(np.float32)


def honest_delta() -> np.ndarray:
    return (0.01 * RNG.normal(size=DIM)).astype(np.float32)


def run_rounds(coordinator: CoordinatorFactory, config: CoordinatorConfig,
               attack: np.ndarray) -> tuple[list[np.ndarray], object]:
    """``config.rounds`` versions of ``goal - 1`` honest updates and one ``attack`` each."""
    honest = [f"h{i}" for i in range(config.flush.goal - 1)]
    async def scenario() -> tuple[list[np.ndarray], object]:
        async with coordinator(config, X0) as server:
            models = []
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                raw = Raw(channel)
                for version in range(config.rounds):
                    for name in honest:
                        assert (await raw.deliver(honest_delta(), f"{name}v{version}")).code \
                            == "OK"
                    await raw.deliver(attack, f"attacker-v{version}")
                    models.append(server.service.engine.model.copy())
            await server.wait_finished()
            return models, server
    return run_async(scenario())


def test_an_update_of_norm_1e8_is_clipped_by_default(coordinator: CoordinatorFactory) -> None:
    attack = RNG.normal(size=DIM)
    attack = (attack / np.linalg.norm(attack) * 1e8).astype(np.float32)
    config = CoordinatorConfig(rounds=3, flush=FlushRule(goal=3, deadline_s=None))
    models, server = run_rounds(coordinator, config, attack)
    # Before the fix the model moved by ~1e8 / 3 per version. Each version's step is at most
    # the bound its flush reports (2 x the lower-median norm of its updates: an honest one's),
    # not merely "a few model norms" (which let a step of 3 x the model's norm pass).
    before = X0
    for model, flush in zip(models, events_of(server, "flush"), strict=True):
        step = np.linalg.norm(model.astype(np.float64) - before)
        assert step <= flush["norm_bound"] * (1 + 1e-6)
        assert step <= 2 * 0.01 * np.sqrt(DIM) * 1.5  # about twice an honest step at most
        before = model
    assert all(np.isfinite(m).all() for m in models)


def test_finite_3e38_deltas_never_make_an_inf_model(coordinator: CoordinatorFactory) -> None:
    # Half of each version's weight: 1.5e38 per value per version, Inf by the third before.
    attack = np.full(DIM, 3e38, np.float32)
    config = CoordinatorConfig(rounds=3, flush=FlushRule(goal=2, deadline_s=None))
    models, _ = run_rounds(coordinator, config, attack)
    assert all(np.isfinite(m).all() for m in models)


def test_an_exploding_step_is_refused_and_the_model_kept(
        coordinator: CoordinatorFactory) -> None:
    """Bounding off, the last line holds: the step is refused, the run goes on."""
    attack = np.full(DIM, 3e38, np.float32)
    config = CoordinatorConfig(rounds=2, norm_bound_adaptive=False,
                               flush=FlushRule(goal=3, deadline_s=None))
    models, server = run_rounds(coordinator, config, attack)
    refused = events_of(server, "flush_refused")
    # 3e38 / 3 per value is still finite: refused as an explosion (an Inf model otherwise).
    assert refused and "over 1000 x the model's norm" in str(refused[0]["reason"])
    assert all(np.isfinite(m).all() for m in models)
    np.testing.assert_array_equal(models[0], X0)  # the last good version: the initial model
