"""Finding 2: a colluding fifth of a flush must not steer the model.

Ten clients per flush, two of them hostile, each declaring and claiming the largest count the
protocol accepts (100,000; honest clients 10). Before the flush guard, the default (mean behind
an adaptive norm bound whose statistics came from the first updates to arrive) let them reverse
the model's step, plant a direction of their choosing, or, committing first, set the bound that
every later update was clipped to. The guard computes its statistics over the whole flush:
claims capped at 2 x the lower-median claim, norms clipped at 2 x the lower-median norm,
updates opposed to the coordinate-wise median dropped, and a 20% trimmed mean.
"""

from __future__ import annotations

import numpy as np
import pytest
from _hostile import events_of, run_flushes, step_norm
from conftest import CoordinatorFactory

from fedlink.coordinator import CoordinatorConfig, FlushRule

pytestmark = pytest.mark.timeout(90)

DIM = 64
CAP = 100_000
RNG = np.random.default_rng(23)
X0 = RNG.normal(size=DIM).astype(np.float32)
DIRECTION = (0.05 * RNG.normal(size=DIM)).astype(np.float32)
# the attackers' target: a direction orthogonal to honest training
TROJAN = RNG.normal(size=DIM)
TROJAN -= TROJAN @ DIRECTION / (DIRECTION @ DIRECTION) * DIRECTION.astype(np.float64)
TROJAN = (TROJAN / np.linalg.norm(TROJAN)).astype(np.float32)


def honest() -> np.ndarray:
    return (DIRECTION + 0.02 * RNG.normal(size=DIM)).astype(np.float32)


def along(step: np.ndarray, direction: np.ndarray) -> float:
    """The component of ``step`` along ``direction``, in units of ``||DIRECTION||``."""
    unit = direction.astype(np.float64) / np.linalg.norm(direction)
    return float(step.astype(np.float64) @ unit / np.linalg.norm(DIRECTION))


def config(rounds: int) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=10, deadline_s=None))


def flush_of(attack: np.ndarray, attackers_first: bool = False) -> list[tuple[str, np.ndarray,
                                                                             int]]:
    good = [(f"honest{i}", honest(), 10) for i in range(8)]
    bad = [(f"byzantine{i}", attack, CAP) for i in range(2)]
    return bad + good if attackers_first else good[:4] + bad + good[4:]


def test_a_fifth_sign_flipping_with_the_largest_claim_cannot_reverse_the_step(
        coordinator: CoordinatorFactory) -> None:
    rounds = 3
    flushes = [flush_of(-10 * honest()) for _ in range(rounds)]
    models, server = run_flushes(coordinator, config(rounds), X0, flushes)
    before = X0
    for model in models:
        assert along(model - before, DIRECTION) > 0.7  # most of an honest step, forward
        before = model
    dropped = [e for e in events_of(server, "update_limited") if e["action"] == "dropped"]
    assert len(dropped) == 2 * rounds
    assert all(str(e["task_id"]) for e in dropped)


def test_a_fifth_planting_a_direction_moves_the_model_little_along_it(
        coordinator: CoordinatorFactory) -> None:
    """A backdoor-like push: the honest step plus a large component along TROJAN."""
    rounds = 3
    attack = (DIRECTION + 20 * np.linalg.norm(DIRECTION) * TROJAN).astype(np.float32)
    models, server = run_flushes(coordinator, config(rounds), X0,
                                 [flush_of(attack) for _ in range(rounds)])
    planted = along(models[-1] - X0, TROJAN)
    progress = along(models[-1] - X0, DIRECTION)
    # Before the guard: about 20 per round along TROJAN (the liars' weight made their update
    # the model's). Now clipped to 2 x an honest norm, counted at most twice, partly trimmed.
    assert planted < 0.5 * rounds
    assert progress > 0.7 * rounds
    assert events_of(server, "flush")[-1]["updates_clipped"] == 2


def test_attackers_committing_first_do_not_set_the_norm_bound(
        coordinator: CoordinatorFactory) -> None:
    """Three huge updates delivered before seven honest ones (the old warm-up held the first
    five and took their median: the attackers' norm)."""
    huge = (1e3 * TROJAN).astype(np.float32)
    flush = [(f"early{i}", huge, 10) for i in range(3)] + [
        (f"honest{i}", honest(), 10) for i in range(7)]
    models, server = run_flushes(coordinator, config(1), X0, [flush])
    honest_norms = [float(np.linalg.norm(d.astype(np.float64))) for _, d, _ in flush[3:]]
    # before: the first five set the bound at 2 x 1e3, and the model moved by about 300
    assert step_norm(models[0], X0) <= 2 * max(honest_norms)
    bound = events_of(server, "flush")[-1]["norm_bound"]
    assert bound <= 2 * max(honest_norms)
    assert step_norm(models[0], X0) <= bound * (1 + 1e-6)
    clipped = [e for e in events_of(server, "update_limited") if e["action"] == "clipped"]
    assert len(clipped) == 3 and all(e["norm"] > 100 for e in clipped)
