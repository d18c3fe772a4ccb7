"""``fedlink conformance`` against fedlink's own edge client (numpy only), and against a client
that does nothing, through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedlink.conformance import CHECKS, ConformanceOptions
from fedlink.errors import ConfigError

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
EDGE = REPO / "clients" / "edge" / "edge_client.py"


def conformance(client_cmd: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedlink", "conformance", "--client-cmd",
                           client_cmd, "--json", str(out), *extra],
                          capture_output=True, text=True, timeout=220)


def test_the_edge_client_passes_every_behaviour(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)  # 64 features, 10 classes: the edge client's logreg
    np.savez(tmp_path / "local.npz", x=rng.normal(size=(200, 64)).astype(np.float32),
             y=rng.integers(0, 10, size=200))
    cmd = f"{sys.executable} {EDGE} --server {{server}} --data {tmp_path / 'local.npz'}"
    result = conformance(cmd, tmp_path / "verdicts.json")

    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    behaviours = {"join", "task", "resume_download", "resume_upload", "idempotent_commit",
                  "delta", "refusal"}
    codecs = {f"{codec}: {check}" for codec in ("fp32", "fp16", "bf16", "fp32-zlib")
              for check in ("codec", "inline")}
    assert set(verdicts) == behaviours | codecs
    assert all(verdicts.values()), result.stdout
    assert "15/15 behaviours passed" in result.stdout


def test_a_client_that_never_connects_fails_every_behaviour(tmp_path: Path) -> None:
    cmd = f"{sys.executable} -c 'import sys; sys.exit(3)' {{server}}"
    result = conformance(cmd, tmp_path / "verdicts.json", "--codecs", "fp32",
                         "--timeout-s", "30")

    assert result.returncode == 1
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts and not any(verdicts.values()), result.stdout
    assert "FAIL  resume_upload" in result.stdout


def test_options_need_the_server_placeholder_and_known_codecs() -> None:
    with pytest.raises(ConfigError, match="server"):
        ConformanceOptions(client_cmd="python client.py")
    with pytest.raises(ConfigError, match="codec"):
        ConformanceOptions(client_cmd="c {server}", codecs=("fp8",))
    assert {"join", "refusal", "codec"} <= set(CHECKS)
