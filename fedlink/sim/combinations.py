"""The combination matrix: does every setting take effect, or get refused, in every combination?

Each feature of fedlink can work alone while a combination of them runs to the end and produces
a wrong model or a wrong record without a word. This module names the factors a research run
combines (``FACTORS``: mode x server optimizer x model with buffers / ``keep_local`` x partition
x codec x privacy x trainer x fleet), builds one small experiment per *cell* (a choice of one
level per factor), runs it on the digits and judges it (``judge``):

- ``learned``: the run finished, its final central accuracy is at least the cell's floor
  (``floor``: lower with privacy noise, a lossy codec or a skewed partition), every tensor of
  the final model is finite, every BatchNorm ``running_var`` is > 0, and the settings the
  record can show took effect (a DP cell's summary holds its mode and a finite epsilon; a
  ``keep_local`` cell's says how the central model's kept-local tensors were filled);
- ``refused``: a ``ConfigError`` before any training, naming the keys it refuses
  (``[section] key`` or ``section.key``), raised when the config is read or the experiment is
  built;
- ``silently_wrong``: the run finished, but one of the checks of ``learned`` failed;
- ``crashed``: anything else (an exception during the run, a refusal that names no key).

``REFUSED`` names the pairs of levels that must be refused at config time. ``pairwise``
picks a small set of cells that covers every pair of levels of every two factors (a
deterministic greedy all-pairs construction), ``product`` all of them.
``tests/integration/test_combinations.py`` runs the pairwise set in ``make test``;
``benchmarks/combinations.py`` the full product.
"""

from __future__ import annotations

import itertools
import math
import re
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlink.errors import ConfigError

FACTORS: dict[str, tuple[str, ...]] = {
    "mode": ("grpc", "virtual"),
    "server_optimizer": ("fedavg", "fedadam", "fedyogi"),
    "model": ("mlp", "cnn_bn", "cnn_fedbn"),
    "partition": ("iid", "dirichlet"),
    "codec": ("fp32", "topk", "qsgd"),
    "privacy": ("none", "dp_fedavg", "dp_sgd"),
    "trainer": ("builtin", "own"),
    "fleet": ("even", "stragglers"),
}
"""Each factor's levels. ``cnn_fedbn`` is the BatchNorm CNN with ``[client] keep_local =
["batchnorm"]``; ``own`` is a trainer factory of the user's, plugged with
``run_simulation(trainer=...)``; ``dp_sgd`` is ``[client] trainer = "dp_sgd"``;
``stragglers`` is a ``[network]`` whose clients compute at different speeds (``STRAGGLERS``:
in gRPC mode the slower ones' trainers are wrapped to take longer)."""

STRAGGLERS: dict[str, Any] = {"preset": "lan",
                              "speed": {"kind": "choice", "values": [1.0, 1.5]}}
"""The ``stragglers`` fleet: a fast link, each client drawing whether it computes 1.5 times as
slowly as the others."""

Cell = Mapping[str, str]
"""One level per factor of ``FACTORS``."""

REFUSED: dict[tuple[tuple[str, str], tuple[str, str]], str] = {
    (("privacy", "dp_sgd"), ("trainer", "own")):
        "a plugged trainer would replace DP-SGD's",
    (("mode", "virtual"), ("model", "cnn_fedbn")):
        "a virtual client's trainer is built per task: kept-local tensors would be lost",
    (("model", "cnn_bn"), ("privacy", "dp_sgd")):
        "DP-SGD cannot clip per example through BatchNorm",
    (("model", "cnn_fedbn"), ("privacy", "dp_sgd")):
        "DP-SGD cannot clip per example through BatchNorm (nor keep tensors local)",
    (("model", "cnn_bn"), ("privacy", "dp_fedavg")):
        "user-level DP would let BatchNorm statistics leave the clients without noise",
}
"""The pairs of levels that must be refused at config time, and why. ``pairwise`` covers
every other pair with cells expected to learn (any of them may still be refused at config
time, naming the keys: a combination refused is honest; one that runs wrong is not)."""

CLIENTS = 6
ROUNDS = 5
BASE_FLOOR = 0.75
"""The accuracy a cell without privacy, compression or skew reaches with room to spare (the
MLP and the CNN both pass 0.9 on the digits in these rounds)."""

OUTCOMES = ("learned", "refused", "silently_wrong", "crashed")

_KEY = re.compile(r"\[[a-z_.]+\]\s*[a-z_]+|\b(run|data|model|client|coordinator|network|"
                  r"virtual)\.[a-z_.]+|run_simulation\(")


def expected_refusal(cell: Cell) -> str:
    """Why ``cell`` must be refused (``REFUSED``), or "" when it must learn."""
    return next((why for ((a, x), (b, y)), why in REFUSED.items()
                 if cell.get(a) == x and cell.get(b) == y), "")


def floor(cell: Cell) -> float:
    """The final accuracy the cell must reach: ``BASE_FLOOR`` less what its settings cost
    (DP noise, a lossy codec, a label-skewed partition), never below twice chance."""
    cost = {"dp_fedavg": 0.2, "dp_sgd": 0.2}.get(cell["privacy"], 0.0)
    cost += {"topk": 0.1, "qsgd": 0.05}.get(cell["codec"], 0.0)
    cost += 0.1 if cell["partition"] == "dirichlet" else 0.0
    return max(0.2, BASE_FLOOR - cost)


def cnn_bn() -> Any:
    """A small CNN with BatchNorm for the 8x8 digits (inputs arrive flat: 64 features)."""
    from torch import nn

    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def own_trainer(model: Any, data: Any, *, seed: int, **settings: Any) -> Any:
    """A user's trainer factory: the torch trainer, taking the ``[client]`` settings it is
    given by keyword (``loss``, ``optimizer``, ``keep_local``)."""
    from fedlink.client.torch_trainer import TorchTrainer

    return TorchTrainer(model, data, seed=seed, **settings)


def config_table(cell: Cell, name: str = "cell") -> dict[str, Any]:
    """The experiment of ``cell`` as a TOML-shaped table (``ExperimentConfig.from_dict``)."""
    client: dict[str, Any] = {}
    model: dict[str, Any] = {"name": "mlp", "options": {"hidden": [32]}}
    if cell["model"] != "mlp":
        model = {"factory": f"{__name__}:cnn_bn"}
    if cell["model"] == "cnn_fedbn":
        client["keep_local"] = ["batchnorm"]
    if cell["codec"] == "topk":
        client.update(compression="topk", compression_options={"density": 0.1})
    elif cell["codec"] == "qsgd":
        client.update(compression="qsgd", compression_options={"bits": 8})
    coordinator: dict[str, Any] = {
        "rounds": ROUNDS, "server_optimizer": cell["server_optimizer"],
        "flush": {"goal": CLIENTS, "min_updates": CLIENTS, "deadline_s": 0,
                  "max_staleness": 0},
        "training": {"local_epochs": 1, "batch_size": 16, "learning_rate": 0.2},
    }
    if cell["privacy"] == "dp_fedavg":
        client["privacy"] = "dp_fedavg"
        coordinator["hooks"] = [{"name": "dp_fedavg", "clip_norm": 5.0,
                                 "noise_multiplier": 0.01, "noise": "central",
                                 "delta": 1e-3}]
    elif cell["privacy"] == "dp_sgd":
        client["trainer"] = "dp_sgd"
        coordinator["training"]["trainer_options"] = {
            "dp_noise_multiplier": 0.3, "dp_max_grad_norm": 5.0, "dp_delta": 1e-5}
        coordinator["hooks"] = [{"name": "dp_sgd", "accountant": "rdp"}]
    data: dict[str, Any] = {"dataset": "digits", "clients": CLIENTS,
                            "partition": cell["partition"]}
    if cell["partition"] == "dirichlet":
        data["options"] = {"alpha": 1.0}
    table = {"run": {"name": name, "seed": 1, "mode": cell["mode"]}, "data": data,
             "model": model, "client": client, "coordinator": coordinator}
    if cell["fleet"] == "stragglers":
        table["network"] = STRAGGLERS
    return table


@dataclass(frozen=True)
class Verdict:
    """How one cell ended (``outcome`` one of ``OUTCOMES``) and why."""

    cell: Cell
    outcome: str
    detail: str = ""
    accuracy: float | None = None
    seconds: float = 0.0
    checks: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: the cell, its outcome, and why."""
        levels = ", ".join(f"{k}={v}" for k, v in self.cell.items())
        return f"{self.outcome:<14} {levels}: {self.detail}"


def judge(cell: Cell, output_dir: Path | None = None) -> Verdict:
    """Run ``cell`` and judge it (module docstring)."""
    from fedlink.experiment.setup import Experiment, Plugs
    from fedlink.sim import ExperimentConfig, run_simulation

    started = time.perf_counter()
    plugs = {"trainer": own_trainer} if cell["trainer"] == "own" else {}
    try:  # "at config time": reading the config, or building the experiment from it
        config = ExperimentConfig.from_dict(config_table(cell))
        Experiment.build(config, Plugs(**plugs))
    except ConfigError as exc:
        return _refused(cell, exc, started)
    with tempfile.TemporaryDirectory(prefix="fedlink-cell-") as scratch:
        try:
            result = run_simulation(config, output_dir or Path(scratch), progress=False,
                                    trainer=plugs.get("trainer"), report=False)
        except Exception as exc:  # the matrix's point: a cell that crashes is reported
            return Verdict(cell, "crashed", f"{type(exc).__name__}: {exc}",
                           seconds=time.perf_counter() - started)
    return _check(cell, result.summary, result.model, time.perf_counter() - started)


def _refused(cell: Cell, exc: ConfigError, started: float) -> Verdict:
    message = str(exc)
    outcome = "refused" if _KEY.search(message) else "crashed"
    return Verdict(cell, outcome, message, seconds=time.perf_counter() - started)


def _check(cell: Cell, summary: Mapping[str, Any], state: Mapping[str, Any],
           seconds: float) -> Verdict:
    """``learned`` or ``silently_wrong`` from a finished run's summary and final model."""
    import torch

    accuracy = summary.get("final_accuracy")
    finite = all(bool(torch.isfinite(t.float()).all()) for t in state.values())
    variances = [float(t.min()) for k, t in state.items() if k.endswith("running_var")]
    counters = [int(t) for k, t in state.items() if k.endswith("num_batches_tracked")]
    least = floor(cell)
    checks = {"accuracy": accuracy, "floor": least, "finite": finite,
              "min_running_var": min(variances) if variances else None,
              "buffers_sane": all(v > 0 for v in variances) and all(c >= 0 for c in counters)}
    wrong = []
    if not isinstance(accuracy, int | float) or not math.isfinite(accuracy) or accuracy < least:
        wrong.append(f"accuracy {accuracy} below the floor {least:.2f}")
    if not finite:
        wrong.append("a non-finite tensor in the final model")
    if not checks["buffers_sane"]:
        wrong.append(f"BatchNorm buffers not sane (min running_var "
                     f"{checks['min_running_var']}, counters {counters})")
    wrong += _not_in_effect(cell, summary)
    outcome = "silently_wrong" if wrong else "learned"
    detail = "; ".join(wrong) or f"accuracy {accuracy:.3f} >= {least:.2f}"
    return Verdict(cell, outcome, detail, accuracy, seconds, checks)


PRIVACY_MODES = {"dp_fedavg": "user_central", "dp_sgd": "sample_dp_sgd"}


def _not_in_effect(cell: Cell, summary: Mapping[str, Any]) -> list[str]:
    """What the run's record says did not happen although the cell asked for it."""
    wrong = []
    privacy = summary.get("privacy") or {}
    wanted = PRIVACY_MODES.get(cell["privacy"])
    if wanted is not None:
        epsilon = privacy.get("epsilon")
        if privacy.get("mode") != wanted or not isinstance(epsilon, int | float) \
                or not math.isfinite(epsilon):
            wrong.append(f"privacy not in the record: {privacy}")
    if cell["model"] == "cnn_fedbn" and not (summary.get("kept_local") or {}).get("filled_with"):
        wrong.append("keep_local: the record does not say how the central model was filled")
    return wrong


def product(factors: Mapping[str, Sequence[str]] = FACTORS) -> list[dict[str, str]]:
    """Every cell of ``factors`` (their full product), in a fixed order."""
    names = list(factors)
    return [dict(zip(names, levels, strict=True))
            for levels in itertools.product(*(factors[n] for n in names))]


def pairwise(factors: Mapping[str, Sequence[str]] = FACTORS) -> list[dict[str, str]]:
    """A small set of cells covering every pair of levels of every two factors.

    Pairs that ``REFUSED`` names are covered by one cell each (the first of ``product`` with
    that pair), which must be refused; every other pair by cells that must learn, so that a
    pair is never covered only by a cell refused for another reason. Greedy and
    deterministic: while a pair is uncovered, start a cell from the first uncovered pair, then
    give each other factor (in order) the level that covers most uncovered pairs with the
    levels chosen so far and leaves the cell one that must learn (ties: the first level).
    """
    names = list(factors)
    uncovered = {((a, x), (b, y)) for a, b in itertools.combinations(names, 2)
                 for x in factors[a] for y in factors[b]} - set(REFUSED)
    cells: list[dict[str, str]] = []
    while uncovered:
        (a, x), (b, y) = min(uncovered, key=lambda p: (names.index(p[0][0]),
                                                       factors[p[0][0]].index(p[0][1]),
                                                       names.index(p[1][0]),
                                                       factors[p[1][0]].index(p[1][1])))
        cell = {a: x, b: y}
        for name in names:
            if name not in cell:
                allowed = [level for level in factors[name]
                           if not expected_refusal({**cell, name: level})]
                cell[name] = max(allowed, key=lambda level: (
                    _gain(cell, name, level, uncovered), -factors[name].index(level)))
        uncovered -= set(_pairs(cell, names))
        cells.append({n: cell[n] for n in names})
    everything = product(factors)
    for pair in REFUSED:
        cells.append(next(c for c in everything
                          if all(c.get(k) == v for k, v in pair)))
    return cells


def _gain(cell: Mapping[str, str], name: str, level: str,
          uncovered: set[tuple[tuple[str, str], tuple[str, str]]]) -> int:
    """How many uncovered pairs setting ``name = level`` would cover with ``cell``."""
    gain = 0
    for other, chosen in cell.items():
        pair = ((other, chosen), (name, level))
        gain += pair in uncovered or (pair[1], pair[0]) in uncovered
    return gain


def _pairs(cell: Mapping[str, str], names: Sequence[str],
           ) -> Iterator[tuple[tuple[str, str], tuple[str, str]]]:
    for a, b in itertools.combinations(names, 2):
        yield (a, cell[a]), (b, cell[b])
