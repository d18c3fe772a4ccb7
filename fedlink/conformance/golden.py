"""Golden vectors: every payload format and a recorded session, as files in any language's reach.

``write_vectors(folder)`` writes ``protos/testdata/`` (``python -m fedlink.conformance.golden
protos/testdata``):

- ``codecs.json``: for each registered codec, a small float32 vector, its codec options, the
  encoded bytes (hex), the ``TensorHeader`` (as proto3 JSON field names), and the decoded
  values as float32 bit patterns (hex, little-endian) so that no decimal rounding intervenes.
- ``codecs_1_1.json``: the rules protocol 1.1 pins down: ``randk`` with the ``splitmix64``
  index rule (full vectors, and seed -> indices tables up to 100,000 values), ``topk`` ties,
  ``qsgd`` edge values (every width, both norms, scale 0, codes at both ends) and ``sign``
  scales where a float32 mean would differ. ``codecs.json`` stays the 1.0 file (``randk``
  there uses numpy's ``choice``, still decoded when ``index_rule`` is absent).
- ``delta.json``: two versions of a model, the ``xor-zlib`` delta between them, its header
  and the header of the target model (``values_checksum`` is what a rebuilt model must match).
- ``session_inline.json`` and ``session_streamed.json``: the messages of one task, in order,
  as ``{call, request, reply}`` in proto3 JSON (bytes fields base64, as proto3 JSON says), for
  a payload small enough to travel inline and one streamed in chunks.
- ``session_secure.json``: one secure group's four phases the same way (four clients, one
  dropping after it shared its keys), with every random draw the clients made
  (``fedlink.conformance.secure_session``; needs the ``secagg`` extra).

Encoding with zlib (``fp32-zlib``, ``xor-zlib``) is not byte-exact across zlib builds: for
those an implementation must decode the given bytes to the given values and check
``values_checksum``; its own encoder's bytes need only decode back (``docs/protocol.md``).
"""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedlink.compress import CODECS, decoder_for, get_codec
from fedlink.compress.delta import apply_delta, encode_delta
from fedlink.compress.sparse import splitmix_indices, splitmix_keys
from fedlink.messages import TensorHeader
from fedlink.wire import checksum, pack, values_checksum

VECTOR = np.array([0.0, -0.0, 1.0, -1.5, 3.140625, 1e-3, -2.5e-4, 65504.0, 1e-8, -7.25, 0.5,
                   100.0], dtype=np.float32)
"""12 values: zeros of both signs, exact and inexact in half precision, beyond fp16's range."""

OPTIONS: dict[str, dict[str, Any]] = {
    "qsgd": {"bits": 4}, "topk": {"density": 0.25}, "randk": {"density": 0.25},
    "split": {"inner": "topk", "plain": "2:3,9:1", "density": 0.5},
}
"""Codec options used for the vectors (sparsifiers with value codecs take the base's)."""

SEED = 20261201

RANDK_1_0 = {"index_rule": "numpy"}
"""``codecs.json`` holds 1.0 ``randk`` vectors: numpy's ``choice``, no ``index_rule`` sent."""

RANDK_TABLES = [(0, 12, 3), (20261201, 1000, 10), (7, 10_001, 100), (2**63 - 1, 12_345, 1_235),
                (123456789, 100_000, 1_000), (42, 5, 5), (42, 5, 0)]
"""``(seed, n, k)`` for the ``randk`` index tables: both ends of the seed range, above 10,000."""

TOPK_TIES = np.array([1.0, -2.0, 2.0, 0.5, -2.0, 1.0, 2.0, -1.0, 0.0, -0.0, 3.0, -1.0],
                     dtype=np.float32)
"""Equal magnitudes straddling the cut: the lower indices are kept."""

QSGD_EDGES: list[tuple[str, list[float], dict[str, Any]]] = [
    ("zeros", [0.0, -0.0, 0.0, 0.0, 0.0], {"bits": 8}),
    ("ends", [1.0, -1.0, 0.5, -0.5, 0.0, 1.0, -1.0], {"bits": 2}),
    ("bits3", [3.0, -1.0, 0.1, -2.9, 2.0, 1e-30, -3.0], {"bits": 3}),
    ("bits5_l2", [0.3, -0.7, 1e-5, 2.5, -2.5, 0.0, 1.75], {"bits": 5, "norm": "l2"}),
    ("bits7", [1e30, -1e30, 3.3e29, -7e29, 1.0], {"bits": 7}),
    ("bits8_rounding", [0.1, 0.2, 0.3, -0.7, 0.9, -1.1, 1.3, 1.7, 1.9, -2.3, 2.9, 3.1],
     {"bits": 8}),
    ("tiny", [1e-38, -1e-38, 5e-39, 1e-45], {"bits": 4}),
]
"""Inputs where the decode formula's rounding shows: ``f32((code - s) * f32(c / s))``."""

SIGN_SCALES = [[0.1, 0.2, 0.3, -0.4, 1e-8, -3.3, 7.77, 0.01],
               [16777216.0, 1.0, -1.0, 1.0, 3.0, -5.0, 1e-3],
               [1.0 / 3.0] * 7 + [-2.0 / 3.0] * 5]
"""Vectors whose float64 mean of magnitudes, rounded once, differs from a float32 mean."""


def float_bits(values: np.ndarray) -> list[str]:
    """Each float32 as 8 hex digits of its little-endian bytes (exact, unlike decimals)."""
    return [v.tobytes().hex() for v in np.ascontiguousarray(values, dtype="<f4")]


def header_json(header: TensorHeader) -> dict[str, Any]:
    """A ``TensorHeader`` as proto3 JSON (lowerCamelCase names, int64 as strings)."""
    return {"encoding": header.encoding, "shape": [str(s) for s in header.shape],
            "dtype": header.dtype, "numBytes": str(header.num_bytes),
            "checksum": header.checksum, "codecParams": dict(header.codec_params),
            "valuesChecksum": header.values_checksum}


def codec_vector(name: str, vector: np.ndarray = VECTOR,
                 options: Mapping[str, Any] | None = None,
                 hidden: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The golden entry of codec ``name``: input, options, bytes, header, decoded values.

    ``hidden`` options shape the encoding without being recorded (the 1.0 ``randk`` rule,
    which sends no ``index_rule``).
    """
    if options is None:
        options = OPTIONS.get(name.split("+")[0], {})
    codec = get_codec(name, **options, **(hidden or {}))
    payload = pack(vector, codec, np.random.default_rng(SEED))
    decoded = decoder_for(name).decode(payload.data, payload.header.codec_params, vector.size)
    return {"codec": name, "options": dict(options), "stochastic": codec.stochastic,
            "zlib": name == "fp32-zlib", "input_bits": float_bits(vector),
            "input": [float(v) for v in vector], "data_hex": payload.data.hex(),
            "header": header_json(payload.header), "decoded_bits": float_bits(decoded)}


def vectors_1_0() -> list[dict[str, Any]]:
    """``codecs.json``: one vector per codec, ``randk`` by the 1.0 (numpy) rule."""
    return [codec_vector(n, hidden=RANDK_1_0 if n.startswith("randk") else None)
            for n in CODECS.names()]


def vectors_1_1() -> dict[str, Any]:
    """``codecs_1_1.json``: the vectors of the rules protocol 1.1 states exactly."""
    randk = [codec_vector(n) for n in CODECS.names() if n.startswith("randk")]
    tables = [{"seed": str(seed), "n": n, "k": k,
               "indices": [int(i) for i in splitmix_indices(seed, n, k)]}
              for seed, n, k in RANDK_TABLES]
    first_keys = [f"{int(key):016x}" for key in splitmix_keys(0, 4)]
    topk = [codec_vector(name, TOPK_TIES, {"density": density})
            for name, density in (("topk", 0.25), ("topk", 0.5), ("topk+fp16", 0.1))]
    qsgd = [{"case": case, **codec_vector("qsgd", np.array(v, dtype=np.float32), opts)}
            for case, v, opts in QSGD_EDGES]
    sign = [codec_vector("sign", np.array(v, dtype=np.float32), {}) for v in SIGN_SCALES]
    return {"randk": randk, "randk_indices": tables, "splitmix64_seed0_keys": first_keys,
            "topk_ties": topk, "qsgd_edges": qsgd, "sign_scales": sign}


def delta_vector() -> dict[str, Any]:
    """Two model versions, the ``xor-zlib`` delta, and the headers a client checks."""
    new = (VECTOR + np.float32(0.001) * np.arange(VECTOR.size, dtype=np.float32)).astype(
        np.float32)
    data = encode_delta(VECTOR, new)
    assert np.array_equal(apply_delta(VECTOR, data).view("<u4"), new.view("<u4"))
    model = pack(new, get_codec("fp32")).header
    delta = TensorHeader(encoding="xor-zlib", shape=(VECTOR.size,), dtype="float32",
                         num_bytes=len(data), checksum=checksum(data),
                         values_checksum=values_checksum(new))
    return {"old_bits": float_bits(VECTOR), "new_bits": float_bits(new),
            "xor_hex": (VECTOR.view("<u4") ^ new.view("<u4")).astype("<u4").tobytes().hex(),
            "data_hex": data.hex(), "delta_header": header_json(delta),
            "model_header": header_json(model)}


def write_vectors(folder: Path, sessions: Mapping[str, list[dict[str, Any]]],
                  secure: Mapping[str, Any] | None = None) -> list[Path]:
    """Write every golden file into ``folder`` (``secure``: the recorded secure session, for
    ``session_secure.json``); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {"codecs.json": {"vectors": vectors_1_0()},
                             "codecs_1_1.json": vectors_1_1(), "delta.json": delta_vector()}
    files.update({f"session_{kind}.json": {"messages": messages}
                  for kind, messages in sessions.items()})
    if secure is not None:
        files["session_secure.json"] = secure
    written = []
    for name, content in files.items():
        path = folder / name
        path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
        written.append(path)
    return written


def b64(data: bytes) -> str:
    """Bytes as proto3 JSON writes them (standard base64 with padding)."""
    return base64.b64encode(data).decode()


def main() -> None:
    """``python -m fedlink.conformance.golden FOLDER``: (re)write the golden vectors."""
    from fedlink.conformance.secure_session import record_secure_session
    from fedlink.conformance.session import record_sessions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    for path in write_vectors(args.folder, record_sessions(), record_secure_session()):
        print(path)


if __name__ == "__main__":
    main()
