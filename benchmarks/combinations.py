"""The combination matrix, whole: every cell of ``fedlink.sim.combinations.FACTORS``.

Each cell (mode x server optimizer x model with buffers / ``keep_local`` x partition x codec x
privacy x trainer x fleet) is one small digits experiment, judged as
``fedlink.sim.combinations.judge`` says: it learned (final accuracy above the cell's floor, a
finite model, every BatchNorm ``running_var`` > 0), it was refused at config time with a
message naming the keys, it ran to the end wrong (``silently_wrong``: the failure this matrix
exists to find), or it crashed.

Figures: ``cells``, ``cells_learned``, ``cells_refused``, ``cells_silently_wrong`` (must be
0), ``cells_crashed`` (must be 0), ``pairwise_cells`` (how many cells the all-pairs set of
``make test`` has: its ratio to ``cells`` is what the test saves), ``seconds_per_cell``
(mean), and ``min_margin`` (the smallest accuracy above its floor among learned cells). Each
cell that is not ``learned`` or ``refused`` is printed with its reason.

Run: ``python benchmarks/combinations.py [--quick] [--json FILE] [--workers N]``
(``--quick``: the pairwise set only, as ``make test`` runs it; ``--workers``: cells judged in
N processes at once, 2 by default).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.sim.combinations import OUTCOMES, judge, pairwise, product


def _workers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="processes judging cells")


def main() -> None:
    """Run the cells and print the figures."""
    args = parse_args(__doc__.splitlines()[0], _workers)
    cells = pairwise() if args.quick else product()
    started = time.perf_counter()
    counts = dict.fromkeys(OUTCOMES, 0)
    margins = []
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for number, verdict in enumerate(pool.map(judge, cells), 1):
            counts[verdict.outcome] += 1
            if verdict.outcome == "learned" and verdict.accuracy is not None:
                margins.append(verdict.accuracy - float(verdict.checks["floor"]))
            if verdict.outcome not in ("learned", "refused"):
                print(f"[{number}/{len(cells)}] {verdict.describe()}", flush=True)
            elif number % 25 == 0:
                print(f"[{number}/{len(cells)}] {counts}", flush=True)
    elapsed = time.perf_counter() - started
    report({"cells": len(cells),
            "cells_learned": counts["learned"],
            "cells_refused": counts["refused"],
            "cells_silently_wrong": counts["silently_wrong"],
            "cells_crashed": counts["crashed"],
            "pairwise_cells": len(pairwise()),
            "seconds_per_cell": elapsed / len(cells),
            "min_margin": min(margins) if margins else 0.0}, args.json)


if __name__ == "__main__":
    main()
