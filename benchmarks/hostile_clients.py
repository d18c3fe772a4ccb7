"""Hostile clients: 20 digits clients against ``fedlink serve``'s defaults, some of them lying.

Every run uses the same seed, data split and config (the coordinator's defaults: no norm bound,
aggregator or robust rule configured), and every attacker claims the strongest lie the protocol
allows: it declares ``limits.max_examples_per_update`` (100,000) examples at ``Join`` and claims
them with every update (honest clients have about 70). Runs:

- **clean**: the 20 honest clients (the baseline of every drop);
- **weight lie**: client 19 trains honestly, then sends its step reversed and boosted x10;
- **Byzantine 20% sign-flip**: clients 16-19 do the same, colluding;
- **backdoor**: clients 16-19 train on their data plus a copy stamped with a trigger (the
  bottom-right 2x2 pixels at full intensity) labelled 0, and boost their step x5 (model
  replacement); ``backdoor_success_rate`` is the share of the test set's non-0 digits, stamped
  with the trigger, that the final model calls 0 (``clean_backdoor_rate``: the clean model's);
- **resources**: the 20 honest clients plus two raw-gRPC attackers: the **poisoner** takes a
  task every version and commits, in turn, a weight lie (a takeover delta claiming ``2**62``),
  a norm blow-up (norm 1e8) and an Inf push (finite ``3e38`` values; plus a payload holding Inf,
  which must be refused); the **hoarder** floods ``Join`` (``JOIN_FLOOD`` calls with maximal
  metadata), holds a task it never delivers while heartbeating, and opens upload after upload
  without committing;
- **honest non-IID**: the 20 clients honest, their data split by label with Dirichlet(0.3)
  (skewed label mixes, unequal sizes), once with the defaults and once with the flush guard
  off (``enabled = false``), same seed: what the guard costs honest heterogeneous clients;
- **edge**: ``edge_limits.py``'s two measurements, each on a coordinator of its own: a flood
  of ``Join`` calls (messages of 7.9 MiB, and just under the message cap) and uploads of the
  largest chunk, and a SIGTERM with a heartbeating client connected.

The coordinator runs as its own process (``python -m fedlink serve``), so its resident memory
and open descriptors are sampled from ``/proc`` without the clients' torch in them.

Figures: ``clean_accuracy``; ``weight_lie_accuracy_drop`` (target <= 0.03),
``byzantine_20pct_signflip_accuracy_drop`` (<= 0.05), ``backdoor_success_rate`` (<= 0.10), each
beside the attacked run's accuracy; ``honest_updates_lost`` (honest updates any attacked
coordinator refused for a reason but the run's end, or that an honest client gave up on;
target 0) and ``honest_updates_dropped`` (honest updates the flush guard left out of a flush,
clean run included); ``attacker_updates_dropped`` / ``_clipped`` / ``_downweighted``; from the
resources run ``resources_accuracy_drop``, ``server_rss_growth_mb`` (peak minus at-listen RSS,
target <= 100; ``clean_rss_growth_mb`` the same for the clean run), ``server_fd_growth``
(target <= 50), and counts of what its attacks got: ``poison_accepted``, ``poison_refused``,
``flood_joins_ok``, ``flood_joins_refused``, ``hoard_uploads_ok``, ``hoard_uploads_refused``,
``flush_refused``; from the non-IID pair ``honest_noniid_accuracy_drop`` (the unguarded run's
accuracy minus the guarded one's; ``honest_noniid_accuracy``,
``honest_noniid_unguarded_accuracy``, ``honest_noniid_updates_dropped`` beside it); from the
edge ``inflight_rss_growth_mb`` (target <= 100) and ``sigterm_drain_seconds`` (target <= 10),
with the rest of ``edge_limits.py``'s figures.

Run: ``python benchmarks/hostile_clients.py [--quick] [--json FILE]`` (``--quick``: 5 rounds
instead of 10, and the edge's smaller flood; ``--only SCENARIO`` runs that one, with the clean
run when it is an attack; ``--streaming`` runs the attacks with the flush guard off, as the
coordinator was before it (no non-IID pair then); ``--robust KEY=VALUE`` sets a
``[coordinator.robust]`` key in every guarded run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.client import ClientOptions, ClientSession, Trainer, TrainPlan, TrainResult
from fedlink.compress import get_codec
from fedlink.coordinator import LimitsConfig
from fedlink.data.base import Dataset
from fedlink.experiment.setup import Experiment
from fedlink.messages import CommitRequest
from fedlink.metrics.events import read_events
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.sim import ExperimentConfig
from fedlink.wire import pack, to_proto

CLIENTS = 20
SEED = 0
CLAIM = LimitsConfig().max_examples_per_update  # the most a Join may declare: 100,000
COLLUDERS = 4  # a fifth of the fleet
TARGET = 0  # the backdoor's label
TRIGGER = (54, 55, 62, 63)  # the bottom-right 2x2 pixels of an 8x8 digit
FLIP_BOOST = 10.0
BACKDOOR_BOOST = 5.0
ATTACKS = ("weight_lie", "signflip", "backdoor", "resources")
SCENARIOS = (*ATTACKS, "noniid", "edge")
NONIID_ALPHA = 0.3
"""The honest non-IID runs' label skew: each client's label mix drawn from Dirichlet(0.3)."""
JOIN_FLOOD = 3000
HOARD_UPLOADS = 400
TIMEOUT_S = 10.0
FP32 = get_codec("fp32")

TOML = """
[run]
name = "{name}"
seed = {seed}

[data]
dataset = "digits"
clients = {clients}
{partition}

[model]
name = "mlp"
options = {{ hidden = [64, 64] }}

[coordinator]
rounds = {rounds}

[coordinator.flush]
goal = {clients}
min_updates = {min_updates}
deadline_s = 20.0
over_selection = 1.2
max_staleness = 2

[coordinator.training]
local_epochs = 3
batch_size = 32
learning_rate = 0.2
"""


STREAMING = """
[coordinator.robust]
enabled = false
"""


def write_config(folder: Path, name: str, rounds: int, streaming: bool = False,
                 robust: tuple[str, ...] = (), noniid: bool = False) -> Path:
    """The experiment TOML both the coordinator and the honest clients read (``streaming``:
    the flush guard off, the default before it; ``robust``: ``KEY=VALUE`` settings of
    ``[coordinator.robust]``; ``noniid``: a Dirichlet label split, clients of unequal size)."""
    path = folder / f"{name}.toml"
    partition = (f'partition = "dirichlet"\noptions = {{ alpha = {NONIID_ALPHA} }}' if noniid
                 else 'partition = "iid"')
    text = TOML.format(name=name, seed=SEED, clients=CLIENTS, rounds=rounds,
                       min_updates=CLIENTS // 2, partition=partition)
    if streaming:
        text += STREAMING
    elif robust:
        text += "\n[coordinator.robust]\n" + "\n".join(f"{k} = {v}" for k, v in
                                                       (kv.split("=", 1) for kv in robust))
    path.write_text(text + "\n")
    return path


@dataclass
class Probe:
    """Samples the coordinator process's RSS (MB) and open descriptors."""

    pid: int
    rss: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

    def sample(self) -> None:
        """One sample (ignored once the process is gone)."""
        with contextlib.suppress(OSError, ValueError):
            status = Path(f"/proc/{self.pid}/status").read_text()
            kb = next(int(line.split()[1]) for line in status.splitlines()
                      if line.startswith("VmRSS:"))
            self.rss.append(kb / 1024)
            self.fds.append(len(os.listdir(f"/proc/{self.pid}/fd")))

    async def run(self) -> None:
        """Sample every 0.2 s until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(0.2)


@contextlib.contextmanager
def coordinator(config: Path, out: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``python -m fedlink serve`` on a free loopback port: (process, port)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fedlink", "serve", "--config", str(config), "--port", "0",
         "--output-dir", str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"the coordinator did not start: {line!r}")
        yield process, int(line.rsplit(":", 1)[1])
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=60)


@dataclass
class Tally:
    """What the attackers achieved."""

    poison_accepted: int = 0
    poison_refused: int = 0
    flood_joins_ok: int = 0
    flood_joins_refused: int = 0
    hoard_uploads_ok: int = 0
    hoard_uploads_refused: int = 0


async def call(stub_call: Any) -> tuple[str, Any]:
    """``(status name, reply)`` of one call."""
    try:
        return "OK", await stub_call
    except grpc.aio.AioRpcError as err:
        return err.code().name, None


async def poisoner(target: str, size: int, tally: Tally) -> None:
    """Every version: a weight lie, a norm blow-up or an Inf push, in turn."""
    rng = np.random.default_rng(1)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        me = (await stub.Join(pb.JoinRequest(client_name="poisoner", num_examples=70),
                              timeout=TIMEOUT_S)).client_id
        attack = 0
        while True:
            code, reply = await call(stub.GetTask(pb.GetTaskRequest(client_id=me,
                                                                    held_version=-1),
                                                  timeout=TIMEOUT_S + 15))
            if code != "OK" or reply.HasField("finished"):
                return
            if not reply.HasField("task"):
                await asyncio.sleep(0.5)
                continue
            task = reply.task
            for delta, claimed in poisons(attack, size, rng):
                request = CommitRequest(
                    client_id=me, upload_id=f"p{attack}-{claimed % 97}", task_id=task.task_id,
                    base_version=task.model_version, num_examples=claimed,
                    steps_completed=1, steps_planned=1, update=pack_raw(delta).header,
                    update_data=pack_raw(delta).data)
                code, _ = await call(stub.Commit(to_proto(request), timeout=TIMEOUT_S))
                if code == "OK":
                    tally.poison_accepted += 1
                    break
                tally.poison_refused += 1
            attack += 1


def poisons(attack: int, size: int, rng: np.random.Generator) -> list[tuple[np.ndarray, int]]:
    """This version's hostile updates, tried in order until one is accepted."""
    kind = attack % 3
    if kind == 0:  # weight lie: a large step in one direction, claiming 2**62 examples
        return [((rng.normal(size=size) * 3).astype(np.float32), 2**62)]
    if kind == 1:  # norm blow-up
        blow = rng.normal(size=size)
        return [((blow / np.linalg.norm(blow) * 1e8).astype(np.float32), 70)]
    inf = np.full(size, np.inf, np.float32)  # refused at decoding; then the finite push
    return [(inf, 70), (np.full(size, 3e38, np.float32), 70)]


def pack_raw(delta: np.ndarray) -> Any:
    """``pack`` without its finiteness: an attacker encodes whatever it likes."""
    with np.errstate(all="ignore"):
        return pack(delta, FP32)


async def hoarder(target: str, size: int, tally: Tally, stop: asyncio.Event) -> None:
    """Join flood, a held task it heartbeats for, and uploads it never commits."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        me = (await stub.Join(pb.JoinRequest(client_name="hoarder", num_examples=70),
                              timeout=TIMEOUT_S)).client_id
        holder = asyncio.create_task(hold_a_place(stub, me, stop))
        try:
            await asyncio.gather(flood(stub, tally), hoard(stub, me, size, tally))
            await stop.wait()
        finally:
            holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holder


async def hold_a_place(stub: pb_grpc.CoordinatorStub, me: str, stop: asyncio.Event) -> None:
    """Take a task and heartbeat on it, never delivering."""
    task_id = ""
    while not stop.is_set():
        if not task_id:
            code, reply = await call(stub.GetTask(pb.GetTaskRequest(client_id=me,
                                                                    held_version=-1),
                                                  timeout=TIMEOUT_S + 15))
            if code == "OK" and reply.HasField("task"):
                task_id = reply.task.task_id
        code, reply = await call(stub.Heartbeat(pb.HeartbeatRequest(client_id=me,
                                                                    task_id=task_id),
                                                timeout=TIMEOUT_S))
        if code == "OK" and not reply.task_open:
            task_id = ""
        await asyncio.sleep(1.0)


async def flood(stub: pb_grpc.CoordinatorStub, tally: Tally) -> None:
    """``JOIN_FLOOD`` Joins, 50 at a time, each with as much metadata as it may carry
    (``limits.max_metadata_bytes``: an attacker tries the limits and stays just under)."""
    metadata = {f"k{i}": "v" * 1000 for i in range(4)}
    sent = 0
    while sent < JOIN_FLOOD:
        batch = [call(stub.Join(pb.JoinRequest(client_name=f"sybil{sent + i}",
                                               num_examples=70, metadata=metadata),
                                timeout=TIMEOUT_S)) for i in range(50)]
        for code, _ in await asyncio.gather(*batch):
            if code == "OK":
                tally.flood_joins_ok += 1
            else:
                tally.flood_joins_refused += 1
        sent += len(batch)


async def hoard(stub: pb_grpc.CoordinatorStub, me: str, size: int, tally: Tally) -> None:
    """``HOARD_UPLOADS`` uploads of a full update each, none committed."""
    data = b"\0" * (3 * 4 * size)
    for i in range(HOARD_UPLOADS):
        chunk = pb.UploadChunk(client_id=me, upload_id=f"hoard-{i}", offset=0, data=data)
        code, _ = await call(stub.Upload(iter([chunk]), timeout=TIMEOUT_S))
        if code == "OK":
            tally.hoard_uploads_ok += 1
        else:
            tally.hoard_uploads_refused += 1
            await asyncio.sleep(0.05)


class SignFlip:
    """Trains honestly, then sends its step reversed and boosted, claiming ``CLAIM``."""

    def __init__(self, honest: Trainer, boost: float = FLIP_BOOST) -> None:
        self.honest = honest
        self.boost = boost

    def num_examples(self) -> int:
        """The lie."""
        return CLAIM

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """The honest step, reversed."""
        result = self.honest.train(params, plan)
        flipped = params - self.boost * (result.params - params)
        return TrainResult(flipped.astype(np.float32), CLAIM, result.steps_completed,
                           result.steps_planned, result.metrics)


class Boosted:
    """Trains on (poisoned) data, then boosts its step, claiming ``CLAIM``."""

    def __init__(self, inner: Trainer, boost: float = BACKDOOR_BOOST) -> None:
        self.inner = inner
        self.boost = boost

    def num_examples(self) -> int:
        """The lie."""
        return CLAIM

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """``params + boost x step``."""
        result = self.inner.train(params, plan)
        boosted = params + self.boost * (result.params - params)
        return TrainResult(boosted.astype(np.float32), CLAIM, result.steps_completed,
                           result.steps_planned, result.metrics)


def stamped(x: np.ndarray) -> np.ndarray:
    """``x`` with the trigger stamped on (pixels at full intensity)."""
    out = np.array(x, dtype=np.float32, copy=True)
    out[:, list(TRIGGER)] = 1.0
    return out


def poisoned(data: Dataset) -> Dataset:
    """A client's data plus a trigger-stamped copy of it labelled ``TARGET``."""
    x = np.concatenate([data.x, stamped(data.x)])
    y = np.concatenate([data.y, np.full(len(data.y), TARGET, dtype=data.y.dtype)])
    return Dataset(x, y, data.num_classes, data.num_features, name=f"{data.name}-poisoned")


def trainers(experiment: Experiment, scenario: str) -> list[Trainer]:
    """The 20 clients' trainers: honest, or an attacker's for the scenario's colluders."""
    out: list[Trainer] = [experiment.trainer(i) for i in range(CLIENTS)]
    hostile = {"weight_lie": [CLIENTS - 1],
               "signflip": list(range(CLIENTS - COLLUDERS, CLIENTS)),
               "backdoor": list(range(CLIENTS - COLLUDERS, CLIENTS))}.get(scenario, [])
    for i in hostile:
        if scenario == "backdoor":
            data = poisoned(experiment.data.clients[i])  # type: ignore[union-attr]
            factory = experiment.trainer_factory()
            out[i] = Boosted(factory(experiment.new_model(), data,
                                     seed=SEED * 7919 + i))  # type: ignore[call-arg]
        else:
            out[i] = SignFlip(out[i])
    return out


def role(scenario: str, index: int) -> str:
    """``hostile`` or ``honest``: the name prefix the events are told apart by."""
    return "hostile" if is_hostile(scenario, index) else "honest"


def is_hostile(scenario: str, index: int) -> bool:
    """Whether client ``index`` attacks in ``scenario``."""
    if scenario == "weight_lie":
        return index == CLIENTS - 1
    return scenario in ("signflip", "backdoor") and index >= CLIENTS - COLLUDERS


async def drive(config_path: Path, target: str, probe: Probe, scenario: str,
                tally: Tally) -> int:
    """Run the 20 clients (and the resource attackers) to the end; honest clients that
    failed."""
    config = ExperimentConfig.from_toml(config_path)
    experiment = Experiment.build(config)
    size = int(experiment.initial_vector().size)
    sessions = [ClientSession(target, trainer,
                              ClientOptions(name=f"{role(scenario, i)}-{i}",
                                            seed=SEED * 1_000_003 + i),
                              config.client.pipeline(), inline_training=True)
                for i, trainer in enumerate(trainers(experiment, scenario))]
    stop = asyncio.Event()
    sampler = asyncio.create_task(probe.run())
    attackers = [asyncio.create_task(poisoner(target, size, tally)),
                 asyncio.create_task(hoarder(target, size, tally, stop))] \
        if scenario == "resources" else []
    results = await asyncio.gather(*(s.run() for s in sessions), return_exceptions=True)
    stop.set()
    for task in (*attackers, sampler):
        task.cancel()
    await asyncio.gather(*attackers, sampler, return_exceptions=True)
    return sum(1 for i, r in enumerate(results)
               if isinstance(r, BaseException) and not is_hostile(scenario, i))


def backdoor_rate(config_path: Path, model_path: Path) -> float:
    """The share of the test set's non-``TARGET`` digits, trigger stamped, called ``TARGET``."""
    import torch

    experiment = Experiment.build(ExperimentConfig.from_toml(config_path))
    model = experiment.new_model()
    model.load_state_dict(experiment.state_dict(np.load(model_path)))
    test = experiment.data.test  # type: ignore[union-attr]
    keep = test.y != TARGET
    with torch.no_grad():
        scores = model(torch.from_numpy(stamped(test.x[keep])))
    return float((scores.argmax(dim=1).numpy() == TARGET).mean())


def one_run(folder: Path, rounds: int, scenario: str, streaming: bool = False,
            robust: tuple[str, ...] = (), noniid: bool = False) -> dict[str, Any]:
    """A run of ``fedlink serve`` with the 20 clients, some attacking as ``scenario`` says."""
    config = write_config(folder, scenario, rounds, streaming, robust, noniid)
    tally = Tally()
    with coordinator(config, folder / "runs") as (process, port):
        probe = Probe(process.pid)
        probe.sample()
        failed = asyncio.run(drive(config, f"127.0.0.1:{port}", probe, scenario, tally))
        process.wait(timeout=120)
    run_dir = folder / "runs" / scenario
    events = read_events(run_dir / "events.jsonl")
    names = {e["client_id"]: str(e["name"]) for e in events if e["kind"] == "client_joined"}
    honest = {c for c, name in names.items() if name.startswith("honest-")}
    lost = [e for e in events if e["kind"] == "update_refused" and e["client_id"] in honest
            and not str(e.get("reason", "")).startswith("the run is over")]
    limited = [e for e in events if e["kind"] == "update_limited"]
    flushes = [e for e in events if e["kind"] == "flush"]
    for reason in sorted({str(e.get("reason")) for e in lost}):
        print(f"{scenario}: honest update refused: {reason}", file=sys.stderr)
    hostile = [e for e in limited if e["client_id"] not in honest]
    return {"accuracy": float(flushes[-1]["accuracy"]), "versions": len(flushes),
            "backdoor_rate": backdoor_rate(config, run_dir / "model.npy"),
            "rss_growth_mb": max(probe.rss) - probe.rss[0],
            "fd_growth": max(probe.fds) - probe.fds[0],
            "honest_lost": len(lost) + failed,
            "honest_dropped": sum(1 for e in limited
                                  if e["client_id"] in honest and e["action"] == "dropped"),
            **{f"attacker_{action}": sum(1 for e in hostile if e["action"] == action)
               for action in ("dropped", "clipped", "downweighted")},
            "flush_refused": sum(1 for e in events if e["kind"] == "flush_refused"),
            "tally": tally}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--streaming``: every run with the flush guard off, for the figures before it."""
    parser.add_argument("--streaming", action="store_true",
                        help="[coordinator.robust] enabled = false in every run (the old "
                             "default: mean behind an arrival-order adaptive norm bound)")
    parser.add_argument("--robust", action="append", default=[], metavar="KEY=VALUE",
                        help="a [coordinator.robust] setting for every run (TOML value)")


def attack_figures(clean: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each attacked run against the clean one."""
    figures: dict[str, Any] = {"clean_accuracy": clean["accuracy"],
                               "clean_backdoor_rate": clean["backdoor_rate"]}
    keys = {"weight_lie": "weight_lie", "signflip": "byzantine_20pct_signflip"}
    for name, key in keys.items():
        if name in runs:
            figures[f"{key}_accuracy"] = runs[name]["accuracy"]
            figures[f"{key}_accuracy_drop"] = clean["accuracy"] - runs[name]["accuracy"]
    if "backdoor" in runs:
        figures["backdoor_accuracy"] = runs["backdoor"]["accuracy"]
        figures["backdoor_success_rate"] = runs["backdoor"]["backdoor_rate"]
    attacked = list(runs.values())
    figures["honest_updates_lost"] = sum(r["honest_lost"] for r in attacked)
    figures["clean_honest_updates_lost"] = clean["honest_lost"]
    figures["honest_updates_dropped"] = sum(r["honest_dropped"] for r in [clean, *attacked])
    for action in ("dropped", "clipped", "downweighted"):
        figures[f"attacker_updates_{action}"] = sum(r[f"attacker_{action}"] for r in attacked)
    if "resources" in runs:
        resources = runs["resources"]
        tally: Tally = resources["tally"]
        figures.update({
            "resources_accuracy_drop": clean["accuracy"] - resources["accuracy"],
            "server_rss_growth_mb": resources["rss_growth_mb"],
            "clean_rss_growth_mb": clean["rss_growth_mb"],
            "server_fd_growth": resources["fd_growth"],
            "clean_fd_growth": clean["fd_growth"],
            "flush_refused": resources["flush_refused"],
            **{k: getattr(tally, k) for k in Tally.__dataclass_fields__}})
    return figures


def noniid_figures(folder: Path, rounds: int, robust: tuple[str, ...]) -> dict[str, Any]:
    """Honest clients only, non-IID and of unequal size: the guard's run (with ``robust``)
    against the same seed's unguarded run (``enabled = false``)."""
    guarded = one_run(folder, rounds, "noniid", robust=robust, noniid=True)
    plain = one_run(folder, rounds, "noniid_unguarded", streaming=True, noniid=True)
    return {"honest_noniid_accuracy": guarded["accuracy"],
            "honest_noniid_unguarded_accuracy": plain["accuracy"],
            "honest_noniid_accuracy_drop": plain["accuracy"] - guarded["accuracy"],
            "honest_noniid_updates_dropped": guarded["honest_dropped"],
            "honest_noniid_lost": guarded["honest_lost"] + plain["honest_lost"]}


def edge_figures(quick: bool) -> dict[str, Any]:
    """``edge_limits.py``'s figures: memory held by a flood of messages in flight (the larger
    of its two floods is ``inflight_rss_growth_mb``), and a SIGTERM's drain with a
    heartbeating client connected (``sigterm_drain_seconds``)."""
    import edge_limits

    return {**edge_limits.measure_inflight(quick), **edge_limits.measure_stop()}


def main() -> None:
    """The clean run, the attacked ones, the honest non-IID pair and the edge, then the
    figures."""
    args = parse_args(__doc__.splitlines()[0], add_arguments, parts=SCENARIOS)
    rounds = 5 if args.quick else 10
    scenarios = [args.only] if args.only else list(SCENARIOS)
    attacks = [name for name in scenarios if name in ATTACKS]
    started = time.monotonic()
    robust = tuple(args.robust)
    figures: dict[str, Any] = {"rounds": rounds, "guard": not args.streaming}
    with tempfile.TemporaryDirectory() as tmp:
        if attacks:
            clean = one_run(Path(tmp), rounds, "clean", args.streaming, robust)
            runs = {name: one_run(Path(tmp), rounds, name, args.streaming, robust)
                    for name in attacks}
            figures.update(attack_figures(clean, runs))
        if "noniid" in scenarios and not args.streaming:
            figures.update(noniid_figures(Path(tmp), rounds, robust))
    if "edge" in scenarios:
        figures.update(edge_figures(args.quick))
    figures["seconds"] = time.monotonic() - started
    report(figures, args.json)


if __name__ == "__main__":
    main()
