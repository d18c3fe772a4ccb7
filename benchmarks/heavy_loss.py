"""Heavy loss with a big model: fedlink's own timeouts against fixed ones (packet tier).

Every run is 5 clients (5 processes: devices, each striping its model downloads over two
connections, the SDK's default, in both arms) and one coordinator in two network namespaces
joined by fedlink's user-space packet link (``fedlink.netem.packet``: kernel TCP on both ends
sees real packet loss), a sync run (every round waits for all 5) of 10 rounds
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
client opened beyond each connection's first, ``SessionStats.reconnects``: fedlink's own
reconnects; target <= 3), ``stalls_<p>``, ``tcp_connections_<p>`` (TCP opens in the clients'
namespace), ``tcp_reconnects_per_client_<p>`` (those opens beyond the connections each client
keeps, over the clients: the same kernel counter in both arms, so it also counts the
reconnects that gRPC makes inside a channel after the kernel or a ping-ack timeout killed its
connection, which ``own_reconnects_per_client`` cannot see in either arm),
``calls_cut_by_ping_timeout_<p>`` and ``calls_cut_by_kernel_<p>`` (client calls that failed
because a ping-ack timeout or the kernel's TCP user timeout killed their connection, from the
clients' logs: the connection changes a channel makes on its own), ``client_timeouts_<p>`` and
``false_client_timeouts_<p>`` (timeouts of clients whose update was accepted later; target 0).
Overall: ``own_reconnects_per_client`` and ``false_client_timeouts`` (the worst of the
default runs); ``models_identical_across_3_runs`` (1 when the final models of the
``25pct`` default, ``25pct`` fixed and ``burst`` default runs are bit-identical: a sync run's
result must not depend on the order its updates arrived in; absent under ``--only``, which
runs one profile); ``models_identical_all_runs`` (the same over every run made).

``--repeats N`` runs each pair N times, alternating which arm goes first (default first, then
fixed first, ...), so that a drift in the machine's load falls on both arms: the slowdown is
then the median of the N paired ratios, with ``slowdown_vs_fixed_timeouts_<p>_min`` and
``_max`` beside it, and the counts are the worst of the N default runs. Each run prints its
rounds' durations and why each client changed connections (the client's log says why).

Needs root and ``/dev/net/tun``; otherwise prints the reason and writes ``{"skipped": reason}``.
A full run takes tens of minutes. Run:
``python benchmarks/heavy_loss.py [--quick] [--json FILE] [--only PROFILE] [--repeats N]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
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
    logging.getLogger("fedlink.client.transport").setLevel(logging.DEBUG)  # each transfer
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


REASONS = {"a transfer stalled": "stall", "connection lost": "connection lost"}
"""What a client's log says when it changes connections, and the short name counted."""


def reconnect_reasons(logs: Sequence[Sequence[str]]) -> dict[str, int]:
    """How often the clients moved to a new connection, and to one set aside, by reason."""
    counts: dict[str, int] = {}
    for lines in logs:
        for line in lines:
            if "new connection" not in line and "back to the connection" not in line:
                continue
            reason = next((short for text, short in REASONS.items() if text in line), "other")
            where = "new" if "new connection" in line else "back"
            counts[f"{reason} -> {where}"] = counts.get(f"{reason} -> {where}", 0) + 1
    return counts


CUTS = {"ping timeout": "calls_cut_by_ping_timeout",
        "Connection timed out": "calls_cut_by_kernel"}
"""What a client's log says when a call failed with its connection killed under it, and the
figure that counts it."""


def cut_calls(logs: Sequence[Sequence[str]]) -> dict[str, int]:
    """Client calls that failed because a ping-ack timeout or the kernel killed their
    connection (``CUTS``), over the clients' logs."""
    counts = dict.fromkeys(CUTS.values(), 0)
    for lines in logs:
        for line in lines:
            if "failed (attempt" in line:
                for text, figure in CUTS.items():
                    counts[figure] += text in line
    return counts


def round_seconds(events: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each round's duration: from the previous flush (or the first task) to its flush."""
    start = next((e["elapsed"] for e in events if e["kind"] == "task_issued"), 0.0)
    flushes = [e["elapsed"] for e in events if e["kind"] == "flush"]
    return [b - a for a, b in zip([start, *flushes], flushes, strict=False)]


def one_run(profile: LinkProfile, rounds: int, fixed: bool, work: Path,
            limit_s: float, repeat: int = 0) -> dict[str, Any]:
    """One sync run through ``profile``; its summary, the clients' stats and the model hash."""
    name = f"{profile.name}_{'fixed' if fixed else 'default'}" + (f"_r{repeat}" if repeat
                                                                    else "")
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
    events = list(read_events(Path(spec["events"])))
    summary = summarize(events, {})
    client_logs = [(work / f"{name}.c{i}.log").read_text().splitlines()
                   for i in range(CLIENTS)]
    print(f"{name}: rounds (s) " + " ".join(f"{s:.1f}" for s in round_seconds(events))
          + f"; connection changes {reconnect_reasons(client_logs)}", flush=True)
    stats = [json.loads(line.removeprefix("STATS "))
             for lines in client_logs for line in lines if line.startswith("STATS ")]
    model = Path(spec["model"])
    return {"name": name, "completed": int(summary["rounds"] == rounds),
            "wall_s": summary["wall_seconds"],
            "reconnects": max((s["reconnects"] for s in stats), default=-1),
            "stalls": sum(s["stalls"] for s in stats),
            "tcp_connections": after["Tcp:ActiveOpens"] - before["Tcp:ActiveOpens"],
            # beyond the connections the clients meant to keep (one each, or one per
            # download connection once a download striped)
            "tcp_reconnects_per_client": round((after["Tcp:ActiveOpens"]
                                                - before["Tcp:ActiveOpens"]
                                                - sum(s["channels_opened"] - s["reconnects"]
                                                      for s in stats)) / CLIENTS, 2),
            **cut_calls(client_logs),
            "client_timeouts": summary["client_timeouts"],
            "false_client_timeouts": summary.get("false_client_timeouts", -1),
            "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest()
            if model.exists() else ""}


def measure(profile: LinkProfile, rounds: int, work: Path, limit_s: float,
            repeats: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``repeats`` pairs of a default run and its fixed-timeout baseline on ``profile``, the
    order alternating; their figures (medians of the paired ratios, worst counts) and runs."""
    pairs = []
    for repeat in range(repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        runs = {fixed: one_run(profile, rounds, fixed, work, limit_s, repeat)
                for fixed in order}
        pairs.append((runs[False], runs[True]))
    p = profile.name
    figures: dict[str, Any] = {
        f"completed_{p}": min(d["completed"] for d, _ in pairs),
        f"completed_fixed_{p}": min(f["completed"] for _, f in pairs)}
    done = [(d, f) for d, f in pairs if d["completed"] and f["completed"]]
    if len(done) == len(pairs):
        ratios = [d["wall_s"] / f["wall_s"] for d, f in done]
        figures[f"wall_s_{p}"] = statistics.median(d["wall_s"] for d, _ in done)
        figures[f"wall_s_fixed_{p}"] = statistics.median(f["wall_s"] for _, f in done)
        figures[f"slowdown_vs_fixed_timeouts_{p}"] = statistics.median(ratios)
        if repeats > 1:
            figures[f"slowdown_vs_fixed_timeouts_{p}_min"] = min(ratios)
            figures[f"slowdown_vs_fixed_timeouts_{p}_max"] = max(ratios)
    for key in ("reconnects", "stalls", "tcp_connections", "tcp_reconnects_per_client",
                *CUTS.values(), "client_timeouts", "false_client_timeouts"):
        label = "own_reconnects_per_client" if key == "reconnects" else key
        figures[f"{label}_{p}"] = max(d.get(key, -1) for d, _ in pairs)
        figures[f"{label}_fixed_{p}"] = max(f.get(key, -1) for _, f in pairs)
    return figures, [run for pair in pairs for run in pair]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--keep DIR``: keep the runs' event logs, models and client logs; ``--repeats N``."""
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep the runs' event logs, models and client logs in DIR")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="pairs of runs per profile, alternating which arm goes first")


def main() -> None:
    """Run both profiles against their fixed-timeout baselines; print and save the figures."""
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "heavy_loss", add_arguments,
                      parts=tuple(PROFILES))
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    available, reason = packet_tier_available()
    if not available:
        print(f"skipped: {reason}")
        report({"skipped": reason}, args.json)
        return
    rounds = 2 if args.quick else 10
    limit_s = 120.0 + 60.0 * rounds
    figures: dict[str, Any] = {"quick": args.quick, "clients": CLIENTS, "rounds": rounds,
                               "model_bytes": 4 * DIM, "repeats": args.repeats,
                               "load_1min_before": os.getloadavg()[0]}
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="heavy_loss-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for profile in PROFILES.values():
            if args.only not in (None, profile.name):
                continue
            found, measured = measure(profile, rounds, work, limit_s, args.repeats)
            figures |= found
            runs |= {run["name"]: run for run in measured}
    figures["load_1min_after"] = os.getloadavg()[0]
    defaults = [r for r in runs.values() if "_default" in r["name"]]
    figures["own_reconnects_per_client"] = max(r.get("reconnects", -1) for r in defaults)
    figures["false_client_timeouts"] = max(r.get("false_client_timeouts", -1) for r in defaults)
    three = [runs[n].get("model_sha256", "") for n in ("25pct_default", "25pct_fixed",
                                                         "burst_default") if n in runs]
    if len(three) == 3:  # ``--only`` runs one profile: the figure cannot be told, not 0
        figures["models_identical_across_3_runs"] = int(bool(three[0]) and len(set(three)) == 1)
    figures["models_identical_all_runs"] = int(
        len({r.get("model_sha256", "") for r in runs.values()} - {""}) == 1
        and all(r.get("model_sha256") for r in runs.values()))
    report(figures, args.json)


if __name__ == "__main__":
    main()
