"""``fedlink netem``: the latency/loss injector from the command line.

``fedlink netem proxy --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT --profile 3g`` runs a
``TcpProxy`` until SIGINT/SIGTERM, printing its counters every few seconds and at exit.
Instead of (or on top of) ``--profile``, the link can be given field by field: explicit flags
override the preset's values.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedlink.netem.base import LinkCounters
    from fedlink.netem.profile import LinkProfile

# LinkProfile field -> help of its flag (``--latency-ms`` for ``latency_ms``)
_FIELDS = {
    "latency_ms": "one-way latency in ms, applied in each direction (RTT adds twice it)",
    "jitter_ms": "standard deviation of a normal jitter on each direction, ms",
    "up_kbps": "bandwidth client -> upstream, kbit/s",
    "down_kbps": "bandwidth upstream -> client, kbit/s",
    "reset_every_kb": "mean kB (both directions) between connection resets",
    "reset_every_s": "mean seconds between connection resets",
    "blackout_every_s": "mean seconds between blackouts",
    "blackout_s": "mean blackout duration, seconds",
    "limit_data_kb": "close each connection after this many kB",
}


def add_netem_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``netem`` (with its ``proxy`` subcommand) to the ``fedlink`` subcommands."""
    netem = sub.add_parser("netem", help="inject latency, bandwidth limits, resets, blackouts")
    actions = netem.add_subparsers(dest="netem_command", required=True)
    from fedlink.netem.presets import preset_names

    p = actions.add_parser(
        "proxy", help="run an impairing TCP proxy until interrupted",
        description="Relay HOST:PORT through an impaired link until SIGINT/SIGTERM, printing "
                    "counters. Explicit impairment flags override the --profile preset.")
    p.add_argument("--listen", required=True, help="HOST:PORT to accept clients on")
    p.add_argument("--upstream", required=True, help="HOST:PORT to relay to")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help=f"a preset: {', '.join(preset_names())}")
    for field, text in _FIELDS.items():
        p.add_argument("--" + field.replace("_", "-"), type=float, default=None, help=text)
    p.add_argument("--seed", type=int, default=None, help="seed of every random draw")
    p.add_argument("--interval", type=float, default=5.0,
                   help="seconds between counter lines (default 5)")
    p.set_defaults(func=run_proxy_command)


def profile_from_args(args: argparse.Namespace) -> LinkProfile:
    """The preset named by ``--profile`` (or no impairment) with the explicit flags applied."""
    from fedlink.netem.presets import preset
    from fedlink.netem.profile import LinkProfile

    base = preset(args.profile) if args.profile else LinkProfile(name="cli")
    changes: dict[str, Any] = {f: getattr(args, f) for f in _FIELDS
                               if getattr(args, f) is not None}
    if args.seed is not None:
        changes["seed"] = args.seed
    return base.replace(**changes) if changes else base


def format_counters(counters: LinkCounters) -> str:
    """One line: bytes each way, connections, resets, blackouts, stalled seconds."""
    return (f"up {counters.bytes_up} B, down {counters.bytes_down} B, "
            f"connections {counters.connections}, resets {counters.resets}, "
            f"blackouts {counters.blackouts}, stalled {counters.stalled_s:.1f} s")


def run_proxy_command(args: argparse.Namespace) -> int:
    """``fedlink netem proxy``: build the profile, then serve until a signal."""
    profile = profile_from_args(args)
    return asyncio.run(serve_proxy(profile, args.upstream, args.listen, args.interval))


async def serve_proxy(profile: LinkProfile, upstream: str, listen: str,
                      interval: float = 5.0) -> int:
    """Run a ``TcpProxy`` until SIGINT/SIGTERM, printing counters every ``interval`` s."""
    from fedlink.errors import ConfigError
    from fedlink.netem.presets import summarize
    from fedlink.netem.proxy import TcpProxy

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows
            loop.add_signal_handler(signum, stop.set)
    proxy = TcpProxy(profile, upstream, listen)
    try:
        await proxy.start()
    except OSError as exc:
        raise ConfigError(f"--listen {listen}: cannot listen ({exc.strerror or exc})") from exc
    try:
        print(f"fedlink netem proxy {proxy.address} -> {upstream}: {summarize(profile)}",
              flush=True)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(interval, 0.1))
            if not stop.is_set():
                print(format_counters(proxy.counters), flush=True)
    finally:
        await proxy.stop()
    print(f"stopped: {format_counters(proxy.counters)}", flush=True)
    return 0
