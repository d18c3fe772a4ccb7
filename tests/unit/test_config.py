"""CoordinatorConfig: built from TOML-style tables, validated at the edge with clear errors."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from fedlink.config import load_toml
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig, TrainingConfig
from fedlink.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "server" / "coordinator.example.toml"

FULL = """
run_name = "edge-trial"
rounds = 7
server_optimizer = "fedavgm"
staleness_weight = "polynomial"
join_token = "s3cret"
seed = 42

[server_optimizer_options]
lr = 0.5
momentum = 0.8

[staleness_weight_options]
a = 0.25

[flush]
goal = 8
min_updates = 5
deadline_s = 20
over_selection = 1.3
max_staleness = 2

[training]
local_steps = 50
batch_size = 16
learning_rate = 0.1
trainer_options = { model = "mlp" }

[limits]
chunk_bytes = 65536
max_update_bytes = 10_000_000
long_poll_s = 0
"""


def test_from_dict_with_nested_tables() -> None:
    config = CoordinatorConfig.from_dict(tomllib.loads(FULL))
    assert config.run_name == "edge-trial"
    assert config.rounds == 7
    assert config.flush == FlushRule(goal=8, min_updates=5, deadline_s=20, over_selection=1.3,
                                     max_staleness=2)
    assert config.flush.cohort == 11  # ceil(8 * 1.3)
    assert config.training == TrainingConfig(local_steps=50, batch_size=16, learning_rate=0.1,
                                             trainer_options={"model": "mlp"})
    assert config.limits.chunk_bytes == 65536
    assert config.limits.max_update_bytes == 10_000_000
    assert config.limits.long_poll_s == 0
    assert config.limits.max_chunk_bytes == LimitsConfig().max_chunk_bytes  # default kept
    assert config.server_optimizer == "fedavgm"
    assert dict(config.server_optimizer_options) == {"lr": 0.5, "momentum": 0.8}
    assert config.join_token == "s3cret" and config.seed == 42
    assert config.to_dict()["flush"]["goal"] == 8


def test_empty_table_gives_defaults() -> None:
    assert CoordinatorConfig.from_dict({}) == CoordinatorConfig()


def test_default_is_synchronous_fedavg() -> None:
    rule = CoordinatorConfig().flush
    assert rule.max_staleness == 0
    assert rule.cohort == rule.goal


@pytest.mark.parametrize(("table", "section", "key"), [
    ({"roundz": 3}, "[coordinator]", "roundz"),
    ({"flush": {"goal": 3, "deadline": 5}}, "[coordinator.flush]", "deadline"),
    ({"training": {"epochs": 2}}, "[coordinator.training]", "epochs"),
    ({"limits": {"chunk_size": 2}}, "[coordinator.limits]", "chunk_size"),
])
def test_unknown_keys_are_config_errors_naming_the_key(table: dict[str, Any], section: str,
                                                       key: str) -> None:
    with pytest.raises(ConfigError) as err:
        CoordinatorConfig.from_dict(table)
    message = str(err.value)
    assert section in message
    assert repr(key) in message
    assert "allowed" in message


@pytest.mark.parametrize(("table", "field"), [
    ({"rounds": 0}, "rounds"),
    ({"run_name": ""}, "run_name"),
    ({"flush": {"goal": 0}}, "flush.goal"),
    ({"flush": {"goal": 4, "min_updates": 5}}, "flush.min_updates"),
    ({"flush": {"deadline_s": -1}}, "flush.deadline_s"),
    ({"flush": {"over_selection": 0.5}}, "flush.over_selection"),
    ({"flush": {"max_staleness": -1}}, "flush.max_staleness"),
    ({"training": {"learning_rate": 0}}, "training.learning_rate"),
    ({"training": {"batch_size": 0}}, "training.batch_size"),
    ({"training": {"local_steps": -1}}, "training.local_steps"),
    ({"training": {"local_epochs": 0}}, "training.local_epochs"),
    ({"limits": {"chunk_bytes": 4 << 20}}, "limits.chunk_bytes"),
    ({"limits": {"max_chunk_bytes": 5 << 20, "chunk_bytes": 1024}}, "limits.max_chunk_bytes"),
    ({"limits": {"retry_after_s": 0}}, "limits.retry_after_s"),
    ({"limits": {"heartbeat_interval_s": -1}}, "limits.heartbeat_interval_s"),
    # wrong types, as a TOML file can easily hold
    ({"rounds": "ten"}, "rounds"),
    ({"flush": {"goal": "3"}}, "flush.goal"),
    ({"flush": {"goal": 2.5}}, "flush.goal"),
    ({"flush": {"deadline_s": "30s"}}, "flush.deadline_s"),
    ({"training": {"trainer_options": "mlp"}}, "training.trainer_options"),
    # unknown components
    ({"server_optimizer": "sgd-please"}, "server_optimizer"),
    ({"server_optimizer": "fedavgm", "server_optimizer_options": {"momentum": 1.5}},
     "server_optimizer"),
    ({"staleness_weight": "exponential"}, "staleness_weight"),
    ({"staleness_weight": "hinge", "staleness_weight_options": {"c": 1}}, "staleness_weight"),
])
def test_invalid_values_are_config_errors_naming_the_field(table: dict[str, Any],
                                                           field: str) -> None:
    with pytest.raises(ConfigError) as err:
        CoordinatorConfig.from_dict(table)
    assert str(err.value).startswith(f"coordinator.{field}:"), str(err.value)


def test_nested_value_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"\[coordinator.flush\] must be a table"):
        CoordinatorConfig.from_dict({"flush": 3})


def test_integers_are_accepted_for_float_fields() -> None:
    rule = CoordinatorConfig.from_dict({"flush": {"deadline_s": 30, "over_selection": 2}}).flush
    assert rule.deadline_s == 30 and rule.cohort == 2 * rule.goal


def test_load_toml_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        load_toml(missing)
    broken = tmp_path / "broken.toml"
    broken.write_text("[flush\ngoal = 3\n")
    with pytest.raises(ConfigError, match=r"broken\.toml: invalid TOML"):
        load_toml(broken)


@pytest.mark.skipif(not EXAMPLE.exists(),
                    reason="server/coordinator.example.toml is not written yet")
def test_example_server_config_loads() -> None:
    document = load_toml(EXAMPLE)
    table = document.get("coordinator", document)
    config = CoordinatorConfig.from_dict(table)
    assert config.rounds >= 1


def test_deadline_zero_means_no_deadline() -> None:
    rule = CoordinatorConfig.from_dict({"flush": {"deadline_s": 0}}).flush
    assert rule.deadline_s is None


WEIGHTS_MODULE = '''
class Boost:
    """FedAsync-style, scaled: fresh updates count double."""
    def __call__(self, tau):
        return 2.0 / (1 + tau)

class Cutoff:
    """1 fresh, 1/2 a version behind, 0 beyond."""
    def __call__(self, tau):
        return {0: 1.0, 1: 0.5}.get(tau, 0.0)
'''


@pytest.mark.parametrize(("weight", "secure", "refused"), [
    ("Boost", False, False),  # a plain mean divides by the total: any positive scale works
    ("Boost", True, True),  # a secure sum carries weights in (0, 1]: every group was lost
    ("Cutoff", False, True),  # a weight of 0 stopped a plain run at its first such update
    ("Cutoff", True, True),
])
def test_a_staleness_weight_a_flush_cannot_use_is_refused_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weight: str, secure: bool,
        refused: bool) -> None:
    """Weights are checked for every staleness the flush accepts (``max_staleness`` 3), so a
    run never fails, or loses every secure group, on the first update that staleness."""
    (tmp_path / "user_weights.py").write_text(WEIGHTS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    table: dict[str, Any] = {"staleness_weight": f"user_weights:{weight}",
                             "flush": {"max_staleness": 3, "goal": 4, "deadline_s": 30}}
    if secure:
        table |= {"secure": {"enabled": True}, "robust": {"enabled": False},
                  "norm_bound_adaptive": False}
    if not refused:
        CoordinatorConfig.from_dict(table)
        return
    with pytest.raises(ConfigError, match=r"^coordinator\.staleness_weight: 'user_weights:"):
        CoordinatorConfig.from_dict(table)


@pytest.mark.parametrize("rule,clients,problem", [
    (FlushRule(goal=6, min_updates=6, deadline_s=None), 4, "min_updates = 6"),
    (FlushRule(goal=6, min_updates=2, deadline_s=None), 4, "goal = 6 and no deadline"),
    (FlushRule(goal=6, min_updates=5, deadline_s=30.0), 4, "min_updates = 5"),
])
def test_a_round_fewer_clients_can_never_flush_is_named(rule: FlushRule, clients: int,
                                                        problem: str) -> None:
    message = rule.unfillable_by(clients, "[data] clients")
    assert message is not None and message.startswith(problem)
    assert "4 clients" in message and message.endswith("or raise [data] clients")


@pytest.mark.parametrize("rule", [
    FlushRule(goal=6, min_updates=2, deadline_s=30.0),  # the deadline flushes what came
    FlushRule(goal=4, min_updates=4, deadline_s=None),
    FlushRule.from_preset("async", goal=10),  # a client is asked again as soon as it delivers
])
def test_a_round_the_clients_can_flush_is_not(rule: FlushRule) -> None:
    assert rule.unfillable_by(4) is None


SECURE = {"secure": {"enabled": True}, "robust": {"enabled": False},
          "norm_bound_adaptive": False}


@pytest.mark.parametrize("flush", [
    {"goal": 8, "min_updates": 4, "deadline_s": 0},
    {"preset": "elastic", "goal": 8, "min_updates": 4, "deadline_s": 0},
    {"preset": "async", "goal": 8, "min_updates": 4},
])
def test_min_updates_without_a_deadline_is_refused(flush: dict[str, Any]) -> None:
    """Without a deadline every version waits for ``goal``: a ``min_updates`` below it would
    be recorded and never read."""
    with pytest.raises(ConfigError, match=r"^coordinator\.flush\.min_updates: 4 is how many "
                                          r"updates the deadline flushes with"):
        CoordinatorConfig.from_dict({"flush": flush})


@pytest.mark.parametrize(("table", "min_updates"), [
    ({"flush": {"goal": 8, "min_updates": 8, "deadline_s": 0}}, 8),
    ({"flush": {"goal": 8, "min_updates": 4, "deadline_s": 10}}, 4),
    # a preset's min_updates is what its deadline flushes with: without one, goal
    ({"flush": {"preset": "elastic", "goal": 8, "deadline_s": 0}}, 8),
    ({"flush": {"preset": "elastic", "goal": 8}}, 4),
    ({"flush": {"preset": "sync", "goal": 8}}, 8),
    # each secure group's floor, with or without a deadline
    ({"flush": {"goal": 8, "min_updates": 4, "deadline_s": 0}} | SECURE, 4),
])
def test_min_updates_that_takes_effect_is_kept(table: dict[str, Any], min_updates: int) -> None:
    assert CoordinatorConfig.from_dict(table).flush.min_updates == min_updates
