"""fedlink's import graph holds the package boundaries of ``docs/design.md``.

The graph is read from the source (an ``ast`` walk of every ``fedlink/**/*.py``), not by
importing it, so a test run that has already imported everything cannot hide an edge. An edge
is an import at module level, relative imports resolved, including those under
``if TYPE_CHECKING:`` (a type-only import still ties two modules together for mypy and for the
reader) and those inside ``try``; importing ``a.b.c`` also runs ``a/__init__`` and
``a/b/__init__``, so it is an edge to those packages too.

Imports inside a function body are *not* edges: a function that imports what it needs when it
is called (torch in a trainer's builder, Ray in its backend, the simulator from a CLI command)
is the sanctioned way to keep a module light, and cannot close a circle at import time.

Two checks:

- no import circle: every strongly connected component of the graph is one module;
- the "must not import" column of ``docs/design.md``: what a package loads at run time (the
  transitive closure of its runtime module-level imports, ``TYPE_CHECKING`` ones left out)
  stays clear of the packages and third-party modules it must not import.
  (``test_architecture.py`` checks each module's own imports, those inside functions too;
  this checks everything a package drags in when it is imported.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fedlink"

Edges = dict[str, set[str]]


def _module_name(path: Path) -> tuple[str, bool]:
    """``fedlink/a/b.py`` -> (``fedlink.a.b``, False); ``fedlink/a/__init__.py`` -> (``fedlink.a``,
    True)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


@cache
def _modules() -> dict[str, tuple[Path, bool]]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name, is_package = _module_name(path)
        modules[name] = (path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(body: list[ast.stmt], typing: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements run at module level (``typing``: with the ``TYPE_CHECKING`` ones);
    function and class bodies are not entered."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if _is_type_checking(node.test):
                if typing:
                    yield from _imports(node.body, typing)
                yield from _imports(node.orelse, typing)
            else:
                yield from _imports(node.body, typing)
                yield from _imports(node.orelse, typing)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _imports(block, typing)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The full dotted names an import statement loads (fedlink's and third-party)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:  # relative: from the module's package, one level up per extra dot
        base = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    yield source
    for alias in node.names:  # ``from pkg import submodule`` loads the submodule
        if f"{source}.{alias.name}" in _modules():
            yield f"{source}.{alias.name}"


def _with_packages(name: str) -> Iterator[str]:
    """``a.b.c`` and the packages importing it runs first: ``a``, ``a.b``."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        yield ".".join(parts[:end])


@cache
def _graph(typing: bool) -> Edges:
    """Module -> the names it loads at module level: fedlink modules (and their packages) and
    third-party top-level names (``torch``, ``grpc``)."""
    modules = _modules()
    edges: Edges = {}
    for module, (path, is_package) in modules.items():
        found: set[str] = set()
        for node in _imports(ast.parse(path.read_text()).body, typing):
            for target in _targets(module, is_package, node):
                if target.split(".")[0] != "fedlink":
                    found.add(target.split(".")[0])
                    continue
                for name in _with_packages(target):
                    # a module does not depend on the packages it sits in (Python runs them
                    # before it), nor on an unknown name (an attribute, not a module)
                    if name in modules and not module.startswith(f"{name}.") and name != module:
                        found.add(name)
        edges[module] = found
    return edges


def _cycles(edges: Edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root] & edges.keys())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child] & edges.keys()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _closure(module: str, edges: Edges) -> set[str]:
    """Everything ``module`` loads at import time, directly or through what it imports."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in edges.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


FEDLINK = "fedlink"
# docs/design.md, "Package boundaries": package -> what it must not import, and the
# modules of the package that are exempt (the torch trainer is the client's torch door).
MUST_NOT_IMPORT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fedlink.clock": ((FEDLINK,), ()),
    "fedlink.proto": ((FEDLINK,), ()),
    "fedlink.wire": (("torch",), ()),
    "fedlink.params": (("grpc",), ()),
    "fedlink.compress": (("grpc", "torch"), ()),
    "fedlink.privacy": (("grpc",), ()),
    "fedlink.aggregate": (("grpc", "torch"), ()),
    "fedlink.coordinator": (("torch",), ()),
    "fedlink.client": (("torch",), ("fedlink.client.torch_trainer",)),
    "fedlink.netem": (("torch",), ()),
    "fedlink.experiment": (("fedlink.sim",), ()),
    "fedlink.data": (("grpc",), ()),
    "fedlink.metrics": (("grpc", "torch"), ()),
}


def test_the_graph_is_read_from_every_module() -> None:
    edges = _graph(typing=True)
    assert "fedlink.experiment.config" in edges and "fedlink.sim.runner" in edges
    assert "fedlink.experiment.config" in edges["fedlink.experiment.setup"]
    assert "torch" in edges["fedlink.experiment.setup"]


def test_there_is_no_import_circle_in_fedlink() -> None:
    cycles = _cycles(_graph(typing=True))
    assert not cycles, "import circles (each a set of modules that import each other at " \
        "module level; move the shared piece below them or import it inside the function " \
        "that needs it):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_circle_and_its_members_only() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", sorted(MUST_NOT_IMPORT))
def test_a_package_does_not_load_what_the_design_forbids(package: str) -> None:
    forbidden, exempt = MUST_NOT_IMPORT[package]
    edges = _graph(typing=False)
    members = [m for m in edges if _in(m, package) and not any(_in(m, e) for e in exempt)]
    assert members, f"no module in {package}"
    broken = {}
    for module in members:
        loaded = _closure(module, edges)
        bad = sorted(n for n in loaded if any(_in(n, f) for f in forbidden)
                     and not _in(n, package))
        if bad:
            broken[module] = bad
    assert not broken, f"{package} must not import {', '.join(forbidden)} " \
        f"(docs/design.md); at import time these load it: {broken}"


def test_serve_and_client_commands_load_no_simulator_module() -> None:
    edges = _graph(typing=False)
    for command in ("fedlink.cli.serve", "fedlink.cli.client"):
        loaded = sorted(n for n in _closure(command, edges) if _in(n, "fedlink.sim"))
        assert not loaded, f"{command} loads the simulator: {loaded}"
