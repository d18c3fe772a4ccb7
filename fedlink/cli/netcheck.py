"""``fedlink netcheck HOST:PORT`` (measure the link, advise settings) and ``fedlink health``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any


def add_netcheck_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``netcheck`` to the ``fedlink`` command."""
    p = sub.add_parser(
        "netcheck", help="measure the link to a coordinator and suggest settings",
        description="Measure RTT, jitter, goodput each way, stalls and resets to a "
                    "coordinator through its Probe call (it must allow them: "
                    "[coordinator.netcheck] enabled = true), read TCP retransmissions and "
                    "congestion window from the kernel where `ss` is available, and suggest "
                    "chunk size, codec and density, deadline and staleness settings.")
    p.add_argument("target", metavar="HOST:PORT", help="the coordinator's address")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--probes", type=int, default=10, help="RTT probes (default 10)")
    p.add_argument("--window-s", type=float, default=1.0,
                   help="seconds each goodput probe should take (default 1)")
    p.add_argument("--repeats", type=int, default=2, help="goodput probes each way (default 2)")
    p.add_argument("--token", default="", help="a client token, if the coordinator needs one")
    p.set_defaults(func=_netcheck)


def add_health_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``health`` to the ``fedlink`` command."""
    p = sub.add_parser(
        "health", help="exit 0 when a coordinator's gRPC health service says SERVING",
        description="Ask the standard grpc.health.v1 service (for HEALTHCHECK and probes).")
    p.add_argument("target", metavar="HOST:PORT", help="the coordinator's address")
    p.add_argument("--service", default="", help="service name (default: the whole server)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="give up after (default 5)")
    p.add_argument("--tls-ca", default="", metavar="PEM", help="dial over TLS with this CA")
    p.set_defaults(func=_health)


def _netcheck(args: argparse.Namespace) -> int:
    from fedlink.netcheck.advice import advise
    from fedlink.netcheck.probe import NetcheckOptions, measure

    options = NetcheckOptions(rtt_probes=args.probes, window_s=args.window_s,
                              repeats=args.repeats, token=args.token)
    result = measure(args.target, options)
    advice = advise(result)
    if args.json:
        print(json.dumps({**dataclasses.asdict(result),
                          "advice": dataclasses.asdict(advice)}, indent=2))
    else:
        print(_text(dataclasses.asdict(result), advice.notes))
    return 0


def _text(result: dict[str, Any], notes: tuple[str, ...]) -> str:
    """The human-readable netcheck report."""
    lines = [f"netcheck {result['target']} ({result['seconds']:.1f} s)",
             f"  RTT        {result['rtt_ms']:.1f} ms (min {result['rtt_min_ms']:.1f}), "
             f"jitter {result['jitter_ms']:.1f} ms",
             f"  goodput    up {result['up']['kbps']:.0f} kbit/s, "
             f"down {result['down']['kbps']:.0f} kbit/s",
             f"  stalls     {result['stalls']}, resets {result['resets']}"]
    for tcp in result["tcp"]:
        lines.append(f"  kernel TCP {tcp['local']} -> {tcp['peer']}: rtt {tcp['rtt_ms']} ms, "
                     f"cwnd {tcp['cwnd']}, retransmits {tcp['retransmits']}, "
                     f"lost {tcp['lost']}")
    if not result["tcp"]:
        lines.append("  kernel TCP not available (no `ss`, or not Linux)")
    lines.append("advice:")
    lines.extend(f"  - {note}" for note in notes)
    return "\n".join(lines)


def _health(args: argparse.Namespace) -> int:
    from fedlink.netcheck.health import check_health

    status = check_health(args.target, args.service, args.timeout_s, args.tls_ca)
    print(status)
    return 0 if status == "SERVING" else 1
