"""Heavy loss with a big model: fedlink's own timeouts against fixed ones (packet tier).

Every run is 5 clients (5 processes: devices with a connection each) and one coordinator in two
network namespaces joined by fedlink's user-space packet link (``fedlink.netem.packet``: kernel
TCP on both ends sees real packet loss), a sync run (every round waits for all 5) of 10 rounds
(``--quick``: 2) on a model the size of a [512, 512] MLP on 8x8 digits (301,066 float32
parameters, 1.2 MB updates; numpy clients moving half way toward a random target of their own,
so that the order updates are summed in shows in the model's bits).

Two loss profiles, each run twice in the same process: with fedlink's defaults (the client's
link-following liveness, the coordinator's link-judged heartbeats), and with **fixed
timeouts**, the baseline: the client's as they were before they followed the link (a fixed
5 s ping-ack timeout, TCP user timeout and stall bound, 30 s call deadlines: fast to cut a
stalled connection on a short link) and a generous fixed 600 s coordinator liveness timeout
(no client is ever released):

- ``25pct``: 25% random loss each way, 10 ms one-way delay;
- ``burst``: Gilbert-Elliott bursts (good -> bad 4% per packet, back 20%; 5% loss in the good
  state, 80% in the bad one: 17.5% on average, bad spells of five packets), 10 ms delay.

Figures per profile ``<p>``: ``completed_<p>`` (1 when all rounds flushed), ``wall_s_<p>`` and
``wall_s_fixed_<p>`` (first task to the end, from the event log), ``slowdown_vs_fixed_timeouts_<p>``
(the ratio; target <= 1.1), ``own_reconnects_per_client_<p>`` (the most channels any one
client opened beyond its first: fedlink's own reconnects; target <= 3), ``stalls_<p>``,
``tcp_connections_<p>`` (TCP opens in the clients' namespace), ``client_timeouts_<p>`` and
``false_client_timeouts_<p>`` (timeouts of clients whose update was accepted later; target 0).
Overall: ``own_reconnects_per_client`` and ``false_client_timeouts`` (the worst of the
default runs), and ``models_identical_across_3_runs`` (1 when the final models of the
``25pct`` default, ``25pct`` fixed and ``burst`` default runs are bit-identical: a sync run's
result must not depend on the order its updates arrived in).

Needs root and ``/dev/net/tun``; otherwise prints the reason and writes ``{"skipped": reason}``.
A full run takes tens of minutes. Run: ``python benchmarks/heavy_loss.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.metrics import read_events, summarize
from fedlink.netem.packet import PacketLink, packet_tier_available
from fedlink.netem.profile import GilbertElliott, LinkProfile

CLIENTS = 5
DIM = 64 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10  # a [512, 512] MLP on 8x8 digits
PROFILES = {
    "25pct": LinkProfile(name="25pct", latency_ms=10, loss_up=0.25, loss_down=0.25, seed=11),
    "burst": LinkProfile(name="burst", latency_ms=10, seed=12, burst_loss=GilbertElliott(
        p=0.04, r=0.2, loss_good=0.05, loss_bad=0.8)),
}
FIXED = {"liveness": {"min_ping_timeout_s": 5.0, "max_ping_timeout_s": 5.0,
                      "widen_factor": 1.0, "rtt_multiple": 1.0, "min_stall_s": 5.0,
                      "max_deadline_s": 30.0, "tcp_user_timeout_s": 5.0},
         "liveness_timeout_s": 600.0}
"""The baseline: the client's timeouts as before they followed the link (fixed 5 s ping-ack
timeout, TCP user timeout and stall bound, 30 s deadlines) and a generous fixed coordinator
liveness timeout (no client is ever released)."""
GRACE_S = 20.0
"""The coordinator's ``finished_grace_s`` in both runs: a client whose ``Leave`` was lost must
not keep it up for twice the fixed run's liveness timeout."""

SERVER = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    import numpy as np
    from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
    from fedlink.coordinator.config import LimitsConfig
    from fedlink.coordinator.server import serve_until_done
    from fedlink.metrics import EventLog

    spec = json.loads(sys.argv[2])
    limits = LimitsConfig(liveness_timeout_s=spec["liveness_timeout_s"],
                          finished_grace_s=spec["grace_s"])
    config = CoordinatorConfig(rounds=spec["rounds"], limits=limits, flush=FlushRule(
        goal=spec["clients"], min_updates=spec["clients"], deadline_s=None))

    async def main() -> None:
        with EventLog(Path(spec["events"])) as events:
            server = CoordinatorServer(config, np.zeros(spec["dim"], np.float32), events,
                                       address=sys.argv[1] + ":0")
            await serve_until_done(server, lambda port: print("port", port, flush=True))
            np.save(spec["model"], server.service.engine.model)

    asyncio.run(main())
""")

CLIENT = textwrap.dedent("""
    import asyncio, dataclasses, json, logging, sys
    import numpy as np
    from fedlink.client import ClientOptions, ClientSession, TrainResult
    from fedlink.client.liveness import LivenessConfig

    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)d %(name)s %(message)s")
    spec, index = json.loads(sys.argv[2]), int(sys.argv[3])

    class Toward:
        def __init__(self, i):
            self.target = np.random.default_rng(i).standard_normal(spec["dim"]).astype(np.float32)
            self.examples = 10 + i
        def num_examples(self):
            return self.examples
        def train(self, params, plan):
            new = (params + 0.5 * (self.target - params)).astype(np.float32)
            return TrainResult(new, self.examples, 1, 1, {})

    options = ClientOptions(name=f"c{index}", liveness=LivenessConfig(**spec["liveness"]))
    stats = asyncio.run(ClientSession(sys.argv[1], Toward(index), options).run())
    print("STATS " + json.dumps(dataclasses.asdict(stats)), flush=True)
""")
"""One client (a process of its own: a device with its own connection, as in the field)."""


def kernel_counters(link: PacketLink) -> dict[str, int]:
    """Tcp counters of the clients' namespace (``/proc/net/snmp``)."""
    lines = link.run_in_client(["cat", "/proc/net/snmp"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
    found: dict[str, int] = {}
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        prefix, *keys = names.split()
        found.update({f"{prefix}{k}": int(v)
                      for k, v in zip(keys, values.split()[1:], strict=True)})
    return found


def one_run(profile: LinkProfile, rounds: int, fixed: bool, work: Path,
            limit_s: float) -> dict[str, Any]:
    """One sync run through ``profile``; its summary, the clients' stats and the model hash."""
    name = f"{profile.name}_{'fixed' if fixed else 'default'}"
    spec: dict[str, Any] = {
        "rounds": rounds, "clients": CLIENTS, "dim": DIM,
        "events": str(work / f"{name}.jsonl"), "model": str(work / f"{name}.npy"),
        "liveness": FIXED["liveness"] if fixed else {},
        "liveness_timeout_s": FIXED["liveness_timeout_s"] if fixed else None,
        "grace_s": GRACE_S}
    with PacketLink(profile) as link:
        before = kernel_counters(link)
        server = link.popen_in_server([sys.executable, "-c", SERVER, link.server_addr,
                                       json.dumps(spec)], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        logs = [(work / f"{name}.c{i}.log").open("w") for i in range(CLIENTS)]
        clients = [link.popen_in_client([sys.executable, "-c", CLIENT,
                                         f"{link.server_addr}:{port}", json.dumps(spec), str(i)],
                                        stdout=log, stderr=subprocess.STDOUT, text=True)
                   for i, log in enumerate(logs)]
        try:
            deadline = time.monotonic() + limit_s
            for client in clients:
                client.wait(timeout=max(1.0, deadline - time.monotonic()))
            server.wait(timeout=GRACE_S + 60)
        except subprocess.TimeoutExpired:
            for process in (*clients, server):
                process.kill()
                process.wait()
            print(f"{name}: the clients or the coordinator did not end within {limit_s:.0f} s "
                  f"and {GRACE_S + 60:.0f} s", flush=True)
            return {"completed": 0, "name": name}
        finally:
            for log in logs:
                log.close()
        after = kernel_counters(link)
    summary = summarize(read_events(Path(spec["events"])), {})
    stats = [json.loads(line.removeprefix("STATS "))
             for i in range(CLIENTS)
             for line in (work / f"{name}.c{i}.log").read_text().splitlines()
             if line.startswith("STATS ")]
    model = Path(spec["model"])
    return {"name": name, "completed": int(summary["rounds"] == rounds),
            "wall_s": summary["wall_seconds"],
            "reconnects": max((s["channels_opened"] - 1 for s in stats), default=-1),
            "stalls": sum(s["stalls"] for s in stats),
            "tcp_connections": after["Tcp:ActiveOpens"] - before["Tcp:ActiveOpens"],
            "client_timeouts": summary["client_timeouts"],
            "false_client_timeouts": summary.get("false_client_timeouts", -1),
            "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest()
            if model.exists() else ""}


def measure(profile: LinkProfile, rounds: int, work: Path,
            limit_s: float) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The default run and its fixed-timeout baseline on ``profile``; their figures."""
    default = one_run(profile, rounds, fixed=False, work=work, limit_s=limit_s)
    fixed = one_run(profile, rounds, fixed=True, work=work, limit_s=limit_s)
    p = profile.name
    figures: dict[str, Any] = {f"completed_{p}": default["completed"],
                               f"completed_fixed_{p}": fixed["completed"]}
    if default["completed"] and fixed["completed"]:
        figures[f"wall_s_{p}"] = default["wall_s"]
        figures[f"wall_s_fixed_{p}"] = fixed["wall_s"]
        figures[f"slowdown_vs_fixed_timeouts_{p}"] = default["wall_s"] / fixed["wall_s"]
    for key in ("reconnects", "stalls", "tcp_connections", "client_timeouts",
                "false_client_timeouts"):
        label = "own_reconnects_per_client" if key == "reconnects" else key
        figures[f"{label}_{p}"] = default.get(key, -1)
        figures[f"{label}_fixed_{p}"] = fixed.get(key, -1)
    return figures, default, fixed


def add_keep(parser: argparse.ArgumentParser) -> None:
    """``--keep DIR``: keep the runs' event logs, models and client logs."""
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep the runs' event logs, models and client logs in DIR")


def main() -> None:
    """Run both profiles against their fixed-timeout baselines; print and save the figures."""
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "heavy_loss", add_keep,
                      parts=tuple(PROFILES))
    available, reason = packet_tier_available()
    if not available:
        print(f"skipped: {reason}")
        report({"skipped": reason}, args.json)
        return
    rounds = 2 if args.quick else 10
    limit_s = 120.0 + 60.0 * rounds
    figures: dict[str, Any] = {"quick": args.quick, "clients": CLIENTS, "rounds": rounds,
                               "model_bytes": 4 * DIM}
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="heavy_loss-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for profile in PROFILES.values():
            if args.only not in (None, profile.name):
                continue
            found, default, fixed = measure(profile, rounds, work, limit_s)
            figures |= found
            runs[default["name"]], runs[fixed["name"]] = default, fixed
    defaults = [r for r in runs.values() if r["name"].endswith("_default")]
    figures["own_reconnects_per_client"] = max(r.get("reconnects", -1) for r in defaults)
    figures["false_client_timeouts"] = max(r.get("false_client_timeouts", -1) for r in defaults)
    three = [runs.get(n, {}).get("model_sha256", "") for n in ("25pct_default", "25pct_fixed",
                                                                 "burst_default")]
    figures["models_identical_across_3_runs"] = int(bool(three[0]) and len(set(three)) == 1)
    figures["models_identical_all_runs"] = int(
        len({r.get("model_sha256", "") for r in runs.values()} - {""}) == 1
        and all(r.get("model_sha256") for r in runs.values()))
    report(figures, args.json)


if __name__ == "__main__":
    main()
