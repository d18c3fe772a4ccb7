"""Heavy dependencies load when a run needs them, not on import: a device importing the SDK,
a coordinator importing the server or the simulation package, pay for none of them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "opacus", "scipy", "sklearn", "matplotlib", "rich", "dp_accounting", "ray")


def loaded_after(statement: str) -> list[str]:
    code = (f"{statement}; import json, sys; print(json.dumps(sorted("
            f"{{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    names: list[str] = json.loads(out.stdout)
    return names


@pytest.mark.parametrize("module", ["fedlink.client", "fedlink.coordinator", "fedlink.sim",
                                    "fedlink.cli", "fedlink.cli.serve", "fedlink.conformance",
                                    "fedlink.privacy", "fedlink.metrics"])
def test_importing_loads_no_heavy_dependency(module: str) -> None:
    assert loaded_after(f"import {module}") == []


def test_an_epsilon_loads_dp_accounting_and_still_no_torch() -> None:
    loaded = loaded_after("from fedlink.privacy import epsilon; epsilon(1.1, 0.01, 10, 1e-5)")
    assert "dp_accounting" in loaded and "torch" not in loaded
