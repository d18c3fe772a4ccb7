"""Secure groups' rules at the coordinator, driven call by call: real ``SecureDelivery`` clients
against a ``CoordinatorService`` (no network: each test decides the order the calls arrive
in, the moment a race on a real link would decide)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_async

pytest.importorskip("cryptography")

from fedlink.aggregate import RobustConfig
from fedlink.client.secure import SecureDelivery
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.coordinator.config import SecureConfig
from fedlink.coordinator.service import CoordinatorService
from fedlink.errors import UpdateRefused
from fedlink.messages import GetTaskRequest, JoinRequest, Task
from fedlink.metrics import EventLog
from fedlink.refusals import RefusalCode

DIM = 8


def group_config(state_dir: Path, **flush: Any) -> CoordinatorConfig:
    """Groups of 3 (at least 2 deliver), phases that never time out on their own."""
    rule = {"goal": 3, "min_updates": 2, "deadline_s": None, "max_staleness": 0, **flush}
    return CoordinatorConfig(
        rounds=10, flush=FlushRule(**rule),
        limits=LimitsConfig(long_poll_s=1.0, retry_after_s=0.05),
        robust=RobustConfig(enabled=False), norm_bound_adaptive=False,
        secure=SecureConfig(enabled=True, phase_s=600.0), state_dir=str(state_dir))


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
            task = await self.service.get_task(GetTaskRequest(joined.client_id, -1))
            assert isinstance(task, Task), task
            settings = self.calls.settings()
            assert settings is not None
            out.append(SecureDelivery(joined.client_id, task, settings,
                                      self.service.engine.num_parameters))
        return out

    async def advertise(self, members: Sequence[SecureDelivery]) -> list[Any]:
        replies = await asyncio.gather(*(self.calls.advertise(d.advertise()) for d in members),
                                       return_exceptions=True)
        for member, reply in zip(members, replies, strict=True):
            if not isinstance(reply, BaseException):
                member.roster(reply)
        return replies

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

    async def unmask(self, members: Sequence[SecureDelivery]) -> list[Any]:
        return await asyncio.gather(*(self.calls.unmask(d.unmask()) for d in members),
                                    return_exceptions=True)


def test_members_left_out_too_stale_are_told_so_even_when_that_loses_their_group(
        tmp_path: Path) -> None:
    """Group 1 is still going when three more clients of version 0 form group 2; with
    ``max_staleness = 0`` they would be a version stale when it flushes, so all three are left
    out, and group 2 is lost below ``min_updates``. Each is refused ``TOO_STALE``, its task
    closed and an ``update_refused`` event recorded: it waits for the next version instead of
    advertising fresh keys into another group it cannot join either."""
    config = group_config(tmp_path / "state", over_selection=2.0)

    async def main() -> None:
        events = EventLog(None)
        service = CoordinatorService(config, np.zeros(DIM, np.float32), events)
        driver = Driver(service)
        try:
            first = await driver.clients(["a0", "a1", "a2"])
            await driver.advertise(first)
            await driver.share(first)  # group 1 waits for its masked updates
            late = await driver.clients(["b0", "b1", "b2"])
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
            assert lost.group == 2
        finally:
            service.close()

    run_async(main(), timeout=20)
