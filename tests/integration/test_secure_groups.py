"""Secure groups' rules at the coordinator, driven call by call: real ``SecureDelivery`` clients
against a ``CoordinatorService`` (no network: each test decides the order the calls arrive
in, the moment a race on a real link would decide)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_async

pytest.importorskip("cryptography")

from fedlink.aggregate import RobustConfig
from fedlink.client.secure import SecureDelivery
from fedlink.clock import ManualClock
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.coordinator.config import SecureConfig
from fedlink.coordinator.secure import KEEP_DONE
from fedlink.coordinator.service import CoordinatorService
from fedlink.coordinator.state.sqlite import DB_FILENAME
from fedlink.errors import InvalidArgument, UpdateRefused
from fedlink.messages import Finished, GetTaskRequest, JoinRequest, Task, Wait
from fedlink.metrics import EventLog
from fedlink.privacy.secure_ddp import SecureDDPHook
from fedlink.refusals import RefusalCode

DIM = 8


def group_config(state_dir: Path, quorum: float = 1.0, **flush: Any) -> CoordinatorConfig:
    """Groups of 3 (at least 2 deliver), phases that never time out on their own."""
    rule = {"goal": 3, "min_updates": 2, "deadline_s": None, "max_staleness": 0, **flush}
    return CoordinatorConfig(
        rounds=10, flush=FlushRule(**rule),
        limits=LimitsConfig(long_poll_s=1.0, retry_after_s=0.05),
        robust=RobustConfig(enabled=False), norm_bound_adaptive=False,
        secure=SecureConfig(enabled=True, phase_s=600.0, quorum=quorum),
        state_dir=str(state_dir))


class Driver:
    """Clients of one ``CoordinatorService``, each phase's calls made together."""

    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self.calls = service.secure_calls

    async def clients(self, names: Sequence[str]) -> list[SecureDelivery]:
        """Join ``names`` and give each a delivery for the training task it is handed."""
        out = []
        for name in names:
            joined = await self.service.join(JoinRequest(name, num_examples=10))
            out.append(await self.task_of(joined.client_id))
        return out

    async def task_of(self, client_id: str) -> SecureDelivery:
        """A delivery, with fresh keys, for the task ``client_id`` is handed now (its open
        task again when it has one: what a restarted client process gets)."""
        task = await self.service.get_task(GetTaskRequest(client_id, -1))
        assert isinstance(task, Task), task
        settings = self.calls.settings()
        assert settings is not None
        return SecureDelivery(client_id, task, settings, self.service.engine.num_parameters)

    async def advertise(self, members: Sequence[SecureDelivery]) -> list[Any]:
        replies = await asyncio.gather(*(self.calls.advertise(d.advertise()) for d in members),
                                       return_exceptions=True)
        for member, reply in zip(members, replies, strict=True):
            if not isinstance(reply, BaseException):
                member.roster(reply)
        return replies

    async def exchange_keys(self, members: Sequence[SecureDelivery]) -> None:
        """Phases 1 and 2: the members advertise their keys, then share their secrets."""
        await self.advertise(members)
        await self.share(members)

    async def share(self, members: Sequence[SecureDelivery]) -> None:
        replies = await asyncio.gather(*(self.calls.share(d.share()) for d in members))
        for member, reply in zip(members, replies, strict=True):
            member.shared(reply)

    async def masked(self, members: Sequence[SecureDelivery], values: Sequence[float]) -> None:
        rng = np.random.default_rng(0)
        for member, value in zip(members, values, strict=True):
            member.trained(np.full(DIM, value, np.float32), 10, 1, 1)
        requests = [member.masked(rng) for member in members]
        replies = await asyncio.gather(*(self.calls.masked(r) for r in requests))
        for member, reply in zip(members, replies, strict=True):
            member.heard(reply)

    @staticmethod
    def masked_requests(members: Sequence[SecureDelivery]) -> list[Any]:
        """The members' masked updates of ``0.1`` everywhere, not sent yet."""
        rng = np.random.default_rng(0)
        requests = []
        for member in members:
            member.trained(np.full(DIM, 0.1, np.float32), 10, 1, 1)
            requests.append(member.masked(rng))
        return requests

    async def unmask(self, members: Sequence[SecureDelivery]) -> list[Any]:
        return await asyncio.gather(*(self.calls.unmask(d.unmask()) for d in members),
                                    return_exceptions=True)

    async def second_group_asked_to_unmask(self) -> list[SecureDelivery]:
        """Group 1 (a0..a2) flushed; group 2 (b0..b2) delivered its masked updates and each
        member heard whom to unmask: group 2's members."""
        first = await self.clients(["a0", "a1", "a2"])
        await self.exchange_keys(first)
        await self.masked(first, [0.1] * 3)
        await self.unmask(first)
        second = await self.clients(["b0", "b1", "b2"])
        await self.exchange_keys(second)
        await self.masked(second, [0.1] * 3)
        return second

    async def more_groups(self, count: int, size: int = 4) -> None:
        """``count`` more groups of ``size`` new clients, each flushed with every member."""
        for n in range(count):
            group = await self.clients([f"g{n}-{i}" for i in range(size)])
            await self.exchange_keys(group)
            await self.masked(group, [0.1] * size)
            await self.unmask(group)


def test_members_left_out_too_stale_are_told_so_even_when_that_loses_their_group(
        tmp_path: Path) -> None:
    """Groups 1 and 2 are still going when three more clients of version 0 form group 3; with
    ``max_staleness = 1`` they would be two versions stale when it flushes, so all three are
    left out, and group 3 is lost below ``min_updates``. Each is refused ``TOO_STALE``, its
    task closed and an ``update_refused`` event recorded: it waits for the next version
    instead of advertising fresh keys into another group it cannot join either."""
    config = group_config(tmp_path / "state", over_selection=3.0, max_staleness=1)

    async def main() -> None:
        async with serving(config) as (service, driver, events):
            for names in (["a0", "a1", "a2"], ["b0", "b1", "b2"]):
                await driver.exchange_keys(await driver.clients(names))  # they train on
            late = await driver.clients(["c0", "c1", "c2"])
            replies = await driver.advertise(late)
            for reply in replies:
                assert isinstance(reply, UpdateRefused), reply
                assert reply.reason is RefusalCode.TOO_STALE, reply
            refused = events.of_kind("update_refused")
            assert sorted(e.task_id for e in refused) == sorted(d.task.task_id for d in late)
            for member in late:
                record = service.engine.task(member.client_id, member.task.task_id)
                assert not record.state.deliverable
            [lost] = events.of_kind("secure_group_lost")
            assert lost.group == 3

    run_async(main(), timeout=20)


def test_a_group_ready_first_flushes_after_the_group_ahead_of_it(tmp_path: Path) -> None:
    """Group 2 forms while group 1 still trains, so its members' staleness counts group 1's
    version as ahead of theirs (one version stale, weight 1/2 under ``polynomial``, a = 1).
    Group 2 unmasks first; its sum waits for group 1's, so every member is folded exactly as
    stale as it was weighed, and never beyond ``max_staleness`` (before, group 2 flushed first
    as version 1 recorded a version stale, and group 1 then counted as fresh)."""
    config = dataclasses.replace(group_config(tmp_path / "state", over_selection=2.0,
                                              max_staleness=1),
                                 staleness_weight="polynomial",
                                 staleness_weight_options={"a": 1.0})

    async def main() -> None:
        async with serving(config) as (service, driver, events):
            first = await driver.clients(["a0", "a1", "a2"])
            await driver.exchange_keys(first)  # group 1 trains on
            second = await driver.clients(["b0", "b1", "b2"])
            await driver.exchange_keys(second)
            await driver.masked(second, [0.3, 0.3, 0.3])
            unmasked = asyncio.ensure_future(driver.unmask(second))
            for _ in range(20):  # its answers are in: it would flush now if it went first
                await asyncio.sleep(0)
            assert not unmasked.done() and service.engine.version == 0
            await driver.masked(first, [0.1, 0.1, 0.1])
            assert not any(isinstance(r, BaseException) for r in await driver.unmask(first))
            assert [r.flushed_version for r in await unmasked] == [2, 2, 2]
            by_client = {e.client_id: e for e in events.of_kind("update_accepted")}
            for member in first:
                assert (by_client[member.client_id].staleness,
                        by_client[member.client_id].weight) == (0, 1.0)
            for member in second:
                assert (by_client[member.client_id].staleness,
                        by_client[member.client_id].weight) == (1, 0.5)
            # version 1 is group 1's mean; version 2 adds group 2's, a version stale:
            # discounted by its weight, as a late update beside fresh ones (before: in full)
            assert np.allclose(service.engine.model, 0.1 + 0.5 * 0.3, atol=1e-3)

    run_async(main(), timeout=20)


@contextlib.asynccontextmanager
async def serving(config: CoordinatorConfig, clock: ManualClock | None = None
                  ) -> AsyncIterator[tuple[CoordinatorService, Driver, EventLog]]:
    """A coordinator on ``config`` (a zero model; ``clock``: the real one when ``None``), a
    driver for its clients and its event log; closed on the way out."""
    events = EventLog(None)
    service = CoordinatorService(config, np.zeros(DIM, np.float32), events, clock=clock)
    try:
        yield service, Driver(service), events
    finally:
        service.close()


async def until_waiting() -> None:
    """Let every call made so far reach the point where it waits for its phase."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_client_that_restarts_while_its_group_forms_is_in_the_roster_with_its_new_keys(
        tmp_path: Path) -> None:
    """c0 advertises, its process restarts (same client, same open task, fresh keys) and it
    advertises again before the roster closes: the new keys replace the old ones, so its
    neighbours mask against keys it holds (before, the roster kept the old keys: the shares
    meant for c0 did not decrypt, and its neighbours' sessions ended on the error)."""
    async def main() -> None:
        async with serving(group_config(tmp_path / "state")) as (service, driver, _):
            old, c1, c2 = await driver.clients(["c0", "c1", "c2"])
            first = asyncio.ensure_future(driver.calls.advertise(old.advertise()))
            await until_waiting()
            first.cancel()  # the process died with its call
            new = await driver.task_of(old.client_id)
            assert new.task.task_id == old.task.task_id
            members = [new, c1, c2]
            await driver.exchange_keys(members)  # every share decrypts
            await driver.masked(members, [0.1, 0.2, 0.3])
            assert [r.flushed_version for r in await driver.unmask(members)] == [1, 1, 1]
            assert np.allclose(service.engine.model, 0.2, atol=1e-3)

    run_async(main(), timeout=20)


def test_a_client_that_restarts_after_sharing_is_a_dropout_there_and_joins_the_next_group(
        tmp_path: Path) -> None:
    """c0 shared its keys in group 1, then restarted: its fresh keys are not the roster's, so
    it is a dropout in group 1 (unmasked from its neighbours' shares) and joins group 2, where
    its update counts once."""
    config = group_config(tmp_path / "state", goal=4, over_selection=2.0, max_staleness=1)
    clock = ManualClock()

    async def main() -> None:
        async with serving(config, clock) as (service, driver, _):
            first = await driver.clients(["c0", "c1", "c2", "c3"])
            await driver.exchange_keys(first)
            restarted = await driver.task_of(first[0].client_id)
            rejoined = asyncio.ensure_future(driver.advertise([restarted]))
            await until_waiting()
            assert not rejoined.done()  # waiting for group 2's roster, not group 1's
            second = [restarted, *await driver.clients(["c4", "c5", "c6"])]
            await driver.advertise(second[1:])
            [roster] = await rejoined
            assert roster.round_id == 2
            await driver.share(second)
            masked = asyncio.ensure_future(driver.masked(first[1:], [0.2, 0.4, 0.6]))
            await until_waiting()
            clock.advance(config.secure.phase_s)  # c0's masked update never comes to group 1
            await masked
            assert [r.flushed_version for r in await driver.unmask(first[1:])] == [1, 1, 1]
            assert np.allclose(service.engine.model, 0.4, atol=1e-3)
            await driver.masked(second, [0.2, 0.2, 0.2, 0.2])
            assert [r.flushed_version for r in await driver.unmask(second)] == [2] * 4
            assert np.allclose(service.engine.model, 0.6, atol=1e-3)

    run_async(main(), timeout=20)


def test_a_client_that_restarts_after_its_masked_update_is_refused_once_its_sum_flushed(
        tmp_path: Path) -> None:
    """c0's masked update is in group 1's sum when it restarts and advertises fresh keys for
    the same task: it is answered once that sum is flushed, refused ``TASK_CLOSED`` (its
    update counts once), and the next task it is handed is a new one."""
    async def main() -> None:
        async with serving(group_config(tmp_path / "state", goal=4)) as (service, driver, _):
            members = await driver.clients(["c0", "c1", "c2", "c3"])
            await driver.exchange_keys(members)
            await driver.masked(members, [0.1, 0.2, 0.3, 0.2])
            restarted = await driver.task_of(members[0].client_id)
            again = asyncio.ensure_future(driver.calls.advertise(restarted.advertise()))
            await until_waiting()
            assert not again.done()
            await driver.unmask(members[1:])  # c0's answer is not needed: its seed is shared
            with pytest.raises(UpdateRefused, match="in secure group 1's sum") as refused:
                await again
            assert refused.value.reason is RefusalCode.TASK_CLOSED
            assert service.engine.version == 1
            assert np.allclose(service.engine.model, 0.2, atol=1e-3)

    run_async(main(), timeout=20)


def test_a_client_that_joins_the_forming_group_with_a_second_task_replaces_its_first(
        tmp_path: Path) -> None:
    """``late`` waits in the forming group with a task of version 0 while two groups ahead
    flush, so that task is too stale to be open; its restarted process is handed a new task
    and advertises it into the same forming group. The new task takes the place of the old
    one (before, the two entries shared an index and the whole group was lost)."""
    config = group_config(tmp_path / "state", over_selection=4.0, max_staleness=1)

    async def main() -> None:
        async with serving(config) as (service, driver, events):
            ahead = [await driver.clients([f"{g}{i}" for i in range(3)]) for g in "ab"]
            for group in ahead:
                await driver.exchange_keys(group)
            [late] = await driver.clients(["late"])
            waiting = asyncio.ensure_future(driver.calls.advertise(late.advertise()))
            await until_waiting()
            for group in ahead:
                await driver.masked(group, [0.1, 0.1, 0.1])
                await driver.unmask(group)
            assert service.engine.version == 2
            waiting.cancel()
            restarted = await driver.task_of(late.client_id)
            assert restarted.task.task_id != late.task.task_id
            last = [restarted, *await driver.clients(["c0", "c1"])]
            rosters = await driver.advertise(last)
            assert sorted(r.index for r in rosters) == [1, 2, 3]  # index 0: the closed task
            await driver.share(last)
            await driver.masked(last, [0.3, 0.3, 0.3])
            assert [r.flushed_version for r in await driver.unmask(last)] == [3, 3, 3]
            assert events.of_kind("secure_group_lost") == []

    run_async(main(), timeout=20)


def test_an_unmask_that_comes_after_its_group_is_forgotten_is_answered_as_summed(
        tmp_path: Path) -> None:
    """c0 delivered its masked update, then went quiet: its group unmasked it from its
    neighbours' shares and flushed. Its unmask comes only after more groups finished than the
    coordinator keeps (``KEEP_DONE``); it is answered with the version its sum made, not
    refused: under group random-k its client keeps the new residual only when told so."""
    config = group_config(tmp_path / "state", goal=4)

    async def main() -> None:
        async with serving(config) as (service, driver, _):
            first = await driver.clients(["c0", "c1", "c2", "c3"])
            await driver.exchange_keys(first)
            await driver.masked(first, [0.1] * 4)
            await driver.unmask(first[1:])
            await driver.more_groups(KEEP_DONE)
            assert service.engine.version == KEEP_DONE + 1
            reply = await driver.calls.unmask(first[0].unmask())
            assert reply.flushed_version == 1

    run_async(main(), timeout=20)


def test_a_masked_update_retried_after_its_group_is_forgotten_is_answered_as_summed(
        tmp_path: Path) -> None:
    """c0's masked update went into group 1's sum, but the answer was lost on the way; its
    retry comes after the group flushed without its unmask and was forgotten (``KEEP_DONE``
    later groups). It is answered with no one to unmask, and the unmask that follows with the
    version its sum made: the client counts its update accepted and keeps the residual it
    held back (refused, as before, it sent its summed residual again and dropped the rest)."""
    config = group_config(tmp_path / "state", goal=4)

    async def main() -> None:
        async with serving(config) as (_, driver, events):
            first = await driver.clients(["c0", "c1", "c2", "c3"])
            await driver.exchange_keys(first)
            rng = np.random.default_rng(0)
            for member in first:
                member.trained(np.full(DIM, 0.1, np.float32), 10, 1, 1)
            requests = [member.masked(rng) for member in first]
            replies = await asyncio.gather(*(driver.calls.masked(r) for r in requests))
            for member, reply in zip(first[1:], replies[1:], strict=True):
                member.heard(reply)  # c0's answer is lost
            await driver.unmask(first[1:])
            await driver.more_groups(KEEP_DONE)
            retried = await driver.calls.masked(requests[0])
            assert (retried.survivors, retried.dropped) == ((), ())
            first[0].heard(retried)
            late = first[0].unmask()
            assert (late.seed_shares, late.key_shares) == ((), ())  # reveals nothing
            assert (await driver.calls.unmask(late)).flushed_version == 1
            accepted = [e.task_id for e in events.of_kind("update_accepted")]
            assert accepted.count(first[0].task.task_id) == 1

    run_async(main(), timeout=20)


def test_after_a_coordinator_restart_a_late_unmask_is_answered_and_groups_number_on(
        tmp_path: Path) -> None:
    """Group 1 flushed without c0's unmask answer, then the coordinator restarted on its state
    directory, forgetting its groups. c0's late unmask is answered (its task was delivered
    with the flush, durably), not refused as in no group: told its update was lost, a client
    under group random-k would keep the sent coordinates as residual and send them again."""
    config = group_config(tmp_path / "state", goal=4)

    async def main() -> None:
        async with serving(config) as (service, driver, _):
            members = await driver.clients(["c0", "c1", "c2", "c3"])
            await driver.exchange_keys(members)
            await driver.masked(members, [0.1, 0.2, 0.3, 0.2])
            await driver.unmask(members[1:])
            assert service.engine.version == 1
        async with serving(config) as (restarted, driver, _):
            assert restarted.engine.version == 1
            late = members[0].unmask()
            reply = await driver.calls.unmask(late)
            assert reply.flushed_version == 1
            stranger = dataclasses.replace(late, client_id=members[1].client_id)
            with pytest.raises(UpdateRefused) as refused:  # another client's task: no answer
                await driver.calls.unmask(stranger)
            assert refused.value.reason is RefusalCode.TASK_CLOSED
            # the groups of the restarted process follow the first's: group random-k draws
            # new coordinates, and events never name two groups alike
            after = await driver.clients(["d0", "d1", "d2", "d3"])
            rosters = await driver.advertise(after)
            assert [r.round_id for r in rosters] == [2] * 4

    run_async(main(), timeout=20)


def test_a_member_sharing_keys_when_the_coordinator_restarts_joins_the_next_group(
        tmp_path: Path) -> None:
    """Group 1 lived in a coordinator process that restarted while its members shared their
    keys. Their tasks are open and their updates unsent, so the restarted coordinator answers
    their retried ``SecureShare`` with ``NEW_KEYS``: they advertise fresh keys into the next
    group while they train, and their updates count there. Before, they were refused
    ``TASK_CLOSED`` and checked in to train their tasks again."""
    config = group_config(tmp_path / "state")

    async def main() -> None:
        async with serving(config) as (_, driver, _):
            members = await driver.clients(["c0", "c1", "c2"])
            await driver.advertise(members)
            requests = [member.share() for member in members]
        async with serving(config) as (restarted, driver, _):
            for request in requests:
                with pytest.raises(UpdateRefused) as refused:
                    await driver.calls.share(request)
                assert refused.value.reason is RefusalCode.NEW_KEYS
            again = [await driver.task_of(m.client_id) for m in members]
            assert [d.task.task_id for d in again] == [m.task.task_id for m in members]
            await driver.exchange_keys(again)
            await driver.masked(again, [0.1, 0.2, 0.3])
            assert [r.flushed_version for r in await driver.unmask(again)] == [1, 1, 1]
            assert np.allclose(restarted.engine.model, 0.2, atol=1e-3)
            for task_id in ("t-none", members[1].task.task_id):  # unknown, another's
                stranger = dataclasses.replace(requests[0], task_id=task_id)
                with pytest.raises(UpdateRefused) as refused:  # nothing of its own to re-key
                    await driver.calls.share(stranger)
                assert refused.value.reason is RefusalCode.TASK_CLOSED

    run_async(main(), timeout=20)


def test_a_group_a_coordinator_restart_cuts_short_is_recorded_lost_once(tmp_path: Path) -> None:
    """Group 1 flushed and group 2 was sharing its keys when the coordinator restarted: the
    restarted coordinator records group 2 lost (``secure_group_lost``, at ``share``, its 3
    members, "the coordinator restarted"), never group 1, and a second restart records
    nothing again. Before, a group lost to a restart left no event: a run's record counted
    fewer lost groups than it had."""
    config = group_config(tmp_path / "state")

    async def main() -> None:
        async with serving(config) as (_, driver, events):
            first = await driver.clients(["a0", "a1", "a2"])
            await driver.exchange_keys(first)
            await driver.masked(first, [0.1] * 3)
            await driver.unmask(first)
            await driver.advertise(await driver.clients(["b0", "b1", "b2"]))
            assert not events.of_kind("secure_group_lost")
        async with serving(config) as (restarted, _, events):
            [lost] = events.of_kind("secure_group_lost")
            assert (lost.group, lost.phase, lost.members, lost.reason, lost.model_version) == \
                (2, "share", 3, "the coordinator restarted", restarted.engine.version)
        async with serving(config) as (_, _, events):  # the outbox may write it again, as is
            again = events.of_kind("secure_group_lost")
            assert [e.event_id for e in again] in ([], [lost.event_id])

    run_async(main(), timeout=20)


def test_an_unmask_answer_at_another_point_is_refused_and_the_sum_stays_exact(
        tmp_path: Path) -> None:
    """c0 answers its unmasking with its shares at another point than its own (or naming a
    client twice): refused ``INVALID_ARGUMENT`` and not counted. Before, the coordinator
    rebuilt a wrong seed from it and flushed a wrong sum."""
    async def main() -> None:
        async with serving(group_config(tmp_path / "state")) as (service, driver, _):
            members = await driver.clients(["c0", "c1", "c2"])
            await driver.exchange_keys(members)
            await driver.masked(members, [0.1, 0.2, 0.3])
            honest = members[0].unmask()
            moved = tuple(dataclasses.replace(s, x=s.x + 1) for s in honest.seed_shares)
            twice = honest.seed_shares + honest.seed_shares[:1]
            for seeds in (moved, twice):
                with pytest.raises(InvalidArgument):
                    await driver.calls.unmask(dataclasses.replace(honest, seed_shares=seeds))
            replies = await asyncio.gather(driver.calls.unmask(honest),
                                           *(driver.calls.unmask(m.unmask())
                                             for m in members[1:]))
            assert [r.flushed_version for r in replies] == [1, 1, 1]
            assert np.allclose(service.engine.model, 0.2, atol=1e-3)

    run_async(main(), timeout=20)


@pytest.mark.parametrize("ddp", [False, True], ids=["weighted", "distributed-dp"])
def test_a_sum_no_honest_members_could_make_is_never_flushed(tmp_path: Path,
                                                             ddp: bool) -> None:
    """c0's masked update is garbage of the right length (a client with a wrong mask, sign or
    packing sends the like): the sum it unmasks to carries another weight than the members
    were named or, under distributed DP (no weight), a norm beyond what clipped, noised
    updates reach. The group is lost with the reason, and the model is untouched; before,
    the garbage was flushed as the next version."""
    config = ddp_config(tmp_path / "state") if ddp else group_config(tmp_path / "state")

    async def main() -> None:
        async with serving(config) as (service, driver, events):
            members = await driver.clients(["c0", "c1", "c2"])
            await driver.exchange_keys(members)
            requests = driver.masked_requests(members)
            rng = np.random.default_rng(1)
            garbage = rng.integers(0, 256, len(requests[0].values), np.uint8).tobytes()
            requests[0] = dataclasses.replace(requests[0], values=garbage)
            replies = await asyncio.gather(*(driver.calls.masked(r) for r in requests))
            for member, reply in zip(members, replies, strict=True):
                member.heard(reply)
            for reply in await driver.unmask(members):
                assert isinstance(reply, UpdateRefused), reply
            [lost] = events.of_kind("secure_group_lost")
            assert lost.phase == "unmask" and "is wrong" in lost.reason, lost.reason
            assert service.engine.version == 0 and not service.engine.model.any()

    run_async(main(), timeout=20)


def test_masked_updates_counts_are_checked_and_bounded_as_a_commit_s(tmp_path: Path) -> None:
    """The example and step counts a masked update claims are its record
    (``update_accepted``): incoherent ones are refused (``INVALID_ARGUMENT``, the member may
    send it again with its true counts), and an example count is bounded by what the client
    declared at ``Join``, as a plain ``Commit``'s is (before, any claim was recorded, up to
    the most an int64 holds)."""
    async def main() -> None:
        async with serving(group_config(tmp_path / "state")) as (_, driver, events):
            members = await driver.clients(["c0", "c1", "c2"])
            await driver.exchange_keys(members)
            requests = driver.masked_requests(members)
            boasts = dataclasses.replace(requests[0], num_examples=2**63 - 1)  # int64's most
            with pytest.raises(InvalidArgument, match="steps_completed 7 exceeds"):
                await driver.calls.masked(dataclasses.replace(requests[1], steps_completed=7))
            with pytest.raises(InvalidArgument, match="num_examples must be >= 1"):
                await driver.calls.masked(dataclasses.replace(requests[1], num_examples=-3))
            replies = await asyncio.gather(*(driver.calls.masked(r)
                                             for r in (boasts, *requests[1:])))
            for member, reply in zip(members, replies, strict=True):
                member.heard(reply)
            assert [r.flushed_version for r in await driver.unmask(members)] == [1, 1, 1]
            recorded = {e.client_id: (e.num_examples, e.steps_completed)
                        for e in events.of_kind("update_accepted")}
            assert recorded == {m.client_id: (10, 1) for m in members}

    run_async(main(), timeout=20)


def ddp_config(state_dir: Path, max_epsilon: float = 0.0, **flush: Any) -> CoordinatorConfig:
    """``group_config`` under distributed DP (``max_epsilon`` 0: no budget)."""
    config = group_config(state_dir, **flush)
    return dataclasses.replace(config, secure=dataclasses.replace(
        config.secure, noise_multiplier=1.0, clip_norm=1.0, max_epsilon=max_epsilon))


def test_a_group_whose_run_stops_before_it_unmasks_is_never_unmasked(tmp_path: Path) -> None:
    """The operator stops the run while group 2 waits for its unmask answers: no sum is
    unmasked once the run is over, and its members are told ``RUN_OVER``. Under distributed
    DP the sum was accounted when its members were asked to unmask it (what they send would
    let the coordinator compute it), and stays so: before, it was learnt and accounted in
    memory only, so a coordinator restarted on the state directory went on below the epsilon
    spent."""
    config = ddp_config(tmp_path / "state")

    async def main() -> None:
        async with serving(config) as (service, driver, _):
            second = await driver.second_group_asked_to_unmask()
            hook = service.engine.hook_of(SecureDDPHook)
            assert hook is not None and service.engine.version == 1
            accounted = hook.privacy_record()
            assert accounted["steps"] == 2  # asked for: accounted, before any answer
            service.lifecycle.end("stopped by signal", durable=False)
            for reply in await driver.unmask(second):
                assert isinstance(reply, UpdateRefused), reply
                assert reply.reason is RefusalCode.RUN_OVER
            assert hook.privacy_record() == accounted and service.engine.version == 1

    run_async(main(), timeout=20)


def committed_accounting(state_dir: Path) -> Any:
    """Distributed DP's accounting as committed in ``state_dir``'s database (read beside the
    coordinator's own connection: what a process killed now would restart from)."""
    with contextlib.closing(sqlite3.connect(state_dir / DB_FILENAME)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'secure_accounting'").fetchone()
    return None if row is None else json.loads(row[0])


def test_the_last_sum_the_budget_allows_flushes_before_the_run_ends(tmp_path: Path) -> None:
    """The budget allows one full sum. Once group 1 is asked to unmask, its sum is spent, and
    a client checking in meanwhile is told to wait (no new task could be summed), not that
    the run is over: group 1 then flushes, and only the next check-in ends the run. Before,
    that check-in ended the run at once, and group 1's sum, spent, was refused ``RUN_OVER``
    and never flushed."""
    one_sum = SecureDDPHook(noise_multiplier=1.0, clip_norm=1.0, noise_shares=3,
                            size=DIM).epsilon_with(3)
    config = ddp_config(tmp_path / "state", max_epsilon=one_sum * 1.001)

    async def main() -> None:
        async with serving(config) as (service, driver, _):
            members = await driver.clients(["c0", "c1", "c2"])
            await driver.exchange_keys(members)
            await driver.masked(members, [0.1] * 3)
            late = await service.join(JoinRequest("late", num_examples=10))
            waiting = await service.get_task(GetTaskRequest(late.client_id, -1))
            assert isinstance(waiting, Wait) and "privacy budget spent" in waiting.reason
            assert [r.flushed_version for r in await driver.unmask(members)] == [1, 1, 1]
            finished = await service.get_task(GetTaskRequest(late.client_id, -1))
            assert isinstance(finished, Finished), finished
            assert "privacy budget exhausted" in finished.reason

    run_async(main(), timeout=20)


def test_a_sum_its_members_were_asked_to_unmask_stays_spent_across_a_restart(
        tmp_path: Path) -> None:
    """Distributed DP: once group 2's members hear whom to unmask, their answers would give
    the coordinator the sum, so it is accounted then, durably, before any of them answers. A
    coordinator restarted at that moment (group 2 lost with its process, its sum never
    unmasked) goes on with that sum's epsilon spent. Before, it restarted with the last
    checkpoint's accounting, one sum short of what its previous process could have learnt."""
    config = ddp_config(tmp_path / "state")

    async def main() -> None:
        async with serving(config) as (service, driver, _):
            await driver.second_group_asked_to_unmask()
            hook = service.engine.hook_of(SecureDDPHook)
            assert hook is not None
            spent = hook.privacy_record()
            assert spent["steps"] == 2 and service.engine.version == 1
            assert committed_accounting(tmp_path / "state") == hook.state_dict()  # on disk
        async with serving(config) as (restarted, _, _):
            assert restarted.engine.version == 1
            hook = restarted.engine.hook_of(SecureDDPHook)
            assert hook is not None and hook.privacy_record() == spent

    run_async(main(), timeout=20)


def test_a_sum_past_the_budget_is_never_asked_for_and_stays_withheld_across_a_restart(
        tmp_path: Path) -> None:
    """The budget admits one sum with all 4 members' noise. Group 1 goes on with 3 (c3's
    keys never come; the share phase closes at its deadline): less noise, more epsilon than
    the budget allows. Its members are refused as its masked phase closes, before any of
    them is asked to unmask, so the coordinator never holds what would rebuild the sum
    (before, the budget was checked once their unmask answers were in), and the sum withheld
    is journalled: a restarted coordinator still reports it."""
    one_sum = SecureDDPHook(noise_multiplier=1.0, clip_norm=1.0, noise_shares=4,
                            size=DIM).epsilon_with(4)
    config = ddp_config(tmp_path / "state", max_epsilon=one_sum * 1.001, goal=4)
    clock = ManualClock()

    async def main() -> None:
        async with serving(config, clock) as (service, driver, events):
            members = await driver.clients(["c0", "c1", "c2", "c3"])
            await driver.advertise(members)
            shared = asyncio.ensure_future(driver.share(members[:3]))
            await until_waiting()
            clock.advance(config.secure.phase_s)  # the share phase closes with 3 of 4
            await shared
            replies = await asyncio.gather(*(driver.calls.masked(r) for r in
                                             driver.masked_requests(members[:3])),
                                           return_exceptions=True)
            for reply in replies:
                assert isinstance(reply, UpdateRefused), reply
            [lost] = events.of_kind("secure_group_lost")
            assert lost.phase == "masked" and "privacy budget" in lost.reason
            hook = service.engine.hook_of(SecureDDPHook)
            assert hook is not None
            assert hook.privacy_record()["sums_withheld"] == 1 and hook.sums == 0
        async with serving(config) as (restarted, _, _):
            hook = restarted.engine.hook_of(SecureDDPHook)
            assert hook is not None
            assert hook.privacy_record()["sums_withheld"] == 1 and hook.epsilon == 0.0

    run_async(main(), timeout=20)


def test_a_group_stuck_ahead_holds_the_next_up_only_until_its_unmask_deadline(
        tmp_path: Path) -> None:
    """Group 1's members shared their keys and then went quiet (still training, as far as the
    coordinator knows). Group 2 is ready to flush: it waits for group 1 only until its own
    unmasking's deadline, then flushes first, its members recorded as stale as they were
    when folded. Group 3 does the same. When group 1's updates finally come they would be two
    versions stale, beyond ``max_staleness = 1``: its sum is lost, never unmasked."""
    config = group_config(tmp_path / "state", over_selection=3.0, max_staleness=1)
    clock = ManualClock()

    async def main() -> None:
        async with serving(config, clock) as (service, driver, events):
            stuck = await driver.clients(["a0", "a1", "a2"])
            await driver.exchange_keys(stuck)
            for number, names in ((2, ["b0", "b1", "b2"]), (3, ["c0", "c1", "c2"])):
                group = await driver.clients(names)
                await driver.exchange_keys(group)
                await driver.masked(group, [0.3, 0.3, 0.3])
                unmasked = asyncio.ensure_future(driver.unmask(group))
                await until_waiting()
                assert not unmasked.done()  # it waits for group 1 ...
                clock.advance(config.secure.phase_s)  # ... until its deadline
                assert [r.flushed_version for r in await unmasked] == [number - 1] * 3
            assert service.engine.version == 2
            staleness = {e.client_id: e.staleness for e in events.of_kind("update_accepted")}
            assert sorted(staleness.values()) == [0, 0, 0, 0, 0, 0]  # folded as fresh as made
            await driver.masked(stuck, [0.1, 0.1, 0.1])
            for reply in await driver.unmask(stuck):
                assert isinstance(reply, UpdateRefused), reply
            [lost] = events.of_kind("secure_group_lost")
            assert (lost.group, lost.phase) == (1, "unmask")
            assert "2 versions stale" in lost.reason
            assert service.engine.version == 2

    run_async(main(), timeout=20)


def test_a_roster_too_small_at_its_deadline_waits_for_members_instead_of_being_lost(
        tmp_path: Path) -> None:
    """Only 2 of a group of 4 advertised keys by the roster's deadline: too few to go on (each
    member shares its secrets among at least 2 others). Before, the group was lost, and its 2
    members formed the same group of 2 again with fresh keys, lost every ``phase_s`` for as
    long as no other client came. Now the roster waits: each waiting call is answered
    ``NEW_KEYS`` after ``phase_s`` (a client's call must not outlive its deadline), its client
    advertises again and keeps its place; the next member to join counts the roster's
    deadline again, and the group goes on with 3."""
    config = group_config(tmp_path / "state", goal=4)
    phase_s = config.secure.phase_s
    clock = ManualClock()

    async def main() -> None:
        async with serving(config, clock) as (service, driver, events):
            early = await driver.clients(["a0", "a1"])
            first = asyncio.ensure_future(driver.advertise(early))
            await until_waiting()
            clock.advance(phase_s)
            for reply in await first:
                assert isinstance(reply, UpdateRefused), reply
                assert reply.reason is RefusalCode.NEW_KEYS
                assert "secure group 1 waits for members: 2 advertised keys, 3 needed" in str(
                    reply)
            again = [await driver.task_of(d.client_id) for d in early]  # fresh keys
            assert [d.task.task_id for d in again] == [d.task.task_id for d in early]
            second = asyncio.ensure_future(driver.advertise(again))
            await until_waiting()
            clock.advance(10 * phase_s)  # waiting past the calls' own bound: asked again
            for reply in await second:
                assert isinstance(reply, UpdateRefused) and reply.reason is RefusalCode.NEW_KEYS
            again = [await driver.task_of(d.client_id) for d in early]
            second = asyncio.ensure_future(driver.advertise(again))
            late = await driver.clients(["a2"])
            third = asyncio.ensure_future(driver.advertise(late))
            await until_waiting()
            clock.advance(phase_s / 2)
            await until_waiting()
            assert not second.done() and not third.done()  # counted again from a2's keys
            clock.advance(phase_s / 2)
            replies = await second + await third
            assert not any(isinstance(r, BaseException) for r in replies), replies
            assert {r.round_id for r in replies} == {1}  # the same group all along
            members = again + late
            await driver.share(members)
            await driver.masked(members, [0.1, 0.2, 0.3])
            assert [r.flushed_version for r in await driver.unmask(members)] == [1, 1, 1]
            assert np.allclose(service.engine.model, 0.2, atol=1e-3)
            assert not events.of_kind("secure_group_lost")

    run_async(main(), timeout=20)


def test_a_task_handed_out_past_the_versions_deadline_still_gets_the_whole_deadline(
        tmp_path: Path) -> None:
    """A secure group is the next clients to start a task, whenever they start, and its
    masked phase waits ``deadline_s`` for them. Before, a task handed out once the version's
    deadline had passed got 1 ms (no poll restarts that deadline in a secure run): its client
    completed no local step, and the sum weighed that update as any other."""
    config = group_config(tmp_path / "state", deadline_s=2400.0)
    clock = ManualClock()

    async def main() -> None:
        async with serving(config, clock) as (_, driver, _events):
            [first] = await driver.clients(["a0"])
            clock.advance(3000.0)
            [late] = await driver.clients(["a1"])
            assert first.task.deadline_s == late.task.deadline_s == 2400.0

    run_async(main(), timeout=20)


def test_a_member_whose_task_was_forgotten_while_its_roster_formed_is_left_out_alone(
        tmp_path: Path) -> None:
    """c0 (a version-0 task) joins the forming group 4 at version 1; two groups formed before
    it flush, and the engine forgets c0's task as too stale (``max_staleness = 1``). When the
    roster closes, c0 is left out ``TOO_STALE`` and the group goes on with the others.
    Before, looking the forgotten task up to close it refused, and lost the whole group."""
    config = group_config(tmp_path / "state", goal=4, over_selection=4.0, max_staleness=1)

    async def main() -> None:
        async with serving(config) as (service, driver, events):
            first = await driver.clients([f"a{i}" for i in range(4)])
            [old] = await driver.clients(["c0"])
            await driver.exchange_keys(first)
            await driver.masked(first, [0.1] * 4)
            await driver.unmask(first)
            ahead = [await driver.clients([f"{n}{i}" for i in range(4)]) for n in "bd"]
            for group in ahead:
                await driver.exchange_keys(group)
            joined = asyncio.ensure_future(driver.advertise([old]))
            await until_waiting()
            for group in ahead:
                await driver.masked(group, [0.1] * 4)
                await driver.unmask(group)
            assert service.engine.version == 3
            fresh = await driver.clients(["e0", "e1", "e2"])
            await driver.advertise(fresh)
            [refused] = await joined
            assert isinstance(refused, UpdateRefused) and refused.reason is RefusalCode.TOO_STALE
            await driver.share(fresh)
            await driver.masked(fresh, [0.1] * 3)
            assert [r.flushed_version for r in await driver.unmask(fresh)] == [4, 4, 4]
            assert not events.of_kind("secure_group_lost")

    run_async(main(), timeout=20)
