"""Shared plumbing for benchmarks: ``--quick`` / ``--json FILE`` and printing figures."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def parse_args(description: str,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
               parts: tuple[str, ...] = ()) -> argparse.Namespace:
    """Every benchmark's flags: ``--quick`` (about a minute) and ``--json FILE``, those
    ``add_arguments`` adds for one benchmark, and with ``parts`` also ``--only PART``
    (measure just that part; ``args.only``, else ``None``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a small version (about a minute)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="write the named figures as one flat JSON object")
    if add_arguments is not None:
        add_arguments(parser)
    if parts:
        parser.add_argument("--only", choices=parts, default=None,
                            help="measure only this part of the benchmark")
    return parser.parse_args()


def report(figures: dict[str, Any], path: Path | None) -> None:
    """Print the figures and, when asked, write them as flat JSON."""
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        print(f"figures written to {path}")
