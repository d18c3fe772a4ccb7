"""The coordinator reads model time only from its ``Clock``: an AST walk of
``fedlink/coordinator`` finds no ``time.monotonic``/``time.time``/``time.sleep``/
``asyncio.sleep``/``loop.time`` outside a short allow-list of I/O and rate timers."""

from __future__ import annotations

import ast
from pathlib import Path

import fedlink.coordinator

COORDINATOR_DIR = Path(fedlink.coordinator.__file__).parent
WALL_CLOCK = {("time", "monotonic"), ("time", "time"), ("time", "sleep"),
              ("time", "perf_counter"), ("asyncio", "sleep"), ("loop", "time")}
ALLOWED = {
    # token buckets limit request rates in real time, whatever clock the run keeps
    ("limits.py", "time.monotonic"), ("admission.py", "time.monotonic"),
    ("probe.py", "time.monotonic"),
    # bearer tokens carry absolute expiry instants (seconds since the epoch)
    ("auth.py", "time.time"), ("server.py", "time.time"),
    # how long one GetTask call is held open: an I/O timeout of the call
    ("service.py", "loop.time"),
}


def wall_clock_reads(source: str) -> list[str]:
    """``module.attr`` for every attribute read of a wall-clock function in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and (node.value.id, node.attr) in WALL_CLOCK):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_walk_finds_what_it_looks_for() -> None:
    source = "import time, asyncio\nx = time.monotonic()\nasync def f(): await asyncio.sleep(1)"
    assert wall_clock_reads(source) == ["time.monotonic", "asyncio.sleep"]


def test_only_io_timers_read_the_wall_clock_in_the_coordinator() -> None:
    offenders = []
    for path in sorted(COORDINATOR_DIR.rglob("*.py")):
        name = str(path.relative_to(COORDINATOR_DIR))
        offenders += [f"{name}: {read}" for read in wall_clock_reads(path.read_text())
                      if (name, read) not in ALLOWED]
    assert offenders == []
