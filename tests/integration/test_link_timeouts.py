"""Timeouts as the kernel and gRPC see them on a live connection, and retry settings at the
edge: ``TCP_USER_TIMEOUT`` of the client's socket is the long ``tcp_user_timeout_s``, not the
ping timeout; ``[client.retry]`` loads from an experiment file; a client that gives up says so.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import CoordinatorFactory, run_async, target_of

from fedlink.client import RetryPolicy, SessionStats
from fedlink.client.liveness import LivenessConfig
from fedlink.client.retry import Caller
from fedlink.client.transport import Transport
from fedlink.coordinator import CoordinatorConfig
from fedlink.errors import ConfigError, Unavailable
from fedlink.messages import JoinRequest
from fedlink.sim import ExperimentConfig

TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)


def user_timeouts_to(port: int) -> list[int]:
    """``TCP_USER_TIMEOUT`` (ms) of this process's sockets connected to ``port``."""
    found = []
    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.raddr and conn.raddr.port == port and conn.fd >= 0:
            with socket.socket(fileno=os.dup(conn.fd)) as sock:
                found.append(sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT))
    return found


def test_the_client_socket_user_timeout_is_long_and_apart_from_the_ping_timeout(
        coordinator: CoordinatorFactory) -> None:
    liveness = LivenessConfig(min_ping_timeout_s=5.0, tcp_user_timeout_s=240.0)

    async def main() -> list[int]:
        async with coordinator(CoordinatorConfig(), np.zeros(4, np.float32)) as server, \
                Transport(target_of(server), liveness=liveness) as transport:
            await transport.join(JoinRequest("probe"))
            assert transport.ping_timeout_s == 5.0
            return user_timeouts_to(server.port)

    timeouts = run_async(main())
    assert timeouts and set(timeouts) == {240_000}


def test_client_retry_and_liveness_tables_load_from_the_experiment_file(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text("[client.retry]\nkeep_trying = true\nmax_backoff_s = 30.0\n"
                    "[client.liveness]\nmax_ping_timeout_s = 90.0\n")
    client = ExperimentConfig.from_toml(path).client
    assert client.retry == RetryPolicy(max_backoff_s=30.0, keep_trying=True)
    assert client.liveness.max_ping_timeout_s == 90.0
    path.write_text("[client.retry]\nattempts = 3\n")
    with pytest.raises(ConfigError, match=r"client\.retry.*unknown keys"):
        ExperimentConfig.from_toml(path)


def test_a_client_that_gives_up_says_what_it_tried_for_how_long_and_the_last_error(
        caplog: pytest.LogCaptureFixture) -> None:
    attempts = []

    async def refuse() -> None:
        attempts.append(1)
        raise Unavailable("failed to connect to all addresses")

    async def no_sleep(_: float) -> None:
        return None

    caller = Caller(RetryPolicy(max_attempts=4, budget_s=60.0), SessionStats(), no_sleep)
    with caplog.at_level(logging.WARNING, logger="fedlink.client"), \
            pytest.raises(Unavailable):
        run_async(caller(refuse, "GetTask"))
    (line,) = [r.getMessage() for r in caplog.records]
    assert len(attempts) == 4
    assert line.startswith("giving up on GetTask after 4 attempts over ")
    assert "at most 4 attempts within 60 s" in line
    assert line.endswith("last error: UNAVAILABLE: failed to connect to all addresses")


def test_keep_trying_outlasts_the_attempt_limit() -> None:
    calls = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 30:
            raise Unavailable("down")
        return "up"

    async def no_sleep(_: float) -> None:
        return None

    stats = SessionStats()
    policy = RetryPolicy(max_attempts=2, budget_s=1.0, keep_trying=True)
    assert run_async(Caller(policy, stats, no_sleep)(flaky, "Join")) == "up"
    assert stats.retries == 29
