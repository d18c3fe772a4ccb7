"""Accuracy of ``fedlink netcheck``: what it measures through the injector's proxy, against the
link profile the proxy applies.

For each preset (``--quick``: ``3g`` and ``flaky``; else also ``4g``, ``edge-2g`` and
``satellite``) a coordinator with ``[coordinator.netcheck]`` enabled and a ``TcpProxy`` run in
this process on 127.0.0.1, and ``fedlink.netcheck.probe.measure`` measures the link through
them. The baseline is the profile itself: RTT ``2 x latency_ms``, goodput ``up_kbps`` and
``down_kbps``. Blackouts and resets are left on (seed 1; flaky's first blackout comes ~39 s
in, after its measurement): netcheck reports them as stalls and resets when they hit.

Figures per preset: ``rtt_ms_<p>``, ``up_kbps_<p>``, ``down_kbps_<p>``, their relative errors
``rtt_error_<p>``, ``up_error_<p>``, ``down_error_<p>``, ``stalls_<p>``, ``seconds_<p>`` (how
long the measurement took); ``max_error`` over all. Target: every error <= 0.15.

Run: ``python benchmarks/netcheck_accuracy.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from _common import parse_args, report

from fedlink.coordinator import CoordinatorConfig, CoordinatorServer
from fedlink.coordinator.operations import NetcheckConfig
from fedlink.metrics import EventLog
from fedlink.netcheck.probe import NetcheckOptions, measure
from fedlink.netem.presets import preset
from fedlink.netem.proxy import TcpProxy

QUICK = ("3g", "flaky")
FULL = ("4g", "3g", "flaky", "edge-2g", "satellite")


async def _one(name: str, options: NetcheckOptions) -> dict[str, Any]:
    profile = preset(name)
    config = CoordinatorConfig(netcheck=NetcheckConfig(enabled=True))
    async with CoordinatorServer(config, np.zeros(10_000, np.float32), EventLog(None)) as server, \
            TcpProxy(profile.with_seed(1), f"127.0.0.1:{server.port}") as proxy:
        result = await asyncio.to_thread(measure, proxy.address, options)
    assert profile.up_kbps is not None and profile.down_kbps is not None
    errors = {"rtt": abs(result.rtt_ms / (2 * profile.latency_ms) - 1),
              "up": abs(result.up.kbps / profile.up_kbps - 1),
              "down": abs(result.down.kbps / profile.down_kbps - 1)}
    return {f"rtt_ms_{name}": result.rtt_ms, f"up_kbps_{name}": result.up.kbps,
            f"down_kbps_{name}": result.down.kbps,
            **{f"{k}_error_{name}": v for k, v in errors.items()},
            f"stalls_{name}": result.stalls, f"seconds_{name}": result.seconds}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    options = NetcheckOptions(window_s=1.0, repeats=2 if args.quick else 3)
    figures: dict[str, Any] = {}
    for name in QUICK if args.quick else FULL:
        figures.update(asyncio.run(_one(name, options)))
    figures["max_error"] = max(v for k, v in figures.items() if "_error_" in k)
    report(figures, args.json)


if __name__ == "__main__":
    main()
