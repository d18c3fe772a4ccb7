"""The client's update pipeline by kind of model state (issue 24; docs/model-state.md).

Privacy clips and noises the trainable weights only; buffers that would leave a private
client are refused before the run (naming ``[client] privacy`` and ``keep_local``) and, if
they get there anyway, at the update; without privacy buffers travel as the plain values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch import nn

from fedlink.client.pipeline import UpdatePipeline, check_state, shared_state
from fedlink.errors import ConfigError
from fedlink.experiment.setup import Experiment, Plugs
from fedlink.params import BUFFER, COUNTER, TRAINABLE, ParamSpec
from fedlink.sim import ExperimentConfig
from fedlink.wire import unpack

SPEC = ParamSpec(names=("w", "bn.running_var", "bn.num_batches_tracked"),
                 shapes=((6,), (2,), ()), dtypes=("float32", "float32", "int64"),
                 kinds=(TRAINABLE, BUFFER, COUNTER))


def dp_pipeline(noise: str = "central") -> UpdatePipeline:
    return UpdatePipeline.from_names("dp_fedavg", privacy_options={
        "clip_norm": 1.0, "noise": noise, "noise_multiplier": 1.0, "clients_per_flush": 2})


def decoded(pipeline: UpdatePipeline, delta: np.ndarray, seed: int = 0) -> np.ndarray:
    payload = pipeline.process(delta, np.random.default_rng(seed))
    return unpack(payload.header, payload.data, delta.size)


def test_clipping_measures_and_scales_the_trainable_part_only() -> None:
    pipeline = dp_pipeline()
    pipeline.bind(SPEC)
    delta = np.array([3, 0, 0, 0, 0, 4, 0, 0, 0], dtype=np.float32)  # weights' norm 5
    out = decoded(pipeline, delta)
    np.testing.assert_allclose(out[:6], delta[:6] / 5, rtol=1e-6)
    assert np.linalg.norm(out[:6]) <= 1.0
    np.testing.assert_array_equal(out[6:], 0)
    assert pipeline.privacy_metrics["dp_clipped"] == 1.0


def test_client_noise_goes_to_the_weights_never_to_buffers_or_counters() -> None:
    pipeline = dp_pipeline("clients")
    pipeline.bind(SPEC)
    out = decoded(pipeline, np.zeros(9, dtype=np.float32))
    assert np.all(out[:6] != 0)  # the noise share
    np.testing.assert_array_equal(out[6:], 0)


def test_a_private_update_that_moves_a_buffer_is_refused_naming_it() -> None:
    pipeline = dp_pipeline()
    pipeline.bind(SPEC)
    delta = np.zeros(9, dtype=np.float32)
    delta[7] = 0.25  # a running variance moved: it would leave un-noised
    with pytest.raises(ConfigError, match=r"changes 'bn.running_var'.*keep_local"):
        pipeline.process(delta, np.random.default_rng(0))


def test_without_privacy_buffers_travel_as_their_values() -> None:
    pipeline = UpdatePipeline()
    pipeline.bind(SPEC)
    delta = np.arange(9, dtype=np.float32) - 3
    np.testing.assert_array_equal(decoded(pipeline, delta), delta)


def test_unbound_pipeline_privatises_the_whole_vector_as_before() -> None:
    delta = np.full(4, 1.0, dtype=np.float32)
    assert np.linalg.norm(decoded(dp_pipeline(), delta)) <= 1.0


def test_check_state_names_the_buffers_a_private_client_would_send() -> None:
    assert shared_state(SPEC) == ("bn.running_var", "bn.num_batches_tracked")
    kept = SPEC.mask(BUFFER, COUNTER)
    assert shared_state(SPEC, kept) == ()
    check_state(UpdatePipeline(), SPEC)  # no privacy: nothing to protect
    check_state(dp_pipeline(), SPEC, kept)  # kept on the clients: nothing leaves
    with pytest.raises(ConfigError, match=r"privacy = 'dp_fedavg' cannot cover the model's "
                                          r"buffers \(bn.running_var, bn.num_batches_tracked\)"):
        check_state(dp_pipeline(), SPEC)


def bn_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


def dp_fedavg_config(**client: Any) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": "kinds", "seed": 1},
        "data": {"dataset": "digits", "clients": 4},
        "client": {"privacy": "dp_fedavg", **client},
        "coordinator": {"rounds": 1, "flush": {"goal": 4},
                        "hooks": [{"name": "dp_fedavg", "clip_norm": 1.0,
                                   "noise_multiplier": 0.5}]},
    })


def test_dp_fedavg_with_a_batchnorm_model_is_refused_before_the_run() -> None:
    with pytest.raises(ConfigError) as caught:
        Experiment.build(dp_fedavg_config(), Plugs(model=bn_mlp))
    message = str(caught.value)
    assert "[client] privacy = 'dp_fedavg'" in message and "1.running_mean" in message
    assert 'keep_local = ["batchnorm"]' in message and "GroupNorm" in message


def test_dp_fedavg_with_batchnorm_kept_local_trains_and_uploads_no_buffer() -> None:
    experiment = Experiment.build(dp_fedavg_config(keep_local=["batchnorm"]),
                                  Plugs(model=bn_mlp))
    trainer = experiment.trainer(0)
    pipeline = experiment.config.client.pipeline()
    from fedlink.client import TrainPlan

    start = experiment.initial_vector()
    result = trainer.train(start, TrainPlan(local_steps=5, batch_size=16, learning_rate=0.1))
    pipeline.bind(trainer.spec)  # type: ignore[attr-defined]
    out = decoded(pipeline, result.params - start)
    buffers = experiment.spec().mask(BUFFER, COUNTER)
    np.testing.assert_array_equal(out[buffers], 0)
    assert 0 < np.linalg.norm(out) <= 1.0


# -- compression by kind ----------------------------------------------------------------------

SIGNS = np.array([0.5, -0.25, 0.125, -1.0, 2.0, -0.5, 0.75, 3.0, 0.0], dtype=np.float32)


@pytest.mark.parametrize("codec", ["sign", "topk", "topk+q8", "randk", "qsgd", "fp16"])
def test_a_lossy_codec_encodes_the_weights_and_buffers_travel_exactly(codec: str) -> None:
    options = {"density": 0.34} if codec.startswith(("topk", "randk")) else {}
    pipeline = UpdatePipeline.from_names("none", codec, options, error_feedback=False)
    pipeline.bind(SPEC)
    payload = pipeline.process(SIGNS, np.random.default_rng(1))
    assert payload.header.encoding == "split"
    assert payload.header.codec_params["inner"] == codec
    out = unpack(payload.header, payload.data, SIGNS.size)
    np.testing.assert_array_equal(out[6:], SIGNS[6:])  # running_var, counter: as they were


def test_lossless_codecs_and_models_without_buffers_are_not_wrapped() -> None:
    for codec in ("fp32", "fp32-zlib"):
        pipeline = UpdatePipeline.from_names("none", codec)
        pipeline.bind(SPEC)
        assert pipeline.process(SIGNS, np.random.default_rng(0)).header.encoding == codec
    weights_only = ParamSpec(names=("w",), shapes=((9,),), dtypes=("float32",))
    pipeline = UpdatePipeline.from_names("none", "sign")
    pipeline.bind(weights_only)
    assert pipeline.process(SIGNS, np.random.default_rng(0)).header.encoding == "sign"


def test_error_feedback_keeps_no_residual_on_buffers() -> None:
    pipeline = UpdatePipeline.from_names("none", "topk", {"density": 0.2})
    pipeline.bind(SPEC)
    pipeline.process(SIGNS, np.random.default_rng(0))
    assert pipeline.feedback is not None and pipeline.feedback.residual is not None
    np.testing.assert_array_equal(pipeline.feedback.residual[6:], 0)
    assert np.any(pipeline.feedback.residual[:6] != 0)


def test_a_sign_compressed_batchnorm_model_keeps_sane_running_statistics() -> None:
    """What silently went wrong before: ``sign`` sent every unchanged running variance as
    +scale, so averaged variances drifted up each round (and a negative delta's sign could
    push one below zero)."""
    experiment = Experiment.build(ExperimentConfig.from_dict({
        "run": {"name": "kinds-sign", "seed": 1},
        "data": {"dataset": "digits", "clients": 2},
        "client": {"compression": "sign"},
        "coordinator": {"rounds": 1, "flush": {"goal": 2}},
    }), Plugs(model=bn_mlp))
    from fedlink.client import TrainPlan

    start = experiment.initial_vector()
    trainer = experiment.trainer(0)
    result = trainer.train(start, TrainPlan(local_steps=5, batch_size=16, learning_rate=0.1))
    pipeline = experiment.config.client.pipeline()
    pipeline.bind(trainer.spec)  # type: ignore[attr-defined]
    sent = decoded(pipeline, result.params - start)
    buffers = experiment.spec().mask(BUFFER, COUNTER)
    np.testing.assert_array_equal(sent[buffers], (result.params - start)[buffers])
