"""The runner's own members of a secure group, so that one external client can complete them.

A secure group needs ``flush.goal`` members (at least 3), so a client under test cannot finish
one alone. The runner adds ``flush.goal - 1`` in-process fedlink clients (``ClientSession``
over real gRPC) that join under ``peer_names`` (the probe lets their calls through unseen)
and train by a small fixed step; one may vanish after sharing its keys (``secure-dropout``).
A peer advertises its keys only once the client under test is in the group now forming: every
group is then that client and the peers, however long the client takes to train (a roster
closes at ``flush.goal`` members, or at its deadline with whoever came, which without the gate
could be the peers alone).

Imported only by the secure scenarios: it needs the ``secagg`` extra (``cryptography``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from fedlink.client import ClientOptions, ClientSession, TrainPlan, TrainResult
from fedlink.client.protocol import Action, ClientProtocol, MaskedUpload
from fedlink.client.secure import SecureDelivery
from fedlink.coordinator.secure import ADVERTISE, SecureDesk

PEER_PREFIX = "conformance-peer-"


def peer_names(count: int) -> tuple[str, ...]:
    """The names ``count`` peers join under."""
    return tuple(f"{PEER_PREFIX}{i}" for i in range(1, count + 1))


class StepTrainer:
    """A numpy trainer that moves every parameter 1% of the way to zero: an update well
    inside any clip, at no cost."""

    def num_examples(self) -> int:
        """Local dataset size (a secure sum weighs every member the same anyway)."""
        return 10

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """One step toward zero."""
        return TrainResult((params * 0.99).astype(np.float32), 10, 1, 1,
                           {"train_seconds": 0.0})


class GroupGate:
    """Open while the newest secure group is still taking members and holds a member that
    ``is_peer`` does not name (the client under test)."""

    def __init__(self, desk: SecureDesk, is_peer: Callable[[str], bool]) -> None:
        self._desk = desk
        self._is_peer = is_peer
        self._changed = asyncio.Event()
        join = desk.join

        # a member joining is the one moment the forming group changes: wake the peers then
        def joined(request: Any) -> Any:
            result = join(request)
            self._wake()
            return result

        desk.join = joined  # type: ignore[method-assign]

    def _wake(self) -> None:
        # a fresh event per change: a waiter re-checks once, on the change it slept through
        self._changed.set()
        self._changed = asyncio.Event()

    def is_open(self) -> bool:
        """Whether a peer's keys would now join a group with the client under test."""
        group = self._desk.group
        return (group is not None and group.phase == ADVERTISE
                and any(not self._is_peer(c) for c in group.members))

    async def wait(self) -> None:
        """Until the gate is open."""
        while not self.is_open():
            await self._changed.wait()


class PeerVanished(Exception):
    """A peer left its group after sharing its keys (it sends nothing more)."""


class PeerSession(ClientSession):
    """A fedlink client that advertises its keys only through ``gate``; with ``vanishes``,
    it stops dead after sharing its keys in its first group (no masked update, no
    ``Leave``): the others must answer the unmask with shares of its mask key."""

    def __init__(self, target: str, name: str, gate: GroupGate, vanishes: bool = False) -> None:
        super().__init__(target, StepTrainer(), ClientOptions(name=name),
                         inline_training=True)
        self._gate = gate
        self._vanishes = vanishes

    async def _advertise(self, secure: SecureDelivery) -> None:
        await self._gate.wait()
        await super()._advertise(secure)

    async def _masked_upload(self, action: MaskedUpload, work: Any,
                             protocol: ClientProtocol) -> Action:
        if self._vanishes:
            await work.keys  # it vanishes once its keys are shared, with its update unsent
            raise PeerVanished(self.options.name)
        return await super()._masked_upload(action, work, protocol)


class Peers:
    """``count`` peers of the client under test, running while the ``async with`` lasts;
    the last ``vanishing`` of them vanish after sharing their keys in their first group."""

    def __init__(self, target: str, count: int, desk: SecureDesk,
                 is_peer: Callable[[str], bool], vanishing: int = 0) -> None:
        gate = GroupGate(desk, is_peer)
        self.sessions = [PeerSession(target, name, gate, i >= count - vanishing)
                         for i, name in enumerate(peer_names(count))]
        self._runs: list[asyncio.Task[Any]] = []

    async def __aenter__(self) -> Peers:
        self._runs = [asyncio.ensure_future(s.run()) for s in self.sessions]
        return self

    async def __aexit__(self, *exc: object) -> None:
        # the run may be over (they left) or not (the client under test stopped early)
        for run in self._runs:
            run.cancel()
        await asyncio.gather(*self._runs, return_exceptions=True)
