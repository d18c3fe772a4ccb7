"""One validation for every config section: errors name the full key path and the expected
type or range, and a typo in ``[data] options`` fails when the file is parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedlink.client import RetryPolicy
from fedlink.config import describe_type, fits
from fedlink.coordinator import CoordinatorConfig
from fedlink.errors import ConfigError
from fedlink.sim import ExperimentConfig


def test_a_string_where_an_integer_belongs_names_data_clients(tmp_path: Path) -> None:
    path = tmp_path / "experiment.toml"
    path.write_text('[data]\nclients = "10"\n')
    with pytest.raises(ConfigError) as err:
        ExperimentConfig.from_toml(path)
    assert "data.clients" in str(err.value)
    assert "integer" in str(err.value)
    assert "'>=' not supported" not in str(err.value)


@pytest.mark.parametrize(("table", "path", "expected"), [
    ({"run": {"seed": "7"}}, "run.seed", "integer"),
    ({"run": {"seed": -1}}, "run.seed", ">= 0"),
    ({"run": {"target_accuracy": "high"}}, "run.target_accuracy", "number"),
    ({"run": {"evaluate_train": 1}}, "run.evaluate_train", "true or false"),
    ({"data": {"partition": 3}}, "data.partition", "a string or nothing"),
    ({"model": {"options": ["hidden"]}}, "model.options", "a table"),
    ({"client": {"keep_local": "batchnorm"}}, "client.keep_local", "a list"),
    ({"client": {"density_bounds": [0.1]}}, "client.density_bounds", "a list or nothing"),
    ({"client": {"retry": {"max_attempts": "5"}}}, "client.retry.max_attempts", "integer"),
    ({"client": {"liveness": {"rtt_multiple": "4"}}}, "client.liveness.rtt_multiple",
     "number"),
    ({"coordinator": {"rounds": 2.5}}, "coordinator.rounds", "integer"),
    ({"coordinator": {"flush": {"goal": "3"}}}, "coordinator.flush.goal", "integer"),
    ({"coordinator": {"limits": {"chunk_bytes": 0}}}, "coordinator.limits.chunk_bytes",
     "max_chunk_bytes"),
    ({"coordinator": {"metrics": {"enabled": "yes"}}}, "coordinator.metrics.enabled",
     "true or false"),
    ({"coordinator": {"evaluation": {"every": 0}}}, "coordinator.evaluation.every", ">= 1"),
    ({"partial_work": {"fraction": True}}, "partial_work.fraction", "number"),
    ({"virtual": {"population": "many"}}, "virtual.population", "integer"),
])
def test_every_section_names_the_full_key_and_what_it_expects(
        table: dict[str, Any], path: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        ExperimentConfig.from_dict(table)
    message = str(err.value)
    assert message.startswith(f"{path}:"), message
    assert expected in message, message


def test_a_typo_in_data_options_fails_at_parse_time() -> None:
    with pytest.raises(ConfigError) as err:
        ExperimentConfig.from_dict({"data": {"partition": "dirichlet",
                                             "options": {"alhpa": 0.3}}})
    message = str(err.value)
    assert message.startswith("data.options:"), message
    assert "'alhpa'" in message and "'alpha'" in message  # the typo and what was meant


def test_data_option_values_are_checked_against_the_declared_types() -> None:
    with pytest.raises(ConfigError, match=r"^data\.options\.alpha: expected a number, got str"):
        ExperimentConfig.from_dict({"data": {"partition": "dirichlet",
                                             "options": {"alpha": "0.3"}}})
    with pytest.raises(ConfigError, match=r"^data\.options\.test_fraction: expected a number"):
        ExperimentConfig.from_dict({"data": {"options": {"test_fraction": [0.2]}}})


def test_unknown_dataset_and_partition_name_their_keys() -> None:
    with pytest.raises(ConfigError, match=r"^data\.dataset: unknown dataset 'mnist'"):
        ExperimentConfig.from_dict({"data": {"dataset": "mnist"}})
    with pytest.raises(ConfigError, match=r"^data\.partition: unknown partition 'dirichet'"):
        ExperimentConfig.from_dict({"data": {"partition": "dirichet"}})


def test_with_a_loader_partitioner_options_are_still_checked() -> None:
    config = ExperimentConfig.from_dict({"data": {
        "loader": "mypkg.data:load", "partition": "dirichlet",
        "options": {"alpha": 0.3, "root": "/data"}}})  # root is for the loader
    assert config.data.options["root"] == "/data"
    with pytest.raises(ConfigError, match=r"^data\.options\.alpha: expected a number"):
        ExperimentConfig.from_dict({"data": {"loader": "mypkg.data:load",
                                             "partition": "dirichlet",
                                             "options": {"alpha": "x"}}})


def test_valid_values_still_load() -> None:
    config = ExperimentConfig.from_dict({
        "run": {"seed": 3, "target_accuracy": 1},
        "data": {"clients": 4, "partition": "dirichlet", "options": {"alpha": 1, "min_samples": 2}},
        "client": {"compression": "topk", "density_bounds": [0.01, 0.1],
                   "keep_local": ["batchnorm"]},
        "coordinator": {"flush": {"goal": 2, "deadline_s": 30}},
    })
    assert config.data.options == {"alpha": 1, "min_samples": 2}
    assert config.client.density_bounds == (0.01, 0.1)


def test_objects_built_in_python_are_checked_the_same_way() -> None:
    with pytest.raises(ConfigError, match=r"^client\.retry\.keep_trying: expected true or false"):
        RetryPolicy(keep_trying="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^coordinator\.rounds: expected an integer"):
        CoordinatorConfig(rounds="3")  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "hint", "ok"), [
    (3, float, True), (True, int, False), (True, float, False), (2.0, int, False),
    ((1.0, 2), tuple[float, float], True), ((1.0,), tuple[float, float], False),
    (("a", "b"), tuple[str, ...], True), (("a", 1), tuple[str, ...], False),
    (None, int | None, True), ("x", int | None, False), ({"k": 1}, dict[str, int], True),
])
def test_fits_reads_hints_as_toml_values(value: object, hint: Any, ok: bool) -> None:
    assert fits(value, hint) is ok


def test_expected_types_are_said_in_toml_words() -> None:
    assert describe_type(int) == "an integer"
    assert describe_type(float | None) == "a number or nothing"
    assert describe_type(tuple[str, ...]) == "a list"
