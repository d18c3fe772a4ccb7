"""Distributed differential privacy: Skellam noise shares summed by the secure sum
(fedlink.secagg.ddp), and its accounting held to the exact Rényi divergence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ive, logsumexp

from fedlink.errors import ConfigError
from fedlink.privacy.accounting import epsilon as gaussian_epsilon
from fedlink.secagg import SkellamConfig, run_secure_sum
from fedlink.secagg.ddp import skellam_rdp


def exact_skellam_rdp(alpha: int, shift: int, variance: float) -> float:
    """D_alpha(Sk(mu) + shift || Sk(mu)) summed over the support (pmf = ive(|k|, mu))."""
    k = np.arange(-int(40 * math.sqrt(variance)) - 60, int(40 * math.sqrt(variance)) + 60)
    with np.errstate(divide="ignore"):
        p, q = np.log(ive(np.abs(k - shift), variance)), np.log(ive(np.abs(k), variance))
    finite = np.isfinite(p) & np.isfinite(q)
    return float(logsumexp(alpha * p[finite] + (1 - alpha) * q[finite]) / (alpha - 1))


@pytest.mark.parametrize("variance", [2.0, 10.0, 100.0])
@pytest.mark.parametrize("alpha", [2, 5, 20])
@pytest.mark.parametrize("shift", [1, 3])
def test_the_rdp_bound_holds_over_the_exact_divergence(variance: float, alpha: int,
                                                       shift: int) -> None:
    exact = exact_skellam_rdp(alpha, shift, variance)
    bound = skellam_rdp(alpha, shift, shift, variance)
    assert exact <= bound
    if variance >= 100:  # and is tight where the noise is wide (the Gaussian's alpha D^2/2mu)
        assert bound <= 1.1 * exact


def test_the_bound_is_refused_at_orders_it_does_not_cover() -> None:
    with pytest.raises(ValueError, match="integer orders"):
        skellam_rdp(1.5, 1.0, 1.0, 10.0)  # type: ignore[arg-type]


def test_a_fine_granularity_accounts_like_the_gaussian_at_the_same_noise() -> None:
    config = SkellamConfig(clip_norm=1.0, noise_multiplier=2.0, clients=50, size=1000)
    assert config.norm_bound == pytest.approx(2 ** 16, rel=1e-3)
    # close to (and never below) central DP-FedAvg's epsilon at z = 2, every client each round
    ours, gaussian = config.epsilon(20, 1e-5), gaussian_epsilon(2.0, 1.0, 20, 1e-5)
    assert gaussian <= ours <= 1.01 * gaussian


def test_the_sum_of_shares_carries_the_target_noise_and_decodes_the_sum() -> None:
    n, d = 20, 4000
    rng = np.random.default_rng(0)
    updates = [rng.normal(0, 1, d) for _ in range(n)]
    updates = [u / np.linalg.norm(u) * 0.5 for u in updates]  # within the clip
    config = SkellamConfig(clip_norm=1.0, noise_multiplier=0.1, clients=n, size=d)
    result = run_secure_sum([config.encode(u, rng) for u in updates], config.ring(), seed=3)
    assert result.exact
    noise = config.decode_sum(result.total) - np.sum(updates, axis=0)
    # the noise of the sum: std z * c, mean 0 (within sampling error over 4000 values)
    assert np.std(noise) == pytest.approx(0.1, rel=0.05)
    assert abs(np.mean(noise)) < 4 * 0.1 / math.sqrt(d)


def test_an_update_is_clipped_and_rounded_within_the_norm_bound() -> None:
    config = SkellamConfig(clip_norm=1.0, noise_multiplier=1e-6, clients=1, size=500,
                           granularity_bits=8)
    rng = np.random.default_rng(1)
    big = rng.normal(0, 10, 500)
    encoded = config.encode(big, rng)
    signed = config.decode_sum(encoded) / config.gamma
    assert float(np.linalg.norm(signed)) <= config.norm_bound
    assert np.allclose(config.decode_sum(encoded), big / np.linalg.norm(big), atol=config.gamma)


def test_a_ring_too_small_for_the_sum_is_refused() -> None:
    with pytest.raises(ConfigError, match="use modulus_bits >= "):
        SkellamConfig(clip_norm=1.0, noise_multiplier=1.0, clients=200, size=1000,
                      granularity_bits=24)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        SkellamConfig(clip_norm=1.0, noise_multiplier=0.0, clients=10, size=10)
