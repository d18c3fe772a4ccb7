"""Compression that survives masking: the group's random-k and masked vectors packed at the
ring's bit width (fedlink.secagg.sparse, fedlink.secagg.packing)."""

from __future__ import annotations

import numpy as np
import pytest

from fedlink.errors import ConfigError
from fedlink.secagg import (
    SecAggConfig,
    SecAggError,
    SharedRandK,
    decode_sum,
    encode,
    round_seed,
    run_secure_sum,
    scatter,
)
from fedlink.secagg.packing import pack, packed_size, unpack


@pytest.mark.parametrize("bits", [1, 5, 12, 16, 24, 31, 32])
def test_packing_round_trips_at_exactly_bits_per_value(bits: int) -> None:
    rng = np.random.default_rng(bits)
    values = rng.integers(0, 1 << bits, 1001, dtype=np.uint64).astype(np.uint32)
    data = pack(values, bits)
    assert len(data) == packed_size(1001, bits) == (1001 * bits + 7) // 8
    assert np.array_equal(unpack(data, 1001, bits), values)


def test_packing_is_least_significant_bit_first_and_refuses_what_does_not_fit() -> None:
    assert pack(np.array([1, 2, 3], np.uint32), 4) == bytes([0x21, 0x03])
    with pytest.raises(SecAggError, match="does not fit in 4 bits"):
        pack(np.array([16], np.uint32), 4)
    with pytest.raises(SecAggError, match="take 2 bytes"):
        unpack(bytes(3), 3, 4)


def test_the_ring_for_a_cohort_holds_its_sum_and_is_the_smallest_that_does() -> None:
    config = SecAggConfig.for_cohort(100, 5, 0.3)
    assert (config.modulus_bits, config.bits) == (12, 5)  # 5 + ceil(log2(101))
    assert 100 * config.levels < config.modulus
    with pytest.raises(ConfigError, match="does not fit in Z_m"):
        SecAggConfig(modulus_bits=11, quantization_bits=5, max_clients=100, clip=0.3)
    with pytest.raises(ConfigError, match=r"modulus_bits: 8\.\.32"):
        SecAggConfig.for_cohort(1000, 24, 1.0)


def test_every_client_of_a_round_keeps_the_same_coordinates_and_rounds_differ() -> None:
    randk = SharedRandK(0.25)
    seed = round_seed(7, 3)
    assert seed == round_seed(7, 3) and 0 <= seed < 2 ** 63
    first = randk.indices(seed, 1000)
    assert first.size == 250 and np.array_equal(first, np.unique(first))
    assert np.array_equal(first, randk.indices(round_seed(7, 3), 1000))
    assert not np.array_equal(first, randk.indices(round_seed(7, 4), 1000))
    assert not np.array_equal(first, randk.indices(round_seed(8, 3), 1000))
    with pytest.raises(ConfigError, match="density"):
        SharedRandK(0.0)


def test_the_secure_sum_of_kept_values_is_the_sum_of_the_updates_there() -> None:
    rng = np.random.default_rng(0)
    n, d = 12, 400
    updates = [rng.normal(0, 0.05, d) for _ in range(n)]
    config = SecAggConfig.for_cohort(n, 10, 0.3, neighbours=6)
    randk = SharedRandK(0.25)
    indices = randk.indices(round_seed(0, 1), d)
    inputs = [encode(randk.keep(u, None, indices)[0], config, rng).values for u in updates]
    result = run_secure_sum(inputs, config, drop_after_sharing={2}, seed=1)
    assert result.exact
    alive = sorted(result.delivered)
    total = scatter(decode_sum(result.total, len(alive), config), indices, d)
    expected = np.zeros(d)
    expected[indices] = np.sum([updates[i] for i in alive], axis=0)[indices]
    assert np.allclose(total, expected, atol=len(alive) * config.step)
    # each delivering client sent its kept values at the ring's bits, not 4 bytes each
    masked = 4 + packed_size(indices.size, config.modulus_bits)
    assert all(result.bytes_up[i] >= masked for i in alive)


def test_error_feedback_sends_every_coordinate_eventually() -> None:
    rng = np.random.default_rng(1)
    d, rounds = 64, 40
    randk = SharedRandK(0.25)
    config = SecAggConfig.for_cohort(4, 8, 1.0)
    residual: np.ndarray | None = None
    sent_total, update_total = np.zeros(d), np.zeros(d)
    for r in range(rounds):
        update = rng.normal(0, 0.1, d)
        update_total += update
        indices = randk.indices(round_seed(0, r), d)
        kept, residual = randk.keep(update, residual, indices)
        sent = decode_sum(encode(kept, config, rng).values, 1, config)
        randk.carry(residual, indices, kept, sent)
        sent_total += scatter(sent, indices, d)
    # what was sent plus what is still held is exactly what the client had to send
    assert residual is not None
    assert np.allclose(sent_total + residual, update_total, atol=1e-9)
    assert np.abs(residual).max() < np.abs(update_total).max()
