"""Every client learns that the run is over, as real processes: ``fedlink serve`` and
``fedlink client``, each client behind its own TCP proxy where the test needs one.

- Two clients are in a 15 s blackout when the last flush happens: the coordinator keeps
  answering "finished" for its grace period, and every client process exits 0 saying so.
- SIGTERM to the coordinator stops it in seconds, its summary and model written, every
  client told to come back; restarted on its state dir, it finishes the run with them.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, run_async, target_of
from test_deployables import FEDLINK, Spawner, start_serve

from fedlink.client import ClientOptions, ClientSession, RetryPolicy, SessionStats
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.netem.profile import LinkProfile
from fedlink.netem.proxy import TcpProxy

pytestmark = pytest.mark.timeout(480)

CLIENTS = 3
BLACKOUT_S = 15.0


def config_text(name: str, rounds: int) -> str:
    """A digits/logreg run that waits for all ``CLIENTS`` each round."""
    return f"""
[run]
name = "{name}"
[data]
dataset = "digits"
clients = {CLIENTS}
[model]
name = "logreg"
[coordinator]
rounds = {rounds}
[coordinator.flush]
goal = {CLIENTS}
min_updates = {CLIENTS}
deadline_s = 0.0
[coordinator.training]
local_epochs = 1
learning_rate = 0.1
"""


class Proxies:
    """TCP proxies on an event loop of their own thread (the test itself is synchronous)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.proxies: list[TcpProxy] = []

    def _run(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)  # type: ignore

    def add(self, upstream: str, latency_ms: float = 0.0) -> str:
        """A new proxy to ``upstream``; its listening address."""

        async def start() -> TcpProxy:
            proxy = TcpProxy(LinkProfile(latency_ms=latency_ms), upstream)
            await proxy.start()
            return proxy

        proxy = self._run(start())
        assert isinstance(proxy, TcpProxy)
        self.proxies.append(proxy)
        return proxy.address

    def blackout(self, index: int, seconds: float) -> None:
        """Freeze the link of proxy ``index`` (nothing passes, TCP stays up)."""
        self.loop.call_soon_threadsafe(self.proxies[index].force_blackout, seconds)

    def close(self) -> None:
        async def stop_all() -> None:
            for proxy in self.proxies:
                await proxy.stop()

        self._run(stop_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def proxies() -> Iterator[Proxies]:
    running = Proxies()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.close()


def events_of(run_dir: Path) -> list[dict]:
    """The events the coordinator has written so far (a torn last line is skipped)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return found


def wait_for_events(run_dir: Path, ready: object, timeout_s: float, what: str) -> list[dict]:
    """Poll the event log until ``ready(events)`` holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = events_of(run_dir)
        if ready(events):  # type: ignore[operator]
            return events
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}; events: {[e['kind'] for e in events_of(run_dir)]}")


def client_argv(server: str, config: Path, index: int) -> list[str]:
    return [*FEDLINK, "client", "--server", server, "--config", str(config), "--index",
            str(index), "--name", f"c{index}"]


def accepted_from(events: list[dict], names: set[str]) -> int:
    ids = {e["client_id"] for e in events if e["kind"] == "client_joined" and e["name"] in names}
    return sum(e["kind"] == "update_accepted" and e["client_id"] in ids for e in events)


def test_clients_in_a_blackout_at_the_last_flush_exit_0_saying_the_run_finished(
        spawn: Spawner, proxies: Proxies, tmp_path: Path) -> None:
    config = tmp_path / "blackout.toml"
    config.write_text(config_text("blackout", rounds=1))
    serve, address = start_serve(spawn, config, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "blackout"
    # c0 and c1 on clean links that will black out; c2's 1.5 s each way makes it the last in
    servers = [proxies.add(address), proxies.add(address), proxies.add(address, 1500.0)]
    clients = [spawn(client_argv(server, config, i)) for i, server in enumerate(servers)]
    wait_for_events(run_dir, lambda ev: accepted_from(ev, {"c0", "c1"}) == 2, 120,
                    "the updates of c0 and c1")
    blackout_started = time.time()
    proxies.blackout(0, BLACKOUT_S)
    proxies.blackout(1, BLACKOUT_S)
    codes = [client.finish(timeout_s=240) for client in clients]
    assert codes == [0] * CLIENTS, "\n".join(c.output for c in clients)
    for client in clients:
        assert len(re.findall(r"run finished: completed 1 rounds", client.output)) == 1, \
            client.output
    assert serve.finish(timeout_s=180) == 0, serve.output
    events = events_of(run_dir)
    (finished,) = [e for e in events if e["kind"] == "run_finished"]
    # the last flush came while c0 and c1 were blacked out
    assert blackout_started <= finished["t"] < blackout_started + BLACKOUT_S
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["clients"] == CLIENTS and summary["updates_accepted"] == CLIENTS


def test_sigterm_tells_clients_to_come_back_and_a_restart_finishes_the_run_with_them(
        spawn: Spawner, proxies: Proxies, tmp_path: Path) -> None:
    config = tmp_path / "stop.toml"
    config.write_text(config_text("stop", rounds=3).replace(
        "[coordinator]\n", f'[coordinator]\nstate_dir = "{tmp_path / "state"}"\n'))
    serve, address = start_serve(spawn, config, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "stop"
    # every round waits for c2, whose 1.5 s each way keeps rounds 2 and 3 seconds behind the
    # first flush: the stop lands mid-run however late a busy machine lets the test see it
    servers = [address, address, proxies.add(address, 1500.0)]
    clients = [spawn(client_argv(server, config, i)) for i, server in enumerate(servers)]
    wait_for_events(run_dir, lambda ev: any(e["kind"] == "flush" for e in ev), 120,
                    "the first flush")
    serve.popen.send_signal(signal.SIGTERM)
    assert serve.finish(timeout_s=180) == 0, serve.output
    events = events_of(run_dir)
    assert [e["reason"] for e in events if e["kind"] == "run_finished"] == ["stopped by signal"]
    assert not [e for e in events if e["kind"] == "client_left"]  # told to come back
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates_accepted"] >= CLIENTS and (run_dir / "model.npy").exists()
    # the same coordinator again, same port and state dir: the clients find it and finish
    host, port = address.rsplit(":", 1)
    again = spawn([*FEDLINK, "serve", "--config", str(config), "--host", host, "--port", port,
                   "--output-dir", str(tmp_path / "runs")])
    codes = [client.finish(timeout_s=240) for client in clients]
    assert codes == [0] * CLIENTS, "\n".join(c.output for c in clients)
    for client in clients:
        assert len(re.findall(r"run finished: completed 3 rounds", client.output)) == 1, \
            client.output
    assert again.finish(timeout_s=180) == 0, again.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["updates_accepted"] == 3 * CLIENTS


def test_a_client_told_the_run_is_over_finds_the_coordinator_gone_and_is_done(
        coordinator: CoordinatorFactory, tmp_path: Path) -> None:
    fast = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=3)
    state = tmp_path / "device"

    async def main() -> tuple[SessionStats, SessionStats]:
        config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None))
        async with coordinator(config, np.zeros(4, np.float32)) as server:
            target = target_of(server)
            first = await ClientSession(target, TowardTrainer(np.ones(4, np.float32)),
                                        ClientOptions(name="d", outbox_dir=state,
                                                      retry=fast)).run()
        # the coordinator is gone; a restarted process of the same device
        again = ClientSession(target, TowardTrainer(np.ones(4, np.float32)),
                              ClientOptions(name="d", outbox_dir=state, retry=fast))
        return first, await again.run()

    first, again = run_async(main())
    assert first.finished == again.finished == "completed 1 rounds"
    assert again.tasks == 0 and again.retries == 2  # it tried, then used what it was told
