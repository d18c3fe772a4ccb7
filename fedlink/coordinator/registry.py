"""The client registry: who joined, under which id, with how much data, seen when, and the
gaps between its signs of life (``fedlink.coordinator.heartbeat``)."""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import replace

from fedlink.clock import RealClock
from fedlink.coordinator.auth import check_caller, principal
from fedlink.coordinator.heartbeat import ClientLinks
from fedlink.coordinator.records import ClientRecord
from fedlink.errors import InvalidArgument, Unauthenticated

MAX_NAME_LENGTH = 128
ID_SECRET_BYTES = 16
_ID_NUMBER = re.compile(r"^c(\d+)-")


class ClientRegistry:
    """Issues client ids at join and checks them on every later call.

    Ids are ``c<n>-<secret>``: ``secret`` is ``ID_SECRET_BYTES`` (128 bits) drawn afresh for
    every client, so an id cannot be guessed from another one (a holder of the shared
    ``join_token`` cannot act as another client), and one stored across a coordinator restart
    is never handed to someone else.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clients: dict[str, ClientRecord] = {}
        self._by_instance: dict[tuple[str, str], str] = {}  # (name, instance key) -> id
        self._principals: dict[str, str] = {}  # id -> whose budget it spends (auth.principal)
        self._ids = itertools.count(1)
        self._clock = clock if clock is not None else RealClock().now
        self.gaps = ClientLinks()  # what each client's link has shown: its silence bound
        self._after_stream: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._clients)

    def ids(self) -> set[str]:
        """Ids of every registered client."""
        return set(self._clients)

    def rejoin(self, name: str, instance_key: str) -> ClientRecord | None:
        """The client already registered under ``name`` with ``instance_key``, seen now.

        ``None`` for an empty key or one not seen: a repeated ``Join`` (its first reply lost)
        gets the id it was given, and the coordinator counts one client, not two.
        """
        client_id = self._by_instance.get((name, instance_key)) if instance_key else None
        return None if client_id is None else self.touch(client_id)

    def join(self, name: str, num_examples: int, metadata: Mapping[str, str],
             instance_key: str = "") -> ClientRecord:
        """Register a client and return its record (with a fresh id)."""
        if len(name) > MAX_NAME_LENGTH:
            raise InvalidArgument(f"client_name is longer than {MAX_NAME_LENGTH} characters")
        if num_examples < 0:
            raise InvalidArgument(f"num_examples must be >= 0, got {num_examples}")
        now = self._clock()
        client_id = f"c{next(self._ids)}-{secrets.token_hex(ID_SECRET_BYTES)}"
        record = ClientRecord(client_id, name or client_id, num_examples, now, now,
                              dict(metadata), instance_key)
        self._clients[client_id] = record
        if instance_key:
            self._by_instance[(name, instance_key)] = client_id
        who = principal()
        if who:
            self._principals[client_id] = who
        return record

    def restore(self, records: list[ClientRecord]) -> None:
        """Take back the clients a previous process registered, seen now; new ids follow theirs.

        Counting them as seen at restart keeps the liveness check from releasing a live
        client's task before it had a chance to call again.
        """
        now = self._clock()
        numbers = [0]
        for record in records:
            self._clients[record.client_id] = replace(record, joined_at=now, last_seen=now)
            self.gaps.pause(record.client_id)  # the restart's gap is the coordinator's own
            if record.instance_key:
                self._by_instance[(record.name, record.instance_key)] = record.client_id
            number = _ID_NUMBER.match(record.client_id)
            if number:
                numbers.append(int(number[1]))
        self._ids = itertools.count(max(numbers) + 1)

    def touch(self, client_id: str, sample: bool = True) -> ClientRecord:
        """The record of ``client_id``, marked as seen now (``Unauthenticated`` if unknown).

        ``sample=False``: the time since it was last seen is not a gap of its link (one of
        its transfer streams was open meanwhile)."""
        record = self._clients.get(client_id)
        if record is None:
            raise Unauthenticated(f"unknown client id {client_id!r}: call Join first")
        check_caller(record.name)  # per-client tokens: only its own id (PERMISSION_DENIED)
        now = self._clock()
        self.gaps.seen(client_id, record.last_seen, now, sample)
        record.last_seen = now
        return record

    def transfer_opened(self, client_id: str) -> None:
        """A transfer stream of ``client_id`` is open: it counts as a sign of life until it
        ends (``fedlink.coordinator.heartbeat``)."""
        if client_id in self._clients:
            self.gaps.opened(client_id)

    def transfer_closed(self, client_id: str) -> None:
        """A transfer stream of ``client_id`` ended: the client counts as seen now (and the
        ``after_stream`` hooks run: its silence bound may be shorter from now on)."""
        if client_id in self._clients:
            self.gaps.closed(client_id)
            self._clients[client_id].last_seen = self._clock()  # not a gap: the stream was on
            for hook in self._after_stream:
                hook()

    def after_stream(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` whenever a client's transfer stream ends (the time rules re-arm)."""
        self._after_stream.append(hook)

    def pause(self, client_id: str) -> None:
        """``client_id`` may stay away by choice until its next call (it was answered a
        ``GetTask``): that gap says nothing about its link."""
        if client_id in self._clients:
            self.gaps.pause(client_id)

    def last_seen(self, client_id: str) -> float | None:
        """When ``client_id`` last made a call (any call), or None if it is not registered."""
        record = self._clients.get(client_id)
        return None if record is None else record.last_seen

    def remove(self, client_id: str) -> ClientRecord:
        """Forget ``client_id`` (``Unauthenticated`` if unknown)."""
        record = self.touch(client_id)
        del self._clients[client_id]
        self.gaps.forget(client_id)
        self._by_instance.pop((record.name, record.instance_key), None)
        self._principals.pop(client_id, None)
        return record

    def budget_key(self, client_id: str) -> str:
        """The identity whose request budget ``client_id`` spends (``coordinator.admission``).

        The principal it joined as (token name, or peer address) with the name it joined under,
        so that an id joined again under the same identity shares its predecessor's budget;
        the id itself for a client joined from inside the process, restored after a restart,
        or joined without a name (each such Join is a new identity).
        """
        record = self._clients.get(client_id)
        who = self._principals.get(client_id)
        if record is None or not who or record.name == client_id:
            return client_id
        return f"{who}/{record.name}"

    def live_ids_of(self, name: str) -> int:
        """How many registered ids carry the client name ``name``."""
        return sum(1 for record in self._clients.values() if record.name == name)

    def silent_since(self, before: float) -> list[str]:
        """Ids of the clients whose last call was before ``before`` (candidates for expiry)."""
        return [cid for cid, record in self._clients.items() if record.last_seen < before]

    def oldest_seen(self) -> float | None:
        """The earliest ``last_seen`` of any client (``None``: no client); O(clients)."""
        return min((record.last_seen for record in self._clients.values()), default=None)

    def name_of(self, client_id: str) -> str:
        """The name ``client_id`` registered under ("" for an unknown id)."""
        record = self._clients.get(client_id)
        return "" if record is None else record.name

    def declared_examples(self, client_id: str) -> int:
        """The dataset size ``client_id`` declared at ``Join`` (0: none, or unknown id)."""
        record = self._clients.get(client_id)
        return 0 if record is None else record.num_examples
