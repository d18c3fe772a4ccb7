"""Secure rounds in virtual mode: the gRPC coordinator's secure groups and the real client's
secure delivery, driven through ``ClientProtocol`` on the manual clock, each phase timed on the
client's link; clients going offline between phases are unmasked from their neighbours."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("cryptography")

from fedlink.client.pipeline import UpdatePipeline
from fedlink.clock import ManualClock
from fedlink.coordinator.config import CoordinatorConfig
from fedlink.coordinator.secure import FlushReportFailed, SecureDesk
from fedlink.errors import InvalidArgument
from fedlink.experiment.config import ExperimentConfig
from fedlink.metrics import EventLog
from fedlink.metrics.summary import summarize
from fedlink.netem import Fleet, LinkProfile
from fedlink.privacy.secure_ddp import SecureDDPHook
from fedlink.secagg import SkellamConfig
from fedlink.secagg.sparse import group_indices
from fedlink.sim.virtual.loop import LoopOptions, VirtualLoop
from fedlink.sim.virtual.population import Links, SyntheticPopulation, SyntheticSpec
from fedlink.sim.virtual.runner import run_virtual
from fedlink.sim.virtual.secure import PHASE_NAMES

pytestmark = pytest.mark.timeout(120)

CLIENTS = 6
SPEC = SyntheticSpec(num_features=8, num_classes=3, min_examples=32, max_examples=32, seed=0)


def _config(secure: bool, rounds: int = 1, density: float = 1.0,
            ddp: dict[str, float] | None = None, **flush: Any) -> CoordinatorConfig:
    table: dict[str, Any] = {
        "rounds": rounds, "training": {"local_steps": 4},
        "robust": {"enabled": False}, "norm_bound_adaptive": False,
        "flush": {"goal": CLIENTS, "deadline_s": None, **flush}}
    if secure:  # each group's floor (a plain flush with no deadline waits for goal alone)
        table["flush"] = {"min_updates": 2, **table["flush"]}
        table["secure"] = {"enabled": True, "phase_s": 5.0, "density": density, **(ddp or {})}
    return CoordinatorConfig.from_dict(table)


class GoesOffline:
    """Clients go offline at the instants ``gone`` gets (the test sets them as phases happen)
    and come back at ``back``, long after the phase deadlines."""

    def __init__(self, back: float = 1000.0) -> None:
        self.gone: dict[int, float] = {}
        self.back = back

    def online(self, index: int, t: float) -> bool:
        gone = self.gone.get(index, math.inf)
        return not gone <= t < self.back

    def next_online(self, index: int, t: float) -> float:
        return t if self.online(index, t) else self.back

    def next_offline(self, index: int, t: float) -> float:
        gone = self.gone.get(index, math.inf)
        return gone if t < gone else (math.inf if t >= self.back else t)


def _loop(config: CoordinatorConfig, availability: Any = None,
          fleet: Fleet | None = None,
          pipeline: Any = UpdatePipeline) -> tuple[VirtualLoop, EventLog]:
    clock = ManualClock()
    events = EventLog(None, clock=clock.now)
    population = SyntheticPopulation(SPEC, CLIENTS, Links(fleet, CLIENTS))
    loop = VirtualLoop(config, np.zeros(SPEC.num_parameters, np.float32), population,
                       pipeline, events, clock,
                       LoopOptions(step_cost_s=0.25, seed=0, deterministic=True),
                       availability=availability)
    return loop, events


def record_with(loop: VirtualLoop, recorders: dict[int, Any]) -> None:
    """The desk records the phases in ``recorders`` (by number) with these functions, in
    this loop only (a test's hook on what a member does at a phase)."""
    secure = loop.secure
    assert secure is not None
    secure._RECORDERS = {**type(secure)._RECORDERS, **recorders}  # type: ignore[misc]


def test_secure_virtual_model_equals_plain_within_the_quantization() -> None:
    """Same seed, no dropouts, every client weighing the same (equal example counts): the
    secure run's model is the plain run's, up to the quantization steps, round after round
    (the rounding draws from its own stream, so later training plans stay the same)."""
    rounds = 3
    plain, _ = _loop(_config(False, rounds=rounds))
    plain.run()
    secure, events = _loop(_config(True, rounds=rounds))
    secure.run()
    assert secure.engine.finished and secure.engine.version == plain.engine.version == rounds
    step = 2 * _config(True).secagg().clip / 2 ** _config(True).secagg().bits
    moved = np.abs(plain.engine.model).max()
    assert moved > 100 * step  # the rounds changed the model: the comparison means something
    np.testing.assert_allclose(secure.engine.model, plain.engine.model, rtol=0,
                               atol=4 * rounds * step)
    accepted = events.of_kind("update_accepted")
    assert len(accepted) == rounds * CLIENTS


def test_group_random_k_moves_the_kept_coordinates_and_keeps_the_rest_as_residuals() -> None:
    """``density`` 0.25 in virtual mode: the first version is the plain run's on the group's
    kept coordinates and unmoved elsewhere; every member keeps the rest of its update as its
    residual for the next group."""
    plain, _ = _loop(_config(False))
    plain.run()
    config = _config(True, density=0.25)
    secure, _ = _loop(config)
    secure.run()
    size = SPEC.num_parameters
    kept = group_indices(0.25, config.seed, 1, size)
    assert kept is not None and kept.size == math.ceil(size / 4)
    outside = np.setdiff1d(np.arange(size), kept)
    step = config.secagg().step
    np.testing.assert_allclose(secure.engine.model[kept], plain.engine.model[kept], rtol=0,
                               atol=2 * step)
    assert not secure.engine.model[outside].any()
    # a second group: each member starts from what its first update kept back
    again, _ = _loop(_config(True, rounds=2, density=0.25))
    taken: dict[int, list[np.ndarray | None]] = {}
    take = again.residuals.take

    def recorded(index: int) -> np.ndarray | None:
        taken.setdefault(index, []).append(take(index))
        return taken[index][-1]

    again.residuals.take = recorded  # type: ignore[method-assign]
    again.run()
    assert again.engine.version == 2
    for index in range(CLIENTS):
        first_group, residual = taken[index]
        assert first_group is None and residual is not None, index
        assert np.abs(residual[kept]).max() <= step  # sent: only what the encoding lost
        assert np.abs(residual[outside]).max() > 100 * step  # held back for a later group


def test_a_pipeline_with_error_feedback_leaves_the_group_random_k_residuals_alone() -> None:
    """A client pipeline with its own error feedback (a residual of zeros under fp32) must
    not overwrite the residual group random-k keeps back: the model is the same as without
    it (before, virtual mode dropped every coordinate a group did not send)."""
    models = []
    for feedback in (None, True):
        loop, _ = _loop(_config(True, rounds=3, density=0.25),
                        pipeline=lambda f=feedback: UpdatePipeline(error_feedback=f))
        loop.run()
        assert loop.engine.version == 3
        models.append(loop.engine.model)
    np.testing.assert_array_equal(models[1], models[0])


@pytest.mark.parametrize(("one_way_s", "flush_at"), [
    (0.1, 1.2 + 3 * 0.1),   # training (1 s after the 0.2 s check-in) outlasts the key exchange
    (1.0, 6 * 1.0 + 3 * 1.0),  # the key exchange (6 one-way trips from the check-in) does
])
def test_each_secure_phase_costs_a_call_s_round_trip_as_over_grpc(
        one_way_s: float, flush_at: float) -> None:
    """As a gRPC client does: the task (its model inside) comes one round trip after the
    check-in; the key exchange starts then, each phase one round trip (request up, answer
    down once the phase closed for the group); the masked update goes once the member
    trained and its keys are shared; the version is made when the unmask request arrives."""
    link = LinkProfile(name="far", latency_ms=1000.0 * one_way_s)  # no bandwidth limit
    loop, events = _loop(_config(True), fleet=Fleet.single(link))
    loop.run()
    (flush,) = events.of_kind("flush")
    assert flush["model_seconds"] == pytest.approx(flush_at)


def test_a_member_s_network_time_leaves_out_the_key_exchange_beside_its_training() -> None:
    """As a gRPC client counts it: the check-in (the model inside its answer), the masked
    upload and the unmasking, three round trips; the advertise and share calls run beside the
    training and are not network time (they were charged on top of it)."""
    one_way_s = 0.1
    link = LinkProfile(name="far", latency_ms=1000.0 * one_way_s)  # no bandwidth limit
    loop, events = _loop(_config(True), fleet=Fleet.single(link))
    totals = loop.run()
    assert len(events.of_kind("update_accepted")) == CLIENTS
    # each member: check-in and masked round trips, the unmask request, and its answer unless
    # the run ended on that flush before it was sent (the key exchange: 4 more legs each)
    assert CLIENTS * 5 * one_way_s <= totals.network_s <= CLIENTS * 6 * one_way_s + 1e-9
    assert totals.compute_s == pytest.approx(CLIENTS * 4 * 0.25)


def test_clients_offline_between_phases_are_unmasked_and_the_round_completes() -> None:
    """One client vanishes after sharing its keys, one after delivering its masked update:
    the group goes on with the rest (each secret rebuilt from at least half of its holder's
    neighbours), the five deliverers are summed."""
    availability = GoesOffline()
    loop, events = _loop(_config(True), availability, Fleet(mix={"4g": 1.0}))
    assert loop.secure is not None
    share, masked = SecureDesk.record_share, SecureDesk.record_masked

    def record_share(desk: SecureDesk, request: Any) -> Any:
        index = int(request.client_id.rsplit("-", 1)[1])
        if index == 5:  # gone as soon as its shares are in
            availability.gone[index] = loop.clock.now()
        return share(desk, request)

    def record_masked(desk: SecureDesk, request: Any, data: Any = None) -> Any:
        if request.client_id == "sim-4":  # its masked update is in; it misses unmasking
            availability.gone[4] = loop.clock.now()
        return masked(desk, request, data)

    record_with(loop, {1: record_share, 2: record_masked})
    loop.run()
    assert loop.engine.finished and loop.engine.version == 1
    summed = {e["client_id"] for e in events.of_kind("update_accepted")}
    assert summed == {"sim-0", "sim-1", "sim-2", "sim-3", "sim-4"}
    totals = loop.secure.totals
    assert totals.groups_lost == 0
    assert totals.round_trips["masked"] == 5  # 5 never sent one
    assert totals.round_trips["unmask"] == 4  # 4 never answered

def test_a_refusal_reaches_its_member_a_one_way_trip_after_the_group_is_lost() -> None:
    """Links of 1 s each way; four of six members go offline once they shared, so the group
    is lost at its masked phase and the two that delivered are refused. Each hears it one
    way later, as over gRPC, where a refusal is an answer like any other (it was heard at
    the instant of the loss, and the member checked in again a trip early)."""
    fleet = Fleet(mix={"slow": 1.0},
                  profiles={"slow": LinkProfile(name="slow", latency_ms=1000.0)})
    availability = GoesOffline(back=200.0)
    loop, _ = _loop(_config(True), availability, fleet)
    assert loop.secure is not None
    share = SecureDesk.record_share

    def record_share(desk: SecureDesk, request: Any) -> Any:
        index = int(request.client_id.rsplit("-", 1)[1])
        if index >= 2:
            availability.gone.setdefault(index, loop.clock.now())
        return share(desk, request)

    record_with(loop, {1: record_share})
    desk, lost_at, heard = loop.secure.desk, [], []
    lose, ended = desk._lose, loop.ended

    def losing(group: Any, reason: str) -> None:
        lost_at.append(loop.clock.now())
        lose(group, reason)

    def hearing(busy: Any, outcome: Any = None) -> None:
        heard.append((type(outcome).__name__, loop.clock.now()))
        ended(busy, outcome)

    desk._lose = losing  # type: ignore[method-assign]
    loop.ended = hearing  # type: ignore[method-assign]
    loop.run()
    assert lost_at and heard[:2] == [("Refused", lost_at[0] + 1.0)] * 2



@pytest.mark.parametrize("quorum", [1.0, 0.75])
def test_a_quorum_closes_the_phases_without_a_member_gone_after_advertising(
        quorum: float) -> None:
    """One of six goes offline once its keys are advertised. With quorum 1 the share phase
    waits for it until ``phase_s`` and the five others are summed; with 0.75 the five that
    shared go on at once (the model clock says when), and the masked phase closes once four
    of them delivered."""
    availability = GoesOffline()
    config = _config(True)
    config = dataclasses.replace(config, secure=dataclasses.replace(config.secure,
                                                                    quorum=quorum))
    loop, events = _loop(config, availability, Fleet(mix={"4g": 1.0}))
    assert loop.secure is not None
    join = SecureDesk.join
    gone_at: list[float] = []

    def advertise(desk: SecureDesk, request: Any) -> Any:
        if request.client_id == "sim-5" and not gone_at:
            gone_at.append(loop.clock.now())
            availability.gone[5] = loop.clock.now()
        return join(desk, request)

    record_with(loop, {0: advertise})
    loop.run()
    assert loop.engine.finished and loop.engine.version == 1
    summed = {e["client_id"] for e in events.of_kind("update_accepted")}
    assert summed <= {f"sim-{i}" for i in range(5)}
    assert len(summed) == math.ceil(quorum * 5)
    (flush,) = events.of_kind("flush")
    waited = flush["model_seconds"] - gone_at[0] >= config.secure.phase_s
    assert waited == (quorum == 1.0), (flush["model_seconds"], gone_at)


def _four_vanish_after_sharing() -> tuple[VirtualLoop, EventLog, Any]:
    """A loop of six on 4G links and the share recorder that takes clients 2 to 5 offline
    (until 200 s) as their first group's shares arrive: two of six deliver, three needed."""
    availability = GoesOffline(back=200.0)
    loop, events = _loop(_config(True), availability, Fleet(mix={"4g": 1.0}))
    share = SecureDesk.record_share
    dropped: set[int] = set()

    def record_share(desk: SecureDesk, request: Any) -> Any:
        index = int(request.client_id.rsplit("-", 1)[1])
        if index >= 2 and not dropped >= {2, 3, 4, 5}:  # once only: the first group
            dropped.add(index)
            availability.gone[index] = loop.clock.now()
        return share(desk, request)

    return loop, events, record_share


def test_a_group_below_threshold_is_lost_and_its_version_tried_again() -> None:
    """Four of six vanish after sharing (two deliver, three needed): the group is lost, its
    members refused; a new group of the clients that check in again makes the version."""
    loop, events, record_share = _four_vanish_after_sharing()
    assert loop.secure is not None
    record_with(loop, {1: record_share})
    loop.run()
    assert loop.secure.totals.groups_lost >= 1
    assert loop.engine.finished and loop.engine.version == 1
    assert len(events.of_kind("update_accepted")) >= 2
    lost = events.of_kind("secure_group_lost")  # the loss is recorded, not only logged
    assert len(lost) == loop.secure.totals.groups_lost
    first = lost[0]
    assert (first.group, first.phase, first.members, first.model_version) == (1, "masked", 6, 0)
    assert "2 of 6 members delivered" in (first.reason or "")


def test_members_of_a_group_lost_after_their_masked_update_check_in_again_at_once() -> None:
    """Four of six vanish after sharing: the group is lost at its masked phase, and the two
    that delivered are refused with their tasks still open. A real client checks in again at
    once and gets its task back; before, the loop drew them only once the liveness check had
    released their places (21 s of model time later here)."""
    loop, events, record_share = _four_vanish_after_sharing()
    join = SecureDesk.join
    joined: list[tuple[str, float]] = []

    def advertise(desk: SecureDesk, request: Any) -> Any:
        joined.append((request.client_id, loop.clock.now()))
        return join(desk, request)

    record_with(loop, {0: advertise, 1: record_share})
    loop.run()
    [lost] = events.of_kind("secure_group_lost")
    again = [(client, t) for client, t in joined if t > lost["elapsed"]]
    assert {client for client, t in again if t < lost["elapsed"] + 1.0} == {"sim-0", "sim-1"}


def test_stragglers_join_later_groups_with_their_staleness_weight(tmp_path: Path) -> None:
    """The demo's elastic fleet with short phases: a client that finishes after a roster
    closed joins the next group, discounted by the run's staleness weight for the version its
    group flushes onto; the run ends (a short ``phase_s`` once left versions retried by ever
    smaller groups)."""
    table = {"run": {"name": "stale", "seed": 0, "mode": "virtual"},
             "data": {"dataset": "digits", "clients": 20, "partition": "iid"},
             "model": {"name": "mlp", "options": {"hidden": [16]}},
             "coordinator": {"rounds": 8, "robust": {"enabled": False},
                             "norm_bound_adaptive": False, "staleness_weight": "polynomial",
                             "staleness_weight_options": {"a": 0.5},
                             "flush": {"goal": 8, "over_selection": 2.0, "min_updates": 4,
                                       "deadline_s": 4.0, "max_staleness": 3},
                             "training": {"local_epochs": 1, "batch_size": 32},
                             "secure": {"enabled": True, "phase_s": 0.5}},
             "network": {"fleet": {"4g": 0.3, "3g": 0.4, "flaky": 0.2, "commute": 0.1}},
             "virtual": {"deterministic": True}}
    result = run_virtual(ExperimentConfig.from_dict(table), tmp_path, progress=False,
                         report=False)
    assert result.summary["final_model_version"] == 8
    accepted = [json.loads(line) for line in
                (result.run_dir / "events.jsonl").read_text().splitlines()
                if '"update_accepted"' in line]
    stale = [e for e in accepted if e["staleness"] > 0]
    assert stale, "no straggler's update was summed"
    for event in accepted:
        assert event["weight"] == pytest.approx((1 + event["staleness"]) ** -0.5)


def test_secure_groups_keep_the_flush_rules_min_updates_and_max_staleness(
        tmp_path: Path) -> None:
    """The flush rule binds secure groups as it binds plain flushes: no version is made of
    fewer than ``min_updates`` updates (a roster or a masked phase short of it is lost, its
    members trying again), and no update staler than ``max_staleness`` is summed (a member
    that grew too stale while its roster formed is left out and told so). Before, groups of
    2 or 3 made versions and updates 4 versions old were summed, and the demo's secure run
    fell from 0.92 to 0.54 accuracy in its last ten versions. The demo's fleet, with
    ``max_staleness`` 1 so that overlapping groups leave members out."""
    table = {"run": {"name": "rule", "seed": 0, "mode": "virtual"},
             "data": {"dataset": "digits", "clients": 20, "partition": "iid"},
             "model": {"name": "mlp", "options": {"hidden": [64, 64]}},
             "coordinator": {"rounds": 40, "robust": {"enabled": False},
                             "norm_bound_adaptive": False, "staleness_weight": "polynomial",
                             "staleness_weight_options": {"a": 0.5},
                             "flush": {"goal": 8, "over_selection": 2.0, "min_updates": 4,
                                       "deadline_s": 4.0, "max_staleness": 1},
                             "training": {"local_epochs": 3, "batch_size": 32,
                                          "learning_rate": 0.2},
                             "secure": {"enabled": True, "phase_s": 1.0}},
             "network": {"fleet": {"4g": 0.3, "3g": 0.4, "flaky": 0.2, "commute": 0.1},
                         "speed": {"kind": "lognormal", "sigma": 0.25}}}
    result = run_virtual(ExperimentConfig.from_dict(table), tmp_path, progress=False,
                         report=False)
    events = [json.loads(line) for line in
              (result.run_dir / "events.jsonl").read_text().splitlines()]
    flushes = [e for e in events if e["kind"] == "flush"]
    assert len(flushes) == 40
    assert min(len(e["updates"]) for e in flushes) >= 4
    accepted = [e for e in events if e["kind"] == "update_accepted"]
    assert max(e["staleness"] for e in accepted) <= 1
    assert any(e["staleness"] == 1 for e in accepted)  # stale members summed, none too stale
    assert result.summary["secure_groups_lost"] == sum(
        e["kind"] == "secure_group_lost" for e in events)
    refused = [e for e in events if e["kind"] == "update_refused"]
    assert any(e["reason_code"] == "too_stale" for e in refused)  # left out, and recorded
    assert len({e["task_id"] for e in refused}) == len(refused)  # once each
    assert not {e["task_id"] for e in refused} & {e["task_id"] for e in accepted}


def test_virtual_secure_run_reports_each_phase_in_the_summary(tmp_path: Path) -> None:
    """A configured virtual secure run (no longer refused) puts every phase's round trips and
    bytes in ``summary.json``; the masked upload weighs ``modulus_bits`` a value."""
    table = {"run": {"name": "sv", "seed": 0, "mode": "virtual"},
             "data": {"dataset": "digits", "clients": 6, "partition": "iid"},
             "model": {"name": "mlp", "options": {"hidden": [8]}},
             "coordinator": {"rounds": 2, "robust": {"enabled": False},
                             "norm_bound_adaptive": False,
                             "flush": {"goal": 6, "min_updates": 2, "deadline_s": None},
                             "training": {"local_epochs": 1, "batch_size": 32},
                             "secure": {"enabled": True, "phase_s": 5.0}},
             "network": {"fleet": {"3g": 1.0}},
             "virtual": {"deterministic": True}}
    config = ExperimentConfig.from_dict(table)
    summary = run_virtual(config, tmp_path, progress=False, report=False).summary
    for name in PHASE_NAMES.values():
        assert summary[f"secure_{name}_round_trips"] == 12  # 6 clients, 2 rounds
        assert summary[f"secure_{name}_bytes_up"] > 0
        assert summary[f"secure_{name}_bytes_down"] > 0
    values = 8 * 64 + 8 + 8 * 10 + 10 + 1  # the model and the weight
    packed = math.ceil(values * config.coordinator.secure.modulus_bits / 8)
    assert summary["secure_masked_bytes_up"] >= 12 * packed
    assert summary["secure_masked_bytes_up"] < 12 * (packed + 256)
    assert summary["secure_values_clipped"] == 0  # one epoch of small steps: within clip 1


def _skellam(config: CoordinatorConfig) -> SkellamConfig:
    secure = config.secure
    return SkellamConfig(secure.clip_norm, secure.noise_multiplier, CLIENTS,
                         SPEC.num_parameters, secure.granularity_bits, secure.modulus_bits)


def test_distributed_dp_sums_carry_the_noise_of_central_dp_and_are_accounted() -> None:
    """Each member adds its share of Skellam noise: with almost none the model is the plain
    run's; with ``noise_multiplier`` z the model's distance from it has the standard
    deviation of central DP-FedAvg's noise on the mean (z * clip_norm / n), and the flush
    records the epsilon of one sum of every share."""
    plain, _ = _loop(_config(False))
    plain.run()
    quiet = _config(True, ddp={"noise_multiplier": 1e-4, "clip_norm": 100.0})
    secure, _ = _loop(quiet)
    secure.run()
    moved = np.abs(plain.engine.model).max()
    gamma = _skellam(quiet).gamma
    assert moved > 100 * gamma
    np.testing.assert_allclose(secure.engine.model, plain.engine.model, rtol=0,
                               atol=2 * gamma + 6 * 1e-4 * 100 / CLIENTS)
    noisy_config = _config(True, ddp={"noise_multiplier": 0.5, "clip_norm": 100.0,
                                      "delta": 1e-6})
    noisy, events = _loop(noisy_config)
    noisy.run()
    noise = noisy.engine.model.astype(np.float64) - plain.engine.model
    expected = 0.5 * 100 / CLIENTS
    assert 0.6 * expected < noise.std() < 1.5 * expected, (noise.std(), expected)
    (flush,) = events.of_kind("flush")
    privacy = flush["privacy"]
    assert privacy["mode"] == "user_distributed" and privacy["steps"] == 1
    assert privacy["epsilon"] == pytest.approx(_skellam(noisy_config).epsilon(1, 1e-6))
    assert privacy["sums_short_of_shares"] == 0


def test_a_sum_that_would_spend_past_the_budget_is_never_unmasked() -> None:
    """``max_epsilon`` admits one sum with every member's noise: a group that would be unmasked
    with a member gone (less noise, more epsilon) is lost instead, and the version is made
    once a full group delivers; epsilon never exceeds the budget, and the run then stops."""
    one_sum = _skellam(_config(True, ddp={"noise_multiplier": 1.0})).epsilon(1, 1e-5)
    config = _config(True, rounds=3, ddp={"noise_multiplier": 1.0,
                                          "max_epsilon": one_sum * 1.001})
    # back while the others, refused at once, form the next group (the budget stops the run
    # after two sums in a row are withheld)
    availability = GoesOffline(back=8.0)
    loop, events = _loop(config, availability, Fleet(mix={"4g": 1.0}))
    assert loop.secure is not None
    share = SecureDesk.record_share

    def record_share(desk: SecureDesk, request: Any) -> Any:
        if request.client_id == "sim-5" and loop.clock.now() < 30:  # gone after sharing
            availability.gone[5] = loop.clock.now()
        return share(desk, request)

    record_with(loop, {1: record_share})
    loop.run()
    hook = loop.engine.hook_of(SecureDDPHook)
    assert hook is not None
    assert hook.privacy_record()["sums_withheld"] >= 1
    assert loop.engine.version == 1 and hook.sums == 1
    assert hook.epsilon == pytest.approx(one_sum) and hook.epsilon <= config.secure.max_epsilon
    assert "privacy budget exhausted" in loop.engine.finished_reason
    assert len(events.of_kind("flush")) == 1


def test_a_fleet_too_small_for_full_groups_ends_on_the_budget_instead_of_training_for_ever(
        ) -> None:
    """Groups of 8 on a fleet of 6: every sum carries 6 of 8 noise shares, and the budget
    admits a full sum but no short one. The run withholds two sums and ends on the budget,
    never past it. Before, it withheld every group's sum and trained on for ever (only a
    virtual run's ``max_model_s`` stopped it)."""
    one_sum = _skellam(_config(True, ddp={"noise_multiplier": 1.0})).epsilon(1, 1e-5)
    goal = CLIENTS + 2
    skellam = SkellamConfig(1.0, 1.0, goal, SPEC.num_parameters, modulus_bits=24)
    config = _config(True, rounds=5, goal=goal, ddp={"noise_multiplier": 1.0,
                                                     "max_epsilon": 1.001 * skellam.epsilon(
                                                         1, 1e-5)})
    assert one_sum > 0
    loop, events = _loop(config)
    loop.run()
    hook = loop.engine.hook_of(SecureDDPHook)
    assert hook is not None
    assert loop.engine.version == 0 and hook.sums == 0 and hook.epsilon == 0.0
    assert hook.privacy_record()["sums_withheld"] == 2
    assert "withheld" in loop.engine.finished_reason
    assert len(events.of_kind("secure_group_lost")) == 2
    # no flush carried the record: the run's end does, so the summary counts both
    [finished] = events.of_kind("run_finished")
    assert finished.privacy is not None and finished.privacy["sums_withheld"] == 2
    assert summarize(events.events, {})["privacy"]["sums_withheld"] == 2


@pytest.mark.parametrize("error", [OSError, InvalidArgument])
@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure"])
def test_a_failure_reporting_a_flush_stops_the_run_and_never_loses_the_summed_group(
        secure: bool, error: type[Exception]) -> None:
    """A flush reporter that raises (a full disk under a user's ``on_flush``) is the run's
    error, in a secure run as in a plain one: the group's sum is already in the model, so it
    must not be recorded as lost nor its members told so (they would send it again)."""
    clock = ManualClock()
    events = EventLog(None, clock=clock.now)
    reported: list[int] = []

    def fails_once(outcome: Any, wall: float) -> None:
        reported.append(outcome.version)
        if len(reported) == 1:
            raise error("no space left on device")

    loop = VirtualLoop(_config(secure, rounds=2), np.zeros(SPEC.num_parameters, np.float32),
                       SyntheticPopulation(SPEC, CLIENTS, Links(None, CLIENTS)),
                       UpdatePipeline, events, clock,
                       LoopOptions(step_cost_s=0.25, seed=0, deterministic=True),
                       on_flush=fails_once)
    with pytest.raises(FlushReportFailed if secure else error, match="no space left") as raised:
        loop.run()
    assert isinstance(raised.value.__cause__ if secure else raised.value, error)
    assert reported == [1] and loop.engine.version == 1
    assert not events.of_kind("secure_group_lost")
