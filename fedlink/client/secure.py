"""One task's side of secure aggregation on a real client: the messages of the four phases.

``SecureDelivery`` wraps a ``fedlink.secagg.SecureClient`` and turns each phase into its
request and each answer back into what the next phase needs. The first two phases (advertise,
share) need no update: a delivery is made when its task starts, and they run while the client
downloads and trains; ``trained`` then hands it the update for the last two (masked upload,
unmask). ``ClientSession`` and the virtual loop perform the calls; it does no I/O itself. The
update is clipped, quantized and masked here, on the client: what leaves is a vector the
coordinator can read only summed with the rest of the group.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np

from fedlink.messages import (
    SecureAdvertiseReply,
    SecureAdvertiseRequest,
    SecureMaskedReply,
    SecureMaskedRequest,
    SecureSettings,
    SecureShare,
    SecureShareReply,
    SecureShareRequest,
    SecureUnmaskRequest,
    ShamirShare,
    Task,
)
from fedlink.secagg import (
    AdvertiseKeys,
    EncryptedShare,
    SecAggConfig,
    SecureClient,
    SkellamConfig,
    UnmaskRequest,
    encode_weighted,
)
from fedlink.secagg.crypto import element_bytes
from fedlink.secagg.encoding import Encoded, decode_sum
from fedlink.secagg.packing import pack
from fedlink.secagg.shamir import RandomBelow
from fedlink.secagg.sparse import SharedRandK, group_indices, masked_size

WEIGHT = 1.0
"""A fresh update's weight in a secure sum: every delivering client weighs the same (its
example count, reported in the clear beside the masked vector for the run's records, weighs
nothing: a weight from it would be a claim inside the sum that nobody could check); an update
trained on an older model is discounted by the staleness weight its roster names."""


def secagg_config(settings: SecureSettings) -> SecAggConfig:
    """The ``SecAggConfig`` the run's ``RunConfig.secure`` describes."""
    return SecAggConfig(modulus_bits=settings.modulus_bits,
                        quantization_bits=settings.quantization_bits, clip=settings.clip,
                        max_clients=settings.max_clients,
                        neighbours=settings.neighbours or None, threshold=settings.threshold)


def skellam_config(settings: SecureSettings, size: int) -> SkellamConfig:
    """The ``SkellamConfig`` of a run with distributed DP, for ``size`` values a member sends."""
    return SkellamConfig(settings.ddp_clip_norm, settings.ddp_noise_multiplier,
                         settings.ddp_noise_shares, size, settings.ddp_granularity_bits,
                         settings.modulus_bits, settings.max_clients)


@dataclass
class SecureDelivery:
    """One task's secure delivery to the secure group the coordinator puts it in: its keys
    from the start (``num_parameters``: the model's size), ``delta`` (the update after the
    privacy stage) once ``trained``."""

    client_id: str
    task: Task
    settings: SecureSettings
    num_parameters: int
    random_below: RandomBelow = field(default=secrets.randbelow, repr=False)
    """Where the keys and the Shamir coefficients come from (a CSPRNG; a golden recording
    gives its own, to write every draw down)."""
    delta: np.ndarray | None = field(default=None, init=False, repr=False)
    num_examples: int = field(default=0, init=False)
    steps_completed: int = field(default=0, init=False)
    steps_planned: int = field(default=0, init=False)
    residual: np.ndarray | None = field(default=None, init=False, repr=False)
    """Under group random-k: what earlier tasks kept back (error feedback; not modified)."""
    next_residual: np.ndarray | None = field(default=None, init=False, repr=False)
    """Under group random-k, after ``masked``: the residual once this update is in a sum."""
    values_clipped: int = field(default=0, init=False)
    """After ``masked``: how many of the update's sent values lay beyond the ring's
    ``[-clip, clip]`` and were clipped (0 under distributed DP, which clips the norm)."""
    config: SecAggConfig = field(init=False)
    client: SecureClient = field(init=False, repr=False)
    _roster: list[AdvertiseKeys] = field(default_factory=list, init=False, repr=False)
    _graph_seed: int = field(default=0, init=False)
    _weight: float = field(default=WEIGHT, init=False)
    _heard: SecureMaskedReply | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.config = secagg_config(self.settings)
        self.client = SecureClient(0, self.config, self.task.model_version,
                                   masked_size(self.settings.density, self.num_parameters,
                                               weighted=not self.ddp), self.random_below)

    def trained(self, delta: np.ndarray, num_examples: int, steps_completed: int,
                steps_planned: int, residual: np.ndarray | None = None) -> None:
        """The task's update (``residual``: under group random-k, what earlier tasks kept
        back), for the masked upload."""
        if delta.size != self.num_parameters:
            raise ValueError(f"an update of {delta.size} values for a model of "
                             f"{self.num_parameters}")
        self.delta, self.residual = delta, residual
        self.num_examples, self.steps_completed = num_examples, steps_completed
        self.steps_planned = steps_planned

    @property
    def ddp(self) -> bool:
        """Whether this run adds distributed-DP noise (``SecureSettings.ddp_*``)."""
        return self.settings.ddp_noise_multiplier > 0

    def advertise(self) -> SecureAdvertiseRequest:
        """Phase 1's request: the two public keys."""
        keys = self.client.advertise()
        return SecureAdvertiseRequest(self.client_id, self.task.task_id, keys.cipher_public,
                                      keys.mask_public)

    def roster(self, reply: SecureAdvertiseReply) -> None:
        """Phase 1's answer: this client's index and the group's keys."""
        self.client.client, self.client.round_id = reply.index, reply.round_id
        self._graph_seed = reply.graph_seed
        self._weight = reply.weight or WEIGHT  # unset on the wire: a fresh update
        self._roster = [AdvertiseKeys(m.index, m.cipher_public, m.mask_public)
                        for m in reply.members]

    def share(self) -> SecureShareRequest:
        """Phase 2's request: this client's secrets, shared and encrypted per neighbour."""
        shares = self.client.share_keys(self._roster, self._graph_seed)
        return SecureShareRequest(self.client_id, self.task.task_id, tuple(
            SecureShare(s.sender, s.receiver, s.ciphertext) for s in shares))

    def shared(self, reply: SecureShareReply) -> None:
        """Phase 2's answer: the neighbours' shares for this client."""
        self.client.receive_shares(EncryptedShare(s.sender, s.receiver, s.ciphertext)
                                   for s in reply.shares)

    def masked(self, rng: np.random.Generator) -> SecureMaskedRequest:
        """Phase 3's request: ``[w * delta, w]`` in Z_m (``w``: the roster's staleness
        weight), masked and packed; under group random-k, only the group's kept coordinates
        of ``delta`` plus the residual."""
        if self.delta is None:
            raise ValueError("no update yet: masked() needs trained() first")
        indices = group_indices(self.settings.density, self.settings.randk_seed,
                                self.client.round_id, self.num_parameters)
        if self.ddp:
            values = self._noised(indices, rng)
        else:
            encoded = (encode_weighted(self.delta, self._weight, self.config, rng)
                       if indices is None else self._encode_kept(indices, rng))
            values, self.values_clipped = encoded.values, encoded.clipped
        masked = self.client.masked_input(values)
        return SecureMaskedRequest(self.client_id, self.task.task_id,
                                   pack(masked.values, self.config.modulus_bits),
                                   int(masked.values.size), self.num_examples,
                                   self.steps_completed, self.steps_planned)

    def _encode_kept(self, indices: np.ndarray, rng: np.random.Generator) -> Encoded:
        """The group's kept coordinates of ``delta`` plus the residual, encoded; the rest,
        and what the encoding lost of the kept values (clipping, rounding), is the
        ``next_residual``."""
        randk = SharedRandK(self.settings.density)
        assert self.delta is not None  # masked() checked
        kept, residual = randk.keep(self.delta, self.residual, indices)
        encoded = encode_weighted(kept, self._weight, self.config, rng)
        sent = decode_sum(encoded.values[:-1], 1, self.config) / self._weight
        randk.carry(residual, indices, kept, sent)
        self.next_residual = residual.astype(np.float32)
        return encoded

    def _noised(self, indices: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        """Distributed DP: the (kept coordinates of the) update clipped to ``ddp_clip_norm``,
        weighted, in integer units, plus this client's share of Skellam noise. Under group
        random-k the residual keeps the unsent coordinates and what clipping cut, never the
        rounding or the noise (feeding noise back would take it out again)."""
        assert self.delta is not None  # masked() checked
        values = np.asarray(self.delta, np.float64)
        if indices is not None:
            randk = SharedRandK(self.settings.density)
            values, residual = randk.keep(values, self.residual, indices)
        clipped = values * min(1.0, self.settings.ddp_clip_norm / max(
            float(np.linalg.norm(values)), 1e-300))
        if indices is not None:
            randk.carry(residual, indices, values, clipped)
            self.next_residual = residual.astype(np.float32)
        return skellam_config(self.settings, clipped.size).encode(self._weight * clipped, rng)

    def heard(self, reply: SecureMaskedReply) -> None:
        """Phase 3's answer: who delivered and who dropped."""
        self._heard = reply

    def unmask(self) -> SecureUnmaskRequest:
        """Phase 4's request: shares of the survivors' seeds and the dropped clients' keys."""
        assert self._heard is not None
        answer = self.client.unmask(UnmaskRequest(frozenset(self._heard.survivors),
                                                  frozenset(self._heard.dropped)))
        return SecureUnmaskRequest(
            self.client_id, self.task.task_id,
            tuple(ShamirShare(o, x, element_bytes(y)) for o, (x, y) in
                  sorted(answer.seed_shares.items())),
            tuple(ShamirShare(o, x, element_bytes(y)) for o, (x, y) in
                  sorted(answer.key_shares.items())))

