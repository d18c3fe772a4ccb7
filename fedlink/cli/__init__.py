"""The ``fedlink`` command: ``simulate``, ``serve``, ``client``, ``netem``, ``token``,
``netcheck``, ``health``, ``compare``, ``conformance``."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import gc
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from fedlink._version import __version__
from fedlink.cli.compare import add_compare_parser
from fedlink.cli.conformance import add_conformance_parser
from fedlink.cli.netcheck import add_health_parser, add_netcheck_parser
from fedlink.cli.netem import add_netem_parser
from fedlink.cli.token import add_token_parser
from fedlink.errors import FedlinkError

Command = Callable[[argparse.Namespace], int]


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="run a coordinator and N clients in one process",
                       description="Run an experiment file; its folder goes first on sys.path, "
                                   "so its import strings find your modules beside it.")
    p.add_argument("config", type=Path, help="experiment TOML file (see examples/)")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="where the run folder goes (default: [run] output_dir)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-report", action="store_true",
                   help="write no report.md and no plots (events, summary and model as "
                        "always): for sweeps")
    p.set_defaults(func=_simulate)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a coordinator")
    p.add_argument("--config", type=Path, required=True, help="coordinator TOML file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=50051, help="port (0 picks a free one)")
    p.add_argument("--output-dir", type=Path, default=None, help="run folder parent")
    p.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                   help="keep the coordinator's durable state in DIR (overrides "
                        "[coordinator] state_dir); a coordinator restarted on the same DIR "
                        "resumes the run where it stopped")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics (0 picks a free "
                        "port; HOST from --metrics-host or [coordinator.metrics])")
    p.add_argument("--metrics-host", default=None, metavar="HOST",
                   help="address the metrics endpoint listens on (default 127.0.0.1)")
    p.set_defaults(func=_serve)


def _add_client(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("client", help="run one client against a coordinator")
    p.add_argument("--server", required=True, help="coordinator address, HOST:PORT")
    p.add_argument("--config", type=Path, required=True, help="experiment TOML file")
    p.add_argument("--index", type=int, default=0,
                   help="which partition of the configured data this client holds")
    p.add_argument("--name", default="", help="client name shown in the coordinator's log")
    p.add_argument("--token", default="",
                   help="the coordinator's join token, or this client's own token "
                        "(fedlink token issue), if the coordinator needs one")
    p.add_argument("--tls-ca", default="", metavar="PEM",
                   help="connect over TLS, trusting this CA for the coordinator's certificate")
    p.add_argument("--tls-cert", default="", metavar="PEM",
                   help="client certificate for mutual TLS (with --tls-key)")
    p.add_argument("--tls-key", default="", metavar="PEM", help="its private key")
    p.add_argument("--outbox", type=Path, default=None, metavar="DIR",
                   help="keep pending updates (and the client's instance key) in DIR, "
                        "delivered after a restart")
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="seed the client's randomness, its privacy noise included, for a "
                        "reproducible run (default: fresh entropy, so that nobody who knows "
                        "the run's settings can predict the client's noise)")
    retry = p.add_argument_group("retries (override [client.retry])")
    retry.add_argument("--retry-max-attempts", type=int, default=None, metavar="N",
                       help="attempts per call before giving up")
    retry.add_argument("--retry-budget-s", type=float, default=None, metavar="S",
                       help="seconds per call before giving up")
    retry.add_argument("--retry-initial-backoff-s", type=float, default=None, metavar="S")
    retry.add_argument("--retry-max-backoff-s", type=float, default=None, metavar="S",
                       help="longest wait between attempts")
    retry.add_argument("--retry-keep-trying", action="store_true", default=None,
                       help="never give up on a retryable error (backed off up to "
                            "--retry-max-backoff-s): for devices that wait out any outage")
    p.set_defaults(func=_client)


def _simulate(args: argparse.Namespace) -> int:
    from fedlink.metrics import print_summary
    from fedlink.sim import ExperimentConfig, run_simulation

    leave_objects_to_the_exit()
    with_config_folder_on_path(args.config)
    config = ExperimentConfig.from_toml(args.config)
    result = run_simulation(config, args.output_dir, progress=not args.no_progress,
                            report=not args.no_report)
    print_summary(result.summary, result.run_dir)
    print(f"final accuracy: {result.summary.get('final_accuracy')}")
    if result.report is not None:
        print(f"report: {result.report}")
    return 0


def leave_objects_to_the_exit() -> None:
    """When this process exits, freeze what is alive (``gc.freeze``) before the interpreter's
    final garbage collections: they would walk every object torch and the run made, half a
    second of a small run's process, to free memory the exit frees anyway. Objects are still
    released by reference counting as modules are torn down; only cycles are left."""
    atexit.register(gc.freeze)


def with_config_folder_on_path(config: Path) -> None:
    """Put the folder of the experiment file first on ``sys.path``: the import strings of a
    config (``[model] factory = "my_models:cnn"``) find the user's modules beside it, from
    whatever directory ``fedlink simulate`` was started (as ``python script.py`` finds the
    modules beside the script)."""
    folder = str(config.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _serve(args: argparse.Namespace) -> int:
    from fedlink.cli.serve import serve

    return asyncio.run(serve(args.config, f"{args.host}:{args.port}", args.output_dir,
                             args.state_dir, args.metrics_port, args.metrics_host))


def _client(args: argparse.Namespace) -> int:
    from fedlink.cli.client import run_one_client
    from fedlink.client import TLSOptions

    tls = TLSOptions(args.tls_ca, args.tls_cert, args.tls_key) \
        if args.tls_ca or args.tls_cert or args.tls_key else None
    retry = {name: getattr(args, f"retry_{name}") for name in RETRY_FLAGS
             if getattr(args, f"retry_{name}") is not None}
    return run_one_client(args.server, args.config, args.index, args.name, args.token,
                          args.outbox, tls, retry, args.seed)


RETRY_FLAGS = ("max_attempts", "budget_s", "initial_backoff_s", "max_backoff_s", "keep_trying")
"""``RetryPolicy`` fields that ``fedlink client --retry-...`` sets."""


def build_parser() -> argparse.ArgumentParser:
    """The ``fedlink`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="fedlink", description="Federated learning that keeps training on bad networks.")
    parser.add_argument("--version", action="version", version=f"fedlink {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_simulate, _add_serve, _add_client, add_netem_parser, add_token_parser,
                add_netcheck_parser, add_health_parser, add_compare_parser,
                add_conformance_parser):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedlink`` console script."""
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except FedlinkError as exc:
        print(f"fedlink: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
