"""The client's update pipeline: delta -> privacy -> compression -> payload.

The order is fixed by construction (see ``fedlink.privacy.base``): a privacy stage maps a
vector to a vector, then a codec maps a vector to bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedlink.compress import Codec, get_codec
from fedlink.privacy import PRIVACY_STAGES, UpdatePrivacy
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

    @classmethod
    def from_names(cls, privacy: str = "none", compression: str = "fp32") -> UpdatePipeline:
        """Build from registry names (``ConfigError`` on an unknown one)."""
        return cls(PRIVACY_STAGES.create(privacy), get_codec(compression))

    def process(self, delta: np.ndarray, rng: np.random.Generator) -> Payload:
        """Privatise, then encode ``delta``."""
        private = self.privacy.apply(np.asarray(delta, dtype=np.float32), rng)
        return pack(private, self.codec)
