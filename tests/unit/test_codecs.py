"""Update codecs: round trips, unbiasedness, top-k selection, index coding and exact byte costs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedlink.compress import CODECS, Codec, decoder_for, get_codec
from fedlink.compress.indexcode import BITMAP, VARINT, decode_indices, encode_indices
from fedlink.compress.sparse import RandK, TopK, kept_count
from fedlink.errors import ConfigError, InvalidArgument
from fedlink.wire import checksum, pack, unpack

ALL = CODECS.names()
LOSSLESS = ("fp32", "fp32-zlib")
finite = st.floats(-1e4, 1e4, width=32, allow_nan=False, allow_infinity=False)
vectors = hnp.arrays(np.float32, st.integers(0, 300), elements=finite)


def roundtrip(codec: Codec, vector: np.ndarray, seed: int = 0) -> np.ndarray:
    encoded = codec.encode(vector, np.random.default_rng(seed))
    return decoder_for(codec.name).decode(encoded.data, encoded.params, vector.size)


def normal(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# -- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSSLESS)
@given(vector=vectors)
def test_lossless_codecs_round_trip_bit_exactly(name: str, vector: np.ndarray) -> None:
    decoded = roundtrip(get_codec(name), vector)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded.view(np.uint32), vector.view(np.uint32))


def test_topk_at_full_density_is_lossless() -> None:
    vector = normal(1000)
    np.testing.assert_array_equal(roundtrip(get_codec("topk", density=1.0), vector), vector)


@given(vector=vectors)
def test_fp16_and_bf16_are_within_their_precision(vector: np.ndarray) -> None:
    for name, rel in (("fp16", 2.0**-11), ("bf16", 2.0**-8)):
        decoded = roundtrip(get_codec(name), vector)
        tiny = 6.2e-5 if name == "fp16" else 1e-40  # subnormals: an absolute error
        assert np.all(np.abs(decoded - vector) <= rel * np.abs(vector) + tiny), name


def test_bf16_rounds_to_nearest_even_and_keeps_representable_values() -> None:
    exact = np.array([1.0, -2.5, 0.0, 3.140625, 1e30], dtype=np.float32)
    exact = (exact.view(np.uint32) & 0xFFFF0000).view(np.float32)
    np.testing.assert_array_equal(roundtrip(get_codec("bf16"), exact), exact)
    # 1 + 2**-8 lies halfway between 1 and 1 + 2**-7: ties go to the even pattern (1.0)
    halfway = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], dtype=np.float32)
    np.testing.assert_array_equal(roundtrip(get_codec("bf16"), halfway),
                                  np.array([1.0, 1.0 + 2 * 2.0**-7], dtype=np.float32))


def test_fp16_saturates_instead_of_overflowing() -> None:
    decoded = roundtrip(get_codec("fp16"), np.array([1e6, -1e6], dtype=np.float32))
    assert np.isfinite(decoded).all() and decoded[0] == 65504.0


# -- stochastic quantization ----------------------------------------------------------------------


@pytest.mark.parametrize(("bits", "norm"), [(2, "max"), (4, "l2"), (8, "max")])
def test_stochastic_quantization_is_unbiased(bits: int, norm: str) -> None:
    """The mean of N draws is within 5 standard errors of the input, per coordinate.

    One draw of a coordinate is off by at most one step ``c / s`` with variance at most
    ``(c / s)**2 / 4``, so the standard error of the mean of N draws is at most
    ``c / (2 s sqrt(N))``.
    """
    vector = normal(64, seed=bits)
    codec = get_codec("qsgd", bits=bits, norm=norm)
    rng = np.random.default_rng(1)
    draws = 4000
    total = np.zeros(vector.size, dtype=np.float64)
    for _ in range(draws):
        encoded = codec.encode(vector, rng)
        total += codec.decode(encoded.data, encoded.params, vector.size)
    scale = np.max(np.abs(vector)) if norm == "max" else np.linalg.norm(vector)
    step = scale / ((1 << (bits - 1)) - 1)
    tolerance = 5 * step / (2 * np.sqrt(draws))
    assert np.max(np.abs(total / draws - vector)) <= tolerance


def test_quantization_error_is_at_most_one_step_and_zero_stays_zero() -> None:
    vector = normal(500)
    decoded = roundtrip(get_codec("qsgd", bits=8), vector)
    assert np.max(np.abs(decoded - vector)) <= np.max(np.abs(vector)) / 127 * (1 + 1e-6)
    np.testing.assert_array_equal(roundtrip(get_codec("qsgd"), np.zeros(9, np.float32)), 0.0)


def test_sign_sends_signs_and_the_mean_magnitude() -> None:
    vector = np.array([3.0, -1.0, 0.5, -0.5], dtype=np.float32)
    np.testing.assert_allclose(roundtrip(get_codec("sign"), vector), [1.25, -1.25, 1.25, -1.25])


# -- sparsifiers ----------------------------------------------------------------------------------


@given(vector=hnp.arrays(np.float32, st.integers(1, 400), elements=finite, unique=True),
       density=st.floats(0.001, 1.0))
def test_topk_keeps_exactly_the_k_largest_magnitudes(vector: np.ndarray,
                                                     density: float) -> None:
    vector = vector[np.unique(np.abs(vector), return_index=True)[1]]  # no magnitude ties
    k = kept_count(density, vector.size)
    decoded = roundtrip(get_codec("topk", density=density), vector)
    kept = np.flatnonzero(decoded != 0)
    largest = np.argsort(-np.abs(vector))[:k]
    assert set(kept) == set(largest[vector[largest] != 0])
    np.testing.assert_array_equal(decoded[largest], vector[largest])


def test_randk_sends_seeded_indices_and_their_exact_values() -> None:
    vector = normal(1000) + 5.0
    codec = get_codec("randk", density=0.05)
    encoded = codec.encode(vector, np.random.default_rng(3))
    decoded = codec.decode(encoded.data, encoded.params, vector.size)
    kept = np.flatnonzero(decoded)
    assert kept.size == 50
    np.testing.assert_array_equal(kept, RandK.indices(int(encoded.params["seed"]), 1000, 50))
    np.testing.assert_array_equal(decoded[kept], vector[kept])


@given(n=st.integers(1, 5000), data=st.data())
def test_index_coding_round_trips_and_picks_the_smaller_format(n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, n))
    indices = np.sort(np.random.default_rng(n + k).choice(n, size=k, replace=False))
    mode, blob = encode_indices(indices, n)
    decoded, used = decode_indices(mode, np.frombuffer(blob, np.uint8), n, k)
    np.testing.assert_array_equal(decoded, indices)
    assert used == len(blob) <= (n + 7) // 8


def test_sparse_indices_use_varints_and_dense_ones_a_bitmap() -> None:
    n = 10_000
    assert encode_indices(np.arange(0, n, 100), n)[0] == VARINT
    assert encode_indices(np.arange(0, n, 2), n)[0] == BITMAP


def test_topk_q8_at_one_percent_is_over_100x_smaller_than_fp32() -> None:
    vector = normal(8970)
    assert len(get_codec("fp32").encode(vector).data) / \
        len(get_codec("topk+q8", density=0.01).encode(vector).data) >= 100


# -- byte costs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@given(vector=vectors, seed=st.integers(0, 2**32))
def test_byte_cost_is_exactly_the_payload_size_on_the_wire(name: str, vector: np.ndarray,
                                                           seed: int) -> None:
    codec = get_codec(name)
    payload = pack(vector, codec, np.random.default_rng(seed))
    assert codec.encoded_size(vector) == payload.header.num_bytes == len(payload.data)
    assert len(payload.data) <= codec.size_bound(vector.size)
    assert payload.header.encoding == name
    unpack(payload.header, payload.data, vector.size)  # the receiving side accepts it


@pytest.mark.parametrize("name", ["topk", "topk+q8", "randk+q4"])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.2, 1.0])
def test_sparse_byte_cost_at_several_densities(name: str, density: float) -> None:
    codec = get_codec(name, density=density)
    vector = normal(20_000)
    assert codec.encoded_size(vector) == len(codec.encode(vector).data) \
        <= codec.size_bound(vector.size)


# -- malformed payloads ---------------------------------------------------------------------------


def _corruptions(data: bytes) -> list[bytes]:
    return [data[:-1], data + b"\x00", data[: len(data) // 2], b""]


@pytest.mark.parametrize("name", ALL)
def test_truncated_or_padded_payloads_are_invalid_argument(name: str) -> None:
    vector = normal(777)
    payload = pack(vector, get_codec(name), np.random.default_rng(0))
    for bad in _corruptions(payload.data):
        header = dataclasses.replace(payload.header, num_bytes=len(bad), checksum=checksum(bad))
        with pytest.raises(InvalidArgument):
            unpack(header, bad, vector.size)


@pytest.mark.parametrize(("name", "key"), [("qsgd", "bits"), ("topk+q8", "bits"),
                                         ("randk", "seed"), ("randk+q4", "bits")])
def test_missing_or_malformed_codec_params_are_invalid_argument(name: str, key: str) -> None:
    vector = normal(100)
    payload = pack(vector, get_codec(name), np.random.default_rng(0))
    out_of_range = "99" if key == "bits" else str(2**64)  # any seed in range decodes
    for value in (None, "x", "-1", out_of_range):
        params = {k: v for k, v in payload.header.codec_params.items() if k != key}
        if value is not None:
            params[key] = value
        header = dataclasses.replace(payload.header, codec_params=params)
        with pytest.raises(InvalidArgument):
            unpack(header, payload.data, vector.size)


@pytest.mark.parametrize("name", ALL)
@given(garbage=st.binary(max_size=300), size=st.integers(0, 200))
def test_garbage_never_crashes_a_decoder(name: str, garbage: bytes, size: int) -> None:
    codec = get_codec(name)
    params = dict(codec.encode(normal(50), np.random.default_rng(0)).params)
    try:
        decoded = decoder_for(name).decode(garbage, params, size)
    except InvalidArgument:
        return
    assert decoded.shape == (size,) and decoded.dtype == np.float32


def test_unknown_codec_and_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        get_codec("topk+zstd")
    with pytest.raises(ConfigError, match="density"):
        get_codec("topk", density=0.0)
    with pytest.raises(ConfigError, match="bits"):
        get_codec("qsgd", bits=1)
    with pytest.raises(ConfigError, match="bad options"):
        get_codec("sign", density=0.1)
    with pytest.raises(InvalidArgument, match="unknown encoding"):
        decoder_for("topk+zstd")


def test_with_density_keeps_the_value_codec() -> None:
    codec = get_codec("topk+q8", density=0.01)
    assert isinstance(codec, TopK)
    other = codec.with_density(0.2)
    assert (other.name, other.density, codec.density) == ("topk+q8", 0.2, 0.01)
