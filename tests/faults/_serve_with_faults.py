"""``fedlink serve`` with a fault plan built from the command line, for the crash-safety test.

    python tests/faults/_serve_with_faults.py [--crash-at MOMENT[:N]] SERVE-ARGS...

runs ``fedlink serve SERVE-ARGS`` (the same options: ``--config``, ``--port``, ...) in this
process, telling a ``KillAt`` plan each moment it passes: the ``N``-th time (default 1) the
coordinator reaches ``MOMENT`` (``fedlink.coordinator.faults.MOMENTS``) the process SIGKILLs
itself there. Without ``--crash-at`` it is plain ``fedlink serve -v``. This is the only way to
make a coordinator kill itself: nothing in the environment or the config can.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading

from fedlink.cli import build_parser
from fedlink.cli.serve import serve
from fedlink.coordinator.faults import MOMENTS, NO_FAULTS, FaultPlan

log = logging.getLogger("fedlink.tests.faults")


class KillAt(FaultPlan):
    """SIGKILL this process the ``times``-th time it reaches ``moment``."""

    def __init__(self, moment: str, times: int = 1) -> None:
        if moment not in MOMENTS:
            raise SystemExit(f"unknown moment {moment!r}; the coordinator passes {MOMENTS}")
        self.moment = moment
        self._left = times
        self._lock = threading.Lock()  # the writer thread and the event loop both report

    @classmethod
    def parse(cls, spec: str) -> KillAt:
        """``MOMENT[:N]``."""
        moment, _, times = spec.partition(":")
        return cls(moment, int(times or 1))

    def reached(self, moment: str) -> None:
        """Count ``moment``; die at the chosen passage."""
        if moment != self.moment:
            return
        with self._lock:
            self._left -= 1
            if self._left != 0:
                return
        log.warning("fault plan: killing the coordinator at %s", moment)
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    """Parse ``--crash-at``, then serve as ``fedlink -v serve`` would with the rest."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crash-at", default="", help="MOMENT[:N]")
    ours, rest = parser.parse_known_args(argv)
    plan = KillAt.parse(ours.crash_at) if ours.crash_at else NO_FAULTS
    args = build_parser().parse_args(["serve", *rest])
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(args.config, f"{args.host}:{args.port}", args.output_dir,
                             args.state_dir, args.metrics_port, args.metrics_host, faults=plan))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
