"""Experiment configs: the dp_fedavg hook is the one switch; both halves must be present."""

from __future__ import annotations

from typing import Any

import pytest

from fedlink.errors import ConfigError
from fedlink.metrics.summary import summarize
from fedlink.privacy import ClipAndNoise
from fedlink.sim import ExperimentConfig


def _table(privacy: str = "dp_fedavg", hooks: list[dict[str, Any]] | None = None,
           **client: Any) -> dict[str, Any]:
    return {
        "data": {"dataset": "digits", "clients": 40},
        "client": {"privacy": privacy, **client},
        "coordinator": {"flush": {"goal": 8},
                        "hooks": hooks if hooks is not None else [
                            {"name": "dp_fedavg", "clip_norm": 0.5, "noise_multiplier": 1.3,
                             "noise": "clients"}]},
    }


def test_client_stage_and_sampling_rate_come_from_the_hook() -> None:
    config = ExperimentConfig.from_dict(_table())

    assert dict(config.client.privacy_options) == {
        "clip_norm": 0.5, "noise": "clients", "noise_multiplier": 1.3, "clients_per_flush": 8}
    stage = config.client.pipeline().privacy
    assert isinstance(stage, ClipAndNoise)
    assert stage.share_stddev == pytest.approx(1.3 * 0.5 / 8**0.5)
    hook = dict(config.coordinator.hooks[0])
    assert hook["population"] == 40 and hook["cohort"] == 8  # q = 8 / 40


def test_an_explicit_sample_rate_is_kept() -> None:
    table = _table(hooks=[{"name": "dp_fedavg", "sample_rate": 0.01}])
    hook = dict(ExperimentConfig.from_dict(table).coordinator.hooks[0])
    assert hook["sample_rate"] == 0.01 and "population" not in hook


@pytest.mark.parametrize(("table", "match"), [
    (_table(hooks=[]), "needs exactly one"),
    (_table(privacy="none"), "needs \\[client\\] privacy"),
    (_table(privacy_options={"clip_norm": 2.0}), "differs"),
    (_table(trainer="jax"), "client.trainer"),
    ({**_table(), "coordinator": {**_table()["coordinator"], "aggregator": "median"}},
     "aggregator"),
])
def test_half_configured_dp_is_a_config_error(table: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ExperimentConfig.from_dict(table)


def test_summary_privacy_is_the_last_flush_record_or_none() -> None:
    record = {"epsilon": 1.5, "delta": 1e-5, "mode": "user_central"}
    events = [{"kind": "flush", "elapsed": 1.0, "epsilon": 1.0, "privacy": {"epsilon": 1.0}},
              {"kind": "flush", "elapsed": 2.0, "epsilon": 1.5, "privacy": record}]
    assert summarize(events, {})["privacy"] == record
    assert summarize([{"kind": "flush", "elapsed": 1.0}], {})["privacy"] is None
