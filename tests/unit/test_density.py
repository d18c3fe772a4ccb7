"""Bandwidth-aware density: the largest top-k density whose upload fits before the deadline."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedlink.client import UpdatePipeline
from fedlink.client.density import DensityPolicy, GoodputMeter
from fedlink.compress import Sparsifier, get_codec
from fedlink.errors import ConfigError
from fedlink.experiment.config import ExperimentConfig

N = 10_000


def topk(density: float = 0.01, name: str = "topk+q8") -> Sparsifier:
    codec = get_codec(name, density=density)
    assert isinstance(codec, Sparsifier)
    return codec


@given(goodput=st.floats(10.0, 1e7), time_left=st.floats(0.0, 100.0),
       name=st.sampled_from(["topk", "topk+q8", "randk+fp16"]))
def test_chosen_density_is_the_largest_that_fits_within_bounds(goodput: float, time_left: float,
                                                               name: str) -> None:
    policy = DensityPolicy(0.001, 0.2, safety=0.5)
    chosen = policy.choose(topk(name=name), N, goodput, time_left)
    budget = 0.5 * goodput * time_left
    k = round(chosen.density * N)
    assert 10 <= k <= 2000
    if k > 10:  # above the minimum, it fits
        assert chosen.size_bound(N) <= budget
    if k < 2000:  # below the maximum, one more value would not fit
        assert chosen.with_density((k + 1) / N).size_bound(N) > budget


def test_without_a_measurement_or_deadline_the_configured_density_is_clamped() -> None:
    policy = DensityPolicy(0.005, 0.05)
    assert policy.choose(topk(0.01), N, None, 10.0).density == 0.01
    assert policy.choose(topk(0.5), N, 1e6, None).density == 0.05
    assert policy.choose(topk(0.0001), N, None, None).density == 0.005


def test_a_slower_link_or_less_time_gets_a_lower_density() -> None:
    policy = DensityPolicy(0.001, 0.5)
    fast = policy.choose(topk(), N, 100_000.0, 1.0).density
    slow = policy.choose(topk(), N, 10_000.0, 1.0).density
    late = policy.choose(topk(), N, 100_000.0, 0.1).density
    assert fast > slow and fast > late


def test_bad_bounds_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        DensityPolicy(0.1, 0.01)
    with pytest.raises(ConfigError):
        DensityPolicy(0.0, 0.1)
    with pytest.raises(ConfigError):
        DensityPolicy(safety=0.0)


def test_goodput_is_a_weighted_average_of_recent_uploads() -> None:
    meter = GoodputMeter(smoothing=0.5)
    assert meter.bytes_per_s is None
    meter.observe(1000, 1.0)
    meter.observe(3000, 1.0)
    meter.observe(0, 1.0)  # ignored
    assert meter.bytes_per_s == pytest.approx(2000.0)


def test_pipeline_sizes_uploads_from_its_goodput() -> None:
    pipeline = UpdatePipeline(codec=topk(0.05), density=DensityPolicy(0.001, 0.1))
    rng = np.random.default_rng(0)
    update = rng.standard_normal(N).astype(np.float32)
    assert pipeline.process(update, rng, time_left_s=1.0).header.codec_params["density"] \
        == repr(0.05)  # no measurement yet
    pipeline.observe_upload(2_000, 1.0)  # 2 kB/s, 1 s left, safety 0.5: 1 kB
    small = pipeline.process(update, rng, time_left_s=1.0)
    assert small.header.num_bytes <= 1_000
    assert float(small.header.codec_params["density"]) < 0.05


def test_non_sparsifying_codecs_are_left_alone() -> None:
    pipeline = UpdatePipeline(codec=get_codec("qsgd"), density=DensityPolicy())
    pipeline.observe_upload(10, 1.0)
    assert pipeline.codec_for(N, 1.0) is pipeline.codec


def test_sim_config_builds_the_compression_pipeline() -> None:
    from fedlink.sim import ExperimentConfig

    config = ExperimentConfig.from_dict({"client": {
        "compression": "topk+q8", "compression_options": {"density": 0.02},
        "density_bounds": [0.005, 0.05]}})
    pipeline = config.client.pipeline()
    assert isinstance(pipeline.codec, Sparsifier)
    assert (pipeline.codec.name, pipeline.codec.density) == ("topk+q8", 0.02)
    assert pipeline.feedback is not None
    assert pipeline.density == DensityPolicy(0.005, 0.05)
    assert config.to_dict()["client"]["compression_options"] == {"density": 0.02}
    assert ExperimentConfig.from_dict({}).client.pipeline().feedback is None
    with pytest.raises(ConfigError):
        ExperimentConfig.from_dict({"client": {"compression": "topk",
                                               "compression_options": {"bits": 8}}})
    with pytest.raises(ConfigError):
        ExperimentConfig.from_dict({"client": {"density_bounds": [0.5, 0.1]}})


@pytest.mark.parametrize("codec", ["fp32", "fp16", "qsgd"])
def test_density_bounds_without_a_sparsifying_codec_are_refused(codec: str) -> None:
    """Only top-k and random-k have a density to choose: with any other codec the bounds
    could not take effect."""
    with pytest.raises(ConfigError, match=r"^client\.density_bounds: .*sparsifying"):
        ExperimentConfig.from_dict({"client": {"compression": codec,
                                               "density_bounds": [0.01, 0.1]}})
