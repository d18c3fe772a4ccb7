"""The "must not import" table of docs/design.md, held by walking fedlink's source (``ast``)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import fedlink

PACKAGE_DIR = Path(fedlink.__file__).parent
GENERATED_DIR = PACKAGE_DIR / "proto" / "v1"

TORCH = ("torch", "opacus", "torchvision")
GRPC = ("grpc",)  # plus every top-level ``grpc_*`` (health, reflection, tools, ...)

# package -> forbidden import families (docs/design.md, "Package boundaries")
MUST_NOT_IMPORT: dict[str, tuple[str, ...]] = {
    "fedlink.wire": ("torch",),
    "fedlink.params": ("grpc",),
    "fedlink.compress": ("grpc", "torch"),
    "fedlink.privacy": ("grpc",),
    "fedlink.aggregate": ("grpc", "torch"),
    "fedlink.coordinator": ("torch",),
    "fedlink.client": ("torch",),
    "fedlink.netem": ("torch",),
    "fedlink.data": ("grpc",),
    "fedlink.metrics": ("grpc", "torch"),
    "fedlink.observe": ("torch",),
    "fedlink.netcheck": ("torch",),
    "fedlink.conformance": ("grpc", "torch"),
}
EXEMPT = {("fedlink.client.torch_trainer", "torch")}

# Only these modules may talk protobuf-generated code or grpc.
PROTO_AND_GRPC_ALLOWED = ("fedlink.wire", "fedlink.coordinator.servicer",
                          "fedlink.coordinator.server", "fedlink.coordinator.edge",
                          "fedlink.coordinator.handlers", "fedlink.coordinator.stopping",
                          "fedlink.coordinator.inflight",
                          "fedlink.client.transport", "fedlink.proto", "fedlink.observe.rpc",
                          "fedlink.netcheck.probe", "fedlink.netcheck.health")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (or module.name for ``from m import name``)
    line: int


def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> list[Import]:
    """Every import in ``source`` (including those inside functions), relative ones resolved."""
    found: list[Import] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append(Import(module, base, node.lineno))
            found += [Import(module, f"{base}.{alias.name}", node.lineno)
                      for alias in node.names if alias.name != "*"]
    return found


def family(target: str) -> str | None:
    top = target.split(".")[0]
    if top in TORCH:
        return "torch"
    if top in GRPC or top.startswith("grpc_"):
        return "grpc"
    return None


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def source_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py")
                  if GENERATED_DIR not in p.parents and "__pycache__" not in p.parts)


def all_imports() -> list[Import]:
    found: list[Import] = []
    for path in source_files():
        found += imports_of(path.read_text(encoding="utf-8"), module_name(path),
                            path.name == "__init__.py")
    return found


def violations(imports: list[Import]) -> list[str]:
    problems: list[str] = []
    for imp in imports:
        fam = family(imp.target)
        for package, forbidden in MUST_NOT_IMPORT.items():
            if (within(imp.module, package) and fam in forbidden
                    and (imp.module, fam) not in EXEMPT):
                problems.append(f"{imp.module}:{imp.line} imports {imp.target} "
                                f"({package} must not import {fam})")
        talks_wire = fam == "grpc" or within(imp.target, "fedlink.proto")
        if talks_wire and not any(within(imp.module, ok) for ok in PROTO_AND_GRPC_ALLOWED):
            problems.append(f"{imp.module}:{imp.line} imports {imp.target} (only "
                            f"{', '.join(PROTO_AND_GRPC_ALLOWED)} may use grpc/fedlink.proto)")
        if (within(imp.module, "fedlink.proto") and within(imp.target, "fedlink")
                and not within(imp.target, "fedlink.proto")):
            problems.append(f"{imp.module}:{imp.line} imports {imp.target} "
                            "(fedlink.proto must import nothing of fedlink)")
    return problems


def test_the_walker_sees_the_packages() -> None:
    modules = {module_name(p) for p in source_files()}
    for expected in ("fedlink.wire.convert", "fedlink.coordinator.engine",
                     "fedlink.client.session", "fedlink.aggregate.streaming"):
        assert expected in modules


def test_must_not_import_table_holds() -> None:
    problems = violations(all_imports())
    assert not problems, "architecture violations:\n" + "\n".join(problems)


def test_generated_proto_code_imports_nothing_of_fedlink_but_itself() -> None:
    found: list[Import] = []
    for path in sorted(GENERATED_DIR.glob("*.py")):
        found += imports_of(path.read_text(encoding="utf-8"), module_name(path),
                            path.name == "__init__.py")
    bad = [i for i in found
           if within(i.target, "fedlink") and not within(i.target, "fedlink.proto")]
    assert not bad, bad


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("fedlink.coordinator.engine", "import torch", "must not import torch"),
    ("fedlink.compress.topk", "def f():\n    from torch import nn", "must not import torch"),
    ("fedlink.aggregate.robust", "import grpc.aio", "must not import grpc"),
    ("fedlink.metrics.prom", "from grpc_health.v1 import health", "must not import grpc"),
    ("fedlink.client.session", "from fedlink.proto.v1 import coordinator_pb2",
     "may use grpc/fedlink.proto"),
    ("fedlink.client.session", "from ..proto.v1 import coordinator_pb2",
     "may use grpc/fedlink.proto"),
    ("fedlink.sim.runner", "import grpc", "may use grpc/fedlink.proto"),
    ("fedlink.proto.v1.extra_pb2", "from fedlink.wire import pack",
     "fedlink.proto must import nothing"),
])
def test_checker_catches_violations(module: str, source: str, expected: str) -> None:
    """The checker itself: a forbidden import in a synthetic module is reported."""
    problems = violations(imports_of(source, module, is_package=False))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("module", "source"), [
    ("fedlink.client.torch_trainer", "import torch"),
    ("fedlink.client.transport", "import grpc"),
    ("fedlink.wire.convert", "from fedlink.proto.v1 import coordinator_pb2"),
    ("fedlink.coordinator.server", "from grpc_health.v1 import health"),
    ("fedlink.params.flat", "import torch"),
])
def test_checker_allows_permitted_imports(module: str, source: str) -> None:
    assert violations(imports_of(source, module, is_package=False)) == []


@pytest.mark.parametrize("package", ["fedlink.client", "fedlink.coordinator"])
def test_importing_does_not_load_torch(package: str) -> None:
    """A device (or coordinator host) without torch can import the package."""
    code = textwrap.dedent(f"""
        import sys
        import {package}
        heavy = sorted(m for m in ("torch", "opacus") if m in sys.modules)
        print(",".join(heavy))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"import {package} loaded {result.stdout.strip()}"


# -- one clock: only fedlink.clock reads the wall clock for model time -----------------------

CLOCK_MODULE = "fedlink.clock"
WALL_CLOCK = {"time": ("monotonic", "time"), "asyncio": ("sleep",)}
"""What reads or waits on real time: ``time.monotonic``, ``time.time``, ``asyncio.sleep``."""

RATE_BUCKETS = "token buckets limit request rates in real time, whatever clock the run keeps"
TOKEN_EXPIRY = "bearer tokens carry absolute expiry instants (seconds since the epoch)"

CLOCK_ALLOW_LIST: dict[str, str] = {
    # module -> why it may read real time (I/O timeouts and wall-clock stamps, not model time)
    "fedlink.client.session": "outbox records carry a wall-clock creation stamp (time.time)",
    "fedlink.netem.proxy": "a real TCP link: its blackout schedule sleeps on the event loop",
    "fedlink.netem.packet_probe": "packet tier: real packets are timed on the host's clock",
    "fedlink.netem.packet_forwarder": "packet tier: real packets are timed on the host's clock",
    "fedlink.metrics.events": "event timestamps: wall-clock Unix time in events.jsonl",
    "fedlink.sim.runner": "a run's wall_seconds; its progress poll goes with typed events",
    "fedlink.coordinator.admission": RATE_BUCKETS,
    "fedlink.coordinator.limits": RATE_BUCKETS,
    "fedlink.coordinator.probe": RATE_BUCKETS,
    "fedlink.coordinator.tokens": TOKEN_EXPIRY,
    "fedlink.coordinator.server": TOKEN_EXPIRY,
}


def wall_clock_uses(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every use of ``WALL_CLOCK`` in ``source``: ``time.monotonic``
    through any alias of the module, and ``from time import monotonic`` (any alias)."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> module
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names
                            if a.name in WALL_CLOCK})
        elif isinstance(node, ast.ImportFrom) and node.module in WALL_CLOCK:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if a.name in WALL_CLOCK[node.module]]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr in WALL_CLOCK[aliases[node.value.id]]):
            found.append((node.lineno, f"{aliases[node.value.id]}.{node.attr}"))
    return sorted(found)


def clock_violations() -> tuple[list[str], set[str]]:
    """Uses of the wall clock outside ``fedlink.clock`` and the allow-list, and the modules
    of the allow-list that use it (to find stale entries)."""
    problems: list[str] = []
    using: set[str] = set()
    for path in source_files():
        module = module_name(path)
        uses = wall_clock_uses(path.read_text(encoding="utf-8"))
        if not uses or module == CLOCK_MODULE:
            continue
        if module in CLOCK_ALLOW_LIST:
            using.add(module)
            continue
        problems += [f"{module}:{line} uses {what}" for line, what in uses]
    return problems, using


def test_only_the_clock_module_reads_the_wall_clock() -> None:
    problems, _ = clock_violations()
    assert not problems, ("read time through fedlink.clock (a Clock passed in, RealClock by "
                          "default; sleep_on/real_sleep in async code), or add the module to "
                          "CLOCK_ALLOW_LIST with its reason:\n" + "\n".join(problems))


def test_the_clock_allow_list_holds_no_stale_entries() -> None:
    _, using = clock_violations()
    stale = sorted(set(CLOCK_ALLOW_LIST) - using)
    assert not stale, f"no longer read the wall clock; drop them from CLOCK_ALLOW_LIST: {stale}"
    assert all(reason.strip() for reason in CLOCK_ALLOW_LIST.values())


@pytest.mark.parametrize(("source", "expected"), [
    ("import time\nt = time.monotonic()", ["time.monotonic"]),
    ("import time as t\nstamp = t.time()", ["time.time"]),
    ("from time import monotonic as now\nx = now()", ["time.monotonic"]),
    ("import asyncio\nasync def f():\n    await asyncio.sleep(1)", ["asyncio.sleep"]),
    ("import asyncio\ndef f(sleep=asyncio.sleep): ...", ["asyncio.sleep"]),
    ("from asyncio import sleep", ["asyncio.sleep"]),
    ("import time\nt = time.perf_counter()", []),  # durations, not the model's time
    ("import asyncio\nasync def f(loop):\n    await asyncio.wait_for(f(loop), 1)", []),
])
def test_the_wall_clock_checker_sees_every_spelling(source: str, expected: list[str]) -> None:
    assert [what for _, what in wall_clock_uses(source)] == expected
