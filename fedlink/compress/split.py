"""``split``: one codec for a model's weights, exact float32 for the ranges that are not weights.

A model's update holds trainable weights and, beside them, state that is not a gradient-like
signal (BatchNorm's running statistics, counters; ``docs/model-state.md``). A sparsifier would
drop most of a running variance's change, ``sign`` would replace it by a scale, and stochastic
quantization could make it negative. The client's pipeline (``fedlink.client.pipeline``) wraps
its codec in ``split`` when the model has such state: the ``inner`` codec encodes the elements
outside the ``plain`` ranges, and the elements inside them travel as raw little-endian float32.

Format: the inner codec's bytes, then ``4 * m`` bytes of float32 (the ``m`` plain elements, in
vector order). Parameters: ``inner`` (the inner codec's name), ``plain`` (the ranges,
``"offset:length"`` joined by commas, increasing and disjoint), ``inner_bytes`` (the length of
the inner part) and the inner codec's own parameters prefixed ``inner.``. The inner codec sees
a vector of ``n - m`` elements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedlink.compress.base import CODECS, FP32, Codec, Encoded, decoder_for, get_codec, param
from fedlink.compress.identity import as_fp32
from fedlink.errors import ConfigError, InvalidArgument

NAME = "split"
_PREFIX = "inner."


def format_ranges(ranges: Sequence[tuple[int, int]]) -> str:
    """``[(offset, length), ...]`` as the ``plain`` parameter."""
    return ",".join(f"{offset}:{length}" for offset, length in ranges)


def parse_ranges(text: str, size: int | None = None) -> list[tuple[int, int]]:
    """The ``plain`` parameter as ``[(offset, length), ...]`` (``ValueError`` unless the
    ranges are non-empty, increasing, disjoint and, given ``size``, inside the vector)."""
    ranges: list[tuple[int, int]] = []
    end = 0
    for part in filter(None, text.split(",")):
        offset_text, _, length_text = part.partition(":")
        offset, length = int(offset_text), int(length_text)
        if offset < end or length < 1:
            raise ValueError(f"plain ranges must be non-empty, increasing and disjoint: {text!r}")
        end = offset + length
        if size is not None and end > size:
            raise ValueError(f"plain range {part!r} ends past the vector's {size} elements")
        ranges.append((offset, length))
    return ranges


def ranges_of(mask: np.ndarray) -> list[tuple[int, int]]:
    """The runs of True in a boolean ``mask``, as ``(offset, length)``."""
    flags = np.concatenate([[False], np.asarray(mask, dtype=bool).reshape(-1), [False]])
    edges = np.flatnonzero(np.diff(flags.astype(np.int8)))
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _mask(ranges: Sequence[tuple[int, int]], size: int) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    for offset, length in ranges:
        mask[offset: offset + length] = True
    return mask


@CODECS.register(NAME)
class SplitCodec(Codec):
    """``inner`` (a codec or its name, built with ``options``) over every element outside
    ``plain`` (ranges, or their ``"offset:length,..."`` text), exact float32 inside them."""

    name = NAME

    def __init__(self, inner: str | Codec = "fp32", plain: str | Sequence[tuple[int, int]] = "",
                 **options: object) -> None:
        if isinstance(inner, str):
            if inner == NAME:
                raise ConfigError("split: the inner codec cannot be split itself")
            inner = get_codec(inner, **options)
        elif options:
            raise ConfigError("split: options apply to an inner codec given by name")
        try:
            self.ranges = parse_ranges(plain) if isinstance(plain, str) else \
                parse_ranges(format_ranges(plain))
        except ValueError as exc:
            raise ConfigError(f"split: {exc}") from exc
        self.inner = inner
        self.plain_count = sum(length for _, length in self.ranges)
        self.biased = inner.biased
        self.lossless = inner.lossless
        self.stochastic = inner.stochastic

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """The inner codec's encoding of the non-plain elements, then the plain ones."""
        flat = as_fp32(vector)
        plain = _mask(self.ranges, flat.size)
        inner = self.inner.encode(flat[~plain], rng)
        params = {"inner": self.inner.name, "plain": format_ranges(self.ranges),
                  "inner_bytes": str(len(inner.data)),
                  **{_PREFIX + k: v for k, v in inner.params.items()}}
        return Encoded(inner.data + flat[plain].tobytes(), params)

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """Both parts, put back in place (``InvalidArgument`` on malformed parameters)."""
        inner_name = params.get("inner", "")
        if inner_name == NAME:
            raise InvalidArgument("split: the inner codec cannot be split itself")
        try:
            ranges = parse_ranges(params.get("plain", ""), size)
        except ValueError as exc:
            raise InvalidArgument(f"split: {exc}") from None
        inner_bytes = int(param(params, "inner_bytes", int, NAME))
        plain = _mask(ranges, size)
        count = int(plain.sum())
        if not 0 <= inner_bytes <= len(data) or len(data) - inner_bytes != 4 * count:
            raise InvalidArgument(f"split payload holds {len(data)} bytes, which is not "
                                  f"{inner_bytes} inner bytes and {count} float32 values")
        inner_params = {k[len(_PREFIX):]: v for k, v in params.items() if k.startswith(_PREFIX)}
        out = np.empty(size, dtype=np.float32)
        out[~plain] = decoder_for(inner_name).decode(data[:inner_bytes], inner_params,
                                                     size - count)
        out[plain] = np.frombuffer(data, dtype=FP32, offset=inner_bytes)
        return out

    def size_bound(self, size: int) -> int:
        """The inner codec's bound for the other elements, plus 4 bytes per plain one."""
        return self.inner.size_bound(size - self.plain_count) + 4 * self.plain_count

    def encoded_size(self, vector: np.ndarray) -> int:
        """Exactly what ``encode`` writes."""
        flat = as_fp32(vector)
        plain = _mask(self.ranges, flat.size)
        return self.inner.encoded_size(flat[~plain]) + 4 * int(plain.sum())
