"""A real-gRPC simulation's population is not throttled as if it were one device.

Every simulated client calls from 127.0.0.1 over the one HTTP/2 connection gRPC shares between
channels to the same target, so the coordinator's per-address and per-connection caps (sized
for one device) would refuse the population: at 10,000 clients, Joins met REFUSED_STREAM and
per-peer throttling until their retry budgets ran out. Here those caps are set far below a
30-client population; the simulation must still run every client.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlink.coordinator.config import CoordinatorConfig, LimitsConfig
from fedlink.experiment.config import ExperimentConfig
from fedlink.sim.capacity import STREAMS_PER_CLIENT, for_population

pytestmark = pytest.mark.timeout(240)

TIGHT = {"max_clients": 5, "join_burst_per_peer": 2, "join_per_peer_per_s": 0.01,
         "max_streams_per_connection": 4}


def test_thirty_clients_run_past_caps_sized_for_one_device(tmp_path: Path) -> None:
    from fedlink.sim import run_simulation

    config = ExperimentConfig.from_dict({
        "run": {"name": "capacity", "seed": 2},
        "data": {"dataset": "synthetic", "clients": 30},
        "model": {"name": "logreg"},
        "coordinator": {"rounds": 2, "flush": {"goal": 30, "deadline_s": 0},
                        "limits": TIGHT},
    })
    summary = run_simulation(config, tmp_path, progress=False).summary
    assert summary["clients"] == 30
    assert summary["updates_accepted"] == 2 * 30


def test_caps_are_raised_to_the_population_never_lowered() -> None:
    tight = CoordinatorConfig(limits=LimitsConfig(**TIGHT))
    raised = for_population(tight, 30).limits
    assert raised.max_clients == 30 and raised.join_burst_per_peer == 30
    assert raised.max_streams_per_connection >= STREAMS_PER_CLIENT * 30
    assert raised.join_per_peer_per_s == TIGHT["join_per_peer_per_s"]  # the refill is kept
    roomy = CoordinatorConfig(limits=LimitsConfig(max_streams_per_connection=1000))
    assert for_population(roomy, 30) == roomy
