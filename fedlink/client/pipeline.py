"""The client's update pipeline: delta -> privacy -> compression -> payload.

The order is fixed by construction (see ``fedlink.privacy.base``): a privacy stage maps a
vector to a vector, then a codec maps a vector to bytes. Privacy must come first: a
differential-privacy guarantee is stated for the privatised vector, and whatever is computed
from it afterwards (error feedback, quantisation, sparsification) is post-processing, which
cannot weaken it. Compressing first would let the codec's data-dependent choices (which
coordinates top-k keeps, a quantiser's scale) leave the device unclipped and un-noised.

By kind (``docs/model-state.md``): once the pipeline knows the model's ``ParamSpec``
(``bind``; a session binds its trainer's), privacy clips and noises the trainable weights
only. Buffers and counters are not a gradient: clipping would shrink a running variance and
noise could make it negative. Nor can they leave a private client un-noised, so with a privacy
stage their delta must be zero (kept on the client, ``keep_local``): ``check_state`` refuses
such a configuration before a run, and ``process`` refuses an update that breaks the rule.
Compression likewise: a codec that is not lossless is wrapped in ``split``
(``fedlink.compress.split``), so it encodes the trainable weights and buffers and counters
travel as their exact float32 values (a sparsifier would drop a running variance's change,
``sign`` replace it, stochastic quantization could make it negative).

Compression: error feedback (``fedlink.client.feedback``) runs between the privacy stage and
the codec, on by default for biased codecs (``error_feedback=None``); with a
``DensityPolicy`` a sparsifying codec's density follows the upload goodput and the time left
before the task's deadline (``fedlink.client.density``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedlink.client.density import DensityPolicy, GoodputMeter
from fedlink.client.feedback import RESIDUAL_FILENAME, ErrorFeedback
from fedlink.compress import Codec, Sparsifier, get_codec
from fedlink.compress.split import SplitCodec, ranges_of
from fedlink.errors import ConfigError
from fedlink.params import TRAINABLE, ParamSpec
from fedlink.privacy import PRIVACY_STAGES, NoPrivacy, UpdatePrivacy
from fedlink.wire import Payload, pack


def _default_codec() -> Codec:
    return get_codec("fp32")


def _no_privacy() -> UpdatePrivacy:
    return PRIVACY_STAGES.create("none")


@dataclass
class UpdatePipeline:
    """Turns a local model delta into the payload that is uploaded."""

    privacy: UpdatePrivacy = field(default_factory=_no_privacy)
    codec: Codec = field(default_factory=_default_codec)
    error_feedback: bool | None = None
    density: DensityPolicy | None = None
    feedback: ErrorFeedback | None = field(default=None, init=False)
    goodput: GoodputMeter = field(default_factory=GoodputMeter, init=False)
    spec: ParamSpec | None = field(default=None, init=False)
    """The model's spec once ``bind`` gave it (``None``: every element is a weight)."""
    _trainable: np.ndarray | None = field(default=None, init=False, repr=False)
    _plain: list[tuple[int, int]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        wanted = self.codec.biased if self.error_feedback is None else self.error_feedback
        self.feedback = ErrorFeedback() if wanted else None

    @classmethod
    def from_names(cls, privacy: str = "none", compression: str = "fp32",
                   compression_options: Mapping[str, object] | None = None,
                   error_feedback: bool | None = None,
                   density: DensityPolicy | None = None,
                   privacy_options: Mapping[str, object] | None = None) -> UpdatePipeline:
        """Build from registry names (``ConfigError`` on an unknown one or bad options)."""
        codec = get_codec(compression, **dict(compression_options or {}))
        stage = PRIVACY_STAGES.create(privacy, **dict(privacy_options or {}))
        return cls(stage, codec, error_feedback, density)

    def bind(self, spec: object) -> None:
        """Learn the kinds of the model's state (``spec``, e.g. a trainer's ``.spec``), so that
        privacy and compression treat them apart (see the module docstring). Anything but a
        ``ParamSpec`` (a trainer without one, or whose ``spec`` means something else) means
        every element is a weight."""
        spec = spec if isinstance(spec, ParamSpec) else None
        if spec is not None and spec is self.spec:
            return  # a reused pipeline bound again to the same model (once per simulated task)
        self.spec = spec
        self._trainable = None if spec is None else spec.trainable_mask()
        self._plain = [] if self._trainable is None else ranges_of(~self._trainable)

    def process(self, delta: np.ndarray, rng: np.random.Generator,
                time_left_s: float | None = None, *, checksums: bool = True) -> Payload:
        """Privatise, then encode ``delta`` (``time_left_s``: until the task's deadline;
        ``checksums=False``: a payload that crosses no wire, see ``pack``)."""
        private = self.privatise(np.asarray(delta, dtype=np.float32), rng)
        return self.compress(private, rng, time_left_s, checksums=checksums)

    def privatise(self, delta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``delta`` through the privacy stage: its trainable part, once ``bind`` said which
        that is; the rest must be zero (``ConfigError`` naming the tensor otherwise)."""
        mask = self._trainable
        if mask is None or isinstance(self.privacy, NoPrivacy):
            return self.privacy.apply(delta, rng)
        flat = delta.reshape(-1)
        if flat.size != mask.size:
            raise ValueError(f"the delta has {flat.size} elements, the model {mask.size}")
        moved = ~mask & (flat != 0)
        if moved.any():
            assert self.spec is not None
            raise ConfigError(f"[client] privacy = {self.privacy.name!r}: the update changes "
                              f"{_tensor_at(self.spec, int(np.argmax(moved)))!r}, which is not "
                              f"a trainable weight; {_KEEP_HINT}")
        out = np.zeros_like(flat)
        out[mask] = self.privacy.apply(flat[mask], rng)
        return out.reshape(np.shape(delta))

    # -- privacy ------------------------------------------------------------------------------

    def configure(self, options: Mapping[str, str]) -> None:
        """Pass a task's options to the privacy stage (an adaptive clip norm, say)."""
        self.privacy.configure(options)

    @property
    def privacy_metrics(self) -> dict[str, float]:
        """What the privacy stage reports about the last update (for its commit metrics)."""
        return self.privacy.metrics()

    # -- compression --------------------------------------------------------------------------

    def compress(self, update: np.ndarray, rng: np.random.Generator,
                 time_left_s: float | None = None, *, checksums: bool = True) -> Payload:
        """Encode ``update`` with error feedback (if on) at the density the policy picks."""
        codec = self.codec_for(update.size, time_left_s)
        if self.feedback is None:
            return pack(update, codec, rng, checksums=checksums)
        accumulated = self.feedback.accumulate(update)
        payload = pack(accumulated, codec, rng, checksums=checksums)
        sent = codec.decode(payload.data, payload.header.codec_params, accumulated.size)
        self.feedback.record(accumulated, sent)
        return payload

    def codec_for(self, size: int, time_left_s: float | None) -> Codec:
        """The codec for the next update: the configured one, or at the policy's density;
        wrapped in ``split`` when the bound model has non-trainable state and the codec is
        not lossless (see the module docstring)."""
        codec = self.codec
        if self.density is not None and isinstance(codec, Sparsifier):
            codec = self.density.choose(codec, size, self.goodput.bytes_per_s, time_left_s)
        if self._plain and not codec.lossless:
            return SplitCodec(codec, self._plain)
        return codec

    def observe_upload(self, num_bytes: int, seconds: float) -> None:
        """An upload of ``num_bytes`` (with its commit) took ``seconds``: feeds the density."""
        self.goodput.observe(num_bytes, seconds)

    def attach_state(self, directory: Path) -> None:
        """Keep the error-feedback residual in ``directory`` (the outbox directory), loading
        what an earlier process left there."""
        if self.feedback is not None:
            self.feedback = ErrorFeedback(Path(directory) / RESIDUAL_FILENAME)

    @property
    def saves_state(self) -> bool:
        """Whether ``save_state`` writes anything (an error-feedback residual with a file)."""
        return self.feedback is not None and self.feedback.path is not None

    def save_state(self) -> None:
        """Persist the error-feedback residual (atomically; a no-op without a directory)."""
        if self.feedback is not None:
            self.feedback.save()


_KEEP_HINT = ("clipping and noise protect trainable weights only, so buffers (BatchNorm's "
              "running statistics) must stay on the clients: set [client] keep_local = "
              "[\"batchnorm\"] (FedBN) or name them there, or use a model without them "
              "(GroupNorm or LayerNorm; opacus.validators.ModuleValidator.fix replaces "
              "BatchNorm)")


def _tensor_at(spec: ParamSpec, element: int) -> str:
    """The name of the tensor that holds vector element ``element``."""
    for name, offset, numel in zip(spec.names, spec.offsets, spec.numels, strict=True):
        if offset <= element < offset + numel:
            return name
    raise IndexError(element)


def shared_state(spec: ParamSpec, kept: np.ndarray | None = None) -> tuple[str, ...]:
    """The tensors of ``spec`` that are not trainable weights and leave the client (not in
    ``kept``, the ``keep_local`` mask), by name."""
    names = []
    for name, kind, offset, numel in zip(spec.names, spec.kinds, spec.offsets, spec.numels,
                                         strict=True):
        if kind != TRAINABLE and not (kept is not None and kept[offset: offset + numel].all()):
            names.append(name)
    return tuple(names)


def check_state(pipeline: UpdatePipeline, spec: ParamSpec,
                kept: np.ndarray | None = None) -> None:
    """``ConfigError``, naming the keys, when ``pipeline``'s privacy stage would have to send
    a model's non-trainable state (buffers, counters not kept local by the ``kept`` mask):
    clipping and noise cover trainable weights only, so those values would leave the client
    unprotected (and the coordinator's noise does not cover them either)."""
    if isinstance(pipeline.privacy, NoPrivacy):
        return
    shared = shared_state(spec, kept)
    if shared:
        more = f" and {len(shared) - 6} more" if len(shared) > 6 else ""
        raise ConfigError(f"[client] privacy = {pipeline.privacy.name!r} cannot cover the "
                          f"model's buffers ({', '.join(shared[:6])}{more}): {_KEEP_HINT}")
