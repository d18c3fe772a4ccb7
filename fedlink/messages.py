"""fedlink's own message types: what the protocol says, free of protobuf.

Each class mirrors one message of ``protos/fedlink/v1/coordinator.proto``; ``fedlink.wire``
is the only place that converts between the two. Domain code (coordinator handlers, the client
SDK) works with these.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from fedlink.refusals import RefusalCode, refusal_code


@dataclass(frozen=True)
class TensorHeader:
    """Describes one encoded tensor payload: codec, decoded shape and dtype, size, checksum."""

    encoding: str
    shape: tuple[int, ...]
    dtype: str
    num_bytes: int
    checksum: str
    codec_params: Mapping[str, str] = field(default_factory=dict)
    values_checksum: str = ""
    """``sha256:<hex>`` of the decoded values as little-endian float32 bytes ("" unknown)."""


@dataclass(frozen=True)
class RunConfig:
    """The run configuration every client receives at ``Join``."""

    run_name: str
    num_parameters: int
    local_steps: int = 0
    local_epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.05
    chunk_bytes: int = 1 << 20
    heartbeat_interval_s: float = 5.0
    max_staleness: int = 0
    accepted_encodings: tuple[str, ...] = ()
    trainer_options: Mapping[str, str] = field(default_factory=dict)
    inline_bytes: int = 0
    max_chunk_bytes: int = 0
    long_poll_s: float = 0.0
    max_update_bytes: int = 0
    max_string_bytes: int = 0
    max_metadata_entries: int = 0
    max_uploads_per_client: int = 0
    requests_per_s: float = 0.0
    request_burst: int = 0
    max_metadata_bytes: int = 0
    max_examples_per_update: int = 0
    max_open_uploads_per_client: int = 0
    secure: SecureSettings | None = None
    """Set: training tasks deliver through secure aggregation (the ``Secure*`` calls)."""


@dataclass(frozen=True)
class SecureSettings:
    """How a secure round encodes updates (``fedlink.secagg.SecAggConfig``'s fields; 0
    ``neighbours``: every other member of the group) and which coordinates it sends."""

    modulus_bits: int = 24
    quantization_bits: int = 16
    clip: float = 1.0
    max_clients: int = 255
    neighbours: int = 0
    threshold: float = 0.5
    phase_s: float = 10.0
    density: float = 0.0
    """Group random-k's fraction of coordinates (0, unset, or 1: every coordinate)."""
    randk_seed: int = 0
    """The run's public seed of the kept coordinates."""
    ddp_noise_multiplier: float = 0.0
    """Distributed DP (0: off): the sum of ``ddp_noise_shares`` clients' Skellam shares has
    standard deviation ``ddp_noise_multiplier * ddp_clip_norm``."""
    ddp_clip_norm: float = 0.0
    """Distributed DP: the L2 norm each update is clipped to."""
    ddp_granularity_bits: int = 0
    """Distributed DP: ``ddp_clip_norm`` is this many bits of integer units."""
    ddp_noise_shares: int = 0
    """Distributed DP: how many clients' noise shares make the whole noise."""


@dataclass(frozen=True)
class SecureMember:
    """One member of a secure group: its index and its two X25519 public keys."""

    index: int
    cipher_public: bytes
    mask_public: bytes


@dataclass(frozen=True)
class SecureAdvertiseRequest:
    """Secure phase 1: a client's public keys for its task's group."""

    client_id: str
    task_id: str
    cipher_public: bytes
    mask_public: bytes


@dataclass(frozen=True)
class SecureAdvertiseReply:
    """Secure phase 1's answer: the client's index and the group's roster."""

    index: int
    round_id: int
    graph_seed: int
    members: tuple[SecureMember, ...] = ()
    weight: float = 1.0
    """The staleness weight the client sums its update with (``[w * update, w]``)."""


@dataclass(frozen=True)
class SecureShare:
    """``sender``'s encrypted shares for ``receiver`` (the coordinator cannot read them)."""

    sender: int
    receiver: int
    ciphertext: bytes


@dataclass(frozen=True)
class SecureShareRequest:
    """Secure phase 2: a client's shares, one per neighbour."""

    client_id: str
    task_id: str
    shares: tuple[SecureShare, ...] = ()


@dataclass(frozen=True)
class SecureShareReply:
    """Secure phase 2's answer: the shares the client's neighbours sent it."""

    shares: tuple[SecureShare, ...] = ()


@dataclass(frozen=True)
class SecureMaskedRequest:
    """Secure phase 3: a client's masked update, packed ``modulus_bits`` bits a value, in
    ``values`` or (``upload_id``) sent before as a resumable upload."""

    client_id: str
    task_id: str
    values: bytes
    num_values: int
    num_examples: int = 0
    steps_completed: int = 0
    steps_planned: int = 0
    upload_id: str = ""


@dataclass(frozen=True)
class SecureMaskedReply:
    """Secure phase 3's answer: who delivered a masked update and who did not."""

    survivors: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()


@dataclass(frozen=True)
class ShamirShare:
    """A Shamir share ``(x, y)`` (``y``: 32 bytes, little-endian) of ``owner``'s secret."""

    owner: int
    x: int
    y: bytes


@dataclass(frozen=True)
class SecureUnmaskRequest:
    """Secure phase 4: a client's shares of survivors' seeds and dropped clients' keys."""

    client_id: str
    task_id: str
    seed_shares: tuple[ShamirShare, ...] = ()
    key_shares: tuple[ShamirShare, ...] = ()


@dataclass(frozen=True)
class SecureUnmaskReply:
    """Secure phase 4's answer: the version the group's sum made (0: the sum was lost)."""

    flushed_version: int = 0


@dataclass(frozen=True)
class JoinRequest:
    """A client asks to take part in the run."""

    client_name: str
    token: str = ""
    num_examples: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)
    instance_key: str = ""
    capabilities: tuple[str, ...] = ()
    """What the client can do beyond training (``EVALUATE_CAPABILITY``: it runs evaluation
    tasks); the coordinator sends only task kinds a client advertised."""


EVALUATE_CAPABILITY = "evaluate"
"""``JoinRequest.capabilities`` entry of a client that runs ``TaskKind.EVALUATE`` tasks."""


class TaskKind(enum.IntEnum):
    """What a task asks of its client (``fedlink.v1.TaskKind``)."""

    TRAIN = 0
    """Train from the model and commit an update (all a client before 0.3 knows)."""
    EVALUATE = 1
    """Score the model on the local data and report it (``EvaluationReport``); no update."""


@dataclass(frozen=True)
class JoinReply:
    """The coordinator's answer to ``Join``."""

    client_id: str
    config: RunConfig


@dataclass(frozen=True)
class GetTaskRequest:
    """A client asks for work."""

    client_id: str
    held_version: int = -1


@dataclass(frozen=True)
class Task:
    """Train from ``model_version`` and commit an update within ``deadline_s`` seconds."""

    task_id: str
    model_version: int
    local_steps: int
    local_epochs: int
    deadline_s: float
    model: TensorHeader
    delta: TensorHeader | None = None
    delta_base_version: int = -1
    options: Mapping[str, str] = field(default_factory=dict)
    model_data: bytes = b""
    delta_data: bytes = b""
    kind: TaskKind = TaskKind.TRAIN

    @property
    def has_delta(self) -> bool:
        """Whether the coordinator offers a delta from ``delta_base_version``."""
        return self.delta is not None and bool(self.delta.encoding)

    def delta_from(self, held_version: int) -> TensorHeader | None:
        """The delta a client holding ``held_version`` downloads instead of the whole model
        (``None``: none is offered from that version)."""
        if self.has_delta and self.delta_base_version == held_version:
            return self.delta
        return None


@dataclass(frozen=True)
class Wait:
    """No work now: ask again after ``retry_after_s`` seconds."""

    retry_after_s: float
    reason: str = ""


@dataclass(frozen=True)
class Finished:
    """The run is over."""

    reason: str = ""


TaskReply = Task | Wait | Finished


@dataclass(frozen=True)
class DownloadRequest:
    """Stream a task's model from ``offset``, up to ``end_offset`` (0: to the end)."""

    client_id: str
    task_id: str
    offset: int = 0
    max_chunk_bytes: int = 0
    delta: bool = False
    end_offset: int = 0


@dataclass(frozen=True)
class DataChunk:
    """A piece of a downloaded payload."""

    offset: int
    data: bytes


@dataclass(frozen=True)
class UploadChunk:
    """A piece of an uploaded payload, placed at ``offset`` of upload ``upload_id``."""

    client_id: str
    upload_id: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class UploadReply:
    """How many bytes of an upload the coordinator holds, contiguous from 0."""

    upload_id: str
    committed_offset: int


@dataclass(frozen=True)
class UploadStatusRequest:
    """Ask how much of an upload the coordinator holds."""

    client_id: str
    upload_id: str


@dataclass(frozen=True)
class CommitRequest:
    """Submit a fully uploaded update for aggregation."""

    client_id: str
    upload_id: str
    task_id: str
    base_version: int
    num_examples: int
    steps_completed: int
    steps_planned: int
    update: TensorHeader
    metrics: Mapping[str, float] = field(default_factory=dict)
    update_data: bytes = b""


@dataclass(frozen=True)
class CommitReply:
    """The update was accepted; or, with ``refusal`` set, why it was refused (the reply that
    rides in a refused commit's status details, ``fedlink.wire.refusal``)."""

    upload_id: str
    model_version: int
    staleness: int
    accepted_version: int | None = None
    """The version current when the update was accepted (``None``: not said, as in a
    refusal's details or a coordinator before protocol 1.1; 0 is a real version)."""
    flushed_version: int = 0
    """The version this commit's flush made; 0 when it triggered none."""
    refusal: RefusalCode = RefusalCode.NONE
    """Why the update was refused; ``NONE`` for an accepted one."""
    refusal_detail: str = ""
    """The readable detail of the refusal (the status message)."""

    def __post_init__(self) -> None:
        if not isinstance(self.refusal, RefusalCode):  # read back from JSON: its value
            object.__setattr__(self, "refusal", refusal_code(self.refusal))


@dataclass(frozen=True)
class HeartbeatRequest:
    """I am alive and working on ``task_id``."""

    client_id: str
    task_id: str = ""


@dataclass(frozen=True)
class HeartbeatReply:
    """The coordinator's current version and whether the task is still open."""

    model_version: int
    task_open: bool


@dataclass(frozen=True)
class EvaluationReport:
    """The result of an evaluation task: ``metrics`` of ``model_version`` on
    ``num_examples`` of the client's examples; with no example and no metric, the task's
    decline (``declines``)."""

    client_id: str
    task_id: str
    model_version: int
    num_examples: int
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def declines(self) -> bool:
        """Whether the client declines the task (protocol 1.2): it could not score the model
        (no local example, or a score that is not a finite number)."""
        return self.num_examples == 0 and not self.metrics


@dataclass(frozen=True)
class EvaluationAck:
    """The report was accepted; ``duplicate``: it had been already (this one counted nothing)."""

    task_id: str
    duplicate: bool = False


@dataclass(frozen=True)
class LeaveRequest:
    """A client leaves the run."""

    client_id: str
    reason: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LeaveReply:
    """Acknowledges ``Leave``."""
