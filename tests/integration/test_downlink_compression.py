"""Downlink compression: the model broadcast encoded with ``downlink_codec``.

Clients start from the decoded vector and rebuild later versions from exact deltas between
served vectors; a digits run with an fp16 broadcast downloads half the bytes and trains as well
as the fp32 one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedlink.client.transfer import model_checksum
from fedlink.compress import broadcast_codec
from fedlink.compress.delta import apply_delta
from fedlink.coordinator import CoordinatorConfig
from fedlink.coordinator.history import ModelHistory
from fedlink.errors import ConfigError
from fedlink.sim import ExperimentConfig, run_simulation
from fedlink.wire import unpack


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32-zlib"])
def test_a_client_rebuilds_the_served_vector_from_a_delta_bit_for_bit(name: str) -> None:
    rng = np.random.default_rng(3)
    models = [rng.standard_normal(4000).astype(np.float32)]
    models.append(models[0] + 0.01 * rng.standard_normal(4000).astype(np.float32))
    history = ModelHistory(broadcast_codec(name), delta_history=4)
    for version, model in enumerate(models):
        history.publish(version, model, oldest_served=0)
    served = [history.payload(v) for v in (0, 1)]
    assert served[0] is not None and served[1] is not None
    held = unpack(served[0].header, served[0].data, 4000)  # what a client of version 0 holds
    delta = history.delta(0, 1)
    if delta is None:  # not smaller than the full payload: the client downloads that instead
        return
    rebuilt = apply_delta(held, delta.data)
    np.testing.assert_array_equal(rebuilt, unpack(served[1].header, served[1].data, 4000))
    assert model_checksum(rebuilt, name) == served[1].header.checksum


def test_a_lossy_broadcast_serves_half_the_bytes() -> None:
    model = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    history = ModelHistory(broadcast_codec("fp16"), delta_history=0)
    history.publish(0, model, oldest_served=0)
    payload = history.payload(0)
    assert payload is not None and payload.header.num_bytes == 2000
    np.testing.assert_allclose(unpack(payload.header, payload.data, 1000), model, rtol=1e-3)


@pytest.mark.parametrize("name", ["topk", "qsgd", "sign", "no-such-codec"])
def test_a_biased_stochastic_or_unknown_downlink_codec_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="downlink_codec"):
        CoordinatorConfig(downlink_codec=name)


def _digits(downlink: str, delta_history: int) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": f"it-downlink-{downlink}-{delta_history}", "seed": 5},
        "data": {"dataset": "digits", "clients": 10, "partition": "iid"},
        "model": {"name": "mlp"},
        "coordinator": {
            "rounds": 12,
            "downlink_codec": downlink,
            "flush": {"goal": 10, "min_updates": 10, "deadline_s": 60.0},
            "training": {"local_epochs": 3, "batch_size": 32, "learning_rate": 0.2},
            "limits": {"delta_history": delta_history},
        },
    })


@pytest.mark.timeout(240)
def test_an_fp16_broadcast_halves_downlink_bytes_at_the_same_accuracy(tmp_path: Path) -> None:
    fp32 = run_simulation(_digits("fp32", 0), tmp_path, progress=False).summary
    half = run_simulation(_digits("fp16", 0), tmp_path, progress=False)
    fp16 = half.summary
    assert fp16["rounds"] == fp32["rounds"] == 12
    assert fp32["final_accuracy"] >= 0.9
    assert fp16["final_accuracy"] >= fp32["final_accuracy"] - 0.01, (fp16, fp32)
    assert fp16["bytes_down"] == pytest.approx(fp32["bytes_down"] / 2, rel=0.01)
    assert fp32["downlink_compression_ratio"] == pytest.approx(1.0, rel=0.01)
    assert fp16["downlink_compression_ratio"] == pytest.approx(2.0, rel=0.01)
    assert "Downlink compression" in half.report.read_text()
    # with deltas: clients rebuild each served fp16 vector exactly, so the run is the same
    with_deltas = run_simulation(_digits("fp16", 4), tmp_path, progress=False).summary
    assert with_deltas["delta_bytes_saved"] > 0
    assert with_deltas["bytes_down"] < fp16["bytes_down"]
    # (to one test example: the order in which updates are folded in may vary)
    assert with_deltas["final_accuracy"] == pytest.approx(fp16["final_accuracy"], abs=0.003)
