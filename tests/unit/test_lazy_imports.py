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


def fedlink_loaded_after(statement: str) -> set[str]:
    """The fedlink modules (and ``tomllib``, ``grpc``) that ``statement`` loads."""
    code = (f"{statement}; import json, sys; print(json.dumps(sorted(m for m in sys.modules "
            f"if m.split('.')[0] in ('fedlink', 'tomllib', 'grpc', 'google'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    return set(json.loads(out.stdout))


COORDINATOR_SIDE = {"fedlink.aggregate", "fedlink.privacy.hooks", "fedlink.privacy.accounting"}
"""What a device never runs: the server's aggregation, flush hooks and privacy accounting."""


def test_importing_the_sdk_loads_its_modules_only_when_a_name_is_read() -> None:
    loaded = fedlink_loaded_after("import fedlink.client")
    assert loaded == {"fedlink", "fedlink._version", "fedlink.client"}


def test_a_client_session_loads_no_coordinator_side_module_nor_a_toml_parser() -> None:
    loaded = fedlink_loaded_after("from fedlink.client import ClientSession, run_client")
    assert {"fedlink.client.session", "fedlink.client.transport", "grpc"} <= loaded
    assert not loaded & (COORDINATOR_SIDE | {"tomllib"})


def test_every_public_name_of_the_sdk_and_the_privacy_package_still_imports() -> None:
    import fedlink.client
    import fedlink.privacy

    for package in (fedlink.client, fedlink.privacy):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
    assert fedlink.client.ClientSession.__module__ == "fedlink.client.session"
    with pytest.raises(AttributeError):
        fedlink.client.NotAName  # noqa: B018


def test_the_coordinator_registers_the_privacy_hooks_that_the_package_now_loads_lazily() -> None:
    loaded = fedlink_loaded_after("import fedlink.privacy")
    assert not loaded & COORDINATOR_SIDE
    code = "import fedlink.coordinator; from fedlink.aggregate import FLUSH_HOOKS; " \
           "print('dp_fedavg' in FLUSH_HOOKS.names(), 'dp_sgd' in FLUSH_HOOKS.names())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["True", "True"]


def test_the_command_line_starts_without_the_coordinator_or_grpc() -> None:
    # `fedlink client` on an edge box should not pay for the coordinator (half a second)
    loaded = fedlink_loaded_after("import fedlink.cli")
    assert not {m for m in loaded if m.startswith(("fedlink.coordinator", "fedlink.conformance",
                                                   "grpc"))}


def test_the_conformance_help_names_every_downlink_codec() -> None:
    from fedlink.cli import build_parser
    from fedlink.conformance import DOWNLINK_CODECS

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    codecs = next(a for a in sub.choices["conformance"]._actions  # type: ignore[index]
                  if a.dest == "codecs")
    assert codecs.help is not None and all(c in codecs.help for c in DOWNLINK_CODECS)
