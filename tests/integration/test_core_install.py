"""The core install on a device: fedlink's wheel with its core dependencies only, in a fresh
virtualenv, holds no torch (nor scipy, scikit-learn, matplotlib, rich), and the edge client
from it trains a numpy logistic regression against ``fedlink serve`` without importing torch.

Slow (a wheel build and a venv install, ~30 s with a warm pip cache): marked ``slow``. It needs
the ``build`` package (the ``dev`` extra) and the package index for the core dependencies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_deployables import EDGE, REPO, TORCH_FREE, Spawner, small_config, start_serve

# one xdist worker for the file: the core-wheel venv (a module fixture) is built once
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.xdist_group("core-install")]

CORE_DISTRIBUTIONS = {"fedlink", "grpcio", "grpcio_health_checking", "grpcio_reflection",
                      "grpcio_status", "googleapis_common_protos", "numpy", "protobuf",
                      "pyjwt", "tenacity", "typing_extensions"}
"""What ``pip install fedlink`` brings (typing_extensions comes with grpcio,
googleapis_common_protos with grpcio_status: ``google.rpc.RetryInfo``; pyjwt checks the
coordinator's per-client tokens)."""
CORE_BUDGET_MB = 85
"""Site-packages of the core install without .pyc files (``core_install_nocompile_mb`` of
``benchmarks/startup.py``): 79.6 MB measured, 97.9 MB as pip installs it by default (.pyc
compiled). Issue 18 asks for 60, which these wheels cannot meet: numpy 2.4.6 is 57.4 MB (28.5 of
them OpenBLAS, gfortran and quadmath in ``numpy.libs``, 6 its own test suites), and no numpy
wheel for CPython 3.11 on x86_64 is smaller (2.2.6: 58.6, 1.26.4: 64.7, 2.0.2: 69.9 MB
unpacked); grpcio 1.85.3 is 18.3 MB (1.66.2 would be 14.2, but the generated stubs require
>= 1.85.1). Those two are 75.7 MB; protobuf, googleapis-common-protos, tenacity,
typing_extensions and the grpcio add-ons 2.6 MB; fedlink 1.3 MB."""


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """A ``Spawner`` (test_deployables) whose processes are killed after the test."""
    spawner = Spawner(tmp_path)
    yield spawner
    spawner.close()


@pytest.fixture(scope="module")
def core_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh venv holding only fedlink's wheel and its core dependencies."""
    root = tmp_path_factory.mktemp("core")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(root / "dist"),
                    str(REPO)], check=True, capture_output=True, timeout=300)
    wheel = next((root / "dist").glob("fedlink-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")],
                   check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-compile", str(wheel)], check=True, capture_output=True, timeout=300)
    return python


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; "
                          "print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def test_the_core_install_holds_only_the_core_dependencies(core_python: Path) -> None:
    packages = site_packages(core_python)
    installed = {p.name.split("-")[0].lower() for p in packages.glob("*.dist-info")}
    size_mb = sum(p.stat().st_size for p in packages.rglob("*") if p.is_file()) / 1e6

    assert installed == CORE_DISTRIBUTIONS
    assert size_mb <= CORE_BUDGET_MB, f"core install is {size_mb:.1f} MB"
    assert (packages / "fedlink" / "py.typed").is_file()


def test_the_edge_client_trains_from_the_core_install_without_torch(
        core_python: Path, spawn: Spawner, tmp_path: Path) -> None:
    from fedlink.data import load_federated

    config = tmp_path / "edge.toml"
    config.write_text(small_config("logreg", clients=1))
    share = load_federated("digits", 1, 0, "iid").clients[0]
    np.savez(tmp_path / "local.npz", x=share.x, y=share.y)
    serve, address = start_serve(spawn, config, tmp_path / "runs")
    device = Spawner(tmp_path)  # the device's environment: no checkout on its path
    device.env = {k: v for k, v in device.env.items() if k != "PYTHONPATH"}
    try:
        edge = device([str(core_python), "-c", TORCH_FREE, str(EDGE), "--server", address,
                       "--data", str(tmp_path / "local.npz"), "--max-tasks", "2"],
                      cwd=tmp_path)
        assert edge.finish(timeout_s=240) == 0, edge.output + serve.output
    finally:
        device.close()
    assert "torch-free exit 0" in edge.output
    assert "tasks 2, accepted 2, refused 0" in edge.output
    assert serve.finish(timeout_s=180) == 0, serve.output
    where = subprocess.run([str(core_python), "-c", "import fedlink; print(fedlink.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert str(site_packages(core_python)) in where.stdout  # the wheel's fedlink, not ours
