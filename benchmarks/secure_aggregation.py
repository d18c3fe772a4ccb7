"""Secure aggregation (``fedlink.secagg``): an exact sum through dropouts, and what it costs.

One secure round of ``n`` clients (100; ``--quick``: 30) with the update size of the demo's
model (the digits MLP 64-64-10: 8,970 values), default settings (SecAgg over every pair, a
2^24 ring, 16-bit stochastic quantization, threshold one half), 30% of the clients dropping
out after sharing their keys and 10% more after delivering their masked input (so they do not
answer at unmasking): the worst places for a client to vanish.

Figures:

- ``exact_sum``: 1 when the unmasked integer sum equals the plain integer sum of the
  survivors' encoded inputs (computed in the clear beside the protocol), else 0;
- ``mean_max_abs_error``: the largest difference between the decoded weighted mean and the
  float weighted mean of the same updates (quantization only), with ``quantization_step``;
- ``secure_bytes_up_ratio``: a delivering client's bytes up over all phases (keys, encrypted
  shares, masked input, unmask answer; median over clients) over the plain fp32 update's bytes
  (target <= 1.15); ``secure_overhead_bytes_per_client`` the part that is not the masked vector;
- ``client_seconds`` (one client's key agreement, sharing and masking, median) and
  ``coordinator_unmask_seconds`` (rebuilding the secrets and removing the masks).

Run: ``python benchmarks/secure_aggregation.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.secagg import SecAggConfig, SecureClient, SecureSum, encode_weighted, weighted_mean

MODEL_SIZE = 8970  # the digits MLP 64-64-10
SEED = 0


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


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    report(secure_round(30 if args.quick else 100), args.json)


if __name__ == "__main__":
    main()
