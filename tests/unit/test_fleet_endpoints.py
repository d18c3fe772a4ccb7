"""The fleet launcher's per-client endpoints: a template with a port base, or a file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "digits_fedavg.toml"


def launcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_launch", REPO / "clients/fleet/launch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_template_gives_each_client_its_own_port() -> None:
    launch = launcher()
    args = launch.parse_args(["--config", str(CONFIG), "--clients", "3", "--first-index", "2",
                              "--server-template", "127.0.0.1:{port}", "--port-base", "7000"])
    assert launch.endpoints(args) == ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
    args = launch.parse_args(["--config", str(CONFIG), "--clients", "2", "--first-index", "4",
                              "--server-template", "10.0.0.{index}:50051"])
    assert launch.endpoints(args) == ["10.0.0.4:50051", "10.0.0.5:50051"]


def test_a_file_lists_one_endpoint_per_client(tmp_path: Path) -> None:
    launch = launcher()
    listed = tmp_path / "servers.txt"
    listed.write_text("# one per client\n127.0.0.1:9001\n\n127.0.0.1:9002  # the slow one\n")
    args = launch.parse_args(["--config", str(CONFIG), "--clients", "2",
                              "--servers-file", str(listed)])
    assert launch.endpoints(args) == ["127.0.0.1:9001", "127.0.0.1:9002"]


def test_bad_endpoint_options_are_refused_at_the_command_line(tmp_path: Path) -> None:
    launch = launcher()
    short = tmp_path / "one.txt"
    short.write_text("127.0.0.1:9001\n")
    for argv in (["--servers-file", str(short)],  # 1 endpoint for 2 clients
                 ["--server-template", "127.0.0.1:{port}"],  # no --port-base
                 ["--server-template", "127.0.0.1:5000"]):  # nothing per client
        with pytest.raises(SystemExit):
            launch.parse_args(["--config", str(CONFIG), "--clients", "2", *argv])
