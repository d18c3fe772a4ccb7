"""Update codecs, registered by name in ``CODECS`` (``get_codec("fp32")``)."""

from fedlink.compress import identity as _identity  # noqa: F401  (registers codecs)
from fedlink.compress.base import CODECS, Codec, Encoded, decoder_for, get_codec

__all__ = ["CODECS", "Codec", "Encoded", "decoder_for", "get_codec"]
