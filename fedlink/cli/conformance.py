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
                        'HOST:PORT and "{update_codec}" by the update codec to send (fp32 '
                        'but in the lossy runs), e.g. "python clients/edge/edge_client.py '
                        '--server {server} --data local.npz --compression {update_codec}"')
    p.add_argument("--num-parameters", type=int, default=650,
                   help="length of the model vector the client trains (default: 650, "
                        "clients/edge's logistic regression on 64 features, 10 classes)")
    p.add_argument("--codecs", default=None,
                   help="downlink codecs to check, comma-separated (default: all of them: "
                        "fp32, fp16, bf16, fp32-zlib)")
    p.add_argument("--update-codecs", default=None,
                   help="lossy update codecs the client is asked to send, comma-separated, "
                        "each in a run of its own with {update_codec} in --client-cmd "
                        "replaced by its name (default: qsgd, sign, topk+q4, randk+q8; "
                        "'' checks none)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address the coordinators listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=0,
                   help="port the coordinators listen on, one after the other (default: 0, "
                        "a free port for each)")
    p.add_argument("--only", default=None,
                   help="check names to run alone, comma-separated (default: every check)")
    p.add_argument("--secure", action="store_true",
                   help="also run the secure-aggregation scenarios (groups filled with the "
                        "runner's own fedlink clients; secure_options runs distributed DP and "
                        "needs the privacy extra); --only secure_round,secure_retry,"
                        "secure_dropout,secure_options runs them alone")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="seconds one client run may take")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write {behaviour: passed} as JSON")
    p.set_defaults(func=_conformance)


def _conformance(args: argparse.Namespace) -> int:
    from fedlink.conformance import (
        DOWNLINK_CODECS,
        LOSSY_CODECS,
        ConformanceOptions,
        format_report,
        run_conformance,
    )

    options = ConformanceOptions(
        client_cmd=args.client_cmd, num_parameters=args.num_parameters,
        codecs=_names(args.codecs, DOWNLINK_CODECS),
        update_codecs=_names(args.update_codecs, LOSSY_CODECS), timeout_s=args.timeout_s,
        host=args.host, port=args.port, only=_names(args.only, ()), secure=args.secure)
    results = asyncio.run(run_conformance(options))
    print(format_report(results), flush=True)
    verdicts = [v for r in results for v in r.verdicts]
    if args.json is not None:
        args.json.write_text(json.dumps({v.name: v.passed for v in verdicts}, indent=1))
    return 0 if all(v.passed for v in verdicts) else 1


def _names(value: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated list of names; ``default`` when the option was not given."""
    return default if value is None else tuple(n.strip() for n in value.split(",") if n.strip())
