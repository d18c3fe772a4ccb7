"""Secure groups: the coordinator's side of secure aggregation over gRPC (``[coordinator.secure]``).

A secure group is the next ``flush.goal`` clients to start a training task, whatever version
each trains on (``fedlink.secagg.SecureSum`` holds its state): a client advertises its keys as
its task starts and exchanges them while it downloads and trains, so that only the masked
upload and the unmasking follow its training. As in a plain elastic flush, an update up to
``flush.max_staleness`` versions old still counts, discounted by the run's staleness weight,
which the coordinator names to each member when the roster closes (the member sums
``[w * update, w]``; staleness is counted against the version the group will flush onto, the
current one plus the groups ahead of it); the version moves by the weighted sum over the
members' count, so a stale group moves the model less than a fresh one. Groups overlap:
while one goes through its later phases the next one forms. The four ``Secure*`` calls are
long-polls: a client's message is recorded, and the call answers once its phase closes for
the whole group, when every member still in it has answered or the phase's deadline has
passed:

1. advertise keys: closes at ``flush.goal`` members or ``secure.phase_s`` after the first; the
   roster is final. The flush rule binds a group as a flush: a member that would be staler
   than ``flush.max_staleness`` is left out (``TOO_STALE``), and a roster of fewer than
   ``flush.min_updates`` is lost. A roster too small to go on when its deadline passes (fewer
   fresh-enough members than ``flush.min_updates`` or ``FEWEST_MEMBERS``) is not closed: it
   waits for more members, its deadline counted again from the next to join (lost, its
   members would only form the same group again with fresh keys, every ``phase_s``);
2. share keys: closes when every member shared (``secure.quorum`` of them, below 1) or
   ``phase_s`` after it opened; a member that did not share is out, and the others mask only
   with those that did. Its update was never sent, so its task stays open: it is refused
   ``NEW_KEYS`` and advertises fresh keys for the next group while it trains;
3. masked update: its members may still be training, so it waits for the first masked update
   as long as a plain flush waits for updates (``flush.deadline_s``, else
   ``limits.max_task_s``), then closes when every sharer delivered (``secure.quorum`` of them)
   or ``phase_s`` after that first one; the group goes on only if at least ``threshold`` of it
   and ``flush.min_updates`` delivered (and at least two: a sum of one is an update). A
   quorum closes either phase only with at least that many answers, and only when those
   members' unmask answers alone would rebuild every secret (``SecureSum.rebuildable``);
4. unmask: closes once the answers hold enough shares to rebuild every secret the sum needs
   (a slow member's update is in the sum whatever it answers), or ``phase_s`` after it
   opened; the sum is unmasked (the pairwise masks of dropped clients removed from their
   neighbours' shares) and flushed as the next version (``RoundEngine.submit_sum``); groups
   flush in the order they formed: one whose unmasking could close waits for the groups
   ahead of it, whose versions its members' staleness counted, up to its deadline (then it
   flushes first; a group it overtook is lost when that leaves a member staler than
   ``max_staleness``). Members are recorded with the staleness they had when folded.

A masked update larger than ``inline_bytes`` arrives as a resumable upload (``Upload``,
``UploadStatus``) that ``SecureMasked`` names; it is taken and settled like a committed one.

A group that cannot go on (too few members, deliveries or shares) is lost: every waiting call
and every later one of its members is refused with the reason, ``NEW_KEYS`` when it was lost
before its masked phase (its members exchange fresh keys in a later group) and
``TASK_CLOSED`` after (their tasks stay open: each client checks in again and trains its task
again). When a group's flush ends the run, every group still going is lost the same way,
refused ``RUN_OVER``. A member left out too stale or because its masked update came late has
its task closed, with an ``update_refused`` event: its client waits for the next version. The
coordinator keeps only the running sum of masked vectors; no individual update is held,
logged or written, in memory or in ``state_dir``. A coordinator restarted mid-group loses the
group: a member that had not sent its update yet is refused ``NEW_KEYS`` (its task stays
open), the others ``TASK_CLOSED`` (they check in again), unless their sum was flushed.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Set
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedlink.aio import cancel_and_wait
from fedlink.clock import Cancellable, Clock, sleep_on
from fedlink.coordinator.config import FEWEST_MEMBERS, CoordinatorConfig
from fedlink.coordinator.engine import FlushOutcome, RoundEngine
from fedlink.coordinator.outcomes import update_refused
from fedlink.coordinator.records import SummedTask, TaskRecord
from fedlink.coordinator.tasks import TaskState
from fedlink.errors import ConfigError, InvalidArgument, NotFound, PermissionDenied, UpdateRefused
from fedlink.messages import (
    SecureAdvertiseReply,
    SecureAdvertiseRequest,
    SecureMaskedReply,
    SecureMaskedRequest,
    SecureMember,
    SecureSettings,
    SecureShare,
    SecureShareReply,
    SecureShareRequest,
    SecureUnmaskReply,
    SecureUnmaskRequest,
)
from fedlink.metrics.kinds import SecureAnswerLate, SecureGroupLost
from fedlink.params.base import BUFFER, COUNTER, FROZEN, ParamSpec
from fedlink.privacy.secure_ddp import SecureDDPHook
from fedlink.refusals import RefusalCode
from fedlink.secagg import (
    AdvertiseKeys,
    EncryptedShare,
    MaskedInput,
    SecAggConfig,
    SecAggError,
    SecureSum,
    UnmaskShares,
    weighted_mean,
)
from fedlink.secagg.base import KEY_BYTES
from fedlink.secagg.packing import packed_size, unpack
from fedlink.secagg.sparse import group_indices, masked_size, scatter

log = logging.getLogger(__name__)

ADVERTISE, SHARE, MASKED, UNMASK, DONE = range(5)
"""The phases of a group, in order (``DONE``: flushed or lost)."""

PHASE_NAMES = {ADVERTISE: "advertise", SHARE: "share", MASKED: "masked", UNMASK: "unmask"}
"""The phases by name (events, the virtual summary's ``secure_<name>_*``)."""


class FlushReportFailed(RuntimeError):
    """Reporting a secure group's flush failed after its sum entered the model: the run's
    error (as a plain flush's reporter raising is), never a lost group nor a member's refusal
    (its members' updates are in the model)."""


KEEP_DONE = 4
"""Finished groups kept to answer a member's retried last call (its answer was lost)."""

KEEP_SUMMED = 100_000
"""Summed tasks remembered (by id, with the version their sum made) after their group is
forgotten, to answer a member's unmask that comes later still (one offline since its masked
upload): its update is in the model, and under group random-k its client keeps its residual
only once told so. About 100 bytes each."""


def secure_settings(config: CoordinatorConfig) -> SecureSettings | None:
    """What ``RunConfig.secure`` tells clients (``None`` when secure aggregation is off)."""
    if not config.secure.enabled:
        return None
    secagg = config.secagg()
    return SecureSettings(modulus_bits=secagg.modulus_bits, quantization_bits=secagg.bits,
                          clip=secagg.clip, max_clients=secagg.max_clients,
                          neighbours=secagg.neighbours or 0, threshold=secagg.threshold,
                          phase_s=config.secure.phase_s,
                          density=0.0 if config.secure.density == 1 else config.secure.density,
                          randk_seed=config.seed % 2**64, **_ddp_settings(config))


def _ddp_settings(config: CoordinatorConfig) -> dict[str, Any]:
    """``SecureSettings``' distributed-DP fields (none without it)."""
    secure = config.secure
    if not secure.ddp:
        return {}
    return {"ddp_noise_multiplier": secure.noise_multiplier, "ddp_clip_norm": secure.clip_norm,
            "ddp_granularity_bits": secure.granularity_bits,
            "ddp_noise_shares": config.flush.goal}


def _refuse_state_beside_weights(config: CoordinatorConfig, spec: ParamSpec | None) -> None:
    """A secure sum clips every value of an update to ``[-clip, clip]`` (under distributed DP:
    to an L2 norm, and noises it), and the coordinator, seeing only the sum, cannot give a
    model's running statistics and counters the plain mean they get in a plain flush
    (``fedlink.aggregate.kinds``): a model with such state is refused, as are frozen weights
    under distributed DP (the noise would move them)."""
    if spec is None:
        return
    kinds = (BUFFER, COUNTER, FROZEN) if config.secure.ddp else (BUFFER, COUNTER)
    names = spec.names_of(*kinds)
    if names:
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise ConfigError(
            f"coordinator.secure.enabled: the model holds state that secure sums would "
            f"corrupt ({shown}: running statistics, counters"
            f"{', frozen weights' if config.secure.ddp else ''}): every value of a secure "
            f"update is clipped{' and noised' if config.secure.ddp else ''}, and the "
            f"coordinator cannot average that state apart from the sum; use a model without "
            f"it (GroupNorm or LayerNorm instead of BatchNorm), or run without secure "
            f"aggregation")


@dataclass
class _Member:
    index: int
    task_id: str
    base_version: int
    bytes_up: int = 0
    staleness: int = 0
    weight: float = 1.0
    num_examples: int = 0
    steps_completed: int = 0
    steps_planned: int = 0
    refused: UpdateRefused | None = None
    """Why the member was left out of the roster (too stale), whatever became of the group."""


@dataclass
class SecureGroup:
    """One secure group: its number in the run, its members, its phase and the
    ``SecureSum``."""

    number: int
    config: SecAggConfig
    goal: int
    size: int
    sum: SecureSum
    members: dict[str, _Member] = field(default_factory=dict)
    too_stale: dict[str, _Member] = field(default_factory=dict)
    phase: int = ADVERTISE
    next_index: int = 0
    lost: str = ""
    lost_at: int = DONE
    """The phase the group was lost at (``DONE``: it was not)."""
    run_over: bool = False
    """Lost because the run ended."""
    flushed_version: int = 0
    accounted: bool = False
    """Its sum is spent under distributed DP and has not flushed or been lost yet."""
    ready: bool = False
    """Its unmasking could close, but a group ahead of it has not flushed yet."""
    unmask_due: bool = False
    """Its unmasking's deadline passed: it flushes without waiting for the groups ahead."""
    short: bool = False
    """Its roster's deadline passed with too few members to go on: it waits for more, its
    deadline counted again from the next to join."""
    closed: list[asyncio.Event] = field(default_factory=lambda: [asyncio.Event()
                                                                 for _ in range(4)])
    roster: tuple[SecureMember, ...] = ()
    graph: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Each member's neighbours (by index): whose keys and fate it is told."""
    adverts: list[AdvertiseKeys] = field(default_factory=list)
    sharers: frozenset[int] = frozenset()
    delivered: set[int] = field(default_factory=set)
    answers: dict[int, UnmaskShares] = field(default_factory=dict)
    answered_late: set[int] = field(default_factory=set)
    """Members whose unmask answer came after the group flushed (each counted once)."""
    request: SecureMaskedReply | None = None
    timer: Cancellable | None = None

    def lost_refusal(self) -> UpdateRefused:
        """The refusal of a member's call once the group is lost: ``NEW_KEYS`` when it was
        lost before its masked phase (its members' updates were never sent: they advertise
        fresh keys in a later group), ``TASK_CLOSED`` after (each member checks in again)."""
        reason = RefusalCode.NEW_KEYS if self.lost_at < MASKED else RefusalCode.TASK_CLOSED
        if self.run_over:
            reason = RefusalCode.RUN_OVER
        return UpdateRefused(f"secure group {self.number} was lost: {self.lost}", reason)

    def advertised(self, member: _Member, request: SecureAdvertiseRequest) -> bool:
        """Whether ``request`` brings the keys ``member`` advertised (a retry)."""
        keys = (request.cipher_public, request.mask_public)
        if self.phase == ADVERTISE:
            return any(a.client == member.index and (a.cipher_public, a.mask_public) == keys
                       for a in self.adverts)
        return any(m.index == member.index and (m.cipher_public, m.mask_public) == keys
                   for m in self.roster)

    def keep_keys(self, member: _Member, request: SecureAdvertiseRequest) -> bool:
        """Whether ``member`` stays in the group with ``request``'s keys: they are the keys it
        advertised (a retry), or new ones while the roster is open, which replace them."""
        if self.advertised(member, request):
            return True
        if self.phase != ADVERTISE:
            return False
        self.drop_advert(member.index)
        self.adverts.append(AdvertiseKeys(member.index, request.cipher_public,
                                          request.mask_public))
        return True

    def drop_advert(self, index: int) -> None:
        """Forget the keys member ``index`` advertised (the roster is not closed yet)."""
        self.adverts = [a for a in self.adverts if a.client != index]

    def rekeyed(self, member: _Member) -> bool:
        """Whether ``member`` was left out of the group before its masked phase because it
        did not share its keys in time (it advertises fresh keys for a later group)."""
        return self.phase > SHARE and member.index not in self.sharers

    def member(self, client_id: str, task_id: str) -> _Member:
        """The caller's membership (refused when it is not in the group with this task)."""
        member = self.members.get(client_id)
        if member is None or member.task_id != task_id:
            raise UpdateRefused(f"task {task_id!r} is not in secure group {self.number}",
                                RefusalCode.TASK_CLOSED)
        return member


def _checked_answer(group: SecureGroup, member: _Member,
                    request: SecureUnmaskRequest) -> UnmaskShares:
    """``member``'s unmask answer as the group's sum reads it; ``INVALID_ARGUMENT`` when the
    round cannot use it (``SecureSum.check_answer``, or a client named twice)."""
    answer = UnmaskShares(
        member.index,
        {s.owner: (s.x, int.from_bytes(s.y, "little")) for s in request.seed_shares},
        {s.owner: (s.x, int.from_bytes(s.y, "little")) for s in request.key_shares})
    if len(answer.seed_shares) + len(answer.key_shares) != (
            len(request.seed_shares) + len(request.key_shares)):
        raise InvalidArgument("an unmask answer names one client twice")
    try:
        group.sum.check_answer(answer)
    except SecAggError as err:
        raise InvalidArgument(str(err)) from None
    return answer


class SecureDesk:
    """Runs the secure groups (module docstring); ``on_flush`` is told each flush a group's
    sum made, ``settled(client_id, task_id)`` each task whose update is in it (the model it
    downloaded was used), ``take_upload(client_id, upload_id, size)`` returns the bytes of a
    masked update sent as a resumable upload."""

    def __init__(self, config: CoordinatorConfig, engine: RoundEngine, clock: Clock,
                 on_flush: Callable[[FlushOutcome], None],
                 durably: Callable[[], AbstractContextManager[None]],
                 take_upload: Callable[[str, str, int], Awaitable[bytes]],
                 settled: Callable[[str, str], None]) -> None:
        self.config = config
        self._settled = settled
        self._durably = durably
        self._take_upload = take_upload
        self.engine = engine
        _refuse_state_beside_weights(config, engine.spec)
        self._clock = clock
        self._on_flush = on_flush
        self._secagg = config.secagg()
        self._settings = secure_settings(config)
        self._ddp = engine.hook_of(SecureDDPHook)
        """Distributed DP's accountant (``None`` without it)."""
        assert self._settings is not None  # a desk exists only with secure groups on
        # [update, weight]: the update's kept coordinates under group random-k
        self._masked_size = masked_size(self._settings.density, engine.num_parameters,
                                        weighted=self._ddp is None)
        self._refuse_an_upload_limit_below_a_masked_update()
        self._next_number = 1
        self._forming: SecureGroup | None = None
        self._groups: dict[int, SecureGroup] = {}  # by number, oldest first
        self._of_task: dict[str, SecureGroup] = {}
        self._summed: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """Task id -> (client id, version made) of summed updates (``KEEP_SUMMED``)."""
        self.on_phase: Callable[[SecureGroup, int], None] | None = None
        """Told each phase that closes (``group.lost``: the group was lost at it)."""
        self.on_groups: Callable[[int, dict[int, dict[str, Any]]], None] | None = None
        """Told the next group's number and the groups still going (``_open_groups``) each
        time a group is numbered, closes a phase or ends (to journal them)."""
        self.on_accounted: Callable[[dict[str, Any]], None] | None = None
        """Told distributed DP's accounting (its ``state_dict``) each time it changes (to
        journal it ahead of the unmasking it accounts)."""

    def _refuse_an_upload_limit_below_a_masked_update(self) -> None:
        """A masked update larger than ``inline_bytes`` rides the resumable upload, which
        ``limits.max_update_bytes`` bounds: one below the masked update would lose every
        group at its masked phase."""
        size = self._masked_size
        need = self._secagg.vector_bytes(size)
        limit = self.config.limits.update_bytes_for(self.engine.num_parameters)
        inline = 0 < need <= self.config.limits.inline_bytes  # sent in the call itself
        if need > limit and not inline:
            raise ConfigError(f"limits.max_update_bytes: {limit} bytes is below a secure "
                              f"group's masked update ({size} values at "
                              f"{self._secagg.modulus_bits} bits: {need} bytes), so every "
                              f"group would be lost at its masked phase; raise it to at least "
                              f"{need}, or unset it")

    def restore(self, next_number: int, accounting: dict[str, Any] | None = None,
                open_groups: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        """Number groups from ``next_number`` on (a restarted coordinator's groups follow its
        previous process's: random-k draws and events never see a number twice), and take
        distributed DP's ``accounting`` as journalled (``None``: the checkpoint's stands):
        every sum the previous process asked its members to unmask stays spent. Each of the
        previous process's ``open_groups`` is lost with it (its secrets lived in memory): a
        ``secure_group_lost`` event says so, once."""
        self._next_number = next_number
        if accounting is not None and self._ddp is not None:
            self._ddp.load_state_dict(accounting)
        for number, group in sorted((open_groups or {}).items()):
            self.engine.events.emit(SecureGroupLost.build(
                group=number, phase=group.get("phase"), members=group.get("members"),
                reason="the coordinator restarted", model_version=self.engine.version))
        if open_groups:
            self._journal_groups()

    def _open_groups(self) -> dict[int, dict[str, Any]]:
        """The groups still going: each one's phase, and its members once its roster closed."""
        return {g.number: {"phase": PHASE_NAMES[g.phase],
                           "members": len(g.members) if g.phase > ADVERTISE else None}
                for g in self._groups.values() if g.phase != DONE}

    def _journal_groups(self) -> None:
        if self.on_groups is not None:
            self.on_groups(self._next_number, self._open_groups())

    def short_roster(self) -> str:
        """What the group now forming waits for past its roster's deadline ("" when it does
        not: it is not short of members)."""
        group = self._forming
        if group is None or not group.short:
            return ""
        return (f"secure group {group.number} waits for members: {len(group.members)} "
                f"advertised keys, {self._fewest_to_go_on} needed")

    @property
    def group(self) -> SecureGroup | None:
        """The newest group (``None`` before the first)."""
        return next(reversed(self._groups.values()), None)

    # -- the four calls -------------------------------------------------------------------
    # Each call records the caller's message (``join``, ``record_*``: synchronous), waits for
    # its phase to close, then answers (``*_reply``). The gRPC calls await the close; the
    # virtual loop, on a manual clock, is told of it by ``on_phase`` and answers then.

    async def advertise(self, request: SecureAdvertiseRequest) -> SecureAdvertiseReply:
        """Phase 1: join the group of the task's version; answered with the final roster."""
        summed = self._summed_under_other_keys(request)
        if summed is not None:  # answered once that sum is flushed (or lost), not in a loop
            await summed.closed[UNMASK].wait()
        group, member = self.join(request)
        await self._roster_closed(group)
        await self._wait(group, ADVERTISE, request.task_id, member)
        return self.advertise_reply(group, member, request.client_id, request.task_id)

    async def _roster_closed(self, group: SecureGroup) -> None:
        """Until ``group``'s roster closes. A roster short of members waits for more, longer
        than a client's call may last (``phase_s`` and a round trip): a call still waiting
        ``phase_s`` after it came is then refused ``NEW_KEYS``, and its client advertises
        fresh keys again, keeping its place in the group."""
        closed = asyncio.ensure_future(group.closed[ADVERTISE].wait())
        try:
            while not closed.done():
                timer = asyncio.ensure_future(sleep_on(self._clock, self.config.secure.phase_s))
                await asyncio.wait((closed, timer), return_when=asyncio.FIRST_COMPLETED)
                await cancel_and_wait(timer)
                if not closed.done() and group.short:
                    raise UpdateRefused(f"{self.short_roster()}: advertise again",
                                        RefusalCode.NEW_KEYS)
        finally:
            await cancel_and_wait(closed)

    def join(self, request: SecureAdvertiseRequest) -> tuple[SecureGroup, _Member]:
        """Phase 1's message: the caller joins the group now forming. The same keys again are
        a retry, answered the same way; new keys for a task already in a group are a client
        that lost its secrets (a restart): they replace the old ones while the roster is open,
        after that the client is a dropout there and joins the group now forming, unless its
        masked update is in that group's sum already (refused ``TASK_CLOSED``)."""
        if len(request.cipher_public) != KEY_BYTES or len(request.mask_public) != KEY_BYTES:
            raise InvalidArgument(f"public keys are {KEY_BYTES} bytes each")
        joined = self._of_task.get(request.task_id)
        if joined is not None and not joined.lost:
            left_out = joined.too_stale.get(request.client_id)
            if left_out is not None and left_out.task_id == request.task_id:
                return joined, left_out
            member = joined.member(request.client_id, request.task_id)
            if not joined.rekeyed(member) and joined.keep_keys(member, request):
                return joined, member
            if member.index in joined.delivered:
                raise UpdateRefused(f"this task's masked update is in secure group "
                                    f"{joined.number}'s sum already", RefusalCode.TASK_CLOSED)
        group, base_version = self._forming_group(request.client_id, request.task_id)
        earlier = group.members.pop(request.client_id, None)
        if earlier is not None:  # the client's earlier task closed while it waited here
            group.drop_advert(earlier.index)
            self._of_task.pop(earlier.task_id, None)
        member = _Member(group.next_index, request.task_id, base_version)
        group.next_index += 1
        group.members[request.client_id] = member
        self._of_task[request.task_id] = group
        group.adverts.append(AdvertiseKeys(member.index, request.cipher_public,
                                           request.mask_public))
        member.bytes_up += 4 + len(request.cipher_public) + len(request.mask_public)
        if len(group.members) == 1 or group.short:  # the roster's deadline: from the first
            group.short = False
            self._arm(group)
        if len(group.members) >= group.goal:
            self._close(group, ADVERTISE)
        return group, member

    def advertise_reply(self, group: SecureGroup, member: _Member, client_id: str,
                        task_id: str) -> SecureAdvertiseReply:
        """Phase 1's answer, once the roster is final: the roster and the member's weight
        (refused to a member that grew staler than ``flush.max_staleness`` meanwhile)."""
        if member.refused is not None:
            raise member.refused
        return SecureAdvertiseReply(member.index, group.number, group.number,
                                    self._roster_for(group, member), member.weight)

    @staticmethod
    def _roster_for(group: SecureGroup, member: _Member) -> tuple[SecureMember, ...]:
        """The roster one member is sent: every member's index (from which it computes the
        group's graph), keys only for itself and its neighbours, the only ones it uses, so
        that the answer grows with the neighbours (SecAgg+: ``O(log n)``), not the group."""
        own = SecureDesk._own(group, member)
        return tuple(m if m.index in own else SecureMember(m.index, b"", b"")
                     for m in group.roster)

    @staticmethod
    def _own(group: SecureGroup, member: _Member) -> set[int]:
        """The member and its neighbours: the only members whose keys and fate it needs."""
        return {member.index, *group.graph.get(member.index, ())}

    async def share(self, request: SecureShareRequest) -> SecureShareReply:
        """Phase 2: hand in the encrypted shares; answered with those sent to the caller."""
        group, member = self.record_share(request)
        await self._wait(group, SHARE, request.task_id, member)
        return self.share_reply(group, member, request.client_id, request.task_id)

    def record_share(self, request: SecureShareRequest) -> tuple[SecureGroup, _Member]:
        """Phase 2's message: the caller's encrypted shares."""
        group, member = self._member(request.client_id, request.task_id, unsent=True)
        if group.phase == SHARE and member.index not in group.sum.sharers:
            try:
                group.sum.collect_shares(member.index, [
                    EncryptedShare(s.sender, s.receiver, s.ciphertext) for s in request.shares])
            except SecAggError as err:
                raise InvalidArgument(str(err)) from None
            member.bytes_up += sum(8 + len(s.ciphertext) for s in request.shares)
            if self._phase_full(group, group.sum.sharers, len(group.members)):
                self._close(group, SHARE)
        return group, member

    def share_reply(self, group: SecureGroup, member: _Member, client_id: str,
                    task_id: str) -> SecureShareReply:
        """Phase 2's answer, once sharing closed (refused to a member that did not share, and
        to a retry that comes once the group is done: its shares are no longer held)."""
        if group.rekeyed(member):  # its update is not sent yet: it joins a later group
            raise UpdateRefused(f"this task's keys were not shared before secure group "
                                f"{group.number}'s sharing closed: advertise fresh keys",
                                RefusalCode.NEW_KEYS)
        if group.phase == DONE:
            done = UpdateRefused(f"secure group {group.number} is done (version "
                                 f"{group.flushed_version}); its shares are no longer held",
                                 RefusalCode.TASK_CLOSED)
            if member.index not in group.delivered:
                self._left_out(client_id, task_id, member, done)
            raise done
        return SecureShareReply(tuple(SecureShare(s.sender, s.receiver, s.ciphertext)
                                      for s in group.sum.shares_for(member.index)))

    async def masked(self, request: SecureMaskedRequest) -> SecureMaskedReply:
        """Phase 3: add the masked update (inline, or the resumable upload it names) to the
        running sum; answered with who delivered."""
        if self._summed_version(request.client_id, request.task_id) is not None:
            # a retry whose first answer was lost, the sum flushed and forgotten since: the
            # member has no one to unmask, and its unmask is answered as summed
            return SecureMaskedReply((), ())
        group, member = self._member(request.client_id, request.task_id)
        if group.phase == MASKED and member.index not in group.delivered:
            data = request.values
            if request.upload_id:
                self._check_size(group, request)
                data = await self._take_upload(
                    request.client_id, request.upload_id,
                    packed_size(group.size, group.config.modulus_bits))
            self.record_masked(request, data)
        await self._wait(group, MASKED, request.task_id, member)
        return self.masked_reply(group, member, request.client_id, request.task_id)

    def record_masked(self, request: SecureMaskedRequest,
                      data: bytes | None = None) -> tuple[SecureGroup, _Member]:
        """Phase 3's message: the masked update (``data``: its bytes when they came as an
        upload, else the request's own) joins the running sum while the phase is open."""
        group, member = self._member(request.client_id, request.task_id)
        if group.phase == MASKED and member.index not in group.delivered:
            self._check_size(group, request)
            member.num_examples = request.num_examples
            member.steps_completed = request.steps_completed
            member.steps_planned = request.steps_planned
            self._add_masked(group, member, request.values if data is None else data)
        return group, member

    @staticmethod
    def _check_size(group: SecureGroup, request: SecureMaskedRequest) -> None:
        if request.num_values != group.size:
            raise InvalidArgument(f"a masked update has {group.size} values, got "
                                  f"{request.num_values}")

    def masked_reply(self, group: SecureGroup, member: _Member, client_id: str,
                     task_id: str) -> SecureMaskedReply:
        """Phase 3's answer, once it closed (refused to a member whose update came late): who
        of the member and its neighbours delivered and who dropped, all it answers for."""
        request = group.request
        assert request is not None
        if member.index not in request.survivors:
            raise self._left_out(client_id, task_id, member, UpdateRefused(
                "this client's masked update came after the phase closed",
                RefusalCode.TASK_CLOSED))
        own = self._own(group, member)
        return SecureMaskedReply(tuple(i for i in request.survivors if i in own),
                                 tuple(i for i in request.dropped if i in own))

    def _add_masked(self, group: SecureGroup, member: _Member, data: bytes) -> None:
        try:
            values = unpack(data, group.size, group.config.modulus_bits)
            group.sum.collect_masked(MaskedInput(member.index, values))
        except SecAggError as err:
            raise InvalidArgument(str(err)) from None
        del values  # masked, but kept no longer than the addition needs
        member.bytes_up += 4 + len(data)
        if not group.delivered:  # the first member trained: the others get phase_s more
            self._arm(group)
        group.delivered.add(member.index)
        if self._phase_full(group, group.delivered, len(group.sharers)):
            self._close(group, MASKED)

    async def unmask(self, request: SecureUnmaskRequest) -> SecureUnmaskReply:
        """Phase 4: hand in the shares; answered once the sum is unmasked and flushed."""
        summed = self.summed_reply(request)
        if summed is not None:
            return summed
        group, member = self.record_unmask(request)
        await self._wait(group, UNMASK, request.task_id, member)
        return SecureUnmaskReply(group.flushed_version)

    def summed_reply(self, request: SecureUnmaskRequest) -> SecureUnmaskReply | None:
        """The answer to an unmask whose task's update is in a flushed sum whose group is
        forgotten (``None``: any other unmask, answered by its group). Told its update was
        lost, a member under group random-k would send those coordinates again."""
        version = self._summed_version(request.client_id, request.task_id)
        return None if version is None else SecureUnmaskReply(version)

    def _summed_version(self, client_id: str, task_id: str) -> int | None:
        """The version made by the flushed sum that holds the update of ``task_id`` (of
        ``client_id``) once its group is forgotten; ``None`` when no such sum does, or while
        the group is held (it answers)."""
        if task_id in self._of_task:
            return None
        summed = self._summed.get(task_id)
        if summed is not None:
            return summed[1] if summed[0] == client_id else None
        if self._delivered(client_id, task_id):
            # summed before a restart, which forgot by which version: the current one has it
            return self.engine.version
        return None

    def _delivered(self, client_id: str, task_id: str) -> bool:
        """Whether the engine holds ``task_id`` of ``client_id`` as delivered: in a secure run
        only a flushed sum delivers a task, durably with its version."""
        record = self._task_record(client_id, task_id)
        return record is not None and record.state is TaskState.DELIVERED

    def _task_record(self, client_id: str, task_id: str) -> TaskRecord | None:
        """The engine's record of ``client_id``'s task ``task_id`` (``None``: unknown, another
        client's, or forgotten as too stale)."""
        try:
            return self.engine.task(client_id, task_id)
        except (UpdateRefused, NotFound, PermissionDenied):
            return None

    def record_unmask(self, request: SecureUnmaskRequest) -> tuple[SecureGroup, _Member]:
        """Phase 4's message: the caller's shares of the survivors' seeds and the dropped
        members' keys."""
        group, member = self._member(request.client_id, request.task_id)
        if group.phase == UNMASK and member.index not in group.answers:
            answer = group.answers[member.index] = _checked_answer(group, member, request)
            member.bytes_up += answer.wire_bytes()
            if group.sum.can_finish(group.answers.values()):
                # enough shares rebuild every secret: the slowest members' answers would
                # add nothing (their updates are in the sum whenever they answer)
                self._close(group, UNMASK)
        elif group.flushed_version and member.index not in group.answered_late:
            self._answered_late(group, member, request)
        return group, member

    def _answered_late(self, group: SecureGroup, member: _Member,
                       request: SecureUnmaskRequest) -> None:
        """An answer after the group's flush, whose ``update_accepted`` is written: its
        bytes are recorded apart, so that the run's ``bytes_up`` counts every byte sent."""
        group.answered_late.add(member.index)
        if not self.engine.finished:  # once the run is over its log may be closing
            self.engine.events.emit(SecureAnswerLate.build(
                client_id=request.client_id, task_id=request.task_id, group=group.number,
                bytes_up=UnmaskShares.size_of(
                    len(request.seed_shares) + len(request.key_shares))))

    # -- the group's phases ---------------------------------------------------------------

    def _summed_under_other_keys(self, request: SecureAdvertiseRequest) -> SecureGroup | None:
        """The group whose sum holds the masked update of ``request``'s task when ``request``
        brings other keys than the member advertised there (its client restarted)."""
        group = self._of_task.get(request.task_id)
        member = None if group is None else group.members.get(request.client_id)
        if (group is None or member is None or member.task_id != request.task_id
                or group.lost or member.index not in group.delivered):
            return None
        return None if group.advertised(member, request) else group

    def _forming_group(self, client_id: str, task_id: str) -> tuple[SecureGroup, int]:
        """The group now taking members (a new one when none is) and the version the
        caller's open task trained on."""
        record = self.engine.task(client_id, task_id)
        if not self.engine.is_open(record):
            raise UpdateRefused(f"task {task_id!r} is no longer open", RefusalCode.TASK_CLOSED)
        group = self._forming
        if group is None:
            number, self._next_number = self._next_number, self._next_number + 1
            size = self._masked_size
            group = SecureGroup(number, self._secagg, self.config.flush.goal, size,
                                SecureSum(self._secagg, number, size, graph_seed=number))
            self._forming = self._groups[number] = group
            self._journal_groups()
        return group, record.version

    def _left_out(self, client_id: str, task_id: str, member: _Member,
                  why: UpdateRefused) -> UpdateRefused:
        """The group goes on without this task: close it, so that its client waits for the
        next version instead of training again for this one, and record why (once: a retried
        call is answered again, not recorded again); returns ``why``. A task the engine
        forgot as too stale is closed already (looking it up would refuse, and lose the
        group for one member)."""
        record = self._task_record(client_id, task_id)
        if record is not None and record.state.deliverable:
            with self._durably():
                self.engine.close_task(client_id, task_id)
                if not self.engine.finished:  # once the run is over its log may be closing
                    self.engine.events.emit(update_refused(client_id, task_id, why,
                                                           member.bytes_up, {}))
        return why

    def _member(self, client_id: str, task_id: str,
                unsent: bool = False) -> tuple[SecureGroup, _Member]:
        """The caller's group and membership; ``unsent``: the call comes before the task's
        update is sent (sharing keys)."""
        group = self._of_task.get(task_id)
        if group is None:
            raise self._in_no_group(client_id, task_id, unsent)
        return group, group.member(client_id, task_id)

    def _in_no_group(self, client_id: str, task_id: str, unsent: bool) -> UpdateRefused:
        """The refusal of a call for a task that no group of this process holds: its group
        lived in a coordinator process that restarted, or was forgotten. While the task is
        open and its update unsent, its client exchanges fresh keys with the next group while
        it trains (``NEW_KEYS``), as a member of a group lost at that phase does, instead of
        checking in again and training its task anew."""
        record = self._task_record(client_id, task_id) if unsent else None
        if record is not None and self.engine.is_open(record):
            return UpdateRefused(f"task {task_id!r} is in no secure group (its group is "
                                 f"gone): advertise fresh keys", RefusalCode.NEW_KEYS)
        return UpdateRefused(f"task {task_id!r} is in no secure group", RefusalCode.TASK_CLOSED)

    async def _wait(self, group: SecureGroup, phase: int, task_id: str,
                    member: _Member) -> None:
        """Until ``phase`` closes; refused when the group was lost meanwhile."""
        await group.closed[phase].wait()
        refusal = self.refusal(group, member)
        if refusal is not None:
            raise refusal

    @staticmethod
    def refusal(group: SecureGroup, member: _Member) -> UpdateRefused | None:
        """Why ``member``'s call is refused once its phase closed (``None``: it is answered):
        left out of the roster as too stale, even if the group was lost after, else the
        group's loss."""
        if member.refused is not None:
            return member.refused
        return group.lost_refusal() if group.lost else None

    def _arm(self, group: SecureGroup, seconds: float | None = None) -> None:
        """The deadline of the group's current phase, ``seconds`` from now (default:
        ``phase_s``; ``math.inf``: none)."""
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        seconds = self.config.secure.phase_s if seconds is None else seconds
        if math.isfinite(seconds):
            phase = group.phase
            group.timer = self._clock.call_at(self._clock.now() + seconds,
                                              lambda: self._deadline(group, phase))

    def _deadline(self, group: SecureGroup, phase: int) -> None:
        """``phase``'s deadline passed: it closes with what it has, but for a roster too
        small to go on, which waits for more members instead of being lost (its members
        would only advertise fresh keys and form the same too-small group again, every
        ``phase_s``, for as long as no other client comes)."""
        if phase == ADVERTISE and group.phase == ADVERTISE and not self._roster_can_go_on(group):
            group.short, group.timer = True, None
            return
        if phase == UNMASK and group.phase == UNMASK:
            group.unmask_due = True
        self._close(group, phase)

    def _roster_can_go_on(self, group: SecureGroup) -> bool:
        """Whether enough of the roster's members are fresh enough to be summed (at least
        ``flush.min_updates`` and ``FEWEST_MEMBERS``) for the group to go on."""
        onto = self._onto(group)
        fresh = sum(1 for m in group.members.values()
                    if onto - m.base_version <= self.config.flush.max_staleness)
        return fresh >= self._fewest_to_go_on

    @property
    def _fewest_to_go_on(self) -> int:
        """The fewest fresh-enough members a roster goes on with: ``flush.min_updates``, and
        never below ``FEWEST_MEMBERS``."""
        return max(FEWEST_MEMBERS, self.config.flush.min_updates)

    def _onto(self, group: SecureGroup) -> int:
        """The version ``group`` will flush onto: the current one, plus one per group ahead
        of it that closed its roster and is still going."""
        ahead = sum(1 for g in self._groups.values()
                    if g.number < group.number and ADVERTISE < g.phase < DONE)
        return self.engine.version + ahead

    def _training_allowance(self) -> float:
        """How long the masked phase waits for its first update: the members shared their keys
        while they trained, and may train for as long as a plain flush waits for updates
        (``flush.deadline_s``; else ``limits.max_task_s``; ``math.inf`` when both are off)."""
        return self.config.flush.deadline_s or self.config.limits.max_task_s or math.inf

    def _close(self, group: SecureGroup, phase: int) -> None:
        """Close ``phase`` (at most once) and open the next, or lose the group. A group's
        unmasking closes (and its sum flushes) once every group ahead of it is done, whose
        versions its members' staleness counted, or at its deadline (``phase_s``), so that a
        group stuck ahead holds it up no longer than that."""
        if group.phase != phase:
            return
        if phase == UNMASK and not group.unmask_due and self._ahead(group):
            group.ready = True  # _flush_next closes it once the groups ahead are done
            return
        try:
            self._CLOSERS[phase](self, group)
        except Exception as err:  # never leave members waiting on a phase that cannot close
            if group.flushed_version:  # reporting a flush failed: the run's error, as in plain
                raise FlushReportFailed(f"secure group {group.number}'s sum made version "
                                        f"{group.flushed_version}; reporting it failed: "
                                        f"{err}") from err
            if isinstance(err, (SecAggError, UpdateRefused, InvalidArgument)):
                self._lose(group, str(err))
            else:
                log.exception("secure group %d failed closing phase %d", group.number, phase)
                self._lose(group, f"internal error closing phase {phase}: {type(err).__name__}")
            return
        group.closed[phase].set()
        group.phase = phase + 1
        if group.phase == MASKED:  # its members may still be training
            self._arm(group, self._training_allowance())
        elif group.phase != DONE:
            self._arm(group)
        else:
            self._retire(group)
        self._journal_groups()
        if self.on_phase is not None:
            self.on_phase(group, phase)
        if group.phase == DONE:
            self._flush_next()

    def _ahead(self, group: SecureGroup) -> bool:
        """Whether a group formed before ``group`` is still going."""
        return any(g.number < group.number and g.phase < DONE for g in self._groups.values())

    def _flush_next(self) -> None:
        """The oldest group still going flushes now if its unmasking was ready to close."""
        if self.engine.finished:  # _end_run loses every group still going
            return
        oldest = next((g for g in self._groups.values() if g.phase < DONE), None)
        if oldest is not None and oldest.phase == UNMASK and oldest.ready:
            self._close(oldest, UNMASK)

    def _close_advertise(self, group: SecureGroup) -> None:
        self._forming = None  # whoever comes next starts the next group
        self._weigh(group)
        needed = self.config.flush.min_updates
        if len(group.members) < needed:  # the flush rule's floor binds a group as a flush
            raise SecAggError(f"{len(group.members)} members advertised keys in time; "
                              f"flush.min_updates is {needed}")
        kept = {member.index for member in group.members.values()}
        roster = group.sum.collect_keys(a for a in group.adverts if a.client in kept)
        # a member shares its secrets among its neighbours, at least 2 of them (Shamir): a
        # roster too small for that is lost here, not by its members' failing to share
        graph = group.sum.graph  # kept on the group: its sum is dropped once it flushes
        few = min(len(n) for n in graph.values())
        if few < 2:
            raise SecAggError(f"{len(roster)} members advertised keys: a member with {few} "
                              f"neighbour cannot share its secrets (at least 2 needed)")
        group.roster = tuple(SecureMember(a.client, a.cipher_public, a.mask_public)
                             for a in roster)
        group.graph = graph
        group.adverts = []

    def _weigh(self, group: SecureGroup) -> None:
        """Each member's staleness against the version the group will flush onto (the
        current one, plus one per group ahead of it still going) and its weight; a member
        staler than ``flush.max_staleness`` is left out (answered ``TOO_STALE``), as a plain
        flush refuses its update."""
        onto = self._onto(group)
        for client_id, member in list(group.members.items()):
            member.staleness = max(0, onto - member.base_version)
            if member.staleness > self.config.flush.max_staleness:
                group.too_stale[client_id] = group.members.pop(client_id)
                member.refused = self._left_out(client_id, member.task_id, member, UpdateRefused(
                    f"this task's update would be {member.staleness} versions stale when "
                    f"secure group {group.number} flushes (max_staleness "
                    f"{self.config.flush.max_staleness})", RefusalCode.TOO_STALE))
                continue
            member.weight = self.engine.staleness_weight(member.staleness)
            if not 0.0 < member.weight <= 1.0:  # a sum carries weights in (0, 1] only
                raise SecAggError(f"the staleness weight of {member.staleness} versions is "
                                  f"{member.weight:g}; a secure group needs one in (0, 1]")

    def _close_share(self, group: SecureGroup) -> None:
        group.sharers = group.sum.close_sharing()
        if len(group.sharers) < 2:
            raise SecAggError(f"{len(group.sharers)} client shared keys; a secure sum needs "
                              f"at least 2")

    def _deliveries_needed(self, group: SecureGroup) -> int:
        """Masked updates the group needs to go on: at least 2 (a sum of one is an update),
        ``flush.min_updates`` and ``threshold`` of the roster."""
        return max(2, self.config.flush.min_updates,
                   math.ceil(group.config.threshold * len(group.members)))

    def _phase_full(self, group: SecureGroup, answered: Set[int], answering: int) -> bool:
        """Whether the share or masked phase closes now, before its deadline: every one of
        its ``answering`` members answered, or ``secure.quorum`` of them (never fewer than
        the masked phase needs) whose unmask answers alone would rebuild every secret."""
        if len(answered) >= answering:
            return True
        quorum = max(math.ceil(self.config.secure.quorum * answering - 1e-9),
                     self._deliveries_needed(group))
        return len(answered) >= quorum and group.sum.rebuildable(answered)

    def _close_masked(self, group: SecureGroup) -> None:
        needed = self._deliveries_needed(group)
        if len(group.delivered) < needed:
            raise SecAggError(f"{len(group.delivered)} of {len(group.members)} members "
                              f"delivered a masked update; {needed} needed")
        self._refuse_if_over(group)
        self._account(group)
        request = group.sum.unmask_request()
        group.request = SecureMaskedReply(tuple(sorted(request.survivors)),
                                          tuple(sorted(request.dropped)))

    def _refuse_if_over(self, group: SecureGroup) -> None:
        """The run ended meanwhile (a stop): no sum is learnt, or asked for, that no flush
        uses; the group's members hear ``RUN_OVER``."""
        if self.engine.finished:
            group.run_over = True
            raise UpdateRefused(f"the run is over: {self.engine.finished_reason}",
                                RefusalCode.RUN_OVER)

    def _account(self, group: SecureGroup) -> None:
        """Under distributed DP, account a group's sum before its members are asked to
        unmask it: their answers would let the coordinator compute it, whatever it does next.
        A sum past the budget is never asked for. The accounting is journalled, so it is
        durable before any member hears whom to unmask (the masked phase's answers wait for
        the store)."""
        if self._ddp is None:
            return
        shares = len(group.delivered)
        if not self._ddp.admits(shares):
            reason = self._ddp.refuse(shares)
            self._journal_accounting(self._ddp)
            raise SecAggError(reason)  # never asked for, never unmasked
        self._ddp.account(shares)
        group.accounted = True
        self._journal_accounting(self._ddp)

    def _settle_accounting(self, group: SecureGroup) -> None:
        """A group whose sum was accounted flushed or was lost: the budget no longer waits
        for it (``SecureDDPHook.settled``)."""
        if group.accounted and self._ddp is not None:
            group.accounted = False
            self._ddp.settled()

    def _journal_accounting(self, ddp: SecureDDPHook) -> None:
        if self.on_accounted is not None:
            self.on_accounted(ddp.state_dict())

    def _close_unmask(self, group: SecureGroup) -> None:
        self._refuse_if_over(group)
        survivors = set(group.delivered)
        self._refuse_overtaken(group, survivors)
        total, count = group.sum.finish(group.answers.values())
        delta, weight = self._delta(group, total, count, survivors)
        delta = self._full(group, delta)
        # staleness as folded: below the one weighed when a group counted ahead was lost
        tasks = [SummedTask(c, m.task_id, m.num_examples, m.steps_completed, m.steps_planned,
                            m.bytes_up, self.engine.version - m.base_version, m.weight)
                 for c, m in group.members.items() if m.index in survivors]
        with self._durably():  # the new version and its events, journalled together
            outcome = self.engine.submit_sum(tasks, delta.astype(np.float32), weight)
            for task in tasks:
                self._settled(task.client_id, task.task_id)
        # the sum is in the model from here on: whatever fails next must not lose the group
        group.flushed_version = outcome.version
        self._settle_accounting(group)
        group.sum = SecureSum(group.config, group.number, 1, 0)  # drop the masked total
        group.answers = {}
        for task in tasks:
            self._summed[task.task_id] = (task.client_id, outcome.version)
        while len(self._summed) > KEEP_SUMMED:
            self._summed.popitem(last=False)
        self._on_flush(outcome)  # may end the run (a target accuracy reached)
        if self.engine.finished:  # that was the last version: no other group will flush
            self._end_run(group)
        log.info("secure group %d: %d of %d members summed, version %d made",
                 group.number, count, len(group.members), outcome.version)

    def _refuse_overtaken(self, group: SecureGroup, survivors: set[int]) -> None:
        """Groups formed after ``group`` flushed first (it was stuck past their deadlines):
        its sum is lost, never unmasked, if that leaves a member staler than the flush rule's
        ``max_staleness``, as a plain flush refuses such an update."""
        worst = max((self.engine.version - m.base_version for m in group.members.values()
                     if m.index in survivors), default=0)
        limit = self.config.flush.max_staleness
        if worst > limit:
            raise SecAggError(f"groups formed after it flushed first: its updates would be "
                              f"folded up to {worst} versions stale (max_staleness {limit})")

    def _delta(self, group: SecureGroup, total: np.ndarray, count: int,
               survivors: set[int]) -> tuple[np.ndarray, float]:
        """The delta a group's unmasked sum makes the next version with, over the survivors'
        kept coordinates, and its weight (the total of the staleness weights the coordinator
        named them). The delta is the sum of their weighted updates over their count: a
        group of fresh members moves the model by their mean, and a stale group by its
        members' staleness weights, as a late update does in a plain flush beside fresh ones
        (normalized by the weights, a group of members all equally stale would move the
        model as far as a fresh one). Under distributed DP (accounted when its unmasking was
        asked for) the sum carries no weight: the members' weighted updates, noised.

        A sum no honest members could have made is refused (``SecAggError``: the group is
        lost, never flushed): a weight other than the one the coordinator named them, up to
        the quantization, or under distributed DP a sum beyond its members' norm bound and
        noise. A wrong mask, packing or share anywhere in the group unmasks to such a sum."""
        named = sum(m.weight for m in group.members.values() if m.index in survivors)
        if self._ddp is None:
            mean, weight = weighted_mean(total, count, group.config, named)
            return mean * (weight / count), weight
        skellam = self._ddp.skellam
        decoded = skellam.decode_sum(total)
        norm, bound = float(np.linalg.norm(decoded)), skellam.sum_norm_bound(count)
        if norm > bound:
            raise SecAggError(f"the unmasked sum's norm {norm:.6g} is beyond what {count} "
                              f"clipped, noised updates reach ({bound:.6g}): a client's "
                              f"masked update or unmask answer is wrong")
        return decoded / count, named

    def _full(self, group: SecureGroup, delta: np.ndarray) -> np.ndarray:
        """The model-sized delta of a group's kept coordinates: zero where none was sent
        (each member keeps those as its residual for a later group)."""
        assert self._settings is not None
        n = self.engine.num_parameters
        indices = group_indices(self._settings.density, self._settings.randk_seed,
                                group.number, n)
        return delta if indices is None else scatter(delta, indices, n)

    _CLOSERS: dict[int, Callable[[SecureDesk, SecureGroup], None]] = {
        ADVERTISE: _close_advertise, SHARE: _close_share, MASKED: _close_masked,
        UNMASK: _close_unmask}

    def _end_run(self, last: SecureGroup) -> None:
        """The run ended with ``last``'s flush: every other group still going is lost, its
        members' waiting calls refused ``RUN_OVER`` (a forming group would wait for its
        roster for ever)."""
        for group in list(self._groups.values()):
            if group is not last and group.phase != DONE:
                group.run_over = True
                self._lose(group, f"the run is over: {self.engine.finished_reason}")

    def _lose(self, group: SecureGroup, reason: str) -> None:
        """The group cannot go on: every waiting call is refused with ``reason``, and the
        loss is a ``secure_group_lost`` event."""
        # a group the run's end cut short did not fail
        log.log(logging.INFO if group.run_over else logging.WARNING,
                "secure group %d lost: %s", group.number, reason)
        phase = group.phase
        if not self.engine.finished:  # once the run is over its log may be closing
            self.engine.events.emit(SecureGroupLost.build(
                group=group.number, phase=PHASE_NAMES[phase], reason=reason,
                members=len(group.members), model_version=self.engine.version))
        group.lost, group.lost_at, group.phase = reason, phase, DONE
        self._settle_accounting(group)
        group.sum = SecureSum(group.config, group.number, 1, 0)
        if self._forming is group:
            self._forming = None
        self._retire(group)
        self._journal_groups()
        for event in group.closed:
            event.set()
        if self.on_phase is not None:
            self.on_phase(group, phase)
        self._flush_next()

    def _retire(self, group: SecureGroup) -> None:
        """``group`` is done: its timer stops, and the oldest finished groups beyond
        ``KEEP_DONE`` are forgotten (their members' retries are then refused)."""
        if group.timer is not None:
            group.timer.cancel()
        done = [g for g in self._groups.values() if g.phase == DONE]
        for old in done[:max(0, len(done) - KEEP_DONE)]:
            del self._groups[old.number]
            for member in [*old.members.values(), *old.too_stale.values()]:
                if self._of_task.get(member.task_id) is old:
                    del self._of_task[member.task_id]
