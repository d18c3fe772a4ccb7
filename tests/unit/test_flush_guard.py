"""The flush guard (``fedlink.aggregate.flushguard``): its rules, and how it composes with
differential privacy, sparsifying codecs, FedNova and memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.aggregate import ACCUMULATORS
from fedlink.aggregate.flushguard import FlushGuard, GuardRules, RobustConfig, lower_median
from fedlink.coordinator import CoordinatorConfig, FlushRule, RoundEngine
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.errors import ConfigError
from fedlink.messages import Task
from fedlink.metrics import EventLog
from fedlink.sim import ExperimentConfig

RNG = np.random.default_rng(9)
DIM = 30


def honest(n: int) -> list[np.ndarray]:
    direction = RNG.normal(size=DIM)
    return [(0.1 * (direction + 0.5 * RNG.normal(size=DIM))).astype(np.float32)
            for _ in range(n)]


def guard(**rules: Any) -> FlushGuard:
    return FlushGuard(ACCUMULATORS.create("mean"), GuardRules(**rules))


def test_lower_median_is_an_element_and_the_smaller_of_two() -> None:
    assert lower_median([3.0, 1.0]) == 1.0
    assert lower_median([5.0, 1.0, 3.0, 100.0]) == 3.0
    assert lower_median([]) == 0.0


def test_honest_updates_of_similar_size_pass_untouched() -> None:
    acc, deltas = guard(), honest(10)
    for i, delta in enumerate(deltas):
        acc.add(delta, 10.0 + i % 3, source=f"c{i}")
    weights = np.array([10.0 + i % 3 for i in range(10)])
    expected = (weights[:, None] * np.stack(deltas)).sum(0) / weights.sum()
    np.testing.assert_allclose(acc.mean(), expected, rtol=1e-5, atol=1e-7)
    assert acc.report.limited == []


def test_weights_are_capped_at_twice_the_lower_median() -> None:
    acc = guard(norm_multiple=0.0, drop_opposed=False)
    deltas = honest(4)
    for i, (delta, weight) in enumerate(zip(deltas, [10.0, 20.0, 30.0, 1e5], strict=True)):
        acc.add(delta, weight, source=f"c{i}")
    assert dict(acc.kept()) == {"c0": 10.0, "c1": 20.0, "c2": 30.0, "c3": 40.0}
    [limited] = acc.report.limited
    assert (limited.source, limited.action, limited.limited_weight) == ("c3", "downweighted", 40)
    assert acc.total_weight == 100.0


def test_at_most_a_minority_is_dropped_the_most_opposed_first() -> None:
    deltas = honest(5)
    opposed = [-d for d in deltas[:3]]  # three of eight pull against the median
    acc = guard(norm_multiple=0.0)
    for i, delta in enumerate([*deltas, *opposed]):
        acc.add(delta, 1.0, source=f"c{i}")
    acc.mean()
    dropped = [x for x in acc.report.limited if x.action == "dropped"]
    assert sorted(x.source for x in dropped) == ["c5", "c6", "c7"]
    assert all(x.cosine is not None and x.cosine < 0 for x in dropped)
    many = guard(norm_multiple=0.0)  # five opposed of eight: at most (8 - 1) // 2 = 3 go
    for i, delta in enumerate([*deltas[:3], *[-d for d in deltas]]):
        many.add(delta, 1.0, source=f"c{i}")
    many.mean()
    assert many.report.counts()["updates_dropped"] <= 3


def test_no_drop_when_the_median_is_zero() -> None:
    """Sparse updates (top-k) that rarely share a coordinate: the median is zero, and the
    guard cannot tell who is opposed, so it drops nobody."""
    acc = guard(norm_multiple=0.0)
    for i in range(6):
        sparse = np.zeros(DIM, np.float32)
        sparse[i] = 1.0 if i % 2 else -1.0
        acc.add(sparse, 1.0, source=f"c{i}")
    acc.mean()
    assert acc.report.counts()["updates_dropped"] == 0


def test_fednova_compares_per_step_norms() -> None:
    """A client that ran 4 x the steps has a delta 4 x as long: not a reason to clip it."""
    acc = FlushGuard(ACCUMULATORS.create("fednova"), GuardRules(drop_opposed=False))
    base = honest(1)[0]
    acc.add(base, 10.0, steps=1, source="short")
    acc.add(4 * base, 10.0, steps=4, source="long")
    acc.mean()
    assert acc.report.limited == []


def test_the_guard_buffers_one_flush_and_refuses_more_than_its_budget(
        fake_clock: FakeClock) -> None:
    config = CoordinatorConfig(flush=FlushRule(goal=100, deadline_s=None),
                               robust=RobustConfig(max_buffer_mb=1.0))
    with pytest.raises(ConfigError, match=r"max_buffer_mb.*robust.enabled = false"):
        RoundEngine(config, np.zeros(10_000, np.float32), EventLog(None), clock=fake_clock)
    streaming = CoordinatorConfig(flush=FlushRule(goal=100, deadline_s=None),
                                  robust=RobustConfig(enabled=False))
    RoundEngine(streaming, np.zeros(10_000, np.float32), EventLog(None), clock=fake_clock)


@pytest.mark.parametrize(("key", "value"), [
    ("weight_cap", 3.0), ("drop_min_updates", 7), ("warmup", 3), ("window", 16),
    ("max_buffer_mb", 1.0)])
def test_guard_settings_without_the_guard_are_refused(key: str, value: float) -> None:
    """Streaming aggregation (``enabled = false``) has no weight cap, drops, statistics window
    or buffer: such a setting would be recorded and applied to nothing."""
    with pytest.raises(ConfigError, match=rf"^coordinator\.robust\.{key}: applies under"):
        RobustConfig(enabled=False, **{key: value})  # type: ignore[arg-type]
    RobustConfig(enabled=True, **{key: value})  # type: ignore[arg-type]
    RobustConfig(enabled=False, weight_cap=0.0)  # "no cap" is what streaming does


@pytest.mark.parametrize("table", [
    {"norm_bound_adaptive": False, "norm_bound_multiple": 3.0},
    {"norm_bound": 1.0, "norm_bound_multiple": 3.0}])
def test_a_norm_bound_multiple_without_the_adaptive_bound_is_refused(
        table: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"^coordinator\.norm_bound_multiple: scales"):
        CoordinatorConfig.from_dict(table)
    CoordinatorConfig.from_dict({"norm_bound_multiple": 3.0})


# -- differential privacy ---------------------------------------------------------------------

DP_CENTRAL = {"name": "dp_fedavg", "clip_norm": 0.5, "noise_multiplier": 1.0,
              "sample_rate": 0.1}


@pytest.mark.parametrize(("robust", "match"), [
    (RobustConfig(trim=0.2), r"robust\.trim"),
    (RobustConfig(drop_opposed=True), r"robust\.drop_opposed"),
])
def test_value_dependent_rules_are_refused_with_dp_fedavg(robust: RobustConfig,
                                                         match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        CoordinatorConfig(hooks=(DP_CENTRAL,), robust=robust)


def test_with_dp_fedavg_the_guard_caps_weights_and_enforces_the_clip_norm(
        fake_clock: FakeClock) -> None:
    """The hook's noise is calibrated to S x the largest weight over the total: the guard
    keeps the plain weighted mean, clips every update to S (a client that did not clip is
    bounded all the same) and caps weights (the noise then sees the capped ones)."""
    config = CoordinatorConfig(rounds=3, flush=FlushRule(goal=6, deadline_s=None),
                               hooks=({**DP_CENTRAL, "noise_multiplier": 1e-6},))
    engine = RoundEngine(config, np.zeros(DIM, np.float32), EventLog(None), clock=fake_clock)
    deltas = honest(6)
    deltas[0] = (deltas[0] / np.linalg.norm(deltas[0]) * 50).astype(np.float32)  # unclipped
    deltas[1] = -deltas[2]  # opposed: kept, the plain mean has every update
    tasks = [engine.issue(f"c{i}") for i in range(6)]
    for i, (task, delta) in enumerate(zip(tasks, deltas, strict=True)):
        assert isinstance(task, Task)
        engine.submit(ReceivedUpdate(f"c{i}", task.task_id, 0, delta,
                                     100_000 if i == 3 else 10, 1, 1, 4 * DIM))
    clipped = [d * min(1.0, 0.5 / float(np.linalg.norm(d))) for d in deltas]
    weights = np.array([10.0, 10, 10, 20, 10, 10])
    expected = (weights[:, None] * np.stack(clipped)).sum(0) / weights.sum()
    np.testing.assert_allclose(engine.model, expected, rtol=1e-4, atol=1e-5)
    actions = sorted(e["action"] for e in engine.events.events
                     if e["kind"] == "update_limited")
    assert "dropped" not in actions and actions.count("downweighted") == 1


def _experiment(compression: str, robust: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"data": {"dataset": "digits", "clients": 10},
            "client": {"compression": compression},
            "coordinator": {"flush": {"goal": 5}, "robust": robust or {}}}


def test_a_sparsifying_codec_turns_the_default_trim_off_and_refuses_a_set_one() -> None:
    assert ExperimentConfig.from_dict(_experiment("topk")).coordinator.robust.trim == 0.0
    assert ExperimentConfig.from_dict(_experiment("fp16")).coordinator.robust.trim is None
    with pytest.raises(ConfigError, match=r"robust.trim.*client.compression"):
        ExperimentConfig.from_dict(_experiment("randk", {"trim": 0.1}))


def test_trim_is_for_the_mean_only() -> None:
    with pytest.raises(ConfigError, match=r"robust\.trim"):
        CoordinatorConfig(aggregator="median", robust=RobustConfig(trim=0.1))
    CoordinatorConfig(aggregator="median")  # the default trim is simply off for it


def test_the_cap_applies_to_the_claim_and_keeps_staleness_and_work_factors() -> None:
    """A stale update's weight is its claim x its staleness factor: the cap bounds the claim
    (against the flush's median claim), and the factor still applies."""
    acc = guard(norm_multiple=0.0, drop_opposed=False)
    deltas = honest(3)
    acc.add(deltas[0], 10.0, source="fresh", claim=10)
    acc.add(deltas[1], 10.0, source="fresh2", claim=10)
    acc.add(deltas[2], 0.5 * 1e5, source="stale-liar", claim=1e5)  # staleness factor 0.5
    assert dict(acc.kept())["stale-liar"] == pytest.approx(0.5 * 20)


def test_norms_are_per_unit_of_work() -> None:
    """An honest client that did a tenth of its steps sends a tenth of a step: not clipped.
    One that claims a tenth of the work with a full-size step is 10 x over: clipped, and its
    weight is a tenth, so its pull is what a full-work update at the bound would have."""
    deltas = honest(6)
    acc = guard(drop_opposed=False)
    for i, delta in enumerate(deltas[:5]):
        acc.add(delta, 10.0, source=f"c{i}", claim=10)
    acc.add(0.1 * deltas[5], 1.0, source="partial", claim=10, work=0.1)
    acc.mean()
    assert acc.report.limited == []
    liar = guard(drop_opposed=False)
    for i, delta in enumerate(deltas[:5]):
        liar.add(delta, 10.0, source=f"c{i}", claim=10)
    liar.add(10 * deltas[5], 1.0, source="liar", claim=10, work=0.1)
    liar.mean()
    [clipped] = liar.report.limited
    assert clipped.source == "liar" and clipped.action == "clipped"
    assert clipped.norm == pytest.approx(100 * float(np.linalg.norm(deltas[5])), rel=1e-5)


def _trimming_guard() -> FlushGuard:
    trimmed = ACCUMULATORS.create("trimmed_mean", trim=0.2, weighted=True, trim_by_count=True)
    return FlushGuard(trimmed, GuardRules(norm_multiple=0.0, drop_opposed=False))


def test_the_trim_does_not_shrink_a_flush_of_honest_updates_of_unequal_work() -> None:
    """Honest clients that trained more send longer updates; the trim ranks directions, so
    it does not cut the long ones at both ends and leave the step to the short ones (trimming
    raw values by count, the step along the clients' common direction is a fifth shorter
    here)."""
    rng = np.random.default_rng(0)
    direction = rng.normal(size=DIM)
    acc, lengths = _trimming_guard(), [1.0, 4.0] * 10
    deltas = [(length * (direction + 0.5 * rng.normal(size=DIM))).astype(np.float32)
              for length in lengths]
    for i, delta in enumerate(deltas):
        acc.add(delta, 10.0, source=f"c{i}")
    plain = np.stack(deltas).mean(0)
    along = float(acc.mean() @ direction) / float(plain @ direction)
    assert 0.95 < along < 1.05


def test_the_trim_still_leaves_out_a_colluding_fifth_on_coordinates_the_honest_leave_alone(
        ) -> None:
    """Four of twenty push a coordinate no honest update touches (a backdoor's trigger
    weights): however long their updates, ranked by direction their values are the extremes,
    and none reaches the flush."""
    acc, deltas = _trimming_guard(), honest(20)
    for delta in deltas:
        delta[0] = 0.0
    for i, delta in enumerate(deltas[16:]):
        delta[0] = 5.0 + i
    for i, delta in enumerate(deltas):
        acc.add(delta, 70.0, source=f"c{i}")
    assert acc.mean()[0] == 0.0
