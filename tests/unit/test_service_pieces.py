"""The service is the short list of RPC handlers composing its pieces: no piece imports the
service (or the server) back, so the pieces never form a circle through it."""

from __future__ import annotations

import ast
from pathlib import Path

import fedlink.coordinator

COORDINATOR_DIR = Path(fedlink.coordinator.__file__).parent
PIECES = ("validation", "transfers", "commits", "reporting", "lifecycle", "timekeeper",
          "journal", "changes", "admission", "timers", "tasks", "faults", "evaluations",
          "secure_calls")
ABOVE = ("fedlink.coordinator.service", "fedlink.coordinator.server",
         "fedlink.coordinator.servicer")


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_piece_imports_the_service_back() -> None:
    offenders = {piece: sorted(imported(COORDINATOR_DIR / f"{piece}.py") & set(ABOVE))
                 for piece in PIECES}
    assert {piece: found for piece, found in offenders.items() if found} == {}


def test_the_service_has_only_handlers_and_their_composition() -> None:
    tree = ast.parse((COORDINATOR_DIR / "service.py").read_text())
    (service,) = [n for n in tree.body if isinstance(n, ast.ClassDef)
                  and n.name == "CoordinatorService"]
    methods = [n for n in service.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    assert len(methods) <= 22, [m.name for m in methods]
