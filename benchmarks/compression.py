"""Update compression: a codec table on digits, and time to 90% accuracy on a 3g fleet.

Table (one row per codec): uplink bytes per update (digits MLP 64-64-10, 8,970 parameters,
from the run's event log), ratio to fp32, encode+decode throughput on 1M float32 values (MB of
fp32 input per second, median of repeats), and the final accuracy of a digits run (10 IID
clients, synchronous FedAvg, 3 local epochs, lr 0.2, seed 7, the same rounds for every codec;
biased codecs run with error feedback).

Time to 90%: the same federation on a ``3g`` fleet ([network] preset = "3g": 750 kbit/s up,
1.5 Mbit/s down, 100 ms one-way, through per-client TCP proxies), once uncompressed and once
with ``topk+q8`` at 1% and error feedback, in the same process. The model there is the MLP with
two 256-unit layers (85,770 parameters, 343 kB as fp32): on a 3g uplink a model of that size
makes the upload the longest part of a round, which is the case compression is for. (With the
64-64 MLP, 36 kB, a round is dominated by round trips and compression does not pay: see the
``tta_*_small`` figures in the full run.)

JSON figures: ``best_ratio_within_1pt`` (highest uplink ratio whose final accuracy is within
1 point of fp32's; target >= 100), ``topk_codec_mb_per_s`` (``topk+q8`` at 1%, encode+decode;
target >= 200), ``tta_speedup_3g`` (time to 90% uncompressed / compressed; target >= 2), and
per-codec rows.

Run: ``python benchmarks/compression.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.compress import get_codec
from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation

TARGET_ACCURACY = 0.90
SPEED_VALUES = 1 << 20
COMPRESSED = ("topk+q8", {"density": 0.01})
FULL_GRID: list[tuple[str, dict[str, Any]]] = [
    ("fp32", {}), ("fp16", {}), ("bf16", {}), ("qsgd", {"bits": 8}), ("qsgd", {"bits": 4}),
    ("sign", {}), ("randk+q8", {"density": 0.01}), ("topk", {"density": 0.01}),
    ("topk+q8", {"density": 0.01}), ("topk+q4", {"density": 0.01}),
]
QUICK_GRID: list[tuple[str, dict[str, Any]]] = [
    ("fp32", {}), ("qsgd", {"bits": 4}), ("topk+q8", {"density": 0.01}),
]


@dataclass(frozen=True)
class Row:
    """One codec's figures."""

    label: str
    bytes_per_update: float
    ratio: float
    mb_per_s: float
    final_accuracy: float


def label_of(name: str, options: Mapping[str, Any]) -> str:
    """``topk+q8@0.01``, ``qsgd@4b``, ``fp32``: a short name for a codec and its options."""
    if "density" in options:
        return f"{name}@{options['density']}"
    if "bits" in options:
        return f"{name}@{options['bits']}b"
    return name


def codec_mb_per_s(name: str, options: Mapping[str, Any], repeats: int) -> float:
    """Encode+decode throughput on ``SPEED_VALUES`` normal values, MB of fp32 per second."""
    codec = get_codec(name, **dict(options))
    rng = np.random.default_rng(0)
    vector = rng.standard_normal(SPEED_VALUES).astype(np.float32)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        encoded = codec.encode(vector, rng)
        codec.decode(encoded.data, encoded.params, vector.size)
        times.append(time.perf_counter() - started)
    return vector.nbytes / 1e6 / float(np.median(times))


def experiment(name: str, options: Mapping[str, Any], rounds: int, hidden: list[int],
               network: bool) -> ExperimentConfig:
    """The benchmark's digits federation with codec ``name``."""
    table: dict[str, Any] = {
        "run": {"name": f"bench-compress-{label_of(name, options)}", "seed": 7},
        "data": {"dataset": "digits", "clients": 10, "partition": "iid"},
        "model": {"name": "mlp", "options": {"hidden": hidden}},
        "client": {"compression": name, "compression_options": dict(options)},
        "coordinator": {
            "rounds": rounds,
            "flush": {"goal": 10, "min_updates": 10, "deadline_s": 120.0},
            "training": {"local_epochs": 3, "batch_size": 32, "learning_rate": 0.2},
        },
    }
    if network:
        table["network"] = {"preset": "3g"}
    return ExperimentConfig.from_dict(table)


def digits_row(name: str, options: Mapping[str, Any], rounds: int, repeats: int,
               out: Path) -> Row:
    """Run digits with the codec and measure its throughput: its table row."""
    result = run_simulation(experiment(name, options, rounds, [64, 64], network=False), out,
                            progress=False)
    summary = result.summary
    return Row(label_of(name, options),
               summary["bytes_up"] / max(1, summary["updates_accepted"]),
               float(summary["uplink_compression_ratio"]),
               codec_mb_per_s(name, options, repeats), float(summary["final_accuracy"]))


def time_to_target(name: str, options: Mapping[str, Any], rounds: int, hidden: list[int],
                   out: Path) -> float | None:
    """Seconds from the start of a 3g run to the first flush at ``TARGET_ACCURACY``."""
    result = run_simulation(experiment(name, options, rounds, hidden, network=True), out,
                            progress=False)
    events = read_events(result.run_dir / "events.jsonl")
    start = next(float(e["elapsed"]) for e in events if e["kind"] == "run_started")
    for event in events:
        if event["kind"] == "flush" and (event.get("accuracy") or 0.0) >= TARGET_ACCURACY:
            return float(event["elapsed"]) - start
    return None


def print_table(rows: list[Row]) -> None:
    """The codec table, Markdown style."""
    print("| codec | uplink bytes/update | ratio to fp32 | encode+decode MB/s | final acc |")
    print("| :--- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r.label} | {r.bytes_per_update:,.0f} | {r.ratio:.1f}x | {r.mb_per_s:,.0f} "
              f"| {r.final_accuracy:.4f} |")


def table_figures(rows: list[Row]) -> dict[str, Any]:
    """Per-codec figures and ``best_ratio_within_1pt``."""
    fp32 = next(r for r in rows if r.label == "fp32")
    within = [r for r in rows if r.final_accuracy >= fp32.final_accuracy - 0.01]
    figures: dict[str, Any] = {
        "best_ratio_within_1pt": max(r.ratio for r in within),
        "best_codec_within_1pt": max(within, key=lambda r: r.ratio).label,
    }
    for r in rows:
        figures[f"{r.label}_bytes_per_update"] = r.bytes_per_update
        figures[f"{r.label}_ratio"] = r.ratio
        figures[f"{r.label}_mb_per_s"] = r.mb_per_s
        figures[f"{r.label}_final_accuracy"] = r.final_accuracy
    return figures


def tta_figures(out: Path, quick: bool) -> dict[str, Any]:
    """Time to 90% on 3g with and without compression (and, in full runs, the small MLP)."""
    cases = [("", [256, 256], 10, 16)] if quick else \
        [("", [256, 256], 15, 30), ("_small", [64, 64], 20, 40)]
    figures: dict[str, Any] = {}
    for suffix, hidden, dense_rounds, sparse_rounds in cases:
        dense = time_to_target("fp32", {}, dense_rounds, hidden, out)
        sparse = time_to_target(*COMPRESSED, sparse_rounds, hidden, out)
        figures[f"tta_fp32_3g{suffix}_s"] = dense
        figures[f"tta_topk_q8_3g{suffix}_s"] = sparse
        figures[f"tta_speedup_3g{suffix}"] = dense / sparse if dense and sparse else None
    return figures


def main() -> None:
    """Run the benchmark and report its figures."""
    args = parse_args(__doc__.splitlines()[0])
    logging.getLogger("fedlink.netem").setLevel(logging.ERROR)
    grid = QUICK_GRID if args.quick else FULL_GRID
    rounds = 60
    with tempfile.TemporaryDirectory(prefix="fedlink-bench-compress-") as tmp:
        out = Path(tmp)
        rows = [digits_row(name, options, rounds, 3 if args.quick else 7, out)
                for name, options in grid]
        print_table(rows)
        figures: dict[str, Any] = {"rounds": rounds}
        figures.update(table_figures(rows))
        figures["topk_codec_mb_per_s"] = codec_mb_per_s(*COMPRESSED, 7)
        figures.update(tta_figures(out, args.quick))
    report(figures, args.json)


if __name__ == "__main__":
    main()
