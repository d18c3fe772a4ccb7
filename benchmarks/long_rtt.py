"""Rounds per minute against the round trip: 10 clients, each behind its own TCP proxy.

For each RTT in 0.1, 1, 5, 10 and 20 s (half of it one-way each direction, ``TcpProxy``
latency), a real coordinator on loopback runs a ``sync`` run (every round waits for all 10
clients) of 3 rounds (``--quick``: 1 round) with numpy clients (a 40 kB model, inline in
``Task`` and ``Commit``). The RTT levels run at the same time, each with its own coordinator,
so the whole sweep takes about as long as its slowest level.

Baseline, in the same run: the old fixed liveness (a 5 s ping-ack timeout that never widens,
the deadlines never following the RTT) at 10 s RTT, given as long as the sweep takes.

Figures: ``rounds_per_min_rtt_<s>s`` (rounds / wall minutes from the first task to the end;
0 when the run did not complete), ``completed_rtt_<s>s`` (1/0), ``joins_rtt_<s>s`` (client
ids registered: 10 means no retried Join counted twice), ``max_rtt_completed_s`` (target
>= 20), ``fixed_ping_rounds_rtt_10s`` (the baseline's rounds, expected 0) and
``rounds_per_min_ratio_10s_vs_0.1s``.

Run: ``python benchmarks/long_rtt.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.client import ClientOptions, ClientSession, RetryPolicy, TrainPlan, TrainResult
from fedlink.client.liveness import LivenessConfig
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
from fedlink.metrics import EventLog, summarize
from fedlink.netem.profile import LinkProfile
from fedlink.netem.proxy import TcpProxy

CLIENTS = 10
DIM = 10_000
RTTS_S = (0.1, 1.0, 5.0, 10.0, 20.0)
KEEP_TRYING = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=5.0, keep_trying=True)
FIXED_PING = LivenessConfig(min_ping_timeout_s=5.0, max_ping_timeout_s=5.0, widen_factor=1.0,
                            rtt_multiple=1.0, max_deadline_s=30.0, tcp_user_timeout_s=5.0,
                            min_stall_s=5.0)
"""The liveness before it followed the link: 5 s ping timeout, 30 s deadlines, fixed (its stall
bound can be no longer than the ping timeout)."""


class Toward:
    """A numpy trainer: half way to its own target."""

    def __init__(self, index: int) -> None:
        self.target = np.full(DIM, float(index % 3), np.float32)

    def num_examples(self) -> int:
        """Local dataset size."""
        return 10

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """One step toward the target."""
        return TrainResult((params + 0.5 * (self.target - params)).astype(np.float32), 10, 1, 1,
                           {})


async def one_level(rtt_s: float, rounds: int, liveness: LivenessConfig,
                    retry: RetryPolicy) -> dict[str, Any]:
    """One sync run with every client behind its own ``rtt_s`` link; its summary."""
    config = CoordinatorConfig(rounds=rounds, flush=FlushRule(
        goal=CLIENTS, min_updates=CLIENTS, deadline_s=None))
    events = EventLog(None)
    async with CoordinatorServer(config, np.zeros(DIM, np.float32), events,
                                 address="127.0.0.1:0") as server:
        proxies = [TcpProxy(LinkProfile(latency_ms=rtt_s * 500.0), f"127.0.0.1:{server.port}")
                   for _ in range(CLIENTS)]
        try:
            for proxy in proxies:
                await proxy.start()
            sessions = [ClientSession(proxy.address, Toward(i),
                                      ClientOptions(name=f"c{i}", retry=retry,
                                                    liveness=liveness))
                        for i, proxy in enumerate(proxies)]
            await asyncio.gather(*(s.run() for s in sessions), return_exceptions=True)
        finally:
            for proxy in proxies:
                await proxy.stop()
    return summarize(events.events, {})


async def bounded(coro: Any, limit_s: float) -> dict[str, Any] | None:
    """``coro``'s result, or ``None`` if it has not finished within ``limit_s``."""
    try:
        return await asyncio.wait_for(coro, limit_s)
    except TimeoutError:
        return None


async def sweep(rounds: int, limit_s: float) -> dict[str, Any]:
    levels = [bounded(one_level(rtt, rounds, LivenessConfig(), KEEP_TRYING), limit_s)
              for rtt in RTTS_S]
    baseline = bounded(one_level(10.0, rounds, FIXED_PING, RetryPolicy()), limit_s)
    *results, fixed = await asyncio.gather(*levels, baseline)
    figures: dict[str, Any] = {"clients": CLIENTS, "rounds": rounds}
    completed = []
    for rtt, summary in zip(RTTS_S, results, strict=True):
        done = summary is not None and summary["rounds"] == rounds
        wall = summary["wall_seconds"] if summary else 0.0
        figures[f"rounds_per_min_rtt_{rtt:g}s"] = rounds / wall * 60 if done and wall else 0.0
        figures[f"completed_rtt_{rtt:g}s"] = int(done)
        figures[f"joins_rtt_{rtt:g}s"] = summary["clients"] if summary else 0
        if done:
            completed.append(rtt)
    figures["max_rtt_completed_s"] = max(completed, default=0.0)
    figures["fixed_ping_rounds_rtt_10s"] = fixed["rounds"] if fixed else 0
    short, long = figures["rounds_per_min_rtt_0.1s"], figures["rounds_per_min_rtt_10s"]
    figures["rounds_per_min_ratio_10s_vs_0.1s"] = long / short if short else 0.0
    return figures


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds = 1 if args.quick else 3
    figures = asyncio.run(sweep(rounds, limit_s=150.0 + 120.0 * rounds))
    report(figures, args.json)


if __name__ == "__main__":
    main()
