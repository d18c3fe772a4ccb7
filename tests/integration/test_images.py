"""The container images' commands, run outside a container (no engine needed): the server
image's ENTRYPOINT + CMD serves a run, its HEALTHCHECK says SERVING, and the edge image's
ENTRYPOINT + CMD (four clients) trains it to the end; the compose file's commands parse.

Paths inside the images are mapped onto the repository and the test's folder, ports onto free
ones, and every address onto loopback. Every process is killed when the test ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from fedlink.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
SERVER_IMAGE = REPO / "server/Containerfile"
EDGE_IMAGE = REPO / "clients/edge/Containerfile"
LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")
METRICS = re.compile(r"metrics on (http://\S+/metrics)")

pytestmark = pytest.mark.timeout(480)


def instruction(containerfile: Path, name: str) -> str:
    """The last ``name`` instruction's argument, line continuations joined."""
    text = re.sub(r"\\\n\s*", " ", containerfile.read_text())
    found = [line.split(None, 1)[1] for line in text.splitlines()
             if line.split(None, 1)[:1] == [name]]
    assert found, f"{containerfile} has no {name}"
    return found[-1].strip()


def exec_form(argument: str) -> list[str]:
    """A JSON exec-form argument (``["fedlink", "serve"]``) as a list."""
    value = json.loads(argument)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def replaced(argv: Sequence[str], mapping: dict[str, str]) -> list[str]:
    """``argv`` with each value found in ``mapping`` replaced (flags' values by position)."""
    out = list(argv)
    for i, arg in enumerate(out):
        for old, new in mapping.items():
            if arg == old or arg.startswith(old + "/"):
                out[i] = new + arg[len(old):]
    return out


def flag(argv: list[str], name: str, value: str) -> list[str]:
    """``argv`` with the value of ``--name`` set to ``value``."""
    index = argv.index(name)
    return [*argv[:index + 1], value, *argv[index + 2:]]


class Procs:
    """Child processes with their output in files; all killed (with children) at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.running: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", MPLCONFIGDIR=str(folder / "mpl"))

    def start(self, argv: Sequence[str], cwd: Path) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.folder / f"proc-{len(self.running)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(list(argv), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env)
        self.running.append((popen, log))
        return popen, log

    def close(self) -> None:
        for popen, _ in self.running:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(popen.pid).children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
            if popen.poll() is None:
                popen.kill()
            popen.wait(timeout=10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    running = Procs(tmp_path)
    try:
        yield running
    finally:
        running.close()


def wait_for(popen: subprocess.Popen[bytes], log: Path, pattern: re.Pattern[str],
             timeout_s: float = 180.0) -> re.Match[str]:
    """The first match of ``pattern`` in the process's output (fails on exit or timeout)."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        match = pattern.search(log.read_text(errors="replace"))
        if match:
            return match
        if popen.poll() is not None:
            break
        time.sleep(0.05)
    pytest.fail(f"no {pattern.pattern!r} from {popen.args}:\n{log.read_text()}")


def test_images_are_non_root_with_a_state_volume_and_a_health_check() -> None:
    for image in (SERVER_IMAGE, EDGE_IMAGE):
        user = instruction(image, "USER")
        assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), f"{image}: USER {user} is not non-root"
        assert exec_form(instruction(image, "VOLUME"))
    health = instruction(SERVER_IMAGE, "HEALTHCHECK")
    assert exec_form(health.split("CMD", 1)[1])[:2] == ["fedlink", "health"]


def test_image_entrypoints_serve_and_train_a_run(procs: Procs, tmp_path: Path) -> None:
    # the server image as the compose file runs it: the edge clients' logreg config mounted
    server = exec_form(instruction(SERVER_IMAGE, "ENTRYPOINT")) + \
        exec_form(instruction(SERVER_IMAGE, "CMD"))
    server = replaced(server, {"/etc/fedlink/coordinator.toml":
                               str(REPO / "clients/edge/coordinator.toml"),
                               "/var/lib/fedlink": str(tmp_path / "state"),
                               "0.0.0.0": "127.0.0.1"})
    server = flag(flag(server, "--port", "0"), "--metrics-port", "0")
    assert server[:2] == ["fedlink", "serve"]
    coordinator, log = procs.start([sys.executable, "-m", "fedlink", *server[1:]], tmp_path)
    host, port = wait_for(coordinator, log, LISTENING).groups()
    metrics_url = wait_for(coordinator, log, METRICS)[1]
    address = f"{host}:{port}"

    health = exec_form(instruction(SERVER_IMAGE, "HEALTHCHECK").split("CMD", 1)[1])
    health = replaced(health, {"127.0.0.1:50051": address})
    checked = subprocess.run([sys.executable, "-m", "fedlink", *health[1:]], cwd=tmp_path,
                             capture_output=True, text=True, timeout=180, env=procs.env)
    assert (checked.returncode, checked.stdout.strip()) == (0, "SERVING"), checked.stderr

    edge = exec_form(instruction(EDGE_IMAGE, "ENTRYPOINT")) + \
        exec_form(instruction(EDGE_IMAGE, "CMD"))
    edge = replaced(edge, {"/opt/fedlink/edge_client.py": str(REPO / "clients/edge/edge_client.py"),
                           "coordinator:50051": address})
    assert edge[0] == "python"
    (tmp_path / "edge").mkdir()
    clients = [procs.start([sys.executable, *flag(edge, "--index", str(i))[1:]],
                           tmp_path / "edge") for i in range(4)]
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:  # live while it runs
        assert b"fedlink_clients" in reply.read()
    for popen, client_log in clients:
        assert popen.wait(timeout=300) == 0, client_log.read_text()
    assert coordinator.wait(timeout=180) == 0, log.read_text()
    summary = json.loads((tmp_path / "state/runs/digits-logreg-edge/summary.json").read_text())
    assert summary["rounds"] == 10 and summary["final_accuracy"] > 0.8
    assert (tmp_path / "state/state").is_dir()  # the durable state went to the volume

    # and the health check fails once the coordinator is gone
    gone = subprocess.run([sys.executable, "-m", "fedlink", *health[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, env=procs.env)
    assert (gone.returncode, gone.stdout.strip()) == (1, "UNREACHABLE")


def test_compose_commands_are_valid_fedlink_and_edge_commands() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the compose file")
    compose = yaml.safe_load((REPO / "server/compose.yaml").read_text())
    services = compose["services"]
    parser = build_parser()
    spec = importlib.util.spec_from_file_location("edge_client",
                                                  REPO / "clients/edge/edge_client.py")
    assert spec is not None and spec.loader is not None
    edge_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(edge_module)
    links = {name for name in services if name.startswith("link-")}
    edges = {name for name in services if name.startswith("edge-")}
    assert len(links) == len(edges) >= 2  # one injector proxy per client
    for name, service in services.items():
        if name == "coordinator":
            parser.parse_args(["serve", *service["command"]])
            assert any(v.startswith("../clients/edge/coordinator.toml:")
                       for v in service["volumes"])
        elif name in links:
            parser.parse_args([*service["entrypoint"][1:], *service["command"]])
        else:
            args = edge_module.build_parser().parse_args(service["command"])
            assert args.server.split(":")[0] in links  # each client dials its own link
    served = {s["command"][s["command"].index("--server") + 1].split(":")[0]
              for n, s in services.items() if n in edges}
    assert served == links
