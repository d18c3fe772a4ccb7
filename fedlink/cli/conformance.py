"""``fedlink conformance``: check an external client against the protocol.

``fedlink.conformance`` (coordinators, fault probes) is imported when the command runs, so
that every other command (``fedlink client`` on an edge box among them) starts without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path


def add_conformance_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``fedlink conformance``."""
    p = sub.add_parser("conformance", help="check an external client against the protocol")
    p.add_argument("--client-cmd", required=True,
                   help='the client command; "{server}" is replaced by the coordinator\'s '
                        'HOST:PORT, e.g. "python clients/edge/edge_client.py --server '
                        '{server} --data local.npz"')
    p.add_argument("--num-parameters", type=int, default=650,
                   help="length of the model vector the client trains (default: 650, "
                        "clients/edge's logistic regression on 64 features, 10 classes)")
    p.add_argument("--codecs", default=None,
                   help="downlink codecs to check, comma-separated (default: all of them: "
                        "fp32, fp16, bf16, fp32-zlib)")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="seconds one client run may take")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write {behaviour: passed} as JSON")
    p.set_defaults(func=_conformance)


def _conformance(args: argparse.Namespace) -> int:
    from fedlink.conformance import (
        DOWNLINK_CODECS,
        ConformanceOptions,
        format_report,
        run_conformance,
    )

    codecs = DOWNLINK_CODECS if args.codecs is None else \
        tuple(c for c in args.codecs.split(",") if c)
    options = ConformanceOptions(
        client_cmd=args.client_cmd, num_parameters=args.num_parameters,
        codecs=codecs, timeout_s=args.timeout_s)
    results = asyncio.run(run_conformance(options))
    print(format_report(results), flush=True)
    verdicts = [v for r in results for v in r.verdicts]
    if args.json is not None:
        args.json.write_text(json.dumps({v.name: v.passed for v in verdicts}, indent=1))
    return 0 if all(v.passed for v in verdicts) else 1
