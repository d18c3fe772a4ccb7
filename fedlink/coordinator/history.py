"""The model versions the coordinator still serves, and exact deltas between recent ones.

Each published version is encoded once (``payload``, with the broadcast codec) and kept while a
client may still train from it. The served vectors (what a client decodes: the model itself for
a lossless codec) of the last ``delta_history`` versions are kept too, so that a client that
holds one of them can download an ``xor-zlib`` delta to the version of its task instead of the
whole model (``fedlink.compress.delta``). A delta is computed once per (held, target) pair
on first use and cached while both versions are kept: at most ``delta_history ** 2`` entries,
each no larger than the model. A delta that would not be smaller than the model is not offered.
"""

from __future__ import annotations

import numpy as np

from fedlink.compress import Codec
from fedlink.compress.delta import DELTA_ENCODING, encode_delta
from fedlink.messages import TensorHeader
from fedlink.wire import Payload, checksum, pack, values_checksum
from fedlink.wire.payload import DTYPE


class ModelHistory:
    """Encoded payloads of served versions, raw recent vectors and a bounded delta cache."""

    def __init__(self, codec: Codec, delta_history: int) -> None:
        self._codec = codec
        self._delta_history = delta_history
        self._payloads: dict[int, Payload] = {}
        self._vectors: dict[int, np.ndarray] = {}
        self._deltas: dict[tuple[int, int], Payload | None] = {}

    def publish(self, version: int, model: np.ndarray, oldest_served: int) -> None:
        """Add ``version``; forget payloads before ``oldest_served`` and vectors past history."""
        payload = pack(model, self._codec)
        self._payloads[version] = payload
        for old in [v for v in self._payloads if v < oldest_served]:
            del self._payloads[old]
        if self._delta_history > 0:
            self._vectors[version] = self._served(model, payload)
        for old in [v for v in self._vectors if v <= version - self._delta_history]:
            del self._vectors[old]
        self._deltas = {pair: delta for pair, delta in self._deltas.items()
                        if pair[0] in self._vectors and pair[1] in self._vectors}

    def _served(self, model: np.ndarray, payload: Payload) -> np.ndarray:
        """The vector a client decodes from ``payload``."""
        if self._codec.lossless:
            return model
        header = payload.header
        return self._codec.decode(payload.data, header.codec_params, int(model.size))

    def payload(self, version: int) -> Payload | None:
        """The encoded model of ``version``, or None once it is no longer served."""
        return self._payloads.get(version)

    def delta(self, base: int, target: int) -> Payload | None:
        """The delta from ``base`` to ``target``, or None when either is not kept, it is
        no smaller than the model, or ``base == target`` (the client holds the model: it needs
        no payload at all, ``docs/protocol.md`` section 7)."""
        if base == target:
            return None
        pair = (base, target)
        if pair not in self._deltas:
            if base not in self._vectors or target not in self._vectors:
                return None
            self._deltas[pair] = self._encode(base, target)
        return self._deltas[pair]

    def _encode(self, base: int, target: int) -> Payload | None:
        data = encode_delta(self._vectors[base], self._vectors[target])
        full = self._payloads.get(target)
        if full is not None and len(data) >= full.header.num_bytes:
            return None
        size = int(self._vectors[target].size)
        # values_checksum: of the values the delta rebuilds (the target model as decoded).
        header = TensorHeader(encoding=DELTA_ENCODING, shape=(size,), dtype=DTYPE,
                              num_bytes=len(data), checksum=checksum(data),
                              values_checksum=values_checksum(self._vectors[target]))
        return Payload(header, data)
