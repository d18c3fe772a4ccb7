"""``[coordinator.metrics] enabled = true`` under ``fedlink simulate`` (real gRPC): the
coordinator serves ``/metrics`` while the run lasts, as ``fedlink serve`` does, says where, and
stops serving when the run is over. Scraped at a flush (the central evaluator's call), read
back with prometheus_client's own parser."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fedlink.sim import ExperimentConfig, run_simulation

parser = pytest.importorskip("prometheus_client.parser",
                             reason="the metrics extra serves the endpoint")

LISTENING = re.compile(r"fedlink metrics on (http://\S+/metrics)")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``url``'s samples: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.timeout(120)
def test_simulation_serves_metrics_while_it_runs(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = ExperimentConfig.from_dict({
        "run": {"name": "metrics", "seed": 1},
        "data": {"dataset": "digits", "clients": 4},
        "model": {"name": "logreg"},
        "coordinator": {"rounds": 3, "flush": {"goal": 4, "min_updates": 4},
                        "training": {"local_steps": 2, "learning_rate": 0.5},
                        "metrics": {"enabled": True, "host": "127.0.0.1", "port": 0}},
    })
    said: list[str] = []
    live: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []

    def evaluate(model: Any, test: Any) -> dict[str, float]:
        """The central evaluator: called once before the coordinator starts, then at each
        flush, while the run is live. It scrapes the endpoint the run said it serves."""
        if not said:
            said.extend(LISTENING.findall(capsys.readouterr().err))
        if said:
            live.append(scrape(said[0]))
        return {"scrapes": float(len(live))}

    result = run_simulation(config, tmp_path, progress=False, evaluate=evaluate, report=False)

    assert len(said) == 1 and not said[0].endswith(":0/metrics")  # the bound port, said once
    assert len(live) == 3  # one scrape at each flush
    # the second flush's scrape: the first flush counted, the run mid-way (at the last
    # flush a client told the run is over may already have left)
    mid = live[1]
    assert mid[("fedlink_model_version", ())] == 1
    assert mid[("fedlink_run_finished", ())] == 0
    assert mid[("fedlink_clients", (("state", "connected"),))] == 4
    assert mid[("fedlink_updates_total", (("code", "OK"), ("outcome", "accepted")))] >= 4
    # the RPC interceptor is on the simulation's server: every client's Join was timed
    assert mid[("fedlink_rpcs_total", (("code", "OK"), ("method", "Coordinator/Join")))] == 4
    assert result.summary["config"]["coordinator"]["metrics"]["enabled"] is True
    with pytest.raises(urllib.error.URLError):  # the endpoint closed with the run
        scrape(said[0])
