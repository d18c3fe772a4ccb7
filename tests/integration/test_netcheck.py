"""``fedlink netcheck`` through the injector's proxy: measured RTT and goodput against the link
profile, the JSON output of the command, and the coordinator's permission and rate limit."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
import pytest
from conftest import run_async

from fedlink.coordinator import CoordinatorConfig, CoordinatorServer
from fedlink.coordinator.operations import NetcheckConfig
from fedlink.coordinator.probe import ProbeDesk
from fedlink.errors import ResourceExhausted, UpdateRefused
from fedlink.metrics import EventLog
from fedlink.netcheck.advice import advise
from fedlink.netcheck.probe import NetcheckOptions, NetcheckResult, measure
from fedlink.netem.presets import preset
from fedlink.netem.proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)

MODEL = np.zeros(10_000, np.float32)
ALLOWED = CoordinatorConfig(netcheck=NetcheckConfig(enabled=True))
SHORT = NetcheckOptions(rtt_probes=8, window_s=1.0, repeats=2)


async def _through(profile_name: str, seed: int, config: CoordinatorConfig,
                   options: NetcheckOptions) -> NetcheckResult:
    async with CoordinatorServer(config, MODEL, EventLog(None)) as server, \
            TcpProxy(preset(profile_name).with_seed(seed), f"127.0.0.1:{server.port}") as proxy:
        return await asyncio.to_thread(measure, proxy.address, options)


@pytest.mark.parametrize("name", ["3g", "flaky"])
def test_netcheck_measures_the_link_it_goes_through(name: str) -> None:
    profile = preset(name)
    # seed 1: flaky's first blackout comes ~39 s after the proxy starts, after the
    # measurement (stalls have their own test below)
    result = run_async(_through(name, 1, ALLOWED, SHORT), timeout=100)

    # What load cannot change: never a shorter round trip than the link's, never more
    # goodput than its bandwidth. How close it comes (within 15% on an idle host) is
    # benchmarks/netcheck_accuracy.py's figure, not this test's.
    assert result.rtt_ms >= 0.85 * 2 * profile.latency_ms, result.rtt_ms
    assert 0 < result.up.kbps <= 1.15 * profile.up_kbps, result.up.kbps
    assert 0 < result.down.kbps <= 1.15 * profile.down_kbps, result.down.kbps
    assert result.model_bytes == 4 * MODEL.size
    assert result.jitter_ms > 0  # the profile's jitter shows up
    # the kernel's view of the connection this netcheck opened (to the proxy, on loopback)
    assert len(result.tcp) == 1 and result.tcp[0].cwnd is not None
    advice = advise(result)
    assert 16 * 1024 <= advice.chunk_bytes <= 1024 * 1024
    assert advice.deadline_s > 2 * result.rtt_ms / 1000


def test_a_blackout_during_the_measurement_is_reported_as_a_stall() -> None:
    async def scenario() -> tuple[NetcheckResult, int]:
        async with CoordinatorServer(ALLOWED, MODEL, EventLog(None)) as server, \
                TcpProxy(preset("flaky").with_seed(1), f"127.0.0.1:{server.port}") as proxy:
            probing = asyncio.create_task(asyncio.to_thread(measure, proxy.address, SHORT))
            # the link goes silent once the RTT probes have begun
            while not probing.done():
                if proxy.counters.bytes_up > 2000:
                    proxy.force_blackout(3.0)
                    break
                await asyncio.sleep(0.01)
            return await probing, proxy.counters.blackouts

    result, blackouts = run_async(scenario(), timeout=100)
    assert blackouts == 1
    assert result.stalls >= 1
    assert advise(result).expect_staleness


def test_netcheck_json_output_for_scripts() -> None:
    async def scenario() -> tuple[int, bytes, bytes]:
        async with CoordinatorServer(ALLOWED, MODEL, EventLog(None)) as server, \
                TcpProxy(preset("4g").with_seed(2), f"127.0.0.1:{server.port}") as proxy:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "fedlink", "netcheck", proxy.address, "--json",
                "--probes", "4", "--window-s", "0.3", "--repeats", "1",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await child.communicate()
            return child.returncode or 0, out, err

    code, out, err = run_async(scenario(), timeout=60)
    assert code == 0, err.decode()
    report = json.loads(out)
    assert report["target"].startswith("127.0.0.1:")
    assert len(report["rtt_samples_ms"]) == 4
    assert report["rtt_ms"] >= 0.5 * 2 * preset("4g").latency_ms  # never under the link's
    for direction in ("up", "down"):
        assert report[direction]["kbps"] > 0 and report[direction]["probe_bytes"] > 0
    assert {"stalls", "resets", "jitter_ms", "model_bytes", "tcp"} <= set(report)
    assert {"chunk_bytes", "codec", "deadline_s", "expect_staleness", "notes"} \
        <= set(report["advice"])


def test_a_coordinator_that_does_not_allow_probes_says_how_to() -> None:
    async def scenario() -> tuple[int, bytes]:
        async with CoordinatorServer(CoordinatorConfig(), MODEL, EventLog(None)) as server:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "fedlink", "netcheck", f"127.0.0.1:{server.port}",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            _, err = await child.communicate()
            return child.returncode or 0, err

    code, err = run_async(scenario(), timeout=60)
    assert code == 2
    assert b"FAILED_PRECONDITION" in err and b"[coordinator.netcheck] enabled = true" in err


def test_probes_are_rate_limited_and_size_capped() -> None:
    now = [0.0]
    desk = ProbeDesk(NetcheckConfig(enabled=True, max_bytes=1000, probes_per_minute=3),
                     model_bytes=40, clock=lambda: now[0])
    for _ in range(3):
        assert len(desk.answer(10, 100).payload) == 100
    with pytest.raises(ResourceExhausted) as refused:
        desk.answer(0, 0)
    assert refused.value.retryable and refused.value.retry_after_s == pytest.approx(20.0)
    now[0] += 20.0  # one token back
    assert desk.answer(0, 0).model_bytes == 40
    with pytest.raises(ResourceExhausted) as too_big:
        desk.answer(1001, 0)
    assert not too_big.value.retryable
    with pytest.raises(UpdateRefused, match="enabled = true"):
        ProbeDesk(NetcheckConfig(), 40).answer(0, 0)
