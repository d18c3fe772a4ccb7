"""RoundEngine: task issuing, weighting, the flush rule and refusals, on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.compress.delta import DELTA_ENCODING, apply_delta
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig, RoundEngine
from fedlink.coordinator import history as history_module
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.errors import InvalidArgument, NotFound, PermissionDenied, UpdateRefused
from fedlink.messages import Finished, Task, Wait
from fedlink.metrics import EventLog
from fedlink.refusals import RefusalCode
from fedlink.wire import checksum

DIM = 5
X0 = np.array([1.0, -2.0, 0.5, 0.0, 3.0], dtype=np.float32)


def make_engine(clock: FakeClock, rounds: int = 10, robust: RobustConfig | None = None,
                **flush: object) -> RoundEngine:
    config = CoordinatorConfig(rounds=rounds, flush=FlushRule(**flush),  # type: ignore[arg-type]
                               robust=robust or RobustConfig())
    return RoundEngine(config, X0.copy(), EventLog(None), clock=clock)


def task_for(engine: RoundEngine, client: str) -> Task:
    reply = engine.issue(client)
    assert isinstance(reply, Task), reply
    return reply


def update(client: str, task: Task, delta: np.ndarray | float, examples: int = 10,
           done: int = 1, planned: int = 1, base: int | None = None) -> ReceivedUpdate:
    vector = np.full(DIM, delta, dtype=np.float32) if np.isscalar(delta) else delta
    return ReceivedUpdate(client_id=client, task_id=task.task_id,
                          base_version=task.model_version if base is None else base,
                          delta=np.asarray(vector, dtype=np.float32), num_examples=examples,
                          steps_completed=done, steps_planned=planned, bytes_up=4 * DIM)


def kinds(engine: RoundEngine, kind: str) -> list[dict[str, object]]:
    return engine.events.of_kind(kind)


# -- synchronous FedAvg ---------------------------------------------------------------------------

@pytest.mark.parametrize("trim", [0.0, None, 0.4])
def test_sync_fedavg_flushes_weighted_mean_when_goal_reached(fake_clock: FakeClock,
                                                             trim: float | None) -> None:
    """The weighted mean: the default trim (0.2) leaves out no whole update of three, and the
    weights are within 2 x their median and the norms within 2 x theirs (the guard caps and
    clips nothing here). ``trim = 0.4`` leaves out one update at each end of each coordinate,
    ranked by direction."""
    engine = make_engine(fake_clock, goal=3, deadline_s=None, robust=RobustConfig(trim=trim))
    rng = np.random.default_rng(0)
    deltas = [rng.normal(size=DIM).astype(np.float32) for _ in range(3)]
    # (num_examples, steps_completed, steps_planned) -> weight = n * min(1, done / planned)
    work = [(10, 5, 5), (30, 1, 4), (20, 0, 0)]
    deltas[1] *= 0.25  # a quarter of the steps went about a quarter as far (or it is clipped)
    tasks = [task_for(engine, f"c{i}") for i in range(3)]

    first = engine.submit(update("c0", tasks[0], deltas[0], *work[0]))
    second = engine.submit(update("c1", tasks[1], deltas[1], *work[1]))
    assert first.flush is None and second.flush is None
    assert engine.version == 0
    np.testing.assert_array_equal(engine.model, X0)

    third = engine.submit(update("c2", tasks[2], deltas[2], *work[2]))
    assert (first.weight, second.weight, third.weight) == (10.0, 7.5, 20.0)
    assert third.flush is not None
    assert third.flush.num_updates == 3
    assert third.flush.total_weight == pytest.approx(37.5)
    assert engine.version == third.flush.version == 1
    weights = np.array([10.0, 7.5, 20.0])
    expected = X0 + (weights[:, None] * np.stack(deltas)).sum(0) / weights.sum()
    if trim == 0.4:  # each coordinate's value from the update whose direction is the middle
        stacked = np.stack(deltas)  # one: the short partial update is not trimmed for its length
        middle = np.argsort(stacked / np.linalg.norm(stacked, axis=1, keepdims=True), axis=0)[1]
        expected = X0 + stacked[middle, np.arange(DIM)]
    assert [e["action"] for e in kinds(engine, "update_limited")] == []
    np.testing.assert_allclose(engine.model, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(third.flush.model, engine.model)
    assert [e["weight"] for e in kinds(engine, "update_accepted")] == [10.0, 7.5, 20.0]


def test_model_versions_are_served_as_payloads(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=1, deadline_s=None)
    task = task_for(engine, "a")
    assert task.model == engine.payload(0).header
    assert task.model.shape == (DIM,)
    engine.submit(update("a", task, 1.0))
    np.testing.assert_array_equal(
        np.frombuffer(engine.payload(1).data, dtype="<f4"), X0 + 1.0)


# -- cohort and over-selection --------------------------------------------------------------------

def test_over_selection_issues_ceil_goal_times_factor_tasks(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=4, over_selection=1.5, deadline_s=None)
    tasks = {f"c{i}": task_for(engine, f"c{i}") for i in range(6)}
    late = engine.issue("c6")
    assert isinstance(late, Wait) and "full" in late.reason
    # an accepted update keeps holding its place
    engine.submit(update("c0", tasks["c0"], 0.1))
    assert isinstance(engine.issue("c6"), Wait)
    for name in ("c1", "c2", "c3"):
        engine.submit(update(name, tasks[name], 0.1))
    assert engine.version == 1
    # the two unfinished v0 tasks are closed: the whole cohort is free again
    assert task_for(engine, "c6").model_version == 1
    assert len(kinds(engine, "task_issued")) == 7


def test_one_task_per_client_per_version(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=2, deadline_s=None)
    task = task_for(engine, "a")
    engine.submit(update("a", task, 0.5))
    again = engine.issue("a")
    assert isinstance(again, Wait) and "already trained on version 0" in again.reason
    engine.submit(update("b", task_for(engine, "b"), 0.5))
    nxt = task_for(engine, "a")
    assert nxt.model_version == 1 and nxt.task_id != task.task_id


def test_issue_is_idempotent(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=2, deadline_s=None)
    first = task_for(engine, "a")
    second = task_for(engine, "a")
    assert first.task_id == second.task_id
    assert len(kinds(engine, "task_issued")) == 1
    # and the repeat did not take a second place in the cohort
    assert isinstance(engine.issue("b"), Task)


# -- the deadline ---------------------------------------------------------------------------------

def test_deadline_with_min_updates_flushes(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=3, min_updates=2, deadline_s=10.0)
    tasks = [task_for(engine, f"c{i}") for i in range(3)]
    assert tasks[0].deadline_s == pytest.approx(10.0)
    engine.submit(update("c0", tasks[0], 1.0, examples=1))
    fake_clock.advance(4.0)
    assert task_for(engine, "c1").deadline_s == pytest.approx(6.0)  # time left, not the rule
    engine.submit(update("c1", tasks[1], 4.0, examples=3))
    fake_clock.advance(5.9)
    assert engine.poll() is None
    fake_clock.advance(0.2)
    outcome = engine.poll()
    assert outcome is not None
    assert outcome.num_updates == 2
    assert outcome.round_seconds == pytest.approx(10.1)
    assert engine.version == 1
    # The plain weighted mean would be (1 x 1 + 3 x 4) / 4. The guard caps c1's weight 3 at
    # 2 x the lower-median claim (1) and clips its 4.0 to 2 x the lower-median norm (of 1.0):
    # values 1 and 2 with weights 1 and 2 (20% of two updates is no whole update: no trim).
    np.testing.assert_allclose(engine.model, X0 + (1 * 1.0 + 2 * 2.0) / 3, rtol=1e-6)
    assert sorted(e["action"] for e in kinds(engine, "update_limited")) == [
        "clipped", "downweighted"]
    # the straggler's v0 task is closed now
    with pytest.raises(UpdateRefused, match="too stale"):
        engine.submit(update("c2", tasks[2], 1.0))


def test_deadline_below_min_releases_tasks_and_restarts(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=3, min_updates=2, deadline_s=10.0)
    tasks = {n: task_for(engine, n) for n in ("a", "b", "c")}
    assert isinstance(engine.issue("d"), Wait)
    engine.submit(update("a", tasks["a"], 1.0))
    fake_clock.advance(10.5)
    assert engine.poll() is None
    assert engine.version == 0
    np.testing.assert_array_equal(engine.model, X0)
    timeouts = kinds(engine, "client_timeout")
    assert sorted(e["client_id"] for e in timeouts) == ["b", "c"]
    assert {e["task_id"] for e in timeouts} == {tasks["b"].task_id, tasks["c"].task_id}
    # released places go to other clients, with a fresh deadline
    fresh = task_for(engine, "d")
    assert fresh.deadline_s == pytest.approx(10.0)
    assert isinstance(engine.issue("e"), Task)
    fake_clock.advance(9.0)
    assert engine.poll() is None  # the deadline restarted at the release
    # a released task may still deliver
    engine.submit(update("b", tasks["b"], 3.0))
    fake_clock.advance(1.5)
    outcome = engine.poll()
    assert outcome is not None and outcome.num_updates == 2
    # b's 3.0 is clipped to 2 x the lower-median norm (a's 1.0): the mean of 1 and 2
    np.testing.assert_allclose(engine.model, X0 + 1.5, rtol=1e-6)


def test_no_deadline_never_flushes_on_poll(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=2, deadline_s=None)
    task = task_for(engine, "a")
    assert task.deadline_s == 0.0
    engine.submit(update("a", task, 1.0))
    fake_clock.advance(1e6)
    assert engine.poll() is None
    assert engine.version == 0


# -- refusals -------------------------------------------------------------------------------------

def test_stale_update_is_refused_and_model_unchanged(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=1, over_selection=2.0, deadline_s=None)
    fast, slow = task_for(engine, "fast"), task_for(engine, "slow")
    engine.submit(update("fast", fast, 1.0))
    model_v1 = engine.model.copy()
    with pytest.raises(UpdateRefused, match=r"too stale.*max_staleness 0") as refused:
        engine.submit(update("slow", slow, 100.0))
    assert refused.value.reason is RefusalCode.TOO_STALE
    assert engine.version == 1
    np.testing.assert_array_equal(engine.model, model_v1)
    assert len(kinds(engine, "update_accepted")) == 1


def test_update_two_versions_old_is_refused_not_unknown(fake_clock: FakeClock) -> None:
    """A task the engine issued stays refusable as stale, however old it gets."""
    engine = make_engine(fake_clock, goal=1, over_selection=2.0, deadline_s=None)
    slow = task_for(engine, "slow")
    for _ in range(3):
        engine.submit(update("fast", task_for(engine, "fast"), 1.0))
    with pytest.raises(UpdateRefused, match="stale") as refused:
        engine.submit(update("slow", slow, 100.0))
    assert refused.value.reason is RefusalCode.TOO_STALE
    np.testing.assert_allclose(engine.model, X0 + 3.0)


def test_bounded_staleness_is_accepted_with_discount(fake_clock: FakeClock) -> None:
    config = CoordinatorConfig(rounds=10,
                               flush=FlushRule(goal=1, over_selection=2.0, deadline_s=None,
                                               max_staleness=1),
                               staleness_weight="polynomial",
                               staleness_weight_options={"a": 0.5})
    engine = RoundEngine(config, X0.copy(), EventLog(None), clock=fake_clock)
    fast, slow = task_for(engine, "fast"), task_for(engine, "slow")
    engine.submit(update("fast", fast, 1.0))
    accepted = engine.submit(update("slow", slow, 2.0, examples=8))
    assert accepted.staleness == 1
    assert accepted.weight == pytest.approx(8 * 2 ** -0.5)
    np.testing.assert_allclose(engine.model, X0 + 3.0, rtol=1e-6)


def test_wrong_base_version_is_invalid_argument(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=1, deadline_s=None)
    task = task_for(engine, "a")
    with pytest.raises(InvalidArgument, match="base_version 3"):
        engine.submit(update("a", task, 1.0, base=3))
    assert engine.version == 0
    np.testing.assert_array_equal(engine.model, X0)
    engine.submit(update("a", task, 1.0))  # the task is still usable
    assert engine.version == 1


def test_wrong_length_is_invalid_argument(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=1, deadline_s=None)
    task = task_for(engine, "a")
    with pytest.raises(InvalidArgument, match=f"{DIM + 1} values, model has {DIM}"):
        engine.submit(update("a", task, np.ones(DIM + 1)))
    assert engine.version == 0
    np.testing.assert_array_equal(engine.model, X0)


def test_second_update_for_a_task_is_refused(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=2, deadline_s=None)
    task = task_for(engine, "a")
    engine.submit(update("a", task, 1.0))
    with pytest.raises(UpdateRefused, match="already has an accepted update"):
        engine.submit(update("a", task, 1.0))
    assert len(kinds(engine, "update_accepted")) == 1


def test_unknown_and_foreign_tasks(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=1, deadline_s=None)
    task = task_for(engine, "a")
    with pytest.raises(NotFound, match="unknown task id"):
        engine.task("a", "no-such-task")
    with pytest.raises(PermissionDenied, match="another client"):
        engine.submit(update("b", task, 1.0))
    assert engine.version == 0


def test_leaving_client_releases_its_place(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=1, deadline_s=None)
    task_for(engine, "a")
    assert isinstance(engine.issue("b"), Wait)
    engine.release_client("a")
    assert isinstance(engine.issue("b"), Task)


# -- end of run -----------------------------------------------------------------------------------

def test_finishes_after_rounds(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, rounds=2, goal=1, over_selection=2.0, deadline_s=None,
                         max_staleness=1)
    first = engine.submit(update("a", task_for(engine, "a"), 1.0))
    assert first.flush is not None and not first.flush.finished
    spare = task_for(engine, "b")
    last = engine.submit(update("a", task_for(engine, "a"), 1.0))
    assert last.flush is not None and last.flush.finished
    assert engine.finished and engine.version == 2
    reply = engine.issue("c")
    assert isinstance(reply, Finished) and "2 rounds" in reply.reason
    with pytest.raises(UpdateRefused, match="run is over") as refused:
        engine.submit(update("b", spare, 1.0))
    assert refused.value.reason is RefusalCode.RUN_OVER
    np.testing.assert_allclose(engine.model, X0 + 2.0)
    assert engine.poll() is None


# -- delta downloads ------------------------------------------------------------------------------

def delta_engine(clock: FakeClock, history: int = 3, dim: int = 2048) -> RoundEngine:
    config = CoordinatorConfig(rounds=20,
                               flush=FlushRule(goal=1, over_selection=4.0, deadline_s=None),
                               limits=LimitsConfig(delta_history=history))
    start = np.random.default_rng(1).normal(size=dim).astype(np.float32)
    return RoundEngine(config, start, EventLog(None), clock=clock)


def small_step(engine: RoundEngine, client: str = "a") -> Task:
    """Flush one small, sparse update; return the task it answered."""
    task = task_for(engine, client)
    delta = np.zeros(engine.num_parameters, np.float32)
    delta[::16] = 0.01
    engine.submit(ReceivedUpdate(client, task.task_id, task.model_version, delta, 1, 1, 1, 4))
    return task


def test_task_offers_an_exact_delta_from_a_held_version(fake_clock: FakeClock) -> None:
    engine = delta_engine(fake_clock)
    v0 = engine.model.copy()
    small_step(engine)
    task = engine.issue("a", held_version=0)
    assert isinstance(task, Task) and task.model_version == 1
    assert task.has_delta and task.delta_base_version == 0
    assert task.delta is not None and task.delta.encoding == DELTA_ENCODING
    assert task.delta.shape == (engine.num_parameters,) and task.delta.dtype == "float32"
    payload = engine.delta_payload(engine.task("a", task.task_id))
    assert task.delta == payload.header and payload.header.checksum == checksum(payload.data)
    assert payload.header.num_bytes < task.model.num_bytes
    rebuilt = apply_delta(v0, payload.data)
    assert rebuilt.tobytes() == engine.model.tobytes()  # bit for bit


def test_no_delta_without_a_kept_held_version(fake_clock: FakeClock) -> None:
    engine = delta_engine(fake_clock, history=2)
    for _ in range(3):
        small_step(engine)
    for held in (-1, 0, 1, 99):  # none, evicted (history 2 keeps 2 and 3), evicted, unknown
        task = engine.issue("a", held_version=held)
        assert isinstance(task, Task) and not task.has_delta, held
        assert task.delta is None and task.delta_base_version == -1
        with pytest.raises(NotFound, match="no delta"):
            engine.delta_payload(engine.task("a", task.task_id))
    task = engine.issue("a", held_version=2)
    assert isinstance(task, Task) and task.has_delta


def test_delta_history_zero_disables_deltas(fake_clock: FakeClock) -> None:
    engine = delta_engine(fake_clock, history=0)
    small_step(engine)
    task = engine.issue("a", held_version=0)
    assert isinstance(task, Task) and not task.has_delta


def test_each_delta_is_encoded_once_and_the_cache_is_bounded(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = history_module.encode_delta

    def counting(old: np.ndarray, new: np.ndarray) -> bytes:
        calls.append(1)
        return real(old, new)

    monkeypatch.setattr(history_module, "encode_delta", counting)
    engine = delta_engine(fake_clock, history=3)
    for _ in range(6):
        small_step(engine)
        for client in ("b", "c", "d"):  # three clients holding the previous version
            engine.issue(client, held_version=engine.version - 1)
    assert len(calls) == 6  # one (v-1 -> v) delta per version, shared by the three clients
    assert len(engine._history._deltas) <= 3 * 3


def test_delta_not_smaller_than_the_model_is_not_offered(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = delta_engine(fake_clock)
    small_step(engine)
    full = engine.payload(1).header.num_bytes
    monkeypatch.setattr(history_module, "encode_delta", lambda old, new: b"\x00" * full)
    reply = engine.issue("a", held_version=0)
    assert isinstance(reply, Task) and not reply.has_delta


# -- presets --------------------------------------------------------------------------------------

def test_presets_give_documented_fields_and_fields_override() -> None:
    from fedlink.coordinator.config import FLUSH_PRESETS

    sync = CoordinatorConfig.from_dict({"flush": {"preset": "sync", "goal": 5}}).flush
    assert sync == FlushRule(goal=5, min_updates=5, deadline_s=None, over_selection=1.0,
                             max_staleness=0, continuous=False)
    elastic = CoordinatorConfig.from_dict({"flush": {"preset": "elastic"}}).flush
    assert elastic == FlushRule(goal=10, min_updates=5, deadline_s=30.0, over_selection=1.3,
                                max_staleness=2, continuous=False)
    fedbuff = CoordinatorConfig.from_dict(
        {"flush": {"preset": "async", "goal": 4, "max_staleness": 3}}).flush
    assert fedbuff == FlushRule(goal=4, min_updates=4, deadline_s=None, over_selection=3.0,
                                max_staleness=3, continuous=True)
    assert fedbuff.cohort == 12
    assert FlushRule.from_preset("elastic", goal=4) == FlushRule(
        goal=4, min_updates=2, deadline_s=30.0, over_selection=1.3, max_staleness=2)
    assert set(FLUSH_PRESETS.names()) == {"async", "elastic", "sync"}


def test_unknown_preset_is_a_config_error() -> None:
    from fedlink.errors import ConfigError

    with pytest.raises(ConfigError, match=r"coordinator\.flush\.preset: unknown flush preset"):
        CoordinatorConfig.from_dict({"flush": {"preset": "fast"}})


def test_no_preset_keeps_the_plain_defaults() -> None:
    assert CoordinatorConfig.from_dict({"flush": {"goal": 3}}).flush == FlushRule(goal=3)
    assert not FlushRule().continuous


# -- continuous issuing (FedBuff) -----------------------------------------------------------------

def fedbuff(clock: FakeClock, goal: int = 2, concurrency: float = 1.5,
            max_staleness: int = 3) -> RoundEngine:
    return make_engine(clock, rounds=50, goal=goal, over_selection=concurrency,
                       deadline_s=None, max_staleness=max_staleness, continuous=True)


def test_continuous_bounds_tasks_in_flight_not_tasks_per_version(fake_clock: FakeClock) -> None:
    engine = fedbuff(fake_clock)  # cohort = 3 in flight, flush every 2
    tasks = {c: task_for(engine, c) for c in "abc"}
    assert isinstance(engine.issue("d"), Wait)
    engine.submit(update("a", tasks["a"], 1.0))
    # a delivered: its place frees at once, and a may train again on the same version
    again = task_for(engine, "a")
    assert again.model_version == 0 and again.task_id != tasks["a"].task_id
    assert isinstance(engine.issue("d"), Wait)
    flush = engine.submit(update("b", tasks["b"], 3.0)).flush
    assert flush is not None and engine.version == 1
    # b's 3.0 is clipped to 2 x the lower-median norm (a's 1.0): the mean of 1 and 2
    np.testing.assert_allclose(engine.model, X0 + 1.5)
    # c's v0 task is still open (stale by 1), and b gets the latest model
    assert task_for(engine, "b").model_version == 1
    late = engine.submit(update("c", tasks["c"], 5.0))
    assert late.staleness == 1


def test_continuous_refuses_updates_past_max_staleness(fake_clock: FakeClock) -> None:
    engine = fedbuff(fake_clock, goal=1, concurrency=2.0, max_staleness=1)
    slow = task_for(engine, "slow")
    for _ in range(2):
        engine.submit(update("fast", task_for(engine, "fast"), 1.0))
    with pytest.raises(UpdateRefused, match=r"too stale.*max_staleness 1"):
        engine.submit(update("slow", slow, 9.0))
    # the slow client's place was freed when its task fell out of the window
    assert task_for(engine, "slow").model_version == 2


def test_continuous_stream_applies_staleness_weights(fake_clock: FakeClock) -> None:
    config = CoordinatorConfig(
        rounds=50, flush=FlushRule.from_preset("async", goal=2, over_selection=2.0),
        staleness_weight="polynomial", staleness_weight_options={"a": 1.0},
        server_optimizer_options={"lr": 0.5},
        norm_bound_adaptive=False)  # "a" is 4x the others' norm: the default bound clips it
    engine = RoundEngine(config, X0.copy(), EventLog(None), clock=fake_clock)
    old = [task_for(engine, c) for c in "ab"]
    engine.submit(update("c", task_for(engine, "c"), 1.0))
    engine.submit(update("d", task_for(engine, "d"), 1.0))  # flush 1: X0 + 0.5
    engine.submit(update("a", old[0], 4.0, examples=10))     # tau 1: weight 10 / 2 = 5
    accepted = engine.submit(update("b", old[1], 1.0, examples=10))
    assert accepted.weight == pytest.approx(5.0) and accepted.flush is not None
    np.testing.assert_allclose(engine.model, X0 + 0.5 + 0.5 * 2.5, rtol=1e-6)


# -- partial work and aggregators -----------------------------------------------------------------

def test_update_with_no_work_done_is_refused_and_its_task_closed(fake_clock: FakeClock) -> None:
    """The same task again would run out of time again: it answers for its place instead."""
    engine = make_engine(fake_clock, goal=2, min_updates=2, deadline_s=None)
    tasks = {c: task_for(engine, c) for c in "ab"}
    with pytest.raises(UpdateRefused, match="no local work: 0 of 5 planned steps") as refused:
        engine.submit(update("a", tasks["a"], 1.0, done=0, planned=5))
    assert refused.value.reason is RefusalCode.NO_WORK
    with pytest.raises(UpdateRefused) as again:
        engine.submit(update("a", tasks["a"], 1.0, done=2, planned=5))
    assert again.value.reason is RefusalCode.TASK_CLOSED
    assert isinstance(engine.issue("a"), Wait)  # not asked again this version
    engine.submit(update("b", tasks["b"], 2.0, done=5, planned=5))
    assert engine.version == 1  # the refused update counted towards the goal, not the mean
    np.testing.assert_allclose(engine.model, X0 + 2.0)


def test_a_cohort_that_did_no_work_still_ends_its_round(fake_clock: FakeClock) -> None:
    """Without this, its clients would be handed the same task and refused for ever."""
    engine = make_engine(fake_clock, goal=2, min_updates=2, deadline_s=None)
    for client in "ab":
        with pytest.raises(UpdateRefused):
            engine.submit(update(client, task_for(engine, client), 1.0, done=0, planned=5))
    outcome = engine.poll()
    assert outcome is not None and outcome.num_updates == 0 and engine.version == 1
    np.testing.assert_array_equal(engine.model, X0)
    assert isinstance(engine.issue("a"), Task)


def test_a_buffer_whose_every_update_did_no_work_still_flushes(fake_clock: FakeClock) -> None:
    """FedBuff asks again as soon as a client answers: a refused answer counts towards the
    buffer, or a fleet that never does any work would be asked for ever."""
    config = CoordinatorConfig(rounds=5, flush=FlushRule.from_preset("async", goal=2))
    engine = RoundEngine(config, X0.copy(), EventLog(None), clock=fake_clock)
    for client in "abab":
        with pytest.raises(UpdateRefused):
            engine.submit(update(client, task_for(engine, client), 1.0, done=0, planned=5))
        outcome = engine.poll()
        assert (outcome is not None) == (client == "b")  # every second answer fills it
    assert engine.version == 2
    np.testing.assert_array_equal(engine.model, X0)


def test_fednova_aggregator_normalises_instead_of_weighting_work(fake_clock: FakeClock) -> None:
    config = CoordinatorConfig(rounds=5, flush=FlushRule(goal=2, deadline_s=None),
                               aggregator="fednova")
    engine = RoundEngine(config, X0.copy(), EventLog(None), clock=fake_clock)
    full = engine.submit(update("a", task_for(engine, "a"), 4.0, examples=10, done=4, planned=4))
    half = engine.submit(update("b", task_for(engine, "b"), 1.0, examples=10, done=2, planned=4))
    assert (full.weight, half.weight) == (10.0, 10.0)  # no work fraction in the weight
    # d_a = 1, d_b = 0.5; tau_eff = 3 -> 3 * (1 + 0.5) / 2 = 2.25
    np.testing.assert_allclose(engine.model, X0 + 2.25, rtol=1e-6)


def test_a_flush_inside_the_norm_bounds_warm_up_counts_the_updates_it_clips(
        fake_clock: FakeClock) -> None:
    """Guard off (streaming), the adaptive bound's warm-up (5 updates) longer than a flush
    (3): the held updates are clipped at the flush, and the flush's record counts the clip
    (it read the count before they were folded, and recorded 0)."""
    engine = make_engine(fake_clock, goal=3, deadline_s=None,
                         robust=RobustConfig(enabled=False))
    accepted = [engine.submit(update(client, task_for(engine, client), delta))
                for client, delta in (("a", 1.0), ("b", 1.1), ("c", 50.0))]
    flush = accepted[-1].flush
    assert flush is not None and flush.hook_report["updates_clipped"] == 1
    # c was clipped to 2 x the median norm of the three (b's): the mean moved by (1 + 1.1 +
    # 2.2) / 3 per coordinate, not by 52.1 / 3
    np.testing.assert_allclose(engine.model, X0 + (1.0 + 1.1 + 2.2) / 3, rtol=1e-5)


def test_robust_aggregator_and_norm_bound_from_config(fake_clock: FakeClock) -> None:
    config = CoordinatorConfig.from_dict({
        "flush": {"goal": 3, "deadline_s": 0}, "aggregator": "median", "norm_bound": 10.0})
    engine = RoundEngine(config, X0.copy(), EventLog(None), clock=fake_clock)
    for client, value in (("a", 1.0), ("b", 2.0), ("c", 1000.0)):
        engine.submit(update(client, task_for(engine, client), value))
    # c is clipped to norm 10 (each of 5 values 10 / sqrt(5)), then the median ignores it
    np.testing.assert_allclose(engine.model, X0 + 2.0, rtol=1e-6)


def test_bad_aggregator_options_are_config_errors() -> None:
    from fedlink.errors import ConfigError

    with pytest.raises(ConfigError, match="aggregator"):
        CoordinatorConfig(aggregator="nope")
    with pytest.raises(ConfigError, match="aggregator"):
        CoordinatorConfig(aggregator="trimmed_mean", aggregator_options={"trim": 0.6})
    with pytest.raises(ConfigError, match="norm_bound"):
        CoordinatorConfig(norm_bound=-1.0)


@pytest.mark.parametrize(("name", "continuous", "deadline"), [
    ("digits_fedbuff.toml", True, None), ("digits_elastic.toml", False, 5.0)])
def test_example_configs_use_the_presets(name: str, continuous: bool,
                                         deadline: float | None) -> None:
    from pathlib import Path

    from fedlink.sim import ExperimentConfig

    config = ExperimentConfig.from_toml(Path(__file__).parents[2] / "examples" / name)
    rule = config.coordinator.flush
    assert (rule.continuous, rule.deadline_s) == (continuous, deadline)
    assert rule.max_staleness > 0 and config.coordinator.staleness_weight == "polynomial"
    assert config.network is not None  # a straggler fleet
