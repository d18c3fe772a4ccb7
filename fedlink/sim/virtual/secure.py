"""Secure aggregation's four phases in virtual mode (``[coordinator.secure]``), timed on the
clients' simulated links.

The coordinator's side is the gRPC coordinator's own ``SecureDesk``
(``fedlink.coordinator.secure``: the groups, their phases and deadlines on the manual clock, a
group lost below threshold and tried again, the unmasked sum flushed through the engine); the
client's side is the real client's ``SecureDelivery`` (``fedlink.client.secure``: keys, shares,
clipping, quantization and masks), driven through the same ``ClientProtocol`` states
(``Advertise``, ``ShareKeys``, ``MaskedUpload``, ``Unmask``). Nothing is written again here:
this module only carries each message over the client's link and back.

Each phase is one call, timed as a gRPC call is: the request reaches the coordinator after
the link's one-way latency and its bytes up (``leg_time``); once the phase closes for the
whole group, the answer reaches the client after the one-way latency and its bytes down. A
masked update too large to travel inline goes first as a resumable upload (a transfer of its
own, round trip included), as the real client sends it. As on a real client, the first two
phases (advertise, share) start once the client has its task (``Download.exchange_keys``)
and run beside the download and the training; the masked update goes once the client trained
and its keys are shared, and a group that goes on without its keys before then (``NEW_KEYS``)
is followed by fresh keys for the next one, while it trains or with the update it trained.
Message sizes are the protobuf messages' own (``to_proto(...).ByteSize()``), so the masked
update weighs ``modulus_bits`` a value, as on the wire. A roster short of members waits for
more (``SecureDesk``); a real client's call is answered ``NEW_KEYS`` after ``phase_s`` meanwhile
and advertises again, which the loop does not charge. Work pauses while a client is offline
(``fedlink.sim.virtual.availability``): a client offline past a phase's deadline is out of the
group (unmasked from its neighbours' shares), exactly as a real client that missed it.
``SecurePhaseTotals`` counts the round trips and bytes of each phase for the run's summary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedlink.client.protocol import (
    Accepted,
    PhaseDone,
    Refused,
    Unmask,
    outcome_of,
    travels_inline,
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
from fedlink.sim.virtual.timing import DOWN, UP, leg_time, transfer_time
from fedlink.wire.convert import to_proto
from fedlink.wire.refusal import refusal_bytes

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
    values_clipped: int = 0
    """Values of masked updates beyond the ring's ``clip``, clipped by their clients."""

    def figures(self) -> dict[str, int]:
        """Flat summary entries: ``secure_<phase>_round_trips`` / ``_bytes_up`` /
        ``_bytes_down``, ``secure_groups_lost`` and ``secure_values_clipped``."""
        out = {"secure_groups_lost": self.groups_lost,
               "secure_values_clipped": self.values_clipped}
        for name in PHASE_NAMES.values():
            out[f"secure_{name}_round_trips"] = self.round_trips[name]
            out[f"secure_{name}_bytes_up"] = self.bytes_up[name]
            out[f"secure_{name}_bytes_down"] = self.bytes_down[name]
        return out


_UNHEARD = object()
"""A delivery's outcome when the run ended before it was heard (``VirtualLoop.ended``'s
``None``)."""


@dataclass
class _Member:
    """One selected client's secure delivery in progress: its key exchange from the start of
    its task, its update once ``trained``."""

    busy: _Busy
    delivery: SecureDelivery
    rng: np.random.Generator | None = None
    group: SecureGroup | None = None
    member: Any = None  # the desk's record of it in ``group``
    keys_done: bool = False
    trained: bool = False
    outcome: Any = None
    """How the delivery ended while its client was still training (told once trained)."""
    over: bool = False


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
        self._delivering: dict[int, _Member] = {}  # by client index

    @staticmethod
    async def _no_upload(client_id: str, upload_id: str, size: int) -> bytes:
        raise AssertionError("virtual masked updates travel inline")  # never named here

    def begin(self, busy: _Busy) -> _Member:
        """``busy``'s task started (``Download.exchange_keys``): its key exchange goes on
        beside the download and the training, in the group now forming."""
        delivery = SecureDelivery(self.loop.client_id(busy.index), busy.task, self.settings,
                                  self.loop.engine.num_parameters)
        state = self._delivering[busy.index] = _Member(busy, delivery)
        self._send(state, ADVERTISE, delivery.advertise())
        return state

    def start(self, busy: _Busy, delta: np.ndarray, num_examples: int, steps_completed: int,
              steps_planned: int, rng: np.random.Generator) -> None:
        """``busy`` trained: its update (the pipeline's output) is masked once its key
        exchange has ended (at once when it has)."""
        state = self._delivering[busy.index]
        state.delivery.trained(delta, num_examples, steps_completed, steps_planned,
                               residual=self.loop.residuals.take(busy.index))
        state.rng, state.trained = rng, True
        if state.outcome is not None:  # refused while it trained
            self._end(state, None if state.outcome is _UNHEARD else state.outcome)
        elif state.keys_done:
            self._mask(state)

    def forget(self, busy: _Busy) -> None:
        """``busy``'s task ended before it trained (lost): its key exchange is dropped."""
        state = self._delivering.pop(busy.index, None)
        if state is not None and state.busy is busy:
            state.over = True

    # -- one phase: the request up, the answer down -----------------------------------------

    def _send(self, state: _Member, phase: int, request: Any) -> None:
        name = PHASE_NAMES[phase]
        size = to_proto(request).ByteSize()
        self.totals.round_trips[name] += 1
        self.totals.bytes_up[name] += size
        seconds = self._request_s(state.busy, request, size, timed=phase >= MASKED)
        self.loop.clock.call_at(self._when(state.busy, seconds),
                                lambda: self._arrived(state, phase, request))

    def _arrived(self, state: _Member, phase: int, request: Any) -> None:
        """The request reached the coordinator: recorded, then answered when its phase
        closes (at once when it already has)."""
        if state.over:
            return
        if self.loop.engine.finished:  # after the end: refused unheard
            self._end(state, _UNHEARD)
            return
        summed = self.desk.summed_reply(request) if phase == UNMASK else None
        if summed is not None:  # its group is forgotten, its update in a flushed sum
            self._reply(state, phase, summed)
            return
        try:
            state.group, state.member = self._RECORDERS[phase](self.desk, request)
        except RemoteError as err:
            self._refused(state, phase, err)
            return
        if state.group.phase > phase or state.group.lost:
            self._answer(state, phase)
        else:
            self._waiting.setdefault((id(state.group), phase), []).append(state)

    def _phase_closed(self, group: SecureGroup, phase: int) -> None:
        if group.lost and not group.run_over:  # one the run's end cut short did not fail
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
        if state.over:
            return
        client_id, task_id = self.loop.client_id(busy.index), busy.task.task_id
        try:
            refusal = self.desk.refusal(group, state.member)
            if refusal is not None:
                raise refusal
            reply = self._REPLIES[phase](self.desk, group, state.member, client_id, task_id)
        except RemoteError as err:
            self._refused(state, phase, err)
            return
        self._reply(state, phase, reply)

    def _reply(self, state: _Member, phase: int, reply: Any) -> None:
        """``reply`` travels down to the client, which hears it on arrival."""
        busy = state.busy
        size = to_proto(reply).ByteSize()
        self.totals.bytes_down[PHASE_NAMES[phase]] += size
        seconds = self._carry(busy, size, DOWN, timed=phase >= MASKED)
        self.loop.clock.call_at(self._when(busy, seconds),
                                lambda: self._heard(state, phase, reply))

    def _heard(self, state: _Member, phase: int, reply: Any) -> None:
        """The answer reached the client: the next phase (or the task's end)."""
        delivery = state.delivery
        if state.over:
            return
        if phase == ADVERTISE:
            delivery.roster(reply)
            self._send(state, SHARE, delivery.share())
        elif phase == SHARE:
            delivery.shared(reply)
            state.keys_done = True
            if state.trained:
                self._mask(state)
        elif phase == MASKED:
            delivery.heard(reply)
            action = state.busy.protocol.heard(PhaseDone())  # the protocol says what follows
            assert isinstance(action, Unmask)
            self._send(state, UNMASK, delivery.unmask())
        else:
            self._end(state, Accepted())

    def _mask(self, state: _Member) -> None:
        """Phase 3, once the client trained and its key exchange ended."""
        assert state.rng is not None
        # its own stream, as on a real client: the client's next training plans stay put
        self._send(state, MASKED, state.delivery.masked(state.rng.spawn(1)[0]))
        self.totals.values_clipped += state.delivery.values_clipped

    def _refused(self, state: _Member, phase: int, err: RemoteError) -> None:
        """A call refused: the refusal travels down to the client as an answer does."""
        busy = state.busy
        size = refusal_bytes(err, f"Secure{PHASE_NAMES[phase].capitalize()}")
        self.totals.bytes_down[PHASE_NAMES[phase]] += size
        seconds = self._carry(busy, size, DOWN, timed=phase >= MASKED)
        self.loop.clock.call_at(self._when(busy, seconds),
                                lambda: self._heard_refusal(state, err))

    def _heard_refusal(self, state: _Member, err: RemoteError) -> None:
        """The refusal reached the client: a group that went on without the task before its
        masked update (``NEW_KEYS``) is followed by fresh keys in the next one, the update
        kept if the client has trained, as the real client does; any other refusal ends the
        delivery."""
        if state.over:
            return
        if isinstance(err, UpdateRefused) and err.reason is RefusalCode.NEW_KEYS:
            state.over = True
            fresh = self.begin(state.busy)
            if state.trained:
                kept = state.delivery
                assert kept.delta is not None
                fresh.delivery.trained(kept.delta, kept.num_examples, kept.steps_completed,
                                       kept.steps_planned, residual=kept.residual)
                fresh.rng, fresh.trained = state.rng, True
            return
        self._end(state, outcome_of(err) or Refused(err.detail))

    def _end(self, state: _Member, outcome: Any) -> None:
        """The delivery ended (``_UNHEARD``: after the run's end), told to the loop once the
        client trained; the client keeps its new group random-k residual if its update is in
        a sum, else the one it started with."""
        if not state.trained:  # it trains on: the loop hears of it when training ends
            state.outcome = outcome
            return
        state.over = True
        if self._delivering.get(state.busy.index) is state:
            del self._delivering[state.busy.index]
        delivery = state.delivery
        summed = isinstance(outcome, Accepted) and delivery.next_residual is not None
        self.loop.residuals.put(state.busy.index,
                                delivery.next_residual if summed else delivery.residual)
        self.loop.ended(state.busy, None if outcome is _UNHEARD else outcome)

    # -- the link ---------------------------------------------------------------------------

    def _request_s(self, busy: _Busy, request: Any, size: int, timed: bool) -> float:
        """Model seconds until ``request`` (``size`` bytes) reaches the coordinator: one leg of
        its call, after a resumable upload of its values when they are a masked update too
        large to travel inline (the real client's rule, ``travels_inline``)."""
        values = getattr(request, "values", b"")
        if not values or travels_inline(len(values), self.loop.config.limits.inline_limit):
            return self._carry(busy, size, UP, timed=timed)
        upload_id = f"{self.loop.client_id(busy.index)}-{busy.task.task_id}-masked-{0:012x}"
        named = to_proto(dataclasses.replace(request, values=b"", upload_id=upload_id))
        return (self._carry(busy, len(values), UP, transfer=True, timed=timed)
                + self._carry(busy, named.ByteSize(), UP, timed=timed))

    def _carry(self, busy: _Busy, size: int, direction: str, transfer: bool = False,
               timed: bool = True) -> float:
        """Model seconds to move ``size`` bytes over ``busy``'s link, one leg of a call (a
        whole transfer, round trip included, with ``transfer``), charged to the task as
        network time when ``timed`` (the key exchange, beside the download and the training,
        is not: as on a real client)."""
        loop = self.loop
        profile = loop.population.profile(busy.index)
        moved = (transfer_time if transfer else leg_time)(profile, size, direction, loop.timing)
        loop.count_network(busy, moved.seconds, moved, timed)
        return moved.seconds

    def _when(self, busy: _Busy, seconds: float) -> float:
        return finish(self.loop.availability, busy.index, self.loop.clock.now(), seconds)

    def _settled(self, client_id: str, task_id: str) -> None:
        """A task's update is in a flushed sum: the model it downloaded was used."""
        busy = self.loop.busy_of(client_id)
        if busy is not None and busy.task.task_id == task_id:
            self.loop.count_used(busy.bytes_down, busy.bytes_saved)

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


