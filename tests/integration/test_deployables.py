"""The deployables, end to end as real processes on loopback.

``fedlink serve`` with the fleet launcher, the numpy-only edge client, both against a mutual-TLS
coordinator too, graceful shutdown on signals, the API quickstart, ``--version``, and the
shipped configs. Every process a test
starts is killed (with its descendants) when the test ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import psutil
import pytest

from fedlink import __version__
from fedlink.aggregate.flushguard import RobustConfig
from fedlink.coordinator.config import (
    AuthConfig,
    CoordinatorConfig,
    EvaluationConfig,
    FlushRule,
    LimitsConfig,
    SecureConfig,
    TLSConfig,
    TrainingConfig,
)
from fedlink.coordinator.operations import MetricsConfig, NetcheckConfig
from fedlink.sim import ExperimentConfig

REPO = Path(__file__).resolve().parents[2]
FEDLINK = [sys.executable, "-m", "fedlink"]
LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")
STARTUP_S = 120.0  # a bound on waiting for evidence, not a timing: a loaded machine is slow

pytestmark = pytest.mark.timeout(300)
# the tests of the one fleet run (a module fixture) share an xdist worker, so it runs once
shares_the_fleet_run = pytest.mark.xdist_group("deployables-fleet-run")


def small_config(model: str, clients: int = 2) -> str:
    """A two-round digits run that waits for ``clients`` updates per round."""
    return f"""
[run]
name = "small-{model}"
[data]
dataset = "digits"
clients = {clients}
[model]
name = "{model}"
[coordinator]
rounds = 2
[coordinator.flush]
goal = {clients}
deadline_s = 30.0
[coordinator.training]
local_epochs = 1
learning_rate = 0.1
"""


# -- process plumbing ---------------------------------------------------------------------------


@dataclasses.dataclass
class Proc:
    """A child process whose merged output is collected by a thread."""

    popen: subprocess.Popen[str]
    lines: list[str] = dataclasses.field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def output(self) -> str:
        """Everything it printed so far."""
        return "".join(self.lines)

    def read(self) -> None:
        """Collect output until the pipe closes (run in a thread)."""
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        """The first output match of ``pattern``; fails the test on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = pattern.search(self.output)
            if match:
                return match
            if self.popen.poll() is not None and not self.reader_alive():
                break
            time.sleep(0.05)
        pytest.fail(f"no {pattern.pattern!r} in the output of {self.popen.args}:\n{self.output}")

    def reader_alive(self) -> bool:
        """Whether output may still arrive."""
        return self.reader is not None and self.reader.is_alive()

    def finish(self, timeout_s: float) -> int:
        """Exit code once it exits (fails the test after ``timeout_s``); output fully read."""
        try:
            code = self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.popen.args} still running after {timeout_s} s:\n{self.output}")
        if self.reader is not None:
            self.reader.join(timeout=5.0)
        return code


class Spawner:
    """Starts processes (``spawner(argv)``) and kills them, with descendants, in ``close``."""

    def __init__(self, scratch: Path) -> None:
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", MPLCONFIGDIR=str(scratch / "mpl"))
        self.procs: list[Proc] = []

    def __call__(self, argv: Sequence[str], cwd: Path = REPO) -> Proc:
        popen = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                 env=self.env)
        proc = Proc(popen)
        proc.reader = threading.Thread(target=proc.read, daemon=True)
        proc.reader.start()
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        """Kill whatever is still running."""
        for proc in self.procs:
            _kill_tree(proc.popen)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """A ``Spawner`` for one test."""
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.close()


def _kill_tree(popen: subprocess.Popen[str]) -> None:
    """SIGKILL ``popen`` and every process below it, then reap it."""
    with contextlib.suppress(psutil.NoSuchProcess):
        family = psutil.Process(popen.pid).children(recursive=True)
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(family, timeout=5)
    if popen.poll() is None:
        popen.kill()
    popen.wait(timeout=5)


def start_serve(spawn: Spawner, config: Path, output_dir: Path) -> tuple[Proc, str]:
    """``fedlink serve`` on a free loopback port; (process, HOST:PORT) once it listens."""
    proc = spawn([*FEDLINK, "serve", "--config", str(config), "--host", "127.0.0.1",
                  "--port", "0", "--output-dir", str(output_dir)])
    match = proc.wait_for(LISTENING, STARTUP_S)
    return proc, f"{match[1]}:{match[2]}"


def read_events(run_dir: Path) -> list[dict]:
    """The run's event log."""
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


# -- fedlink serve + the fleet launcher ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FleetRun:
    """What one launcher run left behind."""

    code: int
    output: str
    run_dir: Path

    def exit_codes(self) -> dict[str, int]:
        """Exit code per process, from the launcher's report."""
        found = re.findall(r"^--- (\S+): exit (-?\d+)", self.output, flags=re.MULTILINE)
        return {name: int(code) for name, code in found}


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRun]:
    """The launcher starts ``fedlink serve`` and two clients; a two-round run to the end."""
    tmp_path = tmp_path_factory.mktemp("fleet")
    config = tmp_path / "fleet.toml"
    config.write_text(small_config("mlp"))
    spawner = Spawner(tmp_path)
    try:
        launcher = spawner([sys.executable, str(REPO / "clients/fleet/launch.py"),
                            "--config", str(config), "--with-coordinator",
                            "--output-dir", str(tmp_path / "runs"), "--grace", "30",
                            "--timeout", "60", "--tail", "3"])
        code = launcher.finish(timeout_s=240)
        yield FleetRun(code, launcher.output, tmp_path / "runs" / "small-mlp")
    finally:
        spawner.close()


@shares_the_fleet_run
def test_serve_and_fleet_complete_a_run(fleet_run: FleetRun) -> None:
    codes = fleet_run.exit_codes()
    assert "SERVING" in fleet_run.output
    assert codes["coordinator"] == 0, fleet_run.output
    assert set(codes) == {"coordinator", "fleet-0", "fleet-1"}, fleet_run.output
    summary = json.loads((fleet_run.run_dir / "summary.json").read_text())
    assert summary["rounds"] == 2
    assert summary["finish_reason"] == "completed 2 rounds"
    assert summary["updates_accepted"] == 4
    assert (fleet_run.run_dir / "model.npy").is_file()
    assert (fleet_run.run_dir / "report.md").is_file()


@shares_the_fleet_run
def test_every_fleet_client_hears_that_the_run_finished(fleet_run: FleetRun) -> None:
    assert fleet_run.code == 0, fleet_run.output
    assert set(fleet_run.exit_codes().values()) == {0}


def test_launcher_forwards_sigint_to_its_clients(spawn: Spawner, tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(small_config("mlp"))
    with _free_port() as port:  # nothing listens there: the clients keep retrying
        launcher = spawn([sys.executable, str(REPO / "clients/fleet/launch.py"),
                          "--config", str(config), "--server", f"127.0.0.1:{port}",
                          "--grace", "10", "--timeout", "60", "--echo", "-v"])
        launcher.wait_for(re.compile("started 2 clients"), STARTUP_S)
        for name in ("fleet-0", "fleet-1"):  # past their imports, retrying the dead address
            launcher.wait_for(re.compile(rf"^\[{name}\] .*retrying", re.MULTILINE), STARTUP_S)
        launcher.popen.send_signal(signal.SIGINT)
        code = launcher.finish(timeout_s=120)
    assert code == 128 + signal.SIGINT, launcher.output
    assert "forwarding to children" in launcher.output
    assert "still running" not in launcher.output  # every client exited on the SIGINT
    assert set(FleetRun(code, launcher.output, tmp_path).exit_codes()) == {"fleet-0", "fleet-1"}


@contextlib.contextmanager
def _free_port() -> Iterator[int]:
    """A loopback port that nothing accepts on (held bound, never listening)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# -- the edge client (numpy only) ---------------------------------------------------------------

# Runs the edge client with torch made unimportable, then checks it was never loaded.
TORCH_FREE = """
import runpy, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not allowed in the edge client")

sys.meta_path.insert(0, NoTorch())
script, sys.argv = sys.argv[1], sys.argv[1:]
code = 0
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exc:
    code = exc.code
assert "torch" not in sys.modules, "torch was imported"
print("torch-free exit", code)
sys.exit(code)
"""

EDGE = REPO / "clients/edge/edge_client.py"
LAUNCH = REPO / "clients/fleet/launch.py"


def load_edge_module() -> ModuleType:
    """``clients/edge/edge_client.py`` as a module."""
    spec = importlib.util.spec_from_file_location("edge_client", EDGE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_edge_clients_finish_a_logreg_run_without_torch(spawn: Spawner, tmp_path: Path) -> None:
    from fedlink.data import load_federated

    config = tmp_path / "edge.toml"
    config.write_text(small_config("logreg"))
    share = load_federated("digits", 2, 0, "iid").clients[0]
    np.savez(tmp_path / "local.npz", x=share.x, y=share.y)
    serve, address = start_serve(spawn, config, tmp_path / "runs")
    data_args = (["--data", str(tmp_path / "local.npz"), "--index", "0"],
                 ["--index", "1", "--of", "2"])
    # --max-tasks 2 = rounds: each client leaves after its last task, not on hearing Finished.
    edges = [spawn([sys.executable, "-c", TORCH_FREE, str(EDGE), "--server", address,
                    "--name", f"edge-{i}", "--max-tasks", "2", *args])
             for i, args in enumerate(data_args)]
    for edge in edges:
        assert edge.finish(timeout_s=180) == 0, edge.output
        assert "torch-free exit 0" in edge.output
        assert "tasks 2, accepted 2, refused 0" in edge.output
    assert serve.finish(timeout_s=120) == 0, serve.output
    summary = json.loads((tmp_path / "runs/small-logreg/summary.json").read_text())
    assert summary["rounds"] == 2
    assert summary["updates_accepted"] == 4
    assert summary["final_accuracy"] > 0.5


def test_edge_trainer_matches_torch_logreg() -> None:
    """One full-batch SGD step of the numpy trainer equals ``TorchTrainer`` on ``logreg``."""
    from fedlink.client import TrainPlan
    from fedlink.client.torch_trainer import TorchTrainer
    from fedlink.data import load_federated
    from fedlink.models import build_model
    from fedlink.params import to_vector

    edge = load_edge_module()
    share = load_federated("digits", 4, 0, "iid").clients[0]
    start = to_vector(build_model("logreg", 64, 10, seed=0))
    for mu in ("0", "0.5"):
        plan = TrainPlan(local_steps=3, batch_size=len(share), learning_rate=0.5,
                         options={"prox_mu": mu})
        ours = edge.LogisticRegressionTrainer(share.x, share.y, 10).train(start, plan)
        theirs = TorchTrainer(build_model("logreg", 64, 10, seed=0), share).train(start, plan)
        np.testing.assert_allclose(ours.params, theirs.params, atol=1e-5)
        assert ours.steps_completed == theirs.steps_completed == 3


# -- TLS: the edge client and the fleet launcher against a mutual-TLS coordinator ---------------

needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None,
    reason="the openssl command line tool is needed to make certificates")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throwaway CA and its server and client certificates (``server/make_test_certs.sh``)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line tool is needed to make certificates")
    root = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(REPO / "server/make_test_certs.sh"), str(root)], check=True,
                   capture_output=True, timeout=60)
    files = {f"{stem}_{ext}": root / f"{stem}.{ext}"
             for stem in ("ca", "server", "client") for ext in ("pem", "key")}
    assert all(path.is_file() for path in files.values())
    return files


def mutual_tls_config(model: str, certs: dict[str, Path], clients: int, rounds: int) -> str:
    """``small_config`` with ``rounds`` rounds and ``[coordinator.tls]`` requiring client certs."""
    config = small_config(model, clients).replace("rounds = 2", f"rounds = {rounds}")
    return config + f"""
[coordinator.tls]
cert_file = "{certs['server_pem']}"
key_file = "{certs['server_key']}"
client_ca_file = "{certs['ca_pem']}"
"""


def tls_flags(certs: dict[str, Path]) -> list[str]:
    """``--tls-ca/--tls-cert/--tls-key`` for our client certificate."""
    return ["--tls-ca", str(certs["ca_pem"]), "--tls-cert", str(certs["client_pem"]),
            "--tls-key", str(certs["client_key"])]


@needs_openssl
def test_edge_client_finishes_a_run_over_mutual_tls(spawn: Spawner, tmp_path: Path,
                                                    certs: dict[str, Path]) -> None:
    config = tmp_path / "edge.toml"
    config.write_text(mutual_tls_config("logreg", certs, clients=1, rounds=2))
    serve, address = start_serve(spawn, config, tmp_path / "runs")
    # The certificate names localhost / 127.0.0.1: dial the loopback IP it was started on.
    edge = spawn([sys.executable, "-c", TORCH_FREE, str(EDGE), "--server", address,
                  "--name", "edge-tls", "--index", "0", "--of", "1", "--max-tasks", "2",
                  *tls_flags(certs)])
    assert edge.finish(timeout_s=180) == 0, edge.output + serve.output
    assert "torch-free exit 0" in edge.output
    assert "tasks 2, accepted 2, refused 0" in edge.output
    assert serve.finish(timeout_s=120) == 0, serve.output
    run_dir = tmp_path / "runs/small-logreg"
    assert [e["name"] for e in read_events(run_dir)
            if e["kind"] == "client_joined"] == ["edge-tls"]
    assert json.loads((run_dir / "summary.json").read_text())["updates_accepted"] == 2


@needs_openssl
def test_edge_client_reports_a_half_given_client_certificate(certs: dict[str, Path]) -> None:
    done = subprocess.run([sys.executable, str(EDGE), "--server", "127.0.0.1:1",
                           "--tls-ca", str(certs["ca_pem"]), "--tls-cert",
                           str(certs["client_pem"])],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cert_file and key_file go together" in done.stderr


@needs_openssl
def test_fleet_with_coordinator_runs_over_mutual_tls(spawn: Spawner, tmp_path: Path,
                                                     certs: dict[str, Path]) -> None:
    """The health check speaks TLS with the client certificate; the clients get the flags."""
    config = tmp_path / "fleet.toml"
    config.write_text(mutual_tls_config("logreg", certs, clients=2, rounds=1))
    launcher = spawn([sys.executable, str(LAUNCH), "--config", str(config),
                      "--with-coordinator", "--output-dir", str(tmp_path / "runs"),
                      "--grace", "3", "--timeout", "50", "--startup-timeout", "30",
                      "--tail", "3", *tls_flags(certs)])
    code = launcher.finish(timeout_s=240)
    run = FleetRun(code, launcher.output, tmp_path / "runs/small-logreg")
    assert code == 0, launcher.output
    assert re.search(r"coordinator SERVING on 127\.0\.0\.1:\d+ \(TLS\)", launcher.output)
    assert run.exit_codes() == {"coordinator": 0, "fleet-0": 0, "fleet-1": 0}, launcher.output
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["rounds"] == 1
    assert summary["updates_accepted"] == 2
    joined = {e["name"] for e in read_events(run.run_dir) if e["kind"] == "client_joined"}
    assert joined == {"fleet-0", "fleet-1"}


@needs_openssl
@pytest.mark.parametrize("flags, message", [
    ([], "pass --tls-ca"),
    (["--tls-ca", "CA"], "pass --tls-cert and --tls-key"),
    (["--tls-ca", "CA", "--tls-cert", "CERT"], "--tls-cert and --tls-key go together"),
    (["--tls-ca", "missing.pem"], "--tls-ca file not found"),
], ids=["no-ca", "no-client-cert", "cert-without-key", "missing-file"])
def test_launcher_refuses_tls_flags_the_config_cannot_use(
        tmp_path: Path, certs: dict[str, Path], flags: list[str], message: str) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(mutual_tls_config("logreg", certs, clients=1, rounds=1))
    files = {"CA": str(certs["ca_pem"]), "CERT": str(certs["client_pem"]),
             "missing.pem": str(tmp_path / "missing.pem")}
    done = subprocess.run([sys.executable, str(LAUNCH), "--config", str(config),
                           "--with-coordinator", *(files.get(f, f) for f in flags)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert "coordinator" not in done.stdout  # refused before anything started


# -- signals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_cleanly_on_a_signal(spawn: Spawner, tmp_path: Path, signum: int) -> None:
    config = tmp_path / "idle.toml"
    config.write_text(small_config("mlp"))
    serve, _ = start_serve(spawn, config, tmp_path / "runs")
    serve.popen.send_signal(signum)
    # it exits by itself, cleanly (how fast is the host's business: no wall-clock bound here)
    assert serve.finish(timeout_s=180) == 0, serve.output
    finished = [e for e in read_events(tmp_path / "runs/small-mlp")
                if e["kind"] == "run_finished"]
    assert [e["reason"] for e in finished] == ["stopped by signal"]
    summary = json.loads((tmp_path / "runs/small-mlp/summary.json").read_text())
    assert summary["rounds"] == 0


# -- quickstart, version, configs ---------------------------------------------------------------


def test_api_quickstart_runs(spawn: Spawner, tmp_path: Path) -> None:
    script = spawn([sys.executable, str(REPO / "examples/api_quickstart.py"),
                    "--output-dir", str(tmp_path / "runs")], cwd=tmp_path)
    assert script.finish(timeout_s=180) == 0, script.output
    accuracy = float(re.search(r"final accuracy: ([\d.]+)", script.output)[1])
    assert accuracy > 0.5
    assert (tmp_path / "runs/api-quickstart/report.md").is_file()


@pytest.mark.parametrize("argv", [[str(Path(sys.executable).parent / "fedlink")], FEDLINK],
                         ids=["console-script", "python-m"])
def test_version(argv: list[str]) -> None:
    if not Path(argv[0]).exists():
        pytest.skip("the fedlink console script is not installed next to this python")
    done = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=30,
                          check=True)
    assert done.stdout.strip() == f"fedlink {__version__}"


def test_example_server_config_loads_and_lists_every_option() -> None:
    path = REPO / "server/coordinator.example.toml"
    config = ExperimentConfig.from_toml(path)
    assert (config.data.dataset, config.model.name) == ("digits", "mlp")
    assert config.data.clients == config.coordinator.flush.goal == 4
    text = path.read_text()
    tables = {"flush": FlushRule, "training": TrainingConfig, "limits": LimitsConfig,
              "tls": TLSConfig, "auth": AuthConfig, "metrics": MetricsConfig,
              "netcheck": NetcheckConfig, "evaluation": EvaluationConfig,
              "robust": RobustConfig, "secure": SecureConfig}
    for table, section in tables.items():
        assert f"[coordinator.{table}]" in text
        for field in dataclasses.fields(section):  # a None default cannot be written: commented
            shown = "(# )?" if field.default is None else ""
            assert re.search(rf"^{shown}{field.name} = ", text, flags=re.MULTILINE), field.name
    for field in dataclasses.fields(CoordinatorConfig):
        if field.name not in tables:  # run_name and seed default from [run]: shown commented
            assert re.search(rf"^(# )?{field.name} = ", text, flags=re.MULTILINE), field.name


def test_edge_coordinator_config_serves_logreg() -> None:
    config = ExperimentConfig.from_toml(REPO / "clients/edge/coordinator.toml")
    assert config.model.name == "logreg"
    assert config.data.dataset == "digits"
