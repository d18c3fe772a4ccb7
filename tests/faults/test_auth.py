"""Per-client tokens: the token format, and a real coordinator on loopback refusing bad callers.

Every refusal is checked on the wire through the SDK's ``Transport`` (which sends the token as
``authorization`` metadata), so what a third-party client sees is what is tested.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jwt
import numpy as np
import pytest
from conftest import (
    CoordinatorFactory,
    TowardTrainer,
    gather_bounded,
    run_async,
    target_of,
)
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from grpc_health.v1 import health_pb2, health_pb2_grpc
from jwt.algorithms import ECAlgorithm

from fedlink.cli import main as fedlink_main
from fedlink.client import ClientOptions, ClientSession, RetryPolicy, Transport
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.coordinator.auth import issue_legacy_token, issue_token, load_secret, verify_token
from fedlink.coordinator.config import AuthConfig
from fedlink.errors import ConfigError, PermissionDenied, RemoteError, Unauthenticated
from fedlink.messages import (
    CommitRequest,
    DownloadRequest,
    GetTaskRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveRequest,
    Task,
    TensorHeader,
    UploadChunk,
    UploadStatusRequest,
)

pytestmark = pytest.mark.timeout(60)

SECRET = b"0123456789abcdef-test-secret-not-for-production"
OTHER_SECRET = b"another-secret-of-sufficient-length!"
DIM = 16
X0 = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
NOW = 1_800_000_000.0
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)
LIMITS = LimitsConfig(chunk_bytes=64, long_poll_s=0.5, retry_after_s=0.05)


def _secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "token.secret"
    path.write_bytes(SECRET + b"\n")
    return path


def auth_config(tmp_path: Path, goal: int = 2, rounds: int = 2) -> CoordinatorConfig:
    """A coordinator config with per-client tokens signed by ``SECRET``."""
    return CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=goal, deadline_s=None),
                             limits=LIMITS,
                             auth=AuthConfig(secret_file=str(_secret_file(tmp_path))))


def token(name: str, ttl_s: float = 600.0) -> str:
    return issue_token(SECRET, name, ttl_s)


# -- the token format ---------------------------------------------------------------------------


def test_token_round_trip_names_the_client() -> None:
    issued = issue_token(SECRET, "alice", 60, now=NOW)
    assert verify_token(SECRET, issued, now=NOW + 59) == "alice"
    payload = json.loads(base64.urlsafe_b64decode(issued.split(".")[1] + "=="))
    assert payload == {"sub": "alice", "iat": int(NOW), "exp": int(NOW) + 60}


def test_expired_token_is_refused() -> None:
    issued = issue_token(SECRET, "alice", 60, now=NOW)
    with pytest.raises(Unauthenticated, match="expired"):
        verify_token(SECRET, issued, now=NOW + 60)


def test_forged_and_tampered_tokens_are_refused() -> None:
    forged = issue_token(OTHER_SECRET, "alice", 60, now=NOW)
    with pytest.raises(Unauthenticated, match="signature"):
        verify_token(SECRET, forged, now=NOW)
    prefix, payload, signature = issue_token(SECRET, "alice", 60, now=NOW).split(".")
    claims = {"sub": "mallory", "iat": int(NOW), "exp": int(NOW) + 60}
    swapped = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(Unauthenticated, match="signature"):
        verify_token(SECRET, f"{prefix}.{swapped}.{signature}", now=NOW)
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    with pytest.raises(Unauthenticated):
        verify_token(SECRET, f"{prefix}.{payload}.{flipped}", now=NOW)


@pytest.mark.parametrize("bad", ["", "garbage", "fl1.a", "fl1.a.b.c", "fl2.e30.AAAA",
                                 "fl1.!!!.@@@", "x" * 5000])
def test_malformed_tokens_are_refused(bad: str) -> None:
    with pytest.raises(Unauthenticated):
        verify_token(SECRET, bad, now=NOW)


def test_secrets_must_be_long_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="at least"):
        issue_token(b"short", "alice", 60)
    monkeypatch.setenv("FEDLINK_TEST_SECRET", SECRET.decode())
    assert load_secret(secret_env="FEDLINK_TEST_SECRET") == SECRET
    assert load_secret(secret_file=str(_secret_file(tmp_path))) == SECRET
    with pytest.raises(ConfigError, match="FEDLINK_TEST_UNSET"):
        load_secret(secret_env="FEDLINK_TEST_UNSET")


def test_config_refuses_join_token_with_per_client_tokens() -> None:
    with pytest.raises(ConfigError, match="join_token"):
        CoordinatorConfig(join_token="shared", auth=AuthConfig(secret_env="X"))
    config = CoordinatorConfig.from_dict({"auth": {"secret_env": "X"}})
    assert config.auth.enabled and "secret" not in json.dumps(config.to_dict()).replace(
        "secret_file", "").replace("secret_env", "")


def test_cli_issues_a_token_the_coordinator_accepts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fedlink_main(["token", "issue", "--client", "edge-7", "--ttl-s", "120",
                         "--secret-file", str(_secret_file(tmp_path))]) == 0
    printed = capsys.readouterr().out.strip()
    assert verify_token(SECRET, printed) == "edge-7"
    assert SECRET.decode() not in printed


# -- on the wire ----------------------------------------------------------------------------------


async def _refusal(call: Awaitable[Any]) -> RemoteError:
    try:
        await call
    except RemoteError as exc:
        return exc
    raise AssertionError("the call was not refused")


async def _join(server: CoordinatorServer, credential: str, name: str = "") -> str:
    async with Transport(target_of(server), token=credential) as transport:
        reply = await transport.join(JoinRequest(client_name=name, num_examples=5))
    return reply.client_id


@pytest.mark.parametrize("credential", [
    pytest.param("", id="no-token"),
    pytest.param(issue_token(SECRET, "alice", 60, now=time.time() - 3600), id="expired"),
    pytest.param(issue_token(OTHER_SECRET, "alice", 600), id="forged-signature"),
    pytest.param("not-a-token", id="malformed"),
    pytest.param(jwt.encode({"sub": "alice", "exp": int(time.time()) + 600},
                            None,  # type: ignore[arg-type]  # unsigned: what "none" takes
                            algorithm="none"), id="alg-none"),
    pytest.param(issue_token(SECRET, "alice", 600, run="another-run"), id="another-run"),
    pytest.param(issue_legacy_token(OTHER_SECRET, "alice", 600), id="forged-fl1"),
])
def test_bad_credentials_are_unauthenticated_on_every_call(
        coordinator: CoordinatorFactory, tmp_path: Path, credential: str) -> None:
    async def scenario() -> None:
        async with coordinator(auth_config(tmp_path), X0) as server:
            alice = await _join(server, token("alice"))
            async with Transport(target_of(server), token=credential) as t:
                header = TensorHeader("fp32", (DIM,), "float32", 4 * DIM, "")
                calls: list[Callable[[], Awaitable[Any]]] = [
                    lambda: t.join(JoinRequest(client_name="alice")),
                    lambda: t.get_task(GetTaskRequest(alice)),
                    lambda: t.heartbeat(HeartbeatRequest(alice)),
                    lambda: t.upload_status(UploadStatusRequest(alice, "u1")),
                    lambda: t.upload([UploadChunk(alice, "u1", 0, b"\0" * 8)]),
                    lambda: t.commit(CommitRequest(alice, "u1", "t1", 0, 5, 1, 1, header)),
                    lambda: t.leave(LeaveRequest(alice)),
                    lambda: _drain(t.download(DownloadRequest(alice, "t1"))),
                ]
                for call in calls:
                    err = await _refusal(call())
                    assert isinstance(err, Unauthenticated), err
                    assert "Traceback" not in err.detail
            assert server.service.registry.ids() == {alice}
            assert server.events.of_kind("client_joined")[0]["name"] == "alice"

    run_async(scenario())


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


def test_another_clients_token_is_permission_denied(coordinator: CoordinatorFactory,
                                                     tmp_path: Path) -> None:
    async def scenario() -> None:
        async with coordinator(auth_config(tmp_path), X0) as server:
            async with Transport(target_of(server), token=token("alice")) as alice_t:
                alice = (await alice_t.join(JoinRequest(client_name="spoofed"))).client_id
                task = await alice_t.get_task(GetTaskRequest(alice))
                assert isinstance(task, Task)
                await alice_t.upload([UploadChunk(alice, "up-a", 0, b"\0" * 8)])
            async with Transport(target_of(server), token=token("bob")) as bob_t:
                bob = (await bob_t.join(JoinRequest(client_name="alice"))).client_id
                calls: list[Callable[[], Awaitable[Any]]] = [
                    lambda: bob_t.get_task(GetTaskRequest(alice)),
                    lambda: bob_t.heartbeat(HeartbeatRequest(alice, task.task_id)),
                    lambda: bob_t.upload_status(UploadStatusRequest(alice, "up-a")),
                    lambda: bob_t.upload([UploadChunk(alice, "up-a", 8, b"\1" * 8)]),
                    lambda: bob_t.commit(CommitRequest(alice, "up-a", task.task_id,
                                                       task.model_version, 5, 1, 1,
                                                       task.model)),
                    lambda: _drain(bob_t.download(DownloadRequest(alice, task.task_id))),
                    lambda: bob_t.leave(LeaveRequest(alice)),
                ]
                for call in calls:
                    err = await _refusal(call())
                    assert isinstance(err, PermissionDenied), err
                # bob still acts freely on his own id
                assert (await bob_t.heartbeat(HeartbeatRequest(bob))).model_version == 0
            names = {e["client_id"]: e["name"] for e in server.events.of_kind("client_joined")}
            assert names == {alice: "alice", bob: "bob"}  # the token's name, not the request's
            assert server.service.uploads.status(alice, "up-a") == 8  # bob's bytes never landed
            assert server.service.registry.ids() == {alice, bob}

    run_async(scenario())


def test_health_stays_open_without_a_token(coordinator: CoordinatorFactory,
                                           tmp_path: Path) -> None:
    import grpc

    async def scenario() -> None:
        async with coordinator(auth_config(tmp_path), X0) as server:
            async with grpc.aio.insecure_channel(target_of(server)) as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

    run_async(scenario())


def test_sessions_with_their_own_tokens_complete_a_run(coordinator: CoordinatorFactory,
                                                       tmp_path: Path) -> None:
    rounds = 2
    trainers = [TowardTrainer(np.full(DIM, float(i), np.float32)) for i in (1, 2)]

    async def scenario() -> CoordinatorServer:
        async with coordinator(auth_config(tmp_path, goal=2, rounds=rounds), X0) as server:
            sessions = [
                ClientSession(target_of(server), trainer,
                              ClientOptions(name=f"dev{i}", token=token(f"dev{i}"),
                                            retry=FAST_RETRY))
                for i, trainer in enumerate(trainers)]
            await gather_bounded(*(s.run() for s in sessions))
            await asyncio.wait_for(server.wait_finished(), 10)
            assert [s.stats.accepted for s in sessions] == [rounds, rounds]
        return server

    server = run_async(scenario())
    assert server.service.engine.version == rounds
    assert not server.events.of_kind("update_refused")


def test_identity_provider_es256_tokens_and_legacy_fl1_tokens_complete_a_run(
        coordinator: CoordinatorFactory, tmp_path: Path) -> None:
    """An operator's provider signs ES256 device tokens (the coordinator holds its JWKS); an old
    device still has an ``fl1`` token under the secret, accepted with a deprecation warning."""
    signing = ec.generate_private_key(ec.SECP256R1())
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [
        ECAlgorithm.to_jwk(signing.public_key(), as_dict=True) | {"kid": "idp-1"}]}))
    pem = signing.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    config = CoordinatorConfig(
        rounds=1, run_name="fleet-a", flush=FlushRule(goal=2, deadline_s=None), limits=LIMITS,
        auth=AuthConfig(algorithm="ES256", jwks_file=str(jwks),
                        secret_file=str(_secret_file(tmp_path))))
    tokens = {"new": issue_token(pem, "new", 600, run="fleet-a", algorithm="ES256",
                                 key_id="idp-1"),
              "old": issue_legacy_token(SECRET, "old", 600)}

    async def scenario() -> list[int]:
        async with coordinator(config, X0) as server:
            sessions = [ClientSession(target_of(server), TowardTrainer(np.ones(DIM, np.float32)),
                                      ClientOptions(name=name, token=credential,
                                                    retry=FAST_RETRY))
                        for name, credential in tokens.items()]
            await gather_bounded(*(s.run() for s in sessions))
            await asyncio.wait_for(server.wait_finished(), 10)
            hs256 = await _refusal(_join(server, token("new")))  # not what this run takes
            assert isinstance(hs256, Unauthenticated) and "HS256" in hs256.detail
            return [s.stats.accepted for s in sessions]

    with pytest.warns(DeprecationWarning, match="fl1"):
        assert run_async(scenario()) == [1, 1]


def test_a_missing_secret_stops_the_coordinator_from_starting(
        coordinator: CoordinatorFactory, tmp_path: Path) -> None:
    config = CoordinatorConfig(auth=AuthConfig(secret_file=str(tmp_path / "missing")))

    async def scenario() -> None:
        with pytest.raises(ConfigError, match="missing"):
            await coordinator(config, X0).start()

    run_async(scenario())


def test_a_session_with_an_expired_token_stops_instead_of_retrying(
        coordinator: CoordinatorFactory, tmp_path: Path) -> None:
    expired = issue_token(SECRET, "dev0", 60, now=time.time() - 3600)

    async def scenario() -> None:
        async with coordinator(auth_config(tmp_path), X0) as server:
            session = ClientSession(target_of(server), TowardTrainer(X0),
                                    ClientOptions(name="dev0", token=expired, retry=FAST_RETRY))
            with pytest.raises(Unauthenticated, match="expired"):
                await asyncio.wait_for(session.run(), 10)
            assert session.stats.retries == 0
            assert len(server.service.registry) == 0

    run_async(scenario())
