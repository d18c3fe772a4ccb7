"""The codec contract: how an update vector becomes bytes on the wire and back.

A codec is registered by name in ``CODECS`` so configs can say ``compression = "fp32"``.
``encode`` returns the payload bytes plus the parameters the decoder needs; those travel in the
payload header (``TensorHeader.codec_params``), so a coordinator decodes whatever codec a client
chose.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedlink.errors import InvalidArgument
from fedlink.registry import Registry


@dataclass(frozen=True)
class Encoded:
    """An encoded vector: the payload bytes and the codec parameters needed to decode them."""

    data: bytes
    params: Mapping[str, str] = field(default_factory=dict)


class Codec(ABC):
    """Encodes a flat float32 vector into bytes and decodes it back."""

    name: str = ""

    @abstractmethod
    def encode(self, vector: np.ndarray) -> Encoded:
        """Encode ``vector`` (flat float32)."""

    @abstractmethod
    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """Decode ``data`` into a flat float32 vector of ``size`` elements.

        Raises ``InvalidArgument`` when the bytes cannot be a valid encoding of that size.
        """


CODECS: Registry[Codec] = Registry("codec")


def get_codec(name: str, **options: object) -> Codec:
    """Build the codec registered as ``name`` (``ConfigError`` when unknown)."""
    return CODECS.create(name, **options)


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
