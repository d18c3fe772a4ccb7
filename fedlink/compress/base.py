"""The codec contract: how an update vector becomes bytes on the wire and back.

A codec is registered by name in ``CODECS`` so configs can say ``compression = "topk+q8"``.
``encode`` returns the payload bytes plus the parameters the decoder needs; those travel in the
payload header (``TensorHeader.codec_params``), so a coordinator decodes whatever codec a client
chose: decoders are built without options (``decoder_for``) and read everything from the
parameters and the bytes.

Stochastic codecs (stochastic quantization, random-k) draw from the ``rng`` passed to
``encode``, which the client seeds; decoding never needs randomness. Every codec states its
exact byte cost: ``encoded_size(vector) == len(encode(vector).data)``, and ``size_bound(n)`` is
an upper bound on it for any vector of ``n`` values (equal to it for fixed-size formats) that a
client can plan with before encoding. ``biased`` marks codecs whose expected output differs
from their input (sparsifiers, sign): those need error feedback (``fedlink.client.feedback``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedlink.errors import ConfigError, InvalidArgument
from fedlink.registry import Registry

FP32 = np.dtype("<f4")


@dataclass(frozen=True)
class Encoded:
    """An encoded vector: the payload bytes and the codec parameters needed to decode them."""

    data: bytes
    params: Mapping[str, str] = field(default_factory=dict)


class Codec(ABC):
    """Encodes a flat float32 vector into bytes and decodes it back."""

    name: str = ""
    biased: bool = False
    lossless: bool = False
    stochastic: bool = False
    """Whether ``encode`` draws from its ``rng`` (two encodings of a vector may differ)."""
    raw: bool = False
    """Whether the encoded bytes are the values' own little-endian float32 bytes (``fp32``):
    a payload's two checksums are then one hash, and ``fedlink.wire`` computes it once."""

    @abstractmethod
    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """Encode ``vector`` (flat float32); stochastic codecs draw from ``rng``."""

    @abstractmethod
    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """Decode ``data`` into a flat float32 vector of ``size`` elements.

        Raises ``InvalidArgument`` when the bytes cannot be a valid encoding of that size.
        """

    @abstractmethod
    def size_bound(self, size: int) -> int:
        """The most bytes ``encode`` produces for any vector of ``size`` values."""

    def encoded_size(self, vector: np.ndarray) -> int:
        """Exactly ``len(self.encode(vector).data)`` (fixed-size formats: ``size_bound``)."""
        return self.size_bound(int(np.size(vector)))


CODECS: Registry[Codec] = Registry("codec")


def get_codec(name: str, **options: object) -> Codec:
    """Build the codec registered as ``name`` (``ConfigError`` when unknown)."""
    return CODECS.create(name, **options)


def broadcast_codec(name: str) -> Codec:
    """The codec ``name`` for the model broadcast (``CoordinatorConfig.downlink_codec``).

    Every client of a version must start from the same vector, and one rebuilt from a delta
    must re-encode to the served bytes, so only deterministic, unbiased codecs qualify
    (``fp32``, ``fp16``, ``bf16``, ``fp32-zlib``); ``ConfigError`` otherwise.
    """
    codec = get_codec(name)
    if codec.biased or codec.stochastic:
        kind = "biased" if codec.biased else "stochastic"
        raise ConfigError(f"{name!r} is {kind}; the model broadcast needs a deterministic, "
                          f"unbiased codec such as fp32, fp16, bf16 or fp32-zlib")
    return codec


def decoder_for(name: str) -> Codec:
    """The codec that decodes payloads named ``name`` (``InvalidArgument`` when unknown).

    Used on the receiving side, where an unknown name is the sender's mistake, not a config one.
    Decoders take their parameters from the payload header, so they are built without options.
    """
    if name not in CODECS:
        raise InvalidArgument(
            f"unknown encoding {name!r}; this coordinator decodes: {', '.join(CODECS.names())}"
        )
    return CODECS.create(name)


def expect_length(name: str, data: bytes, expected: int) -> None:
    """``InvalidArgument`` unless ``data`` holds exactly ``expected`` bytes."""
    if len(data) != expected:
        raise InvalidArgument(f"{name} payload holds {len(data)} bytes, expected {expected}")


def param(params: Mapping[str, str], key: str, kind: type[int] | type[float],
          name: str) -> int | float:
    """``params[key]`` parsed as ``kind`` (``InvalidArgument`` when missing or malformed)."""
    try:
        return kind(params[key])
    except (KeyError, ValueError) as exc:
        raise InvalidArgument(f"{name} needs codec parameter {key!r} as {kind.__name__}, "
                              f"got {params.get(key)!r}") from exc
