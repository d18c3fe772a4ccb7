"""Prometheus metrics of a real run: scraped over HTTP while clients train over gRPC, read back
with prometheus_client's own parser, and checked against the run's summary.json."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, block_until, gather_bounded, run_async
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.metrics import summarize, write_summary
from fedlink.observe.endpoint import MetricsEndpoint

pytestmark = pytest.mark.timeout(90)

DIM = 32
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)
NAME = re.compile(r"^fedlink_[a-z][a-z0-9_]*$")
LABEL = re.compile(r"^[a-z][a-z0-9_]*$")
UNITS = ("_seconds", "_bytes")
BOUNDED_LABELS = {"outcome", "code", "direction", "state", "method", "le"}


def scrape(port: int) -> dict[str, list[Sample]]:
    """``/metrics`` parsed by prometheus_client: family name -> samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {family.name: list(family.samples) for family in text_string_to_metric_families(text)}


def value(families: dict[str, list[Sample]], sample: str, **labels: str) -> float:
    """The value of one sample (0.0 when absent), matched by name and labels."""
    return sum(s.value for family in families.values() for s in family
               if s.name == sample and s.labels == labels)


def check_names(port: int) -> None:
    """promtool-style rules on what was served: prefix and snake case, ``_total`` on every
    counter and on nothing else, units in histogram names, only bounded labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        families = list(text_string_to_metric_families(reply.read().decode()))
    assert families
    for family in families:
        assert NAME.match(family.name), family.name
        assert family.documentation, family.name
        for sample in family.samples:
            assert set(sample.labels) <= BOUNDED_LABELS, (sample.name, sample.labels)
            assert all(LABEL.match(k) for k in sample.labels)
            if family.type == "counter":
                assert sample.name in (f"{family.name}_total", f"{family.name}_created")
            else:
                assert not sample.name.endswith("_total"), sample.name
        if family.type == "histogram":
            assert family.name.endswith(UNITS), family.name


def test_metrics_scraped_during_a_run_agree_with_the_summary(
        coordinator: CoordinatorFactory, tmp_path: Path) -> None:
    rounds = 3
    # sync rounds with over-selection: until a scrape has seen the first flush, two of the
    # four clients are held back (so their first updates arrive stale and are refused) and
    # the other two wait before their second task (so the run cannot end before it)
    config = CoordinatorConfig(
        rounds=rounds, flush=FlushRule(goal=2, min_updates=2, over_selection=2.0,
                                       max_staleness=0),
        limits=LimitsConfig(long_poll_s=2.0, retry_after_s=0.05))
    rng = np.random.default_rng(7)
    seen_mid_run: list[dict[str, list[Sample]]] = []

    def held_from(first: int) -> Callable[[int], None]:
        def hold(call: int) -> None:
            if call >= first:
                block_until(lambda: bool(seen_mid_run), 30, "a scrape after the first flush")
        return hold

    trainers = [TowardTrainer(rng.normal(size=DIM).astype(np.float32),
                              before_train=held_from(1 if i < 2 else 0)) for i in range(4)]
    holder: dict[str, CoordinatorServer] = {}

    async def watch(port: int, server: CoordinatorServer) -> None:
        while not server.lifecycle.finished.is_set():
            families = await asyncio.to_thread(scrape, port)
            if (value(families, "fedlink_model_version") >= 1
                    and value(families, "fedlink_run_finished") == 0):
                seen_mid_run.append(families)
            await asyncio.sleep(0.05)

    async def scenario() -> dict[str, list[Sample]]:
        server = coordinator(config, np.zeros(DIM, np.float32))
        with MetricsEndpoint(server.events) as endpoint:
            server.interceptors = (endpoint.interceptor,)
            endpoint.watch(server.service)
            port = endpoint.start("127.0.0.1", 0)
            async with server:
                holder["server"] = server
                watcher = asyncio.create_task(watch(port, server))
                # the trainers' own threads: the held ones must not starve the scraper's
                with ThreadPoolExecutor(len(trainers)) as pool:
                    sessions = [ClientSession(f"127.0.0.1:{server.port}", t,
                                              ClientOptions(name=f"c{i}", retry=FAST_RETRY),
                                              executor=pool)
                                for i, t in enumerate(trainers)]
                    await gather_bounded(*(s.run() for s in sessions), timeout=60)
                await asyncio.wait_for(server.wait_finished(), 10)
                await watcher
            check_names(port)
            return await asyncio.to_thread(scrape, port)

    final = run_async(scenario(), timeout=80)
    server = holder["server"]
    write_summary(tmp_path / "summary.json", summarize(server.events.events, config.to_dict()))
    summary = json.loads((tmp_path / "summary.json").read_text())

    mid = seen_mid_run[0]
    assert 1 <= value(mid, "fedlink_model_version") < rounds
    assert value(mid, "fedlink_updates_total", outcome="accepted", code="OK") >= 2
    assert value(mid, "fedlink_clients", state="connected") == 4

    assert value(final, "fedlink_model_version") == summary["final_model_version"] == rounds
    assert value(final, "fedlink_rounds_total") == summary["rounds"]
    assert value(final, "fedlink_tasks_issued_total") == summary["tasks_issued"]
    assert value(final, "fedlink_updates_total", outcome="accepted", code="OK") \
        == summary["updates_accepted"]
    assert summary["refusal_codes"], "the held-back clients' stale updates were refused"
    for code, count in summary["refusal_codes"].items():
        assert value(final, "fedlink_updates_total", outcome="refused", code=code) == count
    assert value(final, "fedlink_transfer_bytes_total", direction="up") == summary["bytes_up"]
    assert value(final, "fedlink_transfer_bytes_total", direction="down") \
        == summary["bytes_down"]
    assert value(final, "fedlink_run_finished") == 1
    assert value(final, "fedlink_round_duration_seconds_count") == rounds
    assert value(final, "fedlink_flush_interval_seconds_count") == rounds - 1
    # every call was timed: four joins, one commit per update, all answered
    assert value(final, "fedlink_rpcs_total", method="Coordinator/Join", code="OK") == 4
    assert value(final, "fedlink_rpc_duration_seconds_count", method="Coordinator/Join") == 4
    commits = sum(s.value for s in final["fedlink_rpcs"]
                  if s.labels.get("method") == "Coordinator/Commit")
    assert commits >= summary["updates_accepted"] + summary["updates_refused"]
    assert value(final, "fedlink_upload_sessions") == 0
