"""``fedlink conformance`` against fedlink's own edge client (numpy only), and against a client
that does nothing, through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import fixed_port

from fedlink.conformance import CHECKS, LOSSY_CODECS, ConformanceOptions
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
    cmd = (f"{sys.executable} {EDGE} --server {{server}} --data {tmp_path / 'local.npz'} "
           "--compression {update_codec}")
    result = conformance(cmd, tmp_path / "verdicts.json")

    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    behaviours = {"join", "task", "resume_download", "resume_upload", "idempotent_commit",
                  "delta", "refusal", "new_upload_id", "verify_model", "heartbeat",
                  "retry_hint", "rejoin", "evaluate", "metrics", "leave"}
    codecs = {f"{codec}: {check}" for codec in ("fp32", "fp16", "bf16", "fp32-zlib")
              for check in ("codec", "inline")}
    lossy = {f"{codec}: lossy_update" for codec in LOSSY_CODECS}
    assert set(verdicts) == behaviours | codecs | lossy
    assert all(verdicts.values()), result.stdout
    assert f"{len(verdicts)}/{len(verdicts)} behaviours passed" in result.stdout
    assert "(client exit code 0)" in result.stdout


def test_a_correct_client_whose_update_fits_one_chunk_resumes_nothing(tmp_path: Path) -> None:
    """topk+q8 of 650 values is far below the 512-byte chunk: the cut upload stream carried it
    all, UploadStatus says so, and the client commits without a second stream."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "local.npz", x=rng.normal(size=(200, 64)).astype(np.float32),
             y=rng.integers(0, 10, size=200))
    cmd = (f"{sys.executable} {EDGE} --server {{server}} --data {tmp_path / 'local.npz'} "
           "--compression topk+q8")
    result = conformance(cmd, tmp_path / "verdicts.json", "--only", "resume_upload")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "its first chunk held all" in result.stdout


def test_a_client_that_never_connects_fails_every_behaviour(tmp_path: Path) -> None:
    cmd = f"{sys.executable} -c 'import sys; sys.exit(3)' {{server}}"
    result = conformance(cmd, tmp_path / "verdicts.json", "--codecs", "fp32",
                         "--timeout-s", "30")

    assert result.returncode == 1
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts and not any(verdicts.values()), result.stdout
    assert "FAIL  resume_upload" in result.stdout
    assert "client exit code 3" in result.stdout  # its own status, not "None"
    assert "no {update_codec} placeholder" in result.stdout
    assert "client output (faults): nothing printed" in result.stdout


def test_the_coordinators_listen_where_they_are_told(tmp_path: Path) -> None:
    port = fixed_port()  # below the ephemeral range: no other test's bind(0) takes it meanwhile
    cmd = f"{sys.executable} -c 'import sys; print(sys.argv[1])' {{server}}"
    result = conformance(cmd, tmp_path / "verdicts.json", "--only", "join", "--host",
                         "127.0.0.1", "--port", str(port), "--timeout-s", "30")

    assert result.returncode == 1
    assert f"| 127.0.0.1:{port}" in result.stdout  # the client was given that address


SECURE_CLIENT_TOML = """
[run]
name = "conformance-secure"
[data]
dataset = "digits"
clients = 2
[model]
name = "logreg"
"""
"""fedlink's own client on digits with logistic regression: 650 parameters, the default."""


def test_the_fedlink_client_passes_the_secure_scenario(tmp_path: Path) -> None:
    """fedlink's own client completes two secure groups beside the runner's three peers,
    retries its SecureMasked whose reply was lost, and answers for a peer that vanished after
    sharing its keys; only its own tasks are judged."""
    pytest.importorskip("cryptography")
    config = tmp_path / "client.toml"
    config.write_text(SECURE_CLIENT_TOML)
    cmd = f"{sys.executable} -m fedlink client --server {{server}} --config {config}"
    result = conformance(cmd, tmp_path / "verdicts.json", "--secure", "--only",
                         "secure_round,secure_retry,secure_dropout,secure_options",
                         "--timeout-s", "90")

    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts == {"secure_round": True, "secure_retry": True, "secure_dropout": True,
                        "secure_options": True}, result.stdout
    # the peers' tasks are not the client's: 2 rounds, 2 tasks, not 8
    assert "2 task(s) in secure groups, 2 through all four calls, 2 inside a flushed sum" \
        in result.stdout
    assert "the same content, 1 answered the same, counted 1 time(s)" in result.stdout
    assert "its update inside the flushed sum" in result.stdout


def test_the_secure_scenario_is_asked_for() -> None:
    """A client that delivers plain updates would fail it: the default run leaves it out."""
    def names(options: ConformanceOptions) -> list[str]:
        return [s.name for s in options.scenarios()]

    cmd = "c {server}"
    assert "secure" not in names(ConformanceOptions(cmd))
    assert names(ConformanceOptions(cmd, secure=True))[-3:] == ["secure", "secure-dropout",
                                                                "secure-options"]
    assert names(ConformanceOptions(cmd, only=("secure_round",))) == ["secure"]
    assert names(ConformanceOptions(cmd, only=("secure_dropout",))) == ["secure-dropout"]
    assert names(ConformanceOptions(cmd, only=("secure_options",))) == ["secure-options"]
    assert "secure" not in names(ConformanceOptions(cmd, only=("join",)))


def test_the_secure_options_scenario_names_the_extra_its_accounting_needs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without dp-accounting the secure-options scenario (distributed DP) could not start its
    coordinator: the run is refused at once, naming the extra, and the other secure checks
    still run alone."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "dp_accounting" else find_spec(name, *a))
    with pytest.raises(ConfigError, match="privacy extra"):
        ConformanceOptions("c {server}", secure=True)
    ConformanceOptions("c {server}", only=("secure_round", "secure_dropout"))


def test_options_need_the_server_placeholder_and_known_codecs() -> None:
    with pytest.raises(ConfigError, match="server"):
        ConformanceOptions(client_cmd="python client.py")
    with pytest.raises(ConfigError, match="codec"):
        ConformanceOptions(client_cmd="c {server}", codecs=("fp8",))
    with pytest.raises(ConfigError, match="lossy"):
        ConformanceOptions(client_cmd="c {server}", update_codecs=("fp32",))
    with pytest.raises(ConfigError, match="check"):
        ConformanceOptions(client_cmd="c {server}", only=("no_such_check",))
    with pytest.raises(ConfigError, match="port"):
        ConformanceOptions(client_cmd="c {server}", port=70000)
    assert {"join", "refusal", "codec", "heartbeat", "lossy_update", "secure_round",
            "secure_retry"} <= set(CHECKS)
