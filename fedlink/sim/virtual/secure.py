"""Secure aggregation's four phases in virtual mode (``[coordinator.secure]``), timed on the
clients' simulated links.

The coordinator's side is the gRPC coordinator's own ``SecureDesk``
(``fedlink.coordinator.secure``: the groups, their phases and deadlines on the manual clock, a
group lost below threshold and tried again, the unmasked sum flushed through the engine); the
client's side is the real client's ``SecureDelivery`` (``fedlink.client.secure``: keys, shares,
clipping, quantization and masks), driven through the same ``ClientProtocol`` states
(``Advertise``, ``ShareKeys``, ``MaskedUpload``, ``Unmask``). Nothing is written again here:
this module only carries each message over the client's link and back.

Each phase costs a client one round trip: its request's bytes up plus the link's round-trip
time, then, once the phase closes for the whole group, the answer's bytes down. Message sizes
are the protobuf messages' own (``to_proto(...).ByteSize()``), so the masked update weighs
``modulus_bits`` a value, as on the wire. Work pauses while a client is offline
(``fedlink.sim.virtual.availability``): a client offline past a phase's deadline is out of the
group (unmasked from its neighbours' shares), exactly as a real client that missed it.
``SecurePhaseTotals`` counts the round trips and bytes of each phase for the run's summary.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedlink.client.protocol import (
    Accepted,
    Lost,
    MaskedUpload,
    PhaseDone,
    Refused,
    ShareKeys,
    Unmask,
    outcome_of,
)
from fedlink.client.secure import SecureDelivery
from fedlink.coordinator.secure import (
    ADVERTISE,
    MASKED,
    PHASE_NAMES,
    SHARE,
    UNMASK,
    SecureDesk,
    SecureGroup,
    secure_settings,
)
from fedlink.errors import RemoteError, UpdateRefused
from fedlink.messages import SecureUnmaskReply
from fedlink.refusals import RefusalCode
from fedlink.sim.virtual.availability import finish
from fedlink.sim.virtual.timing import DOWN, UP, round_trip_s, transfer_time
from fedlink.wire.convert import to_proto

if TYPE_CHECKING:
    from fedlink.sim.virtual.loop import VirtualLoop, _Busy



@dataclass
class SecurePhaseTotals:
    """Per phase (``PHASE_NAMES``): requests sent (one round trip each), their bytes up and
    their answers' bytes down; ``groups_lost``: groups that fell below threshold (their
    members' tasks tried again in later groups)."""

    round_trips: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        PHASE_NAMES.values(), 0))
    bytes_up: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        PHASE_NAMES.values(), 0))
    bytes_down: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        PHASE_NAMES.values(), 0))
    groups_lost: int = 0

    def figures(self) -> dict[str, int]:
        """Flat summary entries: ``secure_<phase>_round_trips`` / ``_bytes_up`` /
        ``_bytes_down`` and ``secure_groups_lost``."""
        out = {"secure_groups_lost": self.groups_lost}
        for name in PHASE_NAMES.values():
            out[f"secure_{name}_round_trips"] = self.round_trips[name]
            out[f"secure_{name}_bytes_up"] = self.bytes_up[name]
            out[f"secure_{name}_bytes_down"] = self.bytes_down[name]
        return out


@dataclass
class _Member:
    """One selected client's secure delivery in progress."""

    busy: _Busy
    delivery: SecureDelivery
    rng: np.random.Generator
    group: SecureGroup | None = None
    member: Any = None  # the desk's record of it in ``group``


class VirtualSecure:
    """Carries the secure phases of the loop's clients (module docstring)."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop
        settings = secure_settings(loop.config)
        assert settings is not None
        self.settings = settings
        self.desk = SecureDesk(loop.config, loop.engine, loop.clock, loop.flushed,
                               nullcontext, self._no_upload, self._settled)
        self.desk.on_phase = self._phase_closed
        self.totals = SecurePhaseTotals()
        self._waiting: dict[tuple[int, int], list[_Member]] = {}

    @staticmethod
    async def _no_upload(client_id: str, upload_id: str, size: int) -> bytes:
        raise AssertionError("virtual masked updates travel inline")  # never named here

    def start(self, busy: _Busy, delta: np.ndarray, num_examples: int, steps_completed: int,
              steps_planned: int, rng: np.random.Generator) -> None:
        """Deliver ``busy``'s update (the pipeline's output) through the group now forming."""
        state = _Member(busy, SecureDelivery(self.loop.client_id(busy.index), busy.task,
                                             self.settings, delta, num_examples,
                                             steps_completed, steps_planned,
                                             residual=self.loop.residuals.take(busy.index)),
                        rng)
        self._send(state, ADVERTISE, state.delivery.advertise())

    # -- one phase: the request up, the answer down -----------------------------------------

    def _send(self, state: _Member, phase: int, request: Any) -> None:
        name = PHASE_NAMES[phase]
        size = to_proto(request).ByteSize()
        self.totals.round_trips[name] += 1
        self.totals.bytes_up[name] += size
        seconds = self._carry(state.busy, size, UP, round_trip=True)
        self.loop.clock.call_at(self._when(state.busy, seconds),
                                lambda: self._arrived(state, phase, request))

    def _arrived(self, state: _Member, phase: int, request: Any) -> None:
        """The request reached the coordinator: recorded, then answered when its phase
        closes (at once when it already has)."""
        if self.loop.engine.finished:  # after the end: refused unheard
            self._end(state)
            return
        try:
            state.group, state.member = self._RECORDERS[phase](self.desk, request)
        except RemoteError as err:
            self._refused(state, err)
            return
        if state.group.phase > phase or state.group.lost:
            self._answer(state, phase)
        else:
            self._waiting.setdefault((id(state.group), phase), []).append(state)

    def _phase_closed(self, group: SecureGroup, phase: int) -> None:
        if group.lost:
            self.totals.groups_lost += 1
        for state in self._waiting.pop((id(group), phase), []):
            self._answer(state, phase)
        if group.lost:  # those waiting on a later phase of it (none: phases close in order)
            for key in [k for k in self._waiting if k[0] == id(group)]:
                for state in self._waiting.pop(key):
                    self._answer(state, key[1])

    def _answer(self, state: _Member, phase: int) -> None:
        group, busy = state.group, state.busy
        assert group is not None
        client_id, task_id = self.loop.client_id(busy.index), busy.task.task_id
        try:
            if group.lost:
                raise_lost(group)
            reply = self._REPLIES[phase](self.desk, group, state.member, client_id, task_id)
        except RemoteError as err:
            self._refused(state, err)
            return
        size = to_proto(reply).ByteSize()
        self.totals.bytes_down[PHASE_NAMES[phase]] += size
        seconds = self._carry(busy, size, DOWN, round_trip=False)
        self.loop.clock.call_at(self._when(busy, seconds),
                                lambda: self._heard(state, phase, reply))

    def _heard(self, state: _Member, phase: int, reply: Any) -> None:
        """The answer reached the client: the protocol's next phase (or the task's end)."""
        delivery, busy = state.delivery, state.busy
        if phase == UNMASK:
            self._end(state, Accepted())
            return
        if phase == ADVERTISE:
            delivery.roster(reply)
        elif phase == SHARE:
            delivery.shared(reply)
        else:
            delivery.heard(reply)
        action = busy.protocol.heard(PhaseDone())  # the protocol says what comes next
        request: Any
        if isinstance(action, ShareKeys):
            request = delivery.share()
        elif isinstance(action, MaskedUpload):
            request = delivery.masked(state.rng)
        else:
            assert isinstance(action, Unmask)
            request = delivery.unmask()
        self._send(state, phase + 1, request)

    def _refused(self, state: _Member, err: RemoteError) -> None:
        self._end(state, outcome_of(err) or Refused(err.detail))

    def _end(self, state: _Member, outcome: Accepted | Refused | Lost | None = None) -> None:
        """The delivery ended: the client keeps its new group random-k residual if its update
        is in a sum, else the one it started with."""
        delivery = state.delivery
        summed = isinstance(outcome, Accepted) and delivery.next_residual is not None
        self.loop.residuals.put(state.busy.index,
                                delivery.next_residual if summed else delivery.residual)
        self.loop.ended(state.busy, outcome)

    # -- the link ---------------------------------------------------------------------------

    def _carry(self, busy: _Busy, size: int, direction: str, round_trip: bool) -> float:
        """Model seconds to move ``size`` bytes over ``busy``'s link (plus a round trip for a
        request), charged to the task as network time."""
        loop = self.loop
        profile = loop.population.profile(busy.index)
        transfer = transfer_time(profile, size, direction, loop.timing)
        seconds = transfer.seconds
        if round_trip and profile is not None:
            seconds += round_trip_s(profile, loop.timing)
        loop.count_network(busy, seconds, transfer)
        return seconds

    def _when(self, busy: _Busy, seconds: float) -> float:
        return finish(self.loop.availability, busy.index, self.loop.clock.now(), seconds)

    def _settled(self, client_id: str, task_id: str) -> None:
        """A task's update is in a flushed sum: the model it downloaded was used."""
        busy = self.loop.busy_of(client_id)
        if busy is not None and busy.task.task_id == task_id:
            self.loop.count_used(busy.bytes_down)

    _RECORDERS: dict[int, Callable[[SecureDesk, Any], tuple[SecureGroup, Any]]] = {
        ADVERTISE: SecureDesk.join, SHARE: SecureDesk.record_share,
        MASKED: SecureDesk.record_masked, UNMASK: SecureDesk.record_unmask}

    _REPLIES: dict[int, Callable[..., Any]] = {
        ADVERTISE: SecureDesk.advertise_reply,
        SHARE: SecureDesk.share_reply,
        MASKED: SecureDesk.masked_reply,
        UNMASK: lambda desk, group, member, client_id, task_id:
            SecureUnmaskReply(group.flushed_version),
    }



def raise_lost(group: SecureGroup) -> None:
    """Refuse a member of a lost group, as the gRPC calls do."""
    raise UpdateRefused(f"secure group {group.number} was lost: {group.lost}",
                        RefusalCode.TASK_CLOSED)
