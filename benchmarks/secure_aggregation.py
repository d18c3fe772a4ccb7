"""Secure aggregation (``fedlink.secagg``): an exact sum through dropouts, what it costs, and
training through it: plain, compressed (the group's random-k) and with distributed DP.

**One round.** ``n`` clients (100, ``--quick`` too) with the update size of the demo's model
(the digits MLP 64-64-10: 8,970 values), default settings (SecAgg over every pair, a 2^24
ring, 16-bit stochastic quantization, threshold one half), 30% of the clients dropping out
after sharing their keys and 10% more after delivering their masked input (so they do not
answer at unmasking): the worst places for a client to vanish. Figures:

- ``exact_sum``: 1 when the unmasked integer sum equals the plain integer sum of the
  survivors' encoded inputs (computed in the clear beside the protocol), else 0;
- ``mean_max_abs_error``: the largest difference between the decoded weighted mean and the
  float weighted mean of the same updates (quantization only), with ``quantization_step``;
- ``secure_bytes_up_ratio``: a delivering client's bytes up over all phases (keys, encrypted
  shares, masked input, unmask answer; median over clients) over the plain fp32 update's bytes
  (target <= 1.15); ``secure_overhead_bytes_per_client`` the part that is not the masked vector;
- ``client_seconds`` (one client's key agreement, sharing and masking, median) and
  ``coordinator_unmask_seconds`` (rebuilding the secrets and removing the masks).

**Sparse graphs through the same dropouts.** The compressed training rounds below use
SecAgg+ with ``NEIGHBOURS`` (8) at threshold one half, and no dropouts. Each graph of
``GRAPHS`` (``neighbours``, ``threshold``, random-k density; the compressed rounds' ring,
``for_cohort(100, 5, 0.3)``) runs ``GRAPH_DRAWS`` rounds (20; ``--quick``: 5) of 100 clients
with the one-round dropouts above, each with its own draw of who drops:
``graph_k<k>_t<threshold x 100>_d<1/density>_survived`` is the fraction of rounds that
unmasked an exact sum, and ``_bytes_ratio`` the plain fp32 update's bytes over a delivering
client's bytes up, all phases, in a round without dropouts: what a compressed secure client
pays for a graph that survives them.

**Training.** FedAvg on digits split among 100 clients (IID), the MLP 64-64-10, every client
in every round (cohort 100), 5 local epochs, batch 8, learning rate 0.2, ``ROUNDS`` rounds
(50; ``--quick``: 10). Every variant starts from the same model and each client trains with
the same seed in the same round; only the aggregate differs. Accuracy is on the test split,
the mean of the last three rounds. Secure rounds use SecAgg+ with 8 neighbours, no dropouts.

- ``plain_accuracy``: the float mean of the deltas. ``secure_accuracy``: the mean decoded
  from a secure round (default ring and quantization); ``secure_accuracy_drop_every_client``
  is plain minus secure: what the encoding alone costs, every client in every round.
- ``secure_compressed_*``: the group's random-k (density 1/4, seed from the round) with error
  feedback on each client, values clipped to 0.3 and quantized to 5 bits in the smallest ring
  that holds a sum of 100 (12 bits), sent packed. ``secure_compressed_bytes_ratio``: the plain
  fp32 update's bytes over a client's bytes up in a compressed secure round, all phases,
  median over clients and rounds (target >= 8); ``secure_compressed_accuracy_drop``: plain
  minus compressed accuracy (target <= 0.015). Against plain compression at the same kept
  fraction: ``plain_topk_q8_*``, each client sending its delta in ``topk+q8`` (the largest
  quarter of the coordinates, 8-bit) with error feedback, as a plain client's pipeline does;
  ``plain_topk_q8_bytes_up`` counts the encoded update alone (median over clients and rounds;
  the call's framing is not counted, which favours plain), ``plain_fp32_bytes_up`` the fp32
  update, and ``secure_compressed_over_topk_q8_bytes`` is the compressed secure client's bytes
  up, all phases, over ``plain_topk_q8_bytes_up``.
- ``central_dp_accuracy``: DP-FedAvg with central noise: each delta clipped to L2 norm 1, the
  coordinator adds N(0, (z * 1)^2) to the sum, z = 1.5; ``central_dp_epsilon`` (RDP, sample
  rate 1, delta 1e-3). ``ddp_accuracy``: distributed DP, each client adds its Skellam share in
  the secure sum, at the noise multiplier ``ddp_noise_multiplier`` whose epsilon
  (``ddp_epsilon``, the Skellam RDP bound) equals the central one;
  ``ddp_accuracy_drop_vs_central`` is central minus distributed (target <= 0.01). The noise
  makes one run's accuracy move by about a point: each DP variant runs ``DP_REPEATS`` times
  (3; ``--quick``: 1) with different noise draws, the two alternating; the accuracies are
  medians and the drop is the median of the paired differences.

**Accuracy on the demo's fleet.** ``secure_accuracy_drop`` (target <= 0.01): the demo in
virtual mode, plain and secure as in the time-to-accuracy pairs below, each run for the demo's
40 versions with no stop at the target; a run's accuracy is the mean of its last three
versions, and the figure is the median over seeds ``ACCURACY_SEEDS`` (120; ``--quick``: 5)
of plain minus secure (``_min``, ``_max``; ``secure_accuracy_demo_plain`` and ``_secure`` the
median accuracies); ``secure_accuracy_drop_wait_all`` is the same with quorum 1, and
``secure_accuracy_drop_group8`` with groups of 8, the plain flush's ``goal``. Elastic
rounds on a poor fleet are where secure groups differ from plain flushes: a version is one
group's sum (a quorum of its members, weighed equally), not the first ``goal`` updates to
arrive.

**Time to accuracy.** ``secure_time_to_accuracy_ratio``: the demo (``make demo``'s
``examples/demo_poor_network.toml``: elastic rounds, 20 clients on the poor fleet, the demo's
target accuracy) run in virtual mode twice with the same seed: as it is (plain, 8-bit qsgd
uplink), and secure (``[coordinator.secure]`` with ``phase_s`` 1 s, the most the demo's 4 s
deadline allows; ``quorum`` 0.8, ``DEMO_QUORUM``: a phase closes once 4 in 5 answered; groups
of 9, ``DEMO_GROUP``, one more than the plain flush's ``goal``, so that a group closes its
share phase once 8 members shared and its masked phase once 7 of those delivered; fp32 before
encoding, as secure runs require; robust flush guard off). A pair's ratio is the secure run's
model seconds to the first version at the target accuracy over the plain run's. The demo's
target sits where its accuracy levels off, so when one run crosses it moves a single pair's
ratio by up to a factor of two: the figure is the median of the pairs of seeds ``TTA_SEEDS``
(30; ``--quick``: the first 5) (target <= 1.5), with ``_min``, ``_max`` and
``secure_tta_ratio_seed<s>``; ``secure_time_to_accuracy_ratio_wait_all`` (with ``_min`` and
``_max``) is the same with quorum 1, every phase waiting for every member, and
``secure_time_to_accuracy_ratio_group8`` with groups of 8.
``secure_tta_<plain|secure>_model_seconds``, ``_versions`` (the version that reached the
target) and ``_seconds_per_version`` (medians over the seeds) split the ratio into how long a
version takes and how many it needs; ``secure_tta_<phase>_*`` are the first seed's secure run's
phase figures (``secure_<phase>_round_trips`` / ``_bytes_up`` / ``_bytes_down``). In both
secure runs a client exchanges its keys while it downloads and trains, as every fedlink client
does.

**Time to accuracy over real gRPC.** The same pairs run over real gRPC sessions on the
fleet's emulated links (``fedlink simulate``'s default mode, as ``make demo`` runs it), for the
seeds ``GRPC_TTA_SEEDS`` (10; ``--quick``: the first), wall seconds from the first task:
``secure_time_to_accuracy_ratio_grpc`` (median, with ``_min`` and ``_max``) and the medians
``secure_tta_grpc_<plain|secure>_seconds``. There the clients train on this machine's CPU in
milliseconds, where the virtual clock charges each local step ``[virtual] step_cost_s`` (0.05 s
at speed 1, a device's pace): a version's time is then almost all network, which the key
exchange can no longer hide behind training, and the ratio is far higher than in virtual mode.
``secure_time_to_accuracy_ratio_grpc_device`` (with ``_min``, ``_max`` and
``secure_tta_grpc_device_<plain|secure>_seconds``) is the same pairs over real gRPC with the
clients training at that device pace (``[run] device_step_s`` = ``DEVICE_STEP_S``, 0.05 s per
step times the client's speed, stopping at the task's deadline): the real sessions and phases
timed as the virtual clock times them, so it checks the virtual ratio on real gRPC.

**Virtual timing against gRPC.** The time-to-accuracy pairs run on the virtual clock, so
the benchmark checks that clock against real gRPC on an emulated link: 4 clients on a link of
``FIDELITY_ONE_WAY_MS`` (200 ms each way, no jitter), 4 rounds of one group each, plain (8-bit
qsgd) and secure (fp32, quorum 1), each run over gRPC (the netem proxy on loopback, wall
time) and in virtual mode (deterministic timing, no training cost). ``fidelity_<plain|secure>
_round_s_<grpc|virtual>`` are the median seconds between consecutive versions,
``fidelity_secure_over_plain_<grpc|virtual>`` their ratios, and
``fidelity_virtual_over_grpc`` the virtual ratio over the gRPC one (1: the virtual clock
charges secure rounds what gRPC does, relative to plain ones).

**Secure groups at scale.** What a secure version costs at cohort 100 and 1,000 (``COHORTS``;
``--quick``: 100), in virtual mode: ``examples/population_1m.toml`` (synthetic clients
training a softmax regression at a device's pace, the mixed poor fleet) with ten times the
cohort in clients, always online, 6 versions of ``cohort`` updates each (``COHORT_VERSIONS``),
plain as it is and secure in groups of the cohort over SecAgg+ (``COHORT_NEIGHBOURS``, 16
neighbours), fp32 before encoding, ``quorum`` ``COHORT_QUORUM`` (0.95). Per cohort ``n``:
``cohort<n>_<plain|secure>_seconds_per_version`` (model seconds) and their ratio
``cohort<n>_secure_over_plain_seconds``, with ``_wait_all`` the same at quorum 1;
``cohort<n>_roster_bytes_per_member`` (the advertise answer), and a delivering member's bytes
over all phases, ``cohort<n>_secure_bytes_up_per_member`` and ``_bytes_down_per_member``,
against ``cohort<n>_plain_bytes_up_per_update``; ``cohort<n>_secure_groups_lost``; and
``cohort<n>_secure_wall_s``, the secure run's wall seconds on this machine.

``load_1min`` is the machine's load average when the run ended.

``--quick`` trains 10 rounds with one noise draw: too few for error feedback to catch up or
for the noise to average out, so the training targets are for the full run.

Run: ``python benchmarks/secure_aggregation.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.client.pipeline import UpdatePipeline
from fedlink.config import load_toml
from fedlink.coordinator.secure import PHASE_NAMES
from fedlink.experiment.config import ExperimentConfig
from fedlink.experiment.virtual import VirtualSection
from fedlink.privacy.accounting import epsilon
from fedlink.privacy.clipping import clip_to_norm
from fedlink.secagg import (
    SecAggAborted,
    SecAggConfig,
    SecureClient,
    SecureSum,
    SharedRandK,
    SkellamConfig,
    decode_sum,
    encode,
    encode_weighted,
    round_seed,
    run_round,
    run_secure_sum,
    scatter,
    weighted_mean,
)
from fedlink.sim.virtual.runner import run_virtual

MODEL_SIZE = 8970  # the digits MLP 64-64-10
SEED = 0
COHORT = 100  # every client of the federation, every round
ROUNDS, QUICK_ROUNDS = 50, 10
LOCAL_EPOCHS = 5
NEIGHBOURS = 8  # SecAgg+ graph of the training rounds
DENSITY = 1 / 4  # the group's random-k
QUANTIZATION_BITS = 5  # with a cohort of 100: a 12-bit ring
COMPRESSED_CLIP = 0.3  # per value, after error feedback
DP_CLIP, DP_Z, DP_DELTA = 1.0, 1.5, 1e-3
DP_REPEATS = 3  # noise draws per DP variant (--quick: 1)


def _dropouts(n: int, rng: np.random.Generator) -> tuple[set[int], set[int]]:
    order = [int(i) for i in rng.permutation(n)]
    after_sharing = set(order[: round(0.3 * n)])
    after_input = set(order[round(0.3 * n): round(0.4 * n)])
    return after_sharing, after_input


def secure_round(n: int) -> dict[str, Any]:
    """One round of ``n`` clients with the benchmark's dropouts; its figures."""
    rng = np.random.default_rng(SEED)
    config = SecAggConfig()
    updates = [rng.normal(0, 0.02, MODEL_SIZE) for _ in range(n)]
    weights = [float(w) for w in rng.uniform(0.2, 1.0, n)]
    after_sharing, after_input = _dropouts(n, rng)
    size = MODEL_SIZE + 1
    clients = [SecureClient(i, config, SEED, size) for i in range(n)]
    server = SecureSum(config, SEED, size, graph_seed=SEED)
    up = dict.fromkeys(range(n), 0)
    seconds = dict.fromkeys(range(n), 0.0)
    adverts = []
    for c in clients:
        began = time.perf_counter()
        adverts.append(c.advertise())
        seconds[c.client] += time.perf_counter() - began
        up[c.client] += adverts[-1].wire_bytes()
    roster = server.collect_keys(adverts)
    for c in clients:
        began = time.perf_counter()
        shares = c.share_keys(roster, SEED)
        seconds[c.client] += time.perf_counter() - began
        up[c.client] += sum(s.wire_bytes() for s in shares)
        server.collect_shares(c.client, shares)
    server.close_sharing()
    plain = np.zeros(size, dtype=np.uint32)
    masked_bytes = 0
    for c in clients:
        if c.client in after_sharing:
            continue
        encoded = encode_weighted(updates[c.client], weights[c.client], config, rng).values
        plain += encoded
        began = time.perf_counter()
        c.receive_shares(server.shares_for(c.client))
        masked = c.masked_input(encoded)
        seconds[c.client] += time.perf_counter() - began
        masked_bytes = masked.wire_bytes(config)
        up[c.client] += masked_bytes
        server.collect_masked(masked)
    request = server.unmask_request()
    answers = []
    for c in clients:
        if c.client in after_sharing or c.client in after_input:
            continue
        answers.append(c.unmask(request))
        up[c.client] += answers[-1].wire_bytes()
    began = time.perf_counter()
    total, count = server.finish(answers)
    unmask_s = time.perf_counter() - began
    plain &= np.uint32(config.modulus - 1)
    alive = sorted(request.survivors)
    mean, _ = weighted_mean(total, count, config)
    expected = sum(weights[i] * updates[i] for i in alive) / sum(weights[i] for i in alive)
    delivering = [up[i] for i in alive]
    return {
        "clients": n, "model_values": MODEL_SIZE,
        "dropped_after_sharing": len(after_sharing), "dropped_after_input": len(after_input),
        "exact_sum": int(np.array_equal(total, plain)),
        "mean_max_abs_error": float(np.max(np.abs(mean - expected))),
        "quantization_step": config.step,
        "secure_bytes_up_ratio": statistics.median(delivering) / (4 * MODEL_SIZE),
        "secure_overhead_bytes_per_client": statistics.median(delivering) - masked_bytes,
        "client_seconds": statistics.median(seconds[i] for i in alive),
        "coordinator_unmask_seconds": unmask_s,
    }


GRAPHS = ((8, 0.5, 4), (16, 1 / 3, 4), (24, 1 / 3, 4), (24, 1 / 3, 8))
"""``(neighbours, threshold, 1 / density)`` of the sparse-graph figures."""
GRAPH_DRAWS, QUICK_GRAPH_DRAWS = 20, 5


def _graph_round(config: SecAggConfig, kept: int, dropouts: tuple[set[int], set[int]],
                 seed: int) -> tuple[bool, float]:
    """One compressed round of ``COHORT`` clients: (its sum was exact, the median delivering
    client's bytes up)."""
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(0, config.levels + 1, kept).astype(np.uint32) for _ in range(COHORT)]
    try:
        result = run_secure_sum(inputs, config, drop_after_sharing=dropouts[0],
                                drop_after_input=dropouts[1], seed=seed)
    except SecAggAborted:
        return False, math.nan
    return result.exact, statistics.median(result.bytes_up[i] for i in result.delivered)


def sparse_graphs(draws: int) -> dict[str, Any]:
    """Each of ``GRAPHS`` through ``draws`` dropout draws, and its bytes without dropouts."""
    figures: dict[str, Any] = {"graph_draws": draws}
    for neighbours, threshold, inverse_density in GRAPHS:
        config = SecAggConfig.for_cohort(COHORT, QUANTIZATION_BITS, COMPRESSED_CLIP,
                                         neighbours=neighbours, threshold=threshold)
        kept = int(MODEL_SIZE / inverse_density)
        survived = sum(_graph_round(config, kept, _dropouts(COHORT, np.random.default_rng(d)),
                                    d)[0] for d in range(draws))
        _, bytes_up = _graph_round(config, kept, (set(), set()), draws)
        name = f"graph_k{neighbours}_t{round(100 * threshold)}_d{inverse_density}"
        figures[f"{name}_survived"] = survived / draws
        figures[f"{name}_bytes_ratio"] = 4 * MODEL_SIZE / bytes_up
    return figures


@dataclass
class Federation:
    """The demo task: digits split among ``clients`` clients, the MLP 64-64-10."""

    trainers: list[Any]
    test: Any
    start: np.ndarray
    plan: dict[str, Any]

    @property
    def size(self) -> int:
        """Values in the model."""
        return int(self.start.size)


def federation(clients: int) -> Federation:
    """One trainer per client over one shared working model (``train`` loads its weights)."""
    import torch

    from fedlink.client.torch_trainer import TorchTrainer
    from fedlink.data import load_federated
    from fedlink.models import build_model
    from fedlink.params import to_vector

    torch.set_num_threads(1)
    data = load_federated("digits", clients, SEED, None)
    model = build_model("mlp", data.num_features, data.num_classes, seed=SEED, hidden=[64, 64])
    return Federation([TorchTrainer(model, d) for d in data.clients],
                      TorchTrainer(model, data.test), to_vector(model).astype(np.float64),
                      {"local_epochs": LOCAL_EPOCHS, "batch_size": 8, "learning_rate": 0.2})


Aggregate = Callable[[list[np.ndarray], int], np.ndarray]
"""``(the round's client deltas, round) -> the mean delta the server applies``."""


def train(fed: Federation, rounds: int, aggregate: Aggregate) -> float:
    """FedAvg of every client each round through ``aggregate``; the test accuracy, averaged
    over the last three rounds (one test example is 0.28 points: the mean damps that)."""
    from fedlink.client import TrainPlan

    weights, accuracies = fed.start.copy(), []
    for r in range(rounds):
        deltas = []
        for i, trainer in enumerate(fed.trainers):
            plan = TrainPlan(seed=r * 1000 + i, **fed.plan)
            deltas.append(trainer.train(weights.astype(np.float32), plan).params - weights)
        weights = weights + aggregate(deltas, r)
        if r >= rounds - 3:
            accuracies.append(fed.test.evaluate(weights.astype(np.float32))["accuracy"])
    return float(np.mean(accuracies))


def plain_mean(deltas: list[np.ndarray], r: int) -> np.ndarray:
    """The float mean, in the clear."""
    return np.mean(deltas, axis=0)


def secure_mean(deltas: list[np.ndarray], r: int) -> np.ndarray:
    """The mean from a secure round (default ring and quantization, SecAgg+ graph)."""
    config = SecAggConfig(neighbours=NEIGHBOURS)
    result = run_round(deltas, [1.0] * len(deltas), config, seed=r)
    return weighted_mean(result.total, len(result.delivered), config)[0]


@dataclass
class CompressedMean:
    """The mean from a secure round of the group's random-k, with error feedback."""

    size: int
    clients: int
    randk: SharedRandK = field(default_factory=lambda: SharedRandK(DENSITY))
    config: SecAggConfig = field(default_factory=lambda: SecAggConfig.for_cohort(
        COHORT, QUANTIZATION_BITS, COMPRESSED_CLIP, neighbours=NEIGHBOURS))
    bytes_up: list[float] = field(default_factory=list)
    residuals: dict[int, np.ndarray] = field(default_factory=dict)

    def __call__(self, deltas: list[np.ndarray], r: int) -> np.ndarray:
        """One round: keep, encode (feeding back what encoding lost), secure sum, scatter."""
        indices = self.randk.indices(round_seed(SEED, r), self.size)
        rng = np.random.default_rng(r)
        inputs = []
        for i, delta in enumerate(deltas):
            kept, self.residuals[i] = self.randk.keep(delta, self.residuals.get(i), indices)
            encoded = encode(kept, self.config, rng).values
            self.randk.carry(self.residuals[i], indices, kept,
                             decode_sum(encoded, 1, self.config))
            inputs.append(encoded)
        result = run_secure_sum(inputs, self.config, seed=r)
        self.bytes_up.append(statistics.median(result.bytes_up[i] for i in result.delivered))
        mean = decode_sum(result.total, len(result.delivered), self.config) / len(result.delivered)
        return scatter(mean, indices, self.size)


@dataclass
class PlainCodecMean:
    """The float mean of the clients' deltas, each sent through a plain client's own update
    pipeline in the codec ``codec`` at ``density`` (with error feedback, on for a biased
    codec): the compressed plain uplink that group random-k is measured against."""

    codec: str
    density: float
    bytes_up: list[float] = field(default_factory=list)
    pipelines: dict[int, UpdatePipeline] = field(default_factory=dict)

    def __call__(self, deltas: list[np.ndarray], r: int) -> np.ndarray:
        """One round: each client's pipeline encodes its delta (keeping what the encoding
        lost); the mean of what the coordinator decodes."""
        rng = np.random.default_rng([SEED, r])
        decoded, sizes = [], []
        for i, delta in enumerate(deltas):
            pipeline = self.pipelines.setdefault(i, UpdatePipeline.from_names(
                compression=self.codec, compression_options={"density": self.density}))
            payload = pipeline.compress(delta.astype(np.float32), rng, checksums=False)
            decoded.append(pipeline.codec.decode(payload.data, payload.header.codec_params,
                                                 delta.size).astype(np.float64))
            sizes.append(len(payload.data))
        self.bytes_up.append(statistics.median(sizes))
        return np.mean(decoded, axis=0)


def central_dp_mean(z: float, repeat: int) -> Aggregate:
    """DP-FedAvg, central: clip each delta to ``DP_CLIP``, mean, Gaussian of std ``z * S / n``
    (noise drawn from a generator seeded by ``repeat`` and the round)."""
    def aggregate(deltas: list[np.ndarray], r: int) -> np.ndarray:
        clipped = [clip_to_norm(d, DP_CLIP)[0].astype(np.float64) for d in deltas]
        noise = np.random.default_rng([repeat, r]).normal(0, z * DP_CLIP, clipped[0].size)
        return (np.sum(clipped, axis=0) + noise) / len(deltas)
    return aggregate


def distributed_dp_mean(config: SkellamConfig, repeat: int) -> Aggregate:
    """Each client clips, rounds and adds its Skellam share; the secure sum, over ``n``."""
    def aggregate(deltas: list[np.ndarray], r: int) -> np.ndarray:
        rng = np.random.default_rng([repeat, r])
        inputs = [config.encode(d, rng) for d in deltas]
        result = run_secure_sum(inputs, config.ring(neighbours=NEIGHBOURS), seed=r)
        assert result.exact
        return config.decode_sum(result.total) / len(result.delivered)
    return aggregate


def matched_ddp(z_central: float, rounds: int, size: int) -> SkellamConfig:
    """The Skellam noise whose epsilon after ``rounds`` equals central DP-FedAvg's at
    ``z_central`` (every client every round: sample rate 1), by bisection on ``z``."""
    target = epsilon(z_central, 1.0, rounds, DP_DELTA)

    def config(z: float) -> SkellamConfig:
        return SkellamConfig(DP_CLIP, z, COHORT, size)

    low, high = z_central, 2 * z_central
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if config(middle).epsilon(rounds, DP_DELTA) > target \
            else (low, middle)
    return config(high)


def dp_training(fed: Federation, rounds: int, repeats: int) -> dict[str, float]:
    """Central and distributed DP at the same epsilon, ``repeats`` noise draws each, run in
    alternation; their medians and the median of the paired differences."""
    ddp = matched_ddp(DP_Z, rounds, fed.size)
    central, distributed = [], []
    for repeat in range(repeats):
        central.append(train(fed, rounds, central_dp_mean(DP_Z, repeat)))
        distributed.append(train(fed, rounds, distributed_dp_mean(ddp, repeat)))
    return {
        "central": statistics.median(central), "ddp": statistics.median(distributed),
        "drop": statistics.median(c - d for c, d in zip(central, distributed, strict=True)),
        "ddp_z": ddp.noise_multiplier, "ddp_epsilon": ddp.epsilon(rounds, DP_DELTA),
        "granularity_bits": ddp.granularity_bits, "modulus_bits": ddp.modulus_bits,
    }


def training(rounds: int, dp_repeats: int) -> dict[str, Any]:
    """Accuracy of secure, compressed-secure and distributed-DP training against their
    baselines, all from the same clients' same local training."""
    fed = federation(COHORT)
    compressed = CompressedMean(fed.size, COHORT)
    topk = PlainCodecMean("topk+q8", DENSITY)
    accuracy = {
        "plain": train(fed, rounds, plain_mean),
        "secure": train(fed, rounds, secure_mean),
        "compressed": train(fed, rounds, compressed),
        "topk": train(fed, rounds, topk),
    }
    secure_bytes = statistics.median(compressed.bytes_up)
    topk_bytes = statistics.median(topk.bytes_up)
    dp = dp_training(fed, rounds, dp_repeats)
    return {
        "training_rounds": rounds, "training_clients": COHORT,
        "plain_accuracy": accuracy["plain"], "secure_accuracy": accuracy["secure"],
        "secure_accuracy_drop_every_client": accuracy["plain"] - accuracy["secure"],
        "secure_compressed_accuracy": accuracy["compressed"],
        "secure_compressed_accuracy_drop": accuracy["plain"] - accuracy["compressed"],
        "secure_compressed_bytes_ratio": 4 * fed.size / secure_bytes,
        "secure_compressed_bytes_up": secure_bytes,
        "plain_fp32_bytes_up": 4 * fed.size,
        "plain_topk_q8_accuracy": accuracy["topk"],
        "plain_topk_q8_accuracy_drop": accuracy["plain"] - accuracy["topk"],
        "plain_topk_q8_bytes_up": topk_bytes,
        "secure_compressed_over_topk_q8_bytes": secure_bytes / topk_bytes,
        "secure_compressed_density": DENSITY,
        "secure_compressed_modulus_bits": compressed.config.modulus_bits,
        "secure_compressed_quantization_bits": compressed.config.bits,
        "secure_compressed_clip": COMPRESSED_CLIP,
        "secure_neighbours": NEIGHBOURS,
        "central_dp_accuracy": dp["central"], "ddp_accuracy": dp["ddp"],
        "ddp_accuracy_drop_vs_central": dp["drop"], "dp_repeats": dp_repeats,
        "dp_clip": DP_CLIP, "dp_delta": DP_DELTA,
        "central_dp_noise_multiplier": DP_Z, "ddp_noise_multiplier": dp["ddp_z"],
        "central_dp_epsilon": epsilon(DP_Z, 1.0, rounds, DP_DELTA),
        "ddp_epsilon": dp["ddp_epsilon"],
        "ddp_granularity_bits": dp["granularity_bits"], "ddp_modulus_bits": dp["modulus_bits"],
    }


DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo_poor_network.toml"
DEMO_PHASE_S = 1.0


TTA_SEEDS = tuple(range(30))
"""The seeds of the paired time-to-accuracy runs: the demo's target sits near where its
accuracy levels off, so one seed's crossing moves the ratio by a factor of two, and the
median of five moved by 0.3 from one set of five seeds to the next, and one of fifteen by
0.03."""

QUICK_TTA_SEEDS = TTA_SEEDS[:5]
"""``--quick``'s seeds."""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    """A run's event log, as records."""
    with open(run_dir / "events.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _first_at_target(events: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first flush whose version reached ``target`` accuracy (``None``: none did)."""
    return next((e for e in events if e.get("kind") == "flush"
                 and (e.get("accuracy") or 0.0) >= target), None)


def _time_to_target(table: dict[str, Any],
                    workdir: Path) -> tuple[float, int, dict[str, Any]]:
    """Model seconds from the start to the first version at the run's target accuracy
    (infinity when none reaches it), that version's number (0: none) and the run's summary."""
    config = ExperimentConfig.from_dict(table)
    result = run_virtual(config, workdir, progress=False, report=False)
    hit = _first_at_target(_events(result.run_dir), config.run.target_accuracy)
    if hit is None:
        return math.inf, 0, result.summary
    return float(hit["model_seconds"]), int(hit["model_version"]), result.summary


DEMO_QUORUM = 0.8
"""The secure run's ``quorum``: on this fleet one member in a blackout would hold every phase
of its group up to ``phase_s``; ``_wait_all`` figures are the same runs with quorum 1. A group
then goes on without its slowest member in each phase. At 0.75 the two phases' quorums
compound (a group of 8 sums 5 updates where a plain flush sums 8), and the secure run ends
more than a point of accuracy below plain after the demo's 40 versions."""

DEMO_GROUP = 9
"""The secure run's group (its ``flush.goal``; ``over_selection`` stays the demo's 2, so two groups
train at a time): one member more than the plain flush's ``goal`` of 8, as
docs/secure-aggregation.md advises for a quorum below 1. At ``DEMO_QUORUM`` a group of 9 stops
waiting once 8 shared and 7 of those delivered, where a group of 8 stops at 6 (the ``_group8``
figures)."""


VARIANTS = {"": (DEMO_QUORUM, DEMO_GROUP), "_wait_all": (1.0, DEMO_GROUP),
            "_group8": (DEMO_QUORUM, 8)}
"""The secure runs measured against plain, by the suffix of their figures: ``(quorum,
group)``; the unsuffixed one is the benchmark's secure side."""


def _tta_tables(seed: int, quorum: float,
                group: int = DEMO_GROUP) -> tuple[dict[str, Any], dict[str, Any]]:
    """The demo as it is (plain) and with secure aggregation in groups of ``group``, both in
    virtual mode."""
    plain = load_toml(DEMO)
    plain["run"] = {**plain["run"], "mode": "virtual", "name": "tta-plain", "seed": seed}
    secure = copy.deepcopy(plain)
    secure["run"]["name"] = "tta-secure"
    secure["client"] = {"compression": "fp32"}
    secure["coordinator"] = {**secure["coordinator"], "robust": {"enabled": False},
                             "flush": {**secure["coordinator"]["flush"], "goal": group},
                             "norm_bound_adaptive": False,
                             "secure": {"enabled": True, "phase_s": DEMO_PHASE_S,
                                        "quorum": quorum}}
    return plain, secure


def secure_time_to_accuracy(seeds: tuple[int, ...]) -> dict[str, Any]:
    """The demo in virtual mode, plain and secure, paired by ``seeds`` (see the docstring)."""
    pairs: list[tuple[tuple[float, int, dict[str, Any]], ...]] = []
    ratios_by: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as workdir:
        for seed in seeds:
            plain_run = _time_to_target(_tta_tables(seed, DEMO_QUORUM)[0], Path(workdir))
            for name, (quorum, group) in VARIANTS.items():
                run = _time_to_target(_tta_tables(seed, quorum, group)[1], Path(workdir))
                ratios_by[name].append(run[0] / plain_run[0])
                if not name:
                    pairs.append((plain_run, run))
    figures: dict[str, Any] = {}
    for name, ratios in ratios_by.items():
        figures |= {f"secure_time_to_accuracy_ratio{name}": statistics.median(ratios),
                    f"secure_time_to_accuracy_ratio{name}_min": min(ratios),
                    f"secure_time_to_accuracy_ratio{name}_max": max(ratios)}
    figures |= {
        "secure_tta_seeds": len(seeds), "secure_tta_group": DEMO_GROUP,
        "secure_tta_target_accuracy": load_toml(DEMO)["run"]["target_accuracy"],
        "secure_tta_phase_s": DEMO_PHASE_S, "secure_tta_quorum": DEMO_QUORUM}
    for (plain_run, secure_run), seed in zip(pairs, seeds, strict=True):
        figures[f"secure_tta_ratio_seed{seed}"] = secure_run[0] / plain_run[0]
    for name, runs in (("plain", [p for p, _ in pairs]), ("secure", [s for _, s in pairs])):
        reached = [r for r in runs if r[1]]
        figures[f"secure_tta_{name}_model_seconds"] = statistics.median(r[0] for r in runs)
        figures[f"secure_tta_{name}_versions"] = statistics.median(r[1] or math.inf
                                                                   for r in runs)
        figures[f"secure_tta_{name}_seconds_per_version"] = statistics.median(
            r[0] / r[1] for r in reached) if reached else math.inf
    summary = pairs[0][1][2]  # the first seed's secure run: its phases' counts
    figures |= {f"secure_tta_{k.removeprefix('secure_')}": v for k, v in summary.items()
                if k.startswith("secure_")}
    return figures


ACCURACY_SEEDS = tuple(range(120))
"""The seeds of the paired accuracy runs on the demo's fleet (``--quick``: the first 5): one
pair's drop moves by a point or two with its seed, and a median of thirty by half a point
from one set of seeds to the next (of sixty, by about a fifth of a point)."""


def _demo_pairs(seeds: tuple[int, ...],
                measure: Callable[[dict[str, Any], Path], float]) -> list[tuple[float, float]]:
    """``measure`` of the demo as it is and secure (``_tta_tables``), a pair per seed."""
    with tempfile.TemporaryDirectory() as workdir:
        return [(measure(plain, Path(workdir)), measure(secure, Path(workdir)))
                for plain, secure in (_tta_tables(seed, DEMO_QUORUM) for seed in seeds)]


def _last_accuracy(table: dict[str, Any], workdir: Path) -> float:
    """The mean accuracy of the last three versions of a virtual run of ``table`` that makes
    every version its ``rounds`` ask for (no stop at the target accuracy)."""
    table = {**table, "run": {k: v for k, v in table["run"].items()
                              if k != "target_accuracy"}}
    result = run_virtual(ExperimentConfig.from_dict(table), workdir, progress=False,
                         report=False)
    accuracies = [e["accuracy"] for e in _events(result.run_dir)
                  if e.get("kind") == "flush" and e.get("accuracy") is not None]
    return statistics.mean(accuracies[-3:])


def _seed_accuracies(seed: int) -> dict[str, float]:
    """One seed's last accuracies: ``"plain"``'s, and each of ``VARIANTS``' by its suffix."""
    with tempfile.TemporaryDirectory() as workdir:
        accuracies = {"plain": _last_accuracy(_tta_tables(seed, DEMO_QUORUM)[0], Path(workdir))}
        for name, (quorum, group) in VARIANTS.items():
            accuracies[name] = _last_accuracy(_tta_tables(seed, quorum, group)[1], Path(workdir))
    return accuracies


def secure_accuracy_on_the_demo_fleet(seeds: tuple[int, ...]) -> dict[str, Any]:
    """``secure_accuracy_drop``: the demo, plain and secure (the time-to-accuracy pairs' tables),
    each run for the demo's ``rounds`` versions; plain minus secure accuracy, median of the
    pairs; ``_wait_all``: the same with quorum 1, ``_group8``: groups of 8. The seeds run in
    a process each, as many at once as there are cores: virtual runs time nothing by the wall
    clock, so each gives the same figures however many run beside it."""
    with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) \
            as pool:
        runs = list(pool.map(_seed_accuracies, seeds))
    drops = [r["plain"] - r[""] for r in runs]
    return {**{f"secure_accuracy_drop{name}": statistics.median(r["plain"] - r[name]
                                                                 for r in runs)
               for name in VARIANTS},
            "secure_accuracy_drop_min": min(drops), "secure_accuracy_drop_max": max(drops),
            "secure_accuracy_demo_plain": statistics.median(r["plain"] for r in runs),
            "secure_accuracy_demo_secure": statistics.median(r[""] for r in runs),
            "secure_accuracy_demo_seeds": len(seeds), "secure_accuracy_demo_group": DEMO_GROUP}


GRPC_TTA_SEEDS = tuple(range(10))
"""The seeds of the paired time-to-accuracy runs over real gRPC (``--quick``: the first): real
links with blackouts and resets move one pair's ratio by up to 0.4 between two runs."""


def _grpc_time_to_target(table: dict[str, Any], workdir: Path,
                         device_step_s: float = 0.0) -> float:
    """Wall seconds from the first task to the first version at the run's target accuracy,
    the run over real gRPC on the fleet's emulated links (infinity when none reaches it),
    its clients training at this machine's pace or (``device_step_s``) a device's."""
    from fedlink.metrics import read_events
    from fedlink.metrics.summary import first_task_elapsed
    from fedlink.sim import run_simulation

    table = {**table, "run": {**table["run"], "mode": "grpc"}}
    if device_step_s:
        table["run"]["device_step_s"] = device_step_s
    config = ExperimentConfig.from_dict(table)
    result = run_simulation(config, workdir, progress=False)
    hit = _first_at_target(_events(result.run_dir), config.run.target_accuracy)
    started = first_task_elapsed(read_events(result.run_dir / "events.jsonl"))
    return math.inf if hit is None else float(hit["elapsed"]) - started


DEVICE_STEP_S = VirtualSection.step_cost_s
"""The device pace of the gRPC pairs that train like the virtual ones: ``[run]
device_step_s`` at virtual mode's default ``step_cost_s`` (0.05 s per local step)."""


def secure_time_to_accuracy_grpc(seeds: tuple[int, ...]) -> dict[str, Any]:
    """The time-to-accuracy pairs over real gRPC, at this machine's pace
    (``secure_time_to_accuracy_ratio_grpc``) and at a device's
    (``secure_time_to_accuracy_ratio_grpc_device``; see the docstring)."""
    figures: dict[str, Any] = {"secure_tta_grpc_seeds": len(seeds),
                               "secure_tta_grpc_device_step_s": DEVICE_STEP_S}
    for name, step_s in (("grpc", 0.0), ("grpc_device", DEVICE_STEP_S)):
        pairs = _demo_pairs(seeds, functools.partial(_grpc_time_to_target,
                                                     device_step_s=step_s))
        ratios = [s / p for p, s in pairs]
        figures |= {
            f"secure_time_to_accuracy_ratio_{name}": statistics.median(ratios),
            f"secure_time_to_accuracy_ratio_{name}_min": min(ratios),
            f"secure_time_to_accuracy_ratio_{name}_max": max(ratios),
            f"secure_tta_{name}_plain_seconds": statistics.median(p for p, _ in pairs),
            f"secure_tta_{name}_secure_seconds": statistics.median(s for _, s in pairs)}
    return figures


FIDELITY_ONE_WAY_MS = 200.0
"""The fidelity check's link: 200 ms each way, no jitter, so that round trips dominate."""


def _fidelity_table(mode: str, secure: bool) -> dict[str, Any]:
    """4 clients, each round every one of them (one secure group), the demo's model and
    codecs, on the fidelity link; deterministic timing in virtual mode."""
    table: dict[str, Any] = {
        "run": {"name": f"fidelity-{mode}", "seed": 3, "mode": mode},
        "data": {"dataset": "digits", "clients": 4},
        "model": {"name": "mlp", "options": {"hidden": [64, 64]}},
        "client": ({"compression": "fp32"} if secure else
                   {"compression": "qsgd", "compression_options": {"bits": 8}}),
        "coordinator": {"rounds": 4, "flush": {"goal": 4, "min_updates": 4, "deadline_s": 30.0},
                        "training": {"local_steps": 2, "batch_size": 16}},
        "network": {"profile": {"base": "4g", "latency_ms": FIDELITY_ONE_WAY_MS,
                                "jitter_ms": 0}}}
    if mode == "virtual":  # a gRPC run refuses the [virtual] table
        table["virtual"] = {"deterministic": True, "step_cost_s": 0.0}
    if secure:
        table["coordinator"] |= {"secure": {"enabled": True, "phase_s": 5.0, "quorum": 1.0},
                                 "robust": {"enabled": False}, "norm_bound_adaptive": False}
    return table


def _round_seconds(mode: str, secure: bool, workdir: Path) -> float:
    """The median time between consecutive versions (wall seconds over gRPC, model seconds
    in virtual mode)."""
    from fedlink.sim import run_simulation

    result = run_simulation(ExperimentConfig.from_dict(_fidelity_table(mode, secure)),
                            workdir, progress=False)
    flushes = [e for e in _events(result.run_dir) if e.get("kind") == "flush"]
    times = [e["model_seconds"] if mode == "virtual" else e["t"] for e in flushes]
    return statistics.median(b - a for a, b in itertools.pairwise(times))


def virtual_fidelity() -> dict[str, Any]:
    """A plain and a secure round, over real gRPC on emulated links and in virtual mode (see
    the docstring): how well the virtual clock times what the time-to-accuracy pairs measure."""
    figures: dict[str, Any] = {"fidelity_one_way_ms": FIDELITY_ONE_WAY_MS}
    with tempfile.TemporaryDirectory() as workdir:
        for name, secure in (("plain", False), ("secure", True)):
            for mode in ("grpc", "virtual"):
                figures[f"fidelity_{name}_round_s_{mode}"] = _round_seconds(
                    mode, secure, Path(workdir))
    ratios = {mode: figures[f"fidelity_secure_round_s_{mode}"]
              / figures[f"fidelity_plain_round_s_{mode}"] for mode in ("grpc", "virtual")}
    figures["fidelity_secure_over_plain_grpc"] = ratios["grpc"]
    figures["fidelity_secure_over_plain_virtual"] = ratios["virtual"]
    figures["fidelity_virtual_over_grpc"] = ratios["virtual"] / ratios["grpc"]
    return figures


COHORTS = (100, 1000)
"""The secure group sizes of the cohort figures (``--quick``: the first)."""

COHORT_NEIGHBOURS = 16
"""SecAgg+'s neighbours per member in the cohort runs (about 2 log2 n at n = 1,000)."""

COHORT_QUORUM = 0.95
"""The cohort runs' ``quorum``: in a group of 1,000 on the poor fleet some member is nearly
always in an outage, which holds every phase of a group that waits for all (the
``_wait_all`` figures, quorum 1)."""

COHORT_VERSIONS = 6
"""Versions per cohort run: a member in an outage holds a group that waits for all for up to
``phase_s``, so a few versions more keep one outage from deciding the ``_wait_all`` figure."""

POPULATION = Path(__file__).resolve().parents[1] / "examples" / "population_1m.toml"


def _cohort_table(cohort: int, quorum: float | None) -> dict[str, Any]:
    """``examples/population_1m.toml`` (synthetic clients, the mixed poor fleet) with
    ``10 * cohort`` clients always online and ``COHORT_VERSIONS`` versions of ``cohort``
    updates; with a ``quorum``, secure groups of ``cohort`` over SecAgg+
    (``COHORT_NEIGHBOURS``), fp32 before encoding."""
    table = load_toml(POPULATION)
    table["run"] = {**table["run"], "name": f"cohort{cohort}"}
    table["virtual"] = {**{k: v for k, v in table["virtual"].items() if k != "online_fraction"},
                        "population": 10 * cohort, "availability": "always"}
    table["coordinator"] = {**table["coordinator"], "rounds": COHORT_VERSIONS,
                            "flush": {**table["coordinator"]["flush"], "goal": cohort,
                                      "min_updates": cohort // 2}}
    if quorum is not None:
        table["client"] = {"compression": "fp32"}
        table["coordinator"] |= {"robust": {"enabled": False}, "norm_bound_adaptive": False,
                                 "secure": {"enabled": True, "neighbours": COHORT_NEIGHBOURS,
                                            "phase_s": 60.0, "quorum": quorum}}
    return table


def _cohort_run(cohort: int, quorum: float | None, workdir: Path) -> dict[str, Any]:
    """One virtual run's summary, with its wall seconds (``wall``) and model seconds per
    version (``per_version``)."""
    config = ExperimentConfig.from_dict(_cohort_table(cohort, quorum))
    started = time.perf_counter()
    summary = run_virtual(config, workdir, progress=False, report=False).summary
    return {**summary, "wall": time.perf_counter() - started,
            "per_version": summary["model_seconds"] / summary["final_model_version"]}


def _cohort_figures(n: int, plain: dict[str, Any], secure: dict[str, Any],
                    waiting: dict[str, Any]) -> dict[str, Any]:
    """The figures of cohort ``n`` from its plain, secure and secure wait-all runs."""
    members = secure["secure_masked_round_trips"]
    return {
        f"cohort{n}_plain_seconds_per_version": plain["per_version"],
        f"cohort{n}_secure_seconds_per_version": secure["per_version"],
        f"cohort{n}_secure_over_plain_seconds": secure["per_version"] / plain["per_version"],
        f"cohort{n}_secure_over_plain_seconds_wait_all": waiting["per_version"]
        / plain["per_version"],
        f"cohort{n}_roster_bytes_per_member": secure["secure_advertise_bytes_down"]
        / secure["secure_advertise_round_trips"],
        f"cohort{n}_secure_bytes_up_per_member": sum(
            secure[f"secure_{p}_bytes_up"] for p in PHASE_NAMES.values()) / members,
        f"cohort{n}_secure_bytes_down_per_member": sum(
            secure[f"secure_{p}_bytes_down"] for p in PHASE_NAMES.values()) / members,
        f"cohort{n}_plain_bytes_up_per_update": plain["bytes_up"] / plain["updates_accepted"],
        f"cohort{n}_secure_groups_lost": secure["secure_groups_lost"],
        f"cohort{n}_secure_wall_s": secure["wall"]}


def secure_cohorts(cohorts: tuple[int, ...]) -> dict[str, Any]:
    """Secure groups of 100 and 1,000 in virtual mode against plain flushes of as many updates
    (see the docstring): what a secure version costs at scale, in model time and bytes."""
    figures: dict[str, Any] = {"cohort_neighbours": COHORT_NEIGHBOURS,
                               "cohort_quorum": COHORT_QUORUM}
    with tempfile.TemporaryDirectory() as workdir:
        for n in cohorts:
            figures |= _cohort_figures(n, _cohort_run(n, None, Path(workdir)),
                                       _cohort_run(n, COHORT_QUORUM, Path(workdir)),
                                       _cohort_run(n, 1.0, Path(workdir)))
    return figures



def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    figures = secure_round(COHORT)
    figures.update(sparse_graphs(QUICK_GRAPH_DRAWS if args.quick else GRAPH_DRAWS))
    figures.update(training(QUICK_ROUNDS, 1) if args.quick else training(ROUNDS, DP_REPEATS))
    figures.update(secure_accuracy_on_the_demo_fleet(ACCURACY_SEEDS[:5] if args.quick
                                                     else ACCURACY_SEEDS))
    figures.update(secure_time_to_accuracy(QUICK_TTA_SEEDS if args.quick else TTA_SEEDS))
    figures.update(secure_time_to_accuracy_grpc(GRPC_TTA_SEEDS[:1] if args.quick
                                                else GRPC_TTA_SEEDS))
    figures.update(virtual_fidelity())
    figures.update(secure_cohorts(COHORTS[:1] if args.quick else COHORTS))
    figures["load_1min"] = os.getloadavg()[0]
    report(figures, args.json)


if __name__ == "__main__":
    main()
