"""User-level DP: clipping bounds every update, noise has the promised scale in both modes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlink.aggregate import FlushInfo, UpdateInfo
from fedlink.client.pipeline import UpdatePipeline
from fedlink.coordinator import CoordinatorConfig
from fedlink.errors import ConfigError
from fedlink.privacy import PRIVACY_STAGES, ClipAndNoise, DPFedAvgHook, clip_to_norm
from fedlink.privacy.setup import with_run_seed

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)
norms = st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False)


@given(delta=arrays(np.float32, st.integers(1, 300), elements=finite), clip=norms)
def test_every_clipped_update_has_norm_at_most_s(delta: np.ndarray, clip: float) -> None:
    clipped, was_clipped = clip_to_norm(delta, clip)

    norm = float(np.linalg.norm(clipped.astype(np.float64)))
    assert norm <= clip
    assert clipped.dtype == np.float32 and clipped.shape == delta.shape
    original = float(np.linalg.norm(delta.astype(np.float64)))
    assert was_clipped == (original > clip)
    if not was_clipped:
        np.testing.assert_array_equal(clipped, delta)
    elif original > 0:  # clipping scales, it does not change the direction
        cos = float(clipped.astype(np.float64) @ delta.astype(np.float64)) / (norm * original)
        assert cos > 1 - 1e-5


@given(delta=arrays(np.float32, st.integers(1, 100), elements=finite), clip=norms)
def test_the_stage_in_central_mode_only_clips(delta: np.ndarray, clip: float) -> None:
    stage = PRIVACY_STAGES.create("dp_fedavg", clip_norm=clip)
    out = stage.apply(delta, np.random.default_rng(0))
    assert float(np.linalg.norm(out.astype(np.float64))) <= clip
    clipped = float(np.linalg.norm(delta.astype(np.float64)) > clip)
    assert stage.metrics() == {"dp_clipped": clipped, "dp_clip_norm": clip}


def test_clipping_refuses_non_finite_updates() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        clip_to_norm(np.array([np.nan, 1.0], np.float32), 1.0)


def test_client_share_noise_has_std_z_s_over_sqrt_n() -> None:
    z, s, n = 1.1, 0.5, 16
    stage = ClipAndNoise(clip_norm=s, noise="clients", noise_multiplier=z, clients_per_flush=n)
    out = stage.apply(np.zeros(400_000, np.float32), np.random.default_rng(1))
    expected = z * s / math.sqrt(n)
    assert abs(out.std() / expected - 1) < 0.03


def test_central_noise_has_std_z_s_on_the_sum() -> None:
    z, s, n, dim = 1.1, 0.5, 8, 50_000
    hook = DPFedAvgHook(clip_norm=s, noise_multiplier=z, sample_rate=0.1, seed=2)
    sums = []
    for _ in range(8):
        for i in range(n):
            hook.on_update(UpdateInfo(f"c{i}", 0, 1.0, 10, {}))
        mean = hook.on_flush(np.zeros(dim, np.float32), FlushInfo(1, n, float(n)))
        sums.append(mean.astype(np.float64) * n)  # the noise on the sum of the n updates
    assert abs(np.concatenate(sums).std() / (z * s) - 1) < 0.03


def test_central_noise_is_drawn_afresh_unless_a_seed_is_named() -> None:
    """A served coordinator's noise cannot be regenerated from its config (whoever could
    would take it out of a released model); a named seed repeats it."""
    flush, zeros = FlushInfo(1, 10, 10.0), np.zeros(64, np.float32)

    def noise(**options: Any) -> np.ndarray:
        hook = DPFedAvgHook(clip_norm=1.0, noise_multiplier=1.0, sample_rate=0.1, **options)
        return hook.on_flush(zeros, flush)

    assert not np.array_equal(noise(), noise())
    np.testing.assert_array_equal(noise(seed=5), noise(seed=5))


def test_a_simulation_seeds_the_central_noise_with_its_own_seed() -> None:
    dp = {"name": "dp_fedavg", "sample_rate": 0.1}
    config = CoordinatorConfig(seed=4, hooks=(dp, {**dp, "seed": 9}, {"name": "dp_sgd"}))
    assert with_run_seed(config).hooks == ({**dp, "seed": 4}, {**dp, "seed": 9},
                                           {"name": "dp_sgd"})


def test_central_and_client_share_modes_give_the_same_noise_on_the_aggregate() -> None:
    z, s, n, dim = 0.9, 2.0, 10, 40_000
    rng = np.random.default_rng(3)
    # clients: each adds its share; the engine averages n uniformly weighted updates
    stage = ClipAndNoise(clip_norm=s, noise="clients", noise_multiplier=z, clients_per_flush=n)
    shares = np.mean([stage.apply(np.zeros(dim, np.float32), rng) for _ in range(n)], axis=0)
    clients_hook = DPFedAvgHook(clip_norm=s, noise_multiplier=z, noise="clients",
                                sample_rate=0.1)
    clients_mean = clients_hook.on_flush(shares, FlushInfo(1, n, float(n)))
    # central: clipping only, the hook adds the noise to the mean
    central_hook = DPFedAvgHook(clip_norm=s, noise_multiplier=z, noise="central",
                                sample_rate=0.1, seed=4)
    for i in range(n):
        central_hook.on_update(UpdateInfo(f"c{i}", 0, 3.0, 3, {}))
    central_mean = central_hook.on_flush(np.zeros(dim, np.float32), FlushInfo(1, n, 3.0 * n))

    expected_var = (z * s / n) ** 2
    assert abs(clients_mean.var() / expected_var - 1) < 0.05
    assert abs(central_mean.var() / expected_var - 1) < 0.05
    assert clients_hook.noise_stddev(FlushInfo(1, n, float(n))) == 0.0


def test_central_noise_scales_with_the_largest_weight() -> None:
    hook = DPFedAvgHook(clip_norm=1.0, noise_multiplier=1.0, sample_rate=0.1)
    flush = FlushInfo(1, 3, 10.0)
    assert hook.noise_stddev(flush, max_weight=5.0) == pytest.approx(0.5)
    assert hook.noise_stddev(flush, max_weight=10 / 3) == pytest.approx(1 / 3)


def test_pipeline_applies_privacy_before_the_codec_and_exposes_the_clipped_bit() -> None:
    pipeline = UpdatePipeline.from_names("dp_fedavg", "fp32", privacy_options={"clip_norm": 1.0})
    payload = pipeline.process(np.full(16, 10.0, np.float32), np.random.default_rng(0))
    assert payload.header.num_bytes == 64
    assert pipeline.privacy_metrics == {"dp_clipped": 1.0, "dp_clip_norm": 1.0}
    pipeline.configure({"dp_clip_norm": "100.0"})
    pipeline.process(np.full(16, 10.0, np.float32), np.random.default_rng(0))
    assert pipeline.privacy_metrics == {"dp_clipped": 0.0, "dp_clip_norm": 100.0}


@pytest.mark.parametrize("options", [
    {"clip_norm": 0.0}, {"clip_norm": -1.0}, {"noise": "server"},
    {"noise": "clients", "noise_multiplier": 0.0}, {"clients_per_flush": 0},
])
def test_bad_stage_options_are_config_errors(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        PRIVACY_STAGES.create("dp_fedavg", **options)
