"""A client's randomness, its privacy noise included, is its own unless a seed fixes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fedlink.cli.client
from fedlink.cli import main
from fedlink.client import ClientOptions


def test_a_client_is_unseeded_unless_told_otherwise() -> None:
    assert ClientOptions().seed is None


@pytest.mark.parametrize(("flags", "seed"), [((), None), (("--seed", "7"), 7)])
def test_fedlink_client_passes_its_seed_on_and_draws_its_own_without_one(
        monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], seed: int | None) -> None:
    seen: dict[str, Any] = {}

    def run_one_client(*args: Any) -> int:
        seen["seed"] = args[-1]
        return 0

    monkeypatch.setattr(fedlink.cli.client, "run_one_client", run_one_client)
    assert main(["client", "--server", "127.0.0.1:1", "--config", str(Path("x.toml")),
                 *flags]) == 0
    assert seen == {"seed": seed}
