from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_KIND_TRAIN: _ClassVar[TaskKind]
    TASK_KIND_EVALUATE: _ClassVar[TaskKind]

class RefusalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_REASON_UNSPECIFIED: _ClassVar[RefusalReason]
    REFUSAL_REASON_TOO_STALE: _ClassVar[RefusalReason]
    REFUSAL_REASON_TASK_CLOSED: _ClassVar[RefusalReason]
    REFUSAL_REASON_ALREADY_ACCEPTED: _ClassVar[RefusalReason]
    REFUSAL_REASON_RUN_OVER: _ClassVar[RefusalReason]
    REFUSAL_REASON_PARTIAL_DROPPED: _ClassVar[RefusalReason]
    REFUSAL_REASON_NO_WORK: _ClassVar[RefusalReason]
    REFUSAL_REASON_MODEL_GONE: _ClassVar[RefusalReason]
    REFUSAL_REASON_UPLOAD_INCOMPLETE: _ClassVar[RefusalReason]
    REFUSAL_REASON_PROBES_OFF: _ClassVar[RefusalReason]
    REFUSAL_REASON_INVALID_UPDATE: _ClassVar[RefusalReason]
    REFUSAL_REASON_CORRUPT_UPDATE: _ClassVar[RefusalReason]
    REFUSAL_REASON_TOO_LARGE: _ClassVar[RefusalReason]
    REFUSAL_REASON_UNKNOWN_TASK: _ClassVar[RefusalReason]
    REFUSAL_REASON_NOT_PERMITTED: _ClassVar[RefusalReason]
    REFUSAL_REASON_NEW_KEYS: _ClassVar[RefusalReason]
TASK_KIND_TRAIN: TaskKind
TASK_KIND_EVALUATE: TaskKind
REFUSAL_REASON_UNSPECIFIED: RefusalReason
REFUSAL_REASON_TOO_STALE: RefusalReason
REFUSAL_REASON_TASK_CLOSED: RefusalReason
REFUSAL_REASON_ALREADY_ACCEPTED: RefusalReason
REFUSAL_REASON_RUN_OVER: RefusalReason
REFUSAL_REASON_PARTIAL_DROPPED: RefusalReason
REFUSAL_REASON_NO_WORK: RefusalReason
REFUSAL_REASON_MODEL_GONE: RefusalReason
REFUSAL_REASON_UPLOAD_INCOMPLETE: RefusalReason
REFUSAL_REASON_PROBES_OFF: RefusalReason
REFUSAL_REASON_INVALID_UPDATE: RefusalReason
REFUSAL_REASON_CORRUPT_UPDATE: RefusalReason
REFUSAL_REASON_TOO_LARGE: RefusalReason
REFUSAL_REASON_UNKNOWN_TASK: RefusalReason
REFUSAL_REASON_NOT_PERMITTED: RefusalReason
REFUSAL_REASON_NEW_KEYS: RefusalReason

class TensorHeader(_message.Message):
    __slots__ = ("encoding", "shape", "dtype", "num_bytes", "checksum", "codec_params", "values_checksum")
    class CodecParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CODEC_PARAMS_FIELD_NUMBER: _ClassVar[int]
    VALUES_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    encoding: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    num_bytes: int
    checksum: str
    codec_params: _containers.ScalarMap[str, str]
    values_checksum: str
    def __init__(self, encoding: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., num_bytes: _Optional[int] = ..., checksum: _Optional[str] = ..., codec_params: _Optional[_Mapping[str, str]] = ..., values_checksum: _Optional[str] = ...) -> None: ...

class RunConfig(_message.Message):
    __slots__ = ("run_name", "num_parameters", "local_steps", "local_epochs", "batch_size", "learning_rate", "chunk_bytes", "heartbeat_interval_s", "max_staleness", "accepted_encodings", "trainer_options", "inline_bytes", "max_chunk_bytes", "long_poll_s", "max_update_bytes", "max_string_bytes", "max_metadata_entries", "max_uploads_per_client", "requests_per_s", "request_burst", "max_metadata_bytes", "max_examples_per_update", "max_open_uploads_per_client", "secure")
    class TrainerOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    TRAINER_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    INLINE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LONG_POLL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_UPDATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STRING_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_METADATA_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_UPLOADS_PER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BURST_FIELD_NUMBER: _ClassVar[int]
    MAX_METADATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_EXAMPLES_PER_UPDATE_FIELD_NUMBER: _ClassVar[int]
    MAX_OPEN_UPLOADS_PER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    SECURE_FIELD_NUMBER: _ClassVar[int]
    run_name: str
    num_parameters: int
    local_steps: int
    local_epochs: int
    batch_size: int
    learning_rate: float
    chunk_bytes: int
    heartbeat_interval_s: float
    max_staleness: int
    accepted_encodings: _containers.RepeatedScalarFieldContainer[str]
    trainer_options: _containers.ScalarMap[str, str]
    inline_bytes: int
    max_chunk_bytes: int
    long_poll_s: float
    max_update_bytes: int
    max_string_bytes: int
    max_metadata_entries: int
    max_uploads_per_client: int
    requests_per_s: float
    request_burst: int
    max_metadata_bytes: int
    max_examples_per_update: int
    max_open_uploads_per_client: int
    secure: SecureSettings
    def __init__(self, run_name: _Optional[str] = ..., num_parameters: _Optional[int] = ..., local_steps: _Optional[int] = ..., local_epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., chunk_bytes: _Optional[int] = ..., heartbeat_interval_s: _Optional[float] = ..., max_staleness: _Optional[int] = ..., accepted_encodings: _Optional[_Iterable[str]] = ..., trainer_options: _Optional[_Mapping[str, str]] = ..., inline_bytes: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ..., long_poll_s: _Optional[float] = ..., max_update_bytes: _Optional[int] = ..., max_string_bytes: _Optional[int] = ..., max_metadata_entries: _Optional[int] = ..., max_uploads_per_client: _Optional[int] = ..., requests_per_s: _Optional[float] = ..., request_burst: _Optional[int] = ..., max_metadata_bytes: _Optional[int] = ..., max_examples_per_update: _Optional[int] = ..., max_open_uploads_per_client: _Optional[int] = ..., secure: _Optional[_Union[SecureSettings, _Mapping]] = ...) -> None: ...

class SecureSettings(_message.Message):
    __slots__ = ("modulus_bits", "quantization_bits", "clip", "max_clients", "neighbours", "threshold", "phase_s", "density", "randk_seed", "ddp_noise_multiplier", "ddp_clip_norm", "ddp_granularity_bits", "ddp_noise_shares")
    MODULUS_BITS_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_BITS_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PHASE_S_FIELD_NUMBER: _ClassVar[int]
    DENSITY_FIELD_NUMBER: _ClassVar[int]
    RANDK_SEED_FIELD_NUMBER: _ClassVar[int]
    DDP_NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    DDP_CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    DDP_GRANULARITY_BITS_FIELD_NUMBER: _ClassVar[int]
    DDP_NOISE_SHARES_FIELD_NUMBER: _ClassVar[int]
    modulus_bits: int
    quantization_bits: int
    clip: float
    max_clients: int
    neighbours: int
    threshold: float
    phase_s: float
    density: float
    randk_seed: int
    ddp_noise_multiplier: float
    ddp_clip_norm: float
    ddp_granularity_bits: int
    ddp_noise_shares: int
    def __init__(self, modulus_bits: _Optional[int] = ..., quantization_bits: _Optional[int] = ..., clip: _Optional[float] = ..., max_clients: _Optional[int] = ..., neighbours: _Optional[int] = ..., threshold: _Optional[float] = ..., phase_s: _Optional[float] = ..., density: _Optional[float] = ..., randk_seed: _Optional[int] = ..., ddp_noise_multiplier: _Optional[float] = ..., ddp_clip_norm: _Optional[float] = ..., ddp_granularity_bits: _Optional[int] = ..., ddp_noise_shares: _Optional[int] = ...) -> None: ...

class SecureMember(_message.Message):
    __slots__ = ("index", "cipher_public", "mask_public")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CIPHER_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MASK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    index: int
    cipher_public: bytes
    mask_public: bytes
    def __init__(self, index: _Optional[int] = ..., cipher_public: _Optional[bytes] = ..., mask_public: _Optional[bytes] = ...) -> None: ...

class SecureAdvertiseRequest(_message.Message):
    __slots__ = ("client_id", "task_id", "cipher_public", "mask_public")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CIPHER_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MASK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    cipher_public: bytes
    mask_public: bytes
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., cipher_public: _Optional[bytes] = ..., mask_public: _Optional[bytes] = ...) -> None: ...

class SecureAdvertiseReply(_message.Message):
    __slots__ = ("index", "round_id", "graph_seed", "members", "weight")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEED_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    index: int
    round_id: int
    graph_seed: int
    members: _containers.RepeatedCompositeFieldContainer[SecureMember]
    weight: float
    def __init__(self, index: _Optional[int] = ..., round_id: _Optional[int] = ..., graph_seed: _Optional[int] = ..., members: _Optional[_Iterable[_Union[SecureMember, _Mapping]]] = ..., weight: _Optional[float] = ...) -> None: ...

class SecureShare(_message.Message):
    __slots__ = ("sender", "receiver", "ciphertext")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    sender: int
    receiver: int
    ciphertext: bytes
    def __init__(self, sender: _Optional[int] = ..., receiver: _Optional[int] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class SecureShareRequest(_message.Message):
    __slots__ = ("client_id", "task_id", "shares")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    shares: _containers.RepeatedCompositeFieldContainer[SecureShare]
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., shares: _Optional[_Iterable[_Union[SecureShare, _Mapping]]] = ...) -> None: ...

class SecureShareReply(_message.Message):
    __slots__ = ("shares",)
    SHARES_FIELD_NUMBER: _ClassVar[int]
    shares: _containers.RepeatedCompositeFieldContainer[SecureShare]
    def __init__(self, shares: _Optional[_Iterable[_Union[SecureShare, _Mapping]]] = ...) -> None: ...

class SecureMaskedRequest(_message.Message):
    __slots__ = ("client_id", "task_id", "values", "num_values", "num_examples", "steps_completed", "steps_planned", "upload_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NUM_VALUES_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    STEPS_PLANNED_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    values: bytes
    num_values: int
    num_examples: int
    steps_completed: int
    steps_planned: int
    upload_id: str
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., values: _Optional[bytes] = ..., num_values: _Optional[int] = ..., num_examples: _Optional[int] = ..., steps_completed: _Optional[int] = ..., steps_planned: _Optional[int] = ..., upload_id: _Optional[str] = ...) -> None: ...

class SecureMaskedReply(_message.Message):
    __slots__ = ("survivors", "dropped")
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    survivors: _containers.RepeatedScalarFieldContainer[int]
    dropped: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, survivors: _Optional[_Iterable[int]] = ..., dropped: _Optional[_Iterable[int]] = ...) -> None: ...

class ShamirShare(_message.Message):
    __slots__ = ("owner", "x", "y")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    owner: int
    x: int
    y: bytes
    def __init__(self, owner: _Optional[int] = ..., x: _Optional[int] = ..., y: _Optional[bytes] = ...) -> None: ...

class SecureUnmaskRequest(_message.Message):
    __slots__ = ("client_id", "task_id", "seed_shares", "key_shares")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_SHARES_FIELD_NUMBER: _ClassVar[int]
    KEY_SHARES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    seed_shares: _containers.RepeatedCompositeFieldContainer[ShamirShare]
    key_shares: _containers.RepeatedCompositeFieldContainer[ShamirShare]
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., seed_shares: _Optional[_Iterable[_Union[ShamirShare, _Mapping]]] = ..., key_shares: _Optional[_Iterable[_Union[ShamirShare, _Mapping]]] = ...) -> None: ...

class SecureUnmaskReply(_message.Message):
    __slots__ = ("flushed_version",)
    FLUSHED_VERSION_FIELD_NUMBER: _ClassVar[int]
    flushed_version: int
    def __init__(self, flushed_version: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("client_name", "token", "num_examples", "metadata", "instance_key", "capabilities")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_KEY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    token: str
    num_examples: int
    metadata: _containers.ScalarMap[str, str]
    instance_key: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_name: _Optional[str] = ..., token: _Optional[str] = ..., num_examples: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., instance_key: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("client_id", "config")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    config: RunConfig
    def __init__(self, client_id: _Optional[str] = ..., config: _Optional[_Union[RunConfig, _Mapping]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("client_id", "held_version")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_VERSION_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    held_version: int
    def __init__(self, client_id: _Optional[str] = ..., held_version: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "model_version", "local_steps", "local_epochs", "deadline_s", "model", "delta", "delta_base_version", "options", "model_data", "delta_data", "kind")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_DATA_FIELD_NUMBER: _ClassVar[int]
    DELTA_DATA_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    model_version: int
    local_steps: int
    local_epochs: int
    deadline_s: float
    model: TensorHeader
    delta: TensorHeader
    delta_base_version: int
    options: _containers.ScalarMap[str, str]
    model_data: bytes
    delta_data: bytes
    kind: TaskKind
    def __init__(self, task_id: _Optional[str] = ..., model_version: _Optional[int] = ..., local_steps: _Optional[int] = ..., local_epochs: _Optional[int] = ..., deadline_s: _Optional[float] = ..., model: _Optional[_Union[TensorHeader, _Mapping]] = ..., delta: _Optional[_Union[TensorHeader, _Mapping]] = ..., delta_base_version: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ..., model_data: _Optional[bytes] = ..., delta_data: _Optional[bytes] = ..., kind: _Optional[_Union[TaskKind, str]] = ...) -> None: ...

class Wait(_message.Message):
    __slots__ = ("retry_after_s", "reason")
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    retry_after_s: float
    reason: str
    def __init__(self, retry_after_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class GetTaskReply(_message.Message):
    __slots__ = ("task", "wait", "finished")
    TASK_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    task: Task
    wait: Wait
    finished: Finished
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., wait: _Optional[_Union[Wait, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("client_id", "task_id", "offset", "max_chunk_bytes", "delta", "end_offset")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    offset: int
    max_chunk_bytes: int
    delta: bool
    end_offset: int
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., offset: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ..., delta: _Optional[bool] = ..., end_offset: _Optional[int] = ...) -> None: ...

class DataChunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadChunk(_message.Message):
    __slots__ = ("client_id", "upload_id", "offset", "data")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    upload_id: str
    offset: int
    data: bytes
    def __init__(self, client_id: _Optional[str] = ..., upload_id: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadReply(_message.Message):
    __slots__ = ("upload_id", "committed_offset")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    committed_offset: int
    def __init__(self, upload_id: _Optional[str] = ..., committed_offset: _Optional[int] = ...) -> None: ...

class UploadStatusRequest(_message.Message):
    __slots__ = ("client_id", "upload_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    upload_id: str
    def __init__(self, client_id: _Optional[str] = ..., upload_id: _Optional[str] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("client_id", "upload_id", "task_id", "base_version", "num_examples", "steps_completed", "steps_planned", "update", "metrics", "update_data")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    STEPS_PLANNED_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_DATA_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    upload_id: str
    task_id: str
    base_version: int
    num_examples: int
    steps_completed: int
    steps_planned: int
    update: TensorHeader
    metrics: _containers.ScalarMap[str, float]
    update_data: bytes
    def __init__(self, client_id: _Optional[str] = ..., upload_id: _Optional[str] = ..., task_id: _Optional[str] = ..., base_version: _Optional[int] = ..., num_examples: _Optional[int] = ..., steps_completed: _Optional[int] = ..., steps_planned: _Optional[int] = ..., update: _Optional[_Union[TensorHeader, _Mapping]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., update_data: _Optional[bytes] = ...) -> None: ...

class CommitReply(_message.Message):
    __slots__ = ("upload_id", "model_version", "staleness", "accepted_version", "flushed_version", "refusal", "refusal_detail")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_VERSION_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_DETAIL_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    model_version: int
    staleness: int
    accepted_version: int
    flushed_version: int
    refusal: RefusalReason
    refusal_detail: str
    def __init__(self, upload_id: _Optional[str] = ..., model_version: _Optional[int] = ..., staleness: _Optional[int] = ..., accepted_version: _Optional[int] = ..., flushed_version: _Optional[int] = ..., refusal: _Optional[_Union[RefusalReason, str]] = ..., refusal_detail: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("client_id", "task_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("model_version", "task_open")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_OPEN_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    task_open: bool
    def __init__(self, model_version: _Optional[int] = ..., task_open: _Optional[bool] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("client_id", "reason", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    reason: str
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, client_id: _Optional[str] = ..., reason: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EvaluationReport(_message.Message):
    __slots__ = ("client_id", "task_id", "model_version", "num_examples", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    model_version: int
    num_examples: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., model_version: _Optional[int] = ..., num_examples: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class EvaluationAck(_message.Message):
    __slots__ = ("task_id", "duplicate")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    duplicate: bool
    def __init__(self, task_id: _Optional[str] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("payload", "reply_bytes")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REPLY_BYTES_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    reply_bytes: int
    def __init__(self, payload: _Optional[bytes] = ..., reply_bytes: _Optional[int] = ...) -> None: ...

class ProbeReply(_message.Message):
    __slots__ = ("payload", "received_bytes", "model_bytes", "max_bytes")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    received_bytes: int
    model_bytes: int
    max_bytes: int
    def __init__(self, payload: _Optional[bytes] = ..., received_bytes: _Optional[int] = ..., model_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...
