"""A recorded secure session: one group's four phases on the wire, for the golden files.

Four clients join a run with secure aggregation and form one group; client 3 shares its keys
and then vanishes, so the masked phase closes at its deadline (``phase_s`` on the manual
clock) with three of four, and the other three unmask client 3's pairwise masks from its key
shares. Then client 0 asks for the new
version's model and leaves. The calls are played against a real ``CoordinatorService`` (no
network, a manual clock), each phase's calls made together as a group's clients make them;
every random draw a client makes is written down beside the messages (``draws``: keys and
Shamir coefficients; ``rounding_seed``: numpy's ``default_rng`` for the stochastic
rounding, which a second implementation need not reproduce: the masked values are on the
wire). The coordinator's random client ids become ``CLIENT_0`` .. ``CLIENT_3``.

Needs the ``secagg`` extra (``cryptography``); ``record_secure_session`` imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedlink.aggregate import RobustConfig
from fedlink.clock import ManualClock, real_sleep
from fedlink.conformance.golden import VECTOR
from fedlink.conformance.session import Recorder
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.coordinator.config import SecureConfig
from fedlink.coordinator.service import CoordinatorService
from fedlink.messages import GetTaskRequest, JoinRequest, LeaveRequest, Task
from fedlink.metrics import EventLog

if TYPE_CHECKING:
    from fedlink.client.secure import SecureDelivery

CLIENTS = 4
DROPPED = 3
"""The member that shares its keys and is never heard from again."""
ROUNDING_SEED = 20261205
PHASE_S = 60.0
UPDATES = [np.linspace(-0.5, 0.5, VECTOR.size, dtype=np.float32) * np.float32(i + 1) / 4
           for i in range(CLIENTS)]
"""Each client's update (within the ring's clip of 1)."""


def secure_config() -> CoordinatorConfig:
    """One group of four, a 16-bit ring, 8-bit quantization."""
    return CoordinatorConfig(
        run_name="golden-secure", rounds=2,
        flush=FlushRule(goal=CLIENTS, min_updates=2, deadline_s=None, max_staleness=0),
        limits=LimitsConfig(inline_bytes=4096, long_poll_s=0.0),
        robust=RobustConfig(enabled=False), norm_bound_adaptive=False,
        secure=SecureConfig(enabled=True, modulus_bits=16, quantization_bits=8, phase_s=PHASE_S))


def record_secure_session() -> dict[str, Any]:
    """``{"messages": [{call, request, reply}, ...], "draws", "rounding_seed", "updates"}``
    (``updates``: each survivor's float update before its encoding)."""
    return asyncio.run(_secure_session())


async def _phase(rec: Recorder, name: str, requests: Sequence[Any],
                 call: Callable[[Any], Awaitable[Any]]) -> list[Any]:
    """Make ``requests`` together (a phase's calls, as a group's clients make them) and
    record each with its reply."""
    replies = await asyncio.gather(*(call(r) for r in requests))
    for request, reply in zip(requests, replies, strict=True):
        rec.add(name, request, reply)
    return list(replies)


async def _secure_session() -> dict[str, Any]:
    from fedlink.secagg.golden import Recorded, element

    clock = ManualClock()
    service, rec = CoordinatorService(secure_config(), VECTOR, EventLog(None), clock=clock), \
        Recorder()
    calls = service.secure_calls
    joined = await _phase(rec, "Join", [JoinRequest(f"golden-client-{i}", num_examples=10)
                                        for i in range(CLIENTS)], service.join)
    client_ids = [j.client_id for j in joined]
    tasks = await _phase(rec, "GetTask", [GetTaskRequest(c, held_version=-1)
                                          for c in client_ids], service.get_task)
    draws = [Recorded(300 + i) for i in range(CLIENTS)]
    members = [_delivery(service, c, t, d) for c, t, d in zip(client_ids, tasks, draws,
                                                               strict=True)]
    rosters = await _phase(rec, "SecureAdvertise", [m.advertise() for m in members],
                           calls.advertise)
    for member, roster in zip(members, rosters, strict=True):
        member.roster(roster)
    shared = await _phase(rec, "SecureShare", [m.share() for m in members], calls.share)
    for member, reply in zip(members, shared, strict=True):
        member.shared(reply)
    survivors = [m for i, m in enumerate(members) if i != DROPPED]
    rng = np.random.default_rng(ROUNDING_SEED)
    for member, update in zip(survivors, UPDATES, strict=False):
        member.trained(update, 10, 1, 1)
    masked = asyncio.ensure_future(
        _phase(rec, "SecureMasked", [m.masked(rng) for m in survivors], calls.masked))
    group = service.secure.group if service.secure is not None else None
    assert group is not None
    while len(group.delivered) < len(survivors) and not masked.done():  # each one is in
        await real_sleep(0)  # a turn of the loop: no time passes
    clock.advance(PHASE_S)  # client 3's never comes: the phase closes at its deadline
    heard = await masked
    for member, reply in zip(survivors, heard, strict=True):
        member.heard(reply)
    await _phase(rec, "SecureUnmask", [m.unmask() for m in survivors], calls.unmask)
    await _phase(rec, "GetTask", [GetTaskRequest(client_ids[0], held_version=-1)],
                 service.get_task)
    await _phase(rec, "Leave", [LeaveRequest(client_ids[0], reason="run finished")],
                 service.leave)
    service.close()
    names = {client_id: f"CLIENT_{n}" for n, client_id in enumerate(client_ids)}
    return {"messages": rec.normalised(names), "rounding_seed": ROUNDING_SEED,
            "draws": {f"CLIENT_{i}": [element(v) for v in d.draws] for i, d in enumerate(draws)},
            "updates": {f"CLIENT_{i}": [float(v) for v in UPDATES[i]]
                        for i in range(CLIENTS) if i != DROPPED}}


def _delivery(service: CoordinatorService, client_id: str, task: Any,
              draws: Callable[[int], int]) -> SecureDelivery:
    from fedlink.client.secure import SecureDelivery

    assert isinstance(task, Task), task
    settings = service.secure_calls.settings()
    assert settings is not None
    return SecureDelivery(client_id, task, settings, service.engine.num_parameters, draws)
