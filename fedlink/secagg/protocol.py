"""The two sides of one secure round: ``SecureClient`` and ``SecureSum`` (the coordinator).

Both are plain state objects driven phase by phase (see ``fedlink.secagg.base`` for the
phases); they do no I/O, so the same objects run over gRPC, in the virtual loop, or in a test.
A client's masked vector is

    y_i = x_i + PRG(b_i) + sum over neighbours j of sign(i, j) * PRG(s_ij)   (mod m)

with ``b_i`` its self-mask seed, ``s_ij`` the mask seed it agrees with neighbour ``j``
(X25519 + HKDF: ``s_ij = s_ji``) and ``sign(i, j) = +1`` if ``i < j`` else ``-1``: summed over
the clients that delivered, the pairwise masks of two deliverers cancel. For a deliverer the
coordinator rebuilds ``b_i`` from its neighbours' shares and subtracts ``PRG(b_i)``; for a
client that shared its keys but did not deliver, it rebuilds that client's mask key and
removes the pairwise masks its delivering neighbours added. A client answers for each
neighbour with the share of ``b`` or of the mask key, never both, so the coordinator never
has both secrets of one client.

The coordinator keeps only the running sum of masked vectors (O(model) memory, not
O(clients x model)): it never holds a client's update in the clear.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from fedlink.secagg import crypto, shamir
from fedlink.secagg.base import (
    AdvertiseKeys,
    EncryptedShare,
    MaskedInput,
    SecAggAborted,
    SecAggConfig,
    SecAggError,
    UnmaskRequest,
    UnmaskShares,
)
from fedlink.secagg.graph import neighbours
from fedlink.secagg.shamir import RandomBelow

_SHARE = struct.Struct("<32s32s")  # the receiver's share of the self-mask seed, of the mask key


def _point(client: int) -> int:
    """The Shamir point of a client's shares: its id + 1 (never 0)."""
    return client + 1


def _sign(i: int, j: int) -> int:
    return 1 if i < j else -1


def _mask_of(seed: bytes, size: int, sign: int) -> np.ndarray:
    """``sign * PRG(seed)`` as uint32 (mod 2^32)."""
    mask = crypto.expand(seed, size)
    return mask if sign > 0 else (np.uint32(0) - mask)


@dataclass
class SecureClient:
    """One client's side of a secure round (``round_id`` binds every key to the round)."""

    client: int
    config: SecAggConfig
    round_id: int
    size: int
    random_below: RandomBelow = secrets.randbelow
    _cipher_key: int = field(init=False, repr=False)
    _mask_key: int = field(init=False, repr=False)
    _seed: int = field(init=False, repr=False)
    _roster: dict[int, AdvertiseKeys] = field(default_factory=dict, init=False, repr=False)
    _neighbours: tuple[int, ...] = field(default=(), init=False)
    _held: dict[int, tuple[int, int]] = field(default_factory=dict, init=False, repr=False)
    _answered: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._cipher_key = crypto.private_key(self.random_below)
        self._mask_key = crypto.private_key(self.random_below)
        self._seed = self.random_below(shamir.PRIME)

    def advertise(self) -> AdvertiseKeys:
        """Phase 1: this client's public keys."""
        return AdvertiseKeys(self.client, crypto.public_key(self._cipher_key),
                             crypto.public_key(self._mask_key))

    def share_keys(self, roster: Iterable[AdvertiseKeys], graph_seed: int) -> list[EncryptedShare]:
        """Phase 2: shares of this client's seed and mask key, one encrypted per neighbour."""
        self._roster = {a.client: a for a in roster}
        if self.client not in self._roster:
            raise SecAggError(f"client {self.client} is not in the round's roster")
        self._neighbours = neighbours(self._roster, self.config.neighbours,
                                      graph_seed)[self.client]
        keyless = [j for j in self._neighbours if not self._roster[j].keyed()]
        if keyless:
            raise SecAggError(f"the roster has no keys for neighbour(s) {keyless}")
        points = [_point(j) for j in self._neighbours]
        needed = self.config.shares_needed(len(points))
        seed_shares = shamir.split(self._seed, points, needed, self.random_below)
        key_shares = shamir.split(self._mask_key, points, needed, self.random_below)
        out = []
        for j, x in zip(self._neighbours, points, strict=True):
            key = crypto.agree(self._cipher_key, self._roster[j].cipher_public, "share",
                               self.round_id)
            plain = _SHARE.pack(crypto.element_bytes(seed_shares[x]),
                                crypto.element_bytes(key_shares[x]))
            out.append(EncryptedShare(self.client, j, crypto.encrypt(
                key, plain, self.round_id, self.client, j)))
        return out

    def receive_shares(self, shares: Iterable[EncryptedShare]) -> None:
        """Phase 2's answer: the shares neighbours sent this client (decrypted and kept)."""
        for share in shares:
            if share.receiver != self.client or share.sender not in self._neighbours:
                raise SecAggError(f"client {self.client} was given a share from "
                                  f"{share.sender} to {share.receiver}")
            key = crypto.agree(self._cipher_key, self._roster[share.sender].cipher_public,
                               "share", self.round_id)
            seed_share, key_share = _SHARE.unpack(crypto.decrypt(
                key, share.ciphertext, self.round_id, share.sender, self.client))
            self._held[share.sender] = (int.from_bytes(seed_share, "little"),
                                        int.from_bytes(key_share, "little"))

    def masked_input(self, encoded: np.ndarray) -> MaskedInput:
        """Phase 3: ``encoded`` (uint32 in ``[0, m)``) plus its self mask and the pairwise
        masks of the neighbours whose shares arrived (those that finished phase 2)."""
        values = np.asarray(encoded, dtype=np.uint32)
        if values.shape != (self.size,):
            raise SecAggError(f"a masked input has {self.size} values, got {values.shape}")
        total = values + crypto.expand(crypto.element_bytes(self._seed), self.size)
        for j in self._held:
            seed = crypto.agree(self._mask_key, self._roster[j].mask_public, "mask",
                                self.round_id)
            total += _mask_of(seed, self.size, _sign(self.client, j))
        return MaskedInput(self.client, total & np.uint32(self.config.modulus - 1))

    def unmask(self, request: UnmaskRequest) -> UnmaskShares:
        """Phase 4: the share of each surviving neighbour's seed and of each dropped
        neighbour's mask key (refused if a client is named both ways, or asked twice)."""
        if request.survivors & request.dropped:
            raise SecAggError("an unmask request names a client as both delivered and dropped")
        if self._answered:
            raise SecAggError(f"client {self.client} already answered this round's unmasking")
        self._answered = True
        x = _point(self.client)
        return UnmaskShares(
            self.client,
            {j: (x, s[0]) for j, s in self._held.items() if j in request.survivors},
            {j: (x, s[1]) for j, s in self._held.items() if j in request.dropped})


@dataclass
class SecureSum:
    """The coordinator's side of a secure round: routes shares, sums masked inputs, unmasks.

    ``graph_seed`` (public) fixes the neighbour graph. ``result`` after ``finish``: the integer
    sum of the delivered inputs (uint32 in Z_m) and how many clients it holds.
    """

    config: SecAggConfig
    round_id: int
    size: int
    graph_seed: int
    _roster: dict[int, AdvertiseKeys] = field(default_factory=dict, init=False, repr=False)
    _graph: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False)
    _sharers: set[int] = field(default_factory=set, init=False)
    _pending: dict[int, list[EncryptedShare]] = field(default_factory=dict, init=False,
                                                      repr=False)
    _total: np.ndarray | None = field(default=None, init=False, repr=False)
    _delivered: set[int] = field(default_factory=set, init=False)
    _sharing_closed: bool = field(default=False, init=False)

    @property
    def sharers(self) -> frozenset[int]:
        """The clients whose shares phase 2 has taken so far."""
        return frozenset(self._sharers)

    @property
    def graph(self) -> dict[int, tuple[int, ...]]:
        """Each client's neighbours, once phase 1 closed (empty before)."""
        return dict(self._graph)

    def collect_keys(self, adverts: Iterable[AdvertiseKeys]) -> list[AdvertiseKeys]:
        """Phase 1: the roster every client of phase 2 gets (clients in id order)."""
        for advert in adverts:
            if advert.client in self._roster:
                raise SecAggError(f"client {advert.client} advertised twice")
            self._roster[advert.client] = advert
        if len(self._roster) < 2:
            raise SecAggAborted(f"{len(self._roster)} client advertised keys; a secure sum "
                                f"needs at least 2")
        self._graph = neighbours(self._roster, self.config.neighbours, self.graph_seed)
        return [self._roster[c] for c in sorted(self._roster)]

    def collect_shares(self, client: int, shares: list[EncryptedShare]) -> None:
        """Phase 2: one client's encrypted shares, all of its neighbours' or none."""
        if self._sharing_closed or client not in self._graph or client in self._sharers:
            raise SecAggError(f"client {client} cannot share keys now")
        if sorted(s.receiver for s in shares) != list(self._graph[client]) or any(
                s.sender != client for s in shares):
            raise SecAggError(f"client {client} must send one share to each neighbour")
        self._sharers.add(client)
        for share in shares:
            self._pending.setdefault(share.receiver, []).append(share)

    def close_sharing(self) -> frozenset[int]:
        """End phase 2 (its deadline): the clients that shared keys, who alone go on.

        A client masks with exactly the neighbours whose shares it is given, so shares are
        handed out only once the set is final.
        """
        self._sharing_closed = True
        return frozenset(self._sharers)

    def shares_for(self, client: int) -> list[EncryptedShare]:
        """Phase 2's answer to ``client``: the shares of its neighbours that finished phase 2."""
        if not self._sharing_closed:
            raise SecAggError("shares are handed out once phase 2 is closed")
        if client not in self._sharers:
            raise SecAggError(f"client {client} did not share its keys")
        return [s for s in self._pending.get(client, []) if s.sender in self._sharers]

    def collect_masked(self, masked: MaskedInput) -> None:
        """Phase 3: add one masked input to the running sum (the vector is not kept)."""
        if masked.client not in self._sharers or masked.client in self._delivered:
            raise SecAggError(f"client {masked.client} cannot deliver a masked input now")
        values = np.asarray(masked.values, dtype=np.uint32)
        if values.shape != (self.size,) or np.any(values >= self.config.modulus):
            raise SecAggError(f"client {masked.client}'s masked input is not {self.size} "
                              f"values in Z_m")
        self._total = values.copy() if self._total is None else self._total + values
        self._delivered.add(masked.client)

    def unmask_request(self) -> UnmaskRequest:
        """Phase 4: who delivered and who shared keys but did not."""
        if len(self._delivered) < 2:
            raise SecAggAborted(f"{len(self._delivered)} masked inputs delivered; the sum of "
                                f"fewer than 2 would be an individual update")
        return UnmaskRequest(frozenset(self._delivered),
                             frozenset(self._sharers - self._delivered))

    def check_answer(self, answer: UnmaskShares) -> None:
        """Refuse (``SecAggError``) an unmask answer the round cannot use as it is: from a
        client that did not share keys, a share of another client than one of its neighbours
        that the unmask request names (a seed share for a survivor, a key share for a dropped
        client, never both for one client), at another point than the answering client's
        (``id + 1``), or a value outside the field. Read as sent, such a share would rebuild
        a wrong secret and flush a wrong sum."""
        request = self.unmask_request()
        client = answer.client
        if client not in self._sharers:
            raise SecAggError(f"client {client} did not share keys in this round")
        asked = set(self._graph[client])
        for shares, owners, what in ((answer.seed_shares, request.survivors, "seed"),
                                     (answer.key_shares, request.dropped, "key")):
            wrong = sorted(set(shares) - (asked & owners))
            if wrong:
                raise SecAggError(f"client {client} answers {what} shares for {wrong}: not "
                                  f"its neighbours that the unmask request names so")
            for owner, (x, y) in shares.items():
                if x != _point(client) or not 0 <= y < shamir.PRIME:
                    raise SecAggError(f"client {client}'s share of client {owner}'s {what} "
                                      f"is not at its point {_point(client)} in the field")

    def can_finish(self, answers: Iterable[UnmaskShares]) -> bool:
        """Whether ``answers`` already rebuild every secret ``finish`` needs (each survivor's
        self-mask seed, each dropped client's mask key): phase 4 need not wait for the rest."""
        request = self.unmask_request()
        seeds: dict[int, int] = {}
        keys: dict[int, int] = {}
        for answer in answers:
            if answer.client in self._sharers:
                for owner in answer.seed_shares:
                    seeds[owner] = seeds.get(owner, 0) + 1
                for owner in answer.key_shares:
                    keys[owner] = keys.get(owner, 0) + 1
        return (all(seeds.get(i, 0) >= self._needed(i) for i in request.survivors)
                and all(keys.get(i, 0) >= self._needed(i) for i in request.dropped))

    def rebuildable(self, survivors: Iterable[int]) -> bool:
        """Whether the unmask answers of ``survivors`` alone (sharers, each holding its
        neighbours' shares) would rebuild every secret unmasking needs: each survivor's
        self-mask seed and the mask key of every other sharer (dropped)."""
        alive = set(survivors)
        return all(len(alive.intersection(self._graph[owner])) >= self._needed(owner)
                   for owner in self._sharers | alive)

    def _needed(self, owner: int) -> int:
        return self.config.shares_needed(len(self._graph[owner]))

    def finish(self, answers: Iterable[UnmaskShares]) -> tuple[np.ndarray, int]:
        """The unmasked integer sum (uint32, in Z_m) of the delivered inputs and their count.

        ``SecAggAborted`` naming the client whose secret too few neighbours answered for.
        """
        request = self.unmask_request()
        seed_shares: dict[int, list[tuple[int, int]]] = {}
        key_shares: dict[int, list[tuple[int, int]]] = {}
        for answer in answers:
            if answer.client not in self._sharers:
                continue  # not part of the round: its "shares" are no one's
            for owner, share in answer.seed_shares.items():
                seed_shares.setdefault(owner, []).append(share)
            for owner, share in answer.key_shares.items():
                key_shares.setdefault(owner, []).append(share)
        assert self._total is not None
        total = self._total.copy()
        for i in sorted(request.survivors):
            self_seed = self._rebuild(i, seed_shares.get(i, []), "self-mask seed")
            total -= crypto.expand(crypto.element_bytes(self_seed), self.size)
        for i in sorted(request.dropped):
            key = self._rebuild(i, key_shares.get(i, []), "mask key")
            for j in self._graph[i]:
                if j in request.survivors:  # j masked with i: remove what j added
                    pair = crypto.agree(key, self._roster[j].mask_public, "mask", self.round_id)
                    total -= _mask_of(pair, self.size, _sign(j, i))
        return total & np.uint32(self.config.modulus - 1), len(request.survivors)

    def _rebuild(self, owner: int, shares: list[tuple[int, int]], what: str) -> int:
        needed = self._needed(owner)
        if len(shares) < needed:
            raise SecAggAborted(f"client {owner}'s {what} cannot be rebuilt: {len(shares)} of "
                                f"its {len(self._graph[owner])} neighbours answered, {needed} "
                                f"needed")
        return shamir.reconstruct(shares, needed)
