"""Update codecs, registered by name in ``CODECS`` (``get_codec("topk+q8", density=0.01)``).

Dense: ``fp32`` (identity), ``fp16``, ``bf16``, ``fp32-zlib`` (lossless), ``qsgd`` (unbiased
stochastic quantization), ``sign``. Sparse: ``topk`` and ``randk``, alone or with quantized or
half-precision values (``topk+q8``, ``randk+fp16``, ...). ``fedlink.compress.delta`` holds the
exact model deltas used for downloads; ``split`` (``fedlink.compress.split``) wraps another codec
so that the ranges of a model's non-trainable state travel as exact float32;
``broadcast_codec`` checks a codec for the model broadcast (``downlink_codec``).
"""

from fedlink.compress import identity as _identity  # noqa: F401  (registers codecs)
from fedlink.compress import quantize as _quantize  # noqa: F401
from fedlink.compress import sparse as _sparse  # noqa: F401
from fedlink.compress import split as _split  # noqa: F401  (last: wraps the others)
from fedlink.compress.base import (
    CODECS,
    Codec,
    Encoded,
    broadcast_codec,
    decoder_for,
    get_codec,
)
from fedlink.compress.sparse import Sparsifier

__all__ = ["CODECS", "Codec", "Encoded", "Sparsifier", "broadcast_codec", "decoder_for",
           "get_codec"]
