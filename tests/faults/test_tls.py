"""TLS and mutual TLS on a real coordinator on loopback: right certificates in, wrong ones out.

Certificates come from ``server/make_test_certs.sh`` (run twice: our CA, and another CA whose
certificates must be refused), so the script itself is tested too. Skipped without ``openssl``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, gather_bounded, run_async, target_of

from fedlink.client import ClientOptions, ClientSession, RetryPolicy, Timeouts, TLSOptions
from fedlink.client.transport import Transport
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.coordinator.auth import issue_token
from fedlink.coordinator.config import AuthConfig, TLSConfig
from fedlink.errors import ConfigError, RemoteError
from fedlink.messages import JoinRequest

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("openssl") is None,
                       reason="the openssl command line tool is needed to make certificates"),
]

SCRIPT = Path(__file__).resolve().parents[2] / "server" / "make_test_certs.sh"
DIM = 16
X0 = np.zeros(DIM, np.float32)
SHORT = Timeouts(unary_s=5.0, transfer_s=10.0, long_poll_s=2.0)
LIMITS = LimitsConfig(chunk_bytes=64, long_poll_s=0.5, retry_after_s=0.05)
SECRET = b"tls-test-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Our CA and certificates, plus ``other_*``: a second CA and its certificates."""
    root = tmp_path_factory.mktemp("certs")
    for name in ("ours", "other"):
        subprocess.run(["bash", str(SCRIPT), str(root / name)], check=True,
                       capture_output=True, timeout=60)
    files = {f"{stem}_{ext}": root / "ours" / f"{stem}.{ext}"
             for stem in ("ca", "server", "client") for ext in ("pem", "key")}
    files.update({f"other_{k}": root / "other" / v.name for k, v in files.items()})
    assert all(path.is_file() for path in files.values())
    return files


def tls_config(certs: dict[str, Path], mutual: bool, **kwargs: object) -> CoordinatorConfig:
    tls = TLSConfig(cert_file=str(certs["server_pem"]), key_file=str(certs["server_key"]),
                    client_ca_file=str(certs["ca_pem"]) if mutual else "")
    return CoordinatorConfig(flush=FlushRule(goal=1, deadline_s=None), limits=LIMITS, tls=tls,
                             **kwargs)  # type: ignore[arg-type]


async def _join(server: CoordinatorServer, tls: TLSOptions | None) -> str:
    async with Transport(target_of(server), SHORT, tls=tls) as transport:
        reply = await transport.join(JoinRequest(client_name="probe", num_examples=1))
    return reply.client_id


async def _refused(server: CoordinatorServer, tls: TLSOptions | None) -> RemoteError:
    try:
        await _join(server, tls)
    except RemoteError as exc:
        return exc
    raise AssertionError(f"the coordinator accepted a client with {tls}")


def test_tls_connects_with_our_ca_and_refuses_others(coordinator: CoordinatorFactory,
                                                     certs: dict[str, Path]) -> None:
    async def scenario() -> None:
        async with coordinator(tls_config(certs, mutual=False), X0) as server:
            assert await _join(server, TLSOptions(ca_file=str(certs["ca_pem"])))
            wrong_ca = await _refused(server, TLSOptions(ca_file=str(certs["other_ca_pem"])))
            plaintext = await _refused(server, None)
            assert wrong_ca.code == plaintext.code == "UNAVAILABLE"
            assert len(server.service.registry) == 1

    run_async(scenario())


def test_mutual_tls_needs_a_client_certificate_from_our_ca(coordinator: CoordinatorFactory,
                                                          certs: dict[str, Path]) -> None:
    ours = TLSOptions(ca_file=str(certs["ca_pem"]), cert_file=str(certs["client_pem"]),
                      key_file=str(certs["client_key"]))
    foreign = TLSOptions(ca_file=str(certs["ca_pem"]), cert_file=str(certs["other_client_pem"]),
                         key_file=str(certs["other_client_key"]))

    async def scenario() -> None:
        async with coordinator(tls_config(certs, mutual=True), X0) as server:
            assert await _join(server, ours)
            no_cert = await _refused(server, TLSOptions(ca_file=str(certs["ca_pem"])))
            other_ca = await _refused(server, foreign)
            assert no_cert.code == other_ca.code == "UNAVAILABLE"
            assert len(server.service.registry) == 1

    run_async(scenario())


def test_session_completes_a_run_with_tokens_over_mutual_tls(
        coordinator: CoordinatorFactory, certs: dict[str, Path], tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    config = tls_config(certs, mutual=True, rounds=2,
                        auth=AuthConfig(secret_file=str(secret)))
    tls = TLSOptions(ca_file=str(certs["ca_pem"]), cert_file=str(certs["client_pem"]),
                     key_file=str(certs["client_key"]))
    trainer = TowardTrainer(np.ones(DIM, np.float32))

    async def scenario() -> CoordinatorServer:
        async with coordinator(config, X0) as server:
            session = ClientSession(
                target_of(server), trainer,
                ClientOptions(name="edge-1", token=issue_token(SECRET, "edge-1", 600),
                              tls=tls, retry=RetryPolicy(initial_backoff_s=0.01,
                                                         max_backoff_s=0.05, max_attempts=5)))
            await gather_bounded(session.run())
            await asyncio.wait_for(server.wait_finished(), 10)
            assert session.stats.accepted == 2
        return server

    server = run_async(scenario())
    assert server.service.engine.version == 2
    assert [e["name"] for e in server.events.of_kind("client_joined")] == ["edge-1"]


def test_tls_config_is_checked_at_the_edge(coordinator: CoordinatorFactory,
                                           tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cert_file and key_file"):
        TLSConfig(cert_file="server.pem")
    with pytest.raises(ConfigError, match="mutual TLS"):
        TLSConfig(client_ca_file="ca.pem")
    with pytest.raises(ConfigError, match="cert_file and key_file"):
        TLSOptions(cert_file="client.pem")
    config = CoordinatorConfig.from_dict({"tls": {"cert_file": str(tmp_path / "none.pem"),
                                                  "key_file": str(tmp_path / "none.key")}})
    assert config.tls.enabled

    async def start() -> None:
        with pytest.raises(ConfigError, match=r"tls\.key_file"):
            await coordinator(config, X0).start()

    run_async(start())



SERVE_CONFIG = """
[run]
name = "secure"
[data]
dataset = "digits"
clients = 1
[model]
name = "logreg"
[coordinator]
rounds = 1
[coordinator.flush]
goal = 1
deadline_s = 30.0
[coordinator.limits]
long_poll_s = 1.0
retry_after_s = 0.2
[coordinator.tls]
cert_file = "{server_pem}"
key_file = "{server_key}"
client_ca_file = "{ca_pem}"
[coordinator.auth]
secret_env = "FEDLINK_TEST_TOKEN_SECRET"
"""


def test_fedlink_serve_and_client_run_with_mutual_tls_and_a_token(
        certs: dict[str, Path], tmp_path: Path) -> None:
    """The command line end to end: ``token issue``, ``serve`` and ``client`` with TLS flags."""
    config = tmp_path / "secure.toml"
    config.write_text(SERVE_CONFIG.format(**{k: certs[k] for k in
                                             ("server_pem", "server_key", "ca_pem")}))
    secret = "command-line-secret-0123456789abcdef"
    env = {**os.environ, "FEDLINK_TEST_TOKEN_SECRET": secret}
    fedlink = [sys.executable, "-m", "fedlink"]
    token = subprocess.run([*fedlink, "token", "issue", "--client", "edge-9", "--secret-env",
                            "FEDLINK_TEST_TOKEN_SECRET"], env=env, capture_output=True,
                           text=True, check=True, timeout=60).stdout.strip()
    serve = subprocess.Popen([*fedlink, "serve", "--config", str(config), "--port", "0",
                              "--output-dir", str(tmp_path / "runs")], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        port = re.search(r"listening on [\d.]+:(\d+)", line)
        assert port, line
        client = subprocess.run(
            [*fedlink, "client", "--server", f"localhost:{port[1]}", "--config", str(config),
             "--token", token, "--tls-ca", str(certs["ca_pem"]),
             "--tls-cert", str(certs["client_pem"]), "--tls-key", str(certs["client_key"])],
            env=env, capture_output=True, text=True, timeout=300)  # bounds a wait: on a
        # loaded machine starting python and torch alone took most of a minute
        assert client.returncode == 0, client.stdout + client.stderr
        assert "accepted 1" in client.stdout
        assert serve.wait(timeout=120) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(timeout=5)
    run_dir = tmp_path / "runs" / "secure"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["name"] for e in events if e["kind"] == "client_joined"] == ["edge-9"]
    for written in ("events.jsonl", "summary.json"):
        assert secret not in (run_dir / written).read_text()
