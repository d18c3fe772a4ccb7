"""``fedlink compare RUN...``: overlay runs in one report (see ``fedlink.metrics.compare``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``compare`` to the ``fedlink`` command."""
    p = sub.add_parser(
        "compare", help="one report overlaying several runs (the first is the baseline)",
        description="Accuracy against wall time, model version and bytes sent; time to a "
                    "target accuracy and each run's speed-up over the first; refusals.")
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders")
    p.add_argument("--target", type=float, default=None,
                   help="target accuracy (default: the best accuracy every run reached)")
    p.add_argument("--output", type=Path, default=None,
                   help="report folder (default: runs/compare-<run names>)")
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from fedlink.metrics.compare import (
        comparable,
        default_target,
        load_run,
        speedups,
        warnings_of,
        write_comparison,
    )

    runs = [load_run(path) for path in args.runs]
    for name, warning in warnings_of(runs):
        print(f"fedlink: warning: {name}: {warning}", file=sys.stderr)
    target = args.target if args.target is not None else default_target(runs)
    output = args.output or Path("runs") / ("compare-" + "-vs-".join(r.name for r in runs))
    report = write_comparison(runs, output, target)
    base = runs[0]
    for run, speedup in zip(runs, speedups(runs, target), strict=True):
        reached = run.seconds_to(target)
        when = "never" if reached is None else f"after {reached:.1f} s"
        print(f"{run.name}: reached {target:.3f} {when}")
        if run is not base:
            ratio = (f"{speedup:.2f}x" if speedup is not None
                     else "n/a (model seconds against wall seconds)"
                     if not comparable(base, run) else "n/a (a run never reached the target)")
            print(f"time-to-target speed-up of {run.name} over {base.name}: {ratio}")
    print(f"comparison: {report}")
    return 0
