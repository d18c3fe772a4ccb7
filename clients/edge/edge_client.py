"""A federated client for a small device: numpy-only training on the fedlink client SDK.

No torch anywhere: the model is multinomial logistic regression trained with minibatch SGD in
numpy, plugged into the SDK through the ``Trainer`` protocol. It matches the coordinator's
``[model] name = "logreg"`` (torch ``nn.Linear(features, classes)``), whose flat parameter
vector is the weight matrix ``(classes, features)`` in row-major order, then the bias
``(classes,)``.

Run it against a coordinator serving ``clients/edge/coordinator.toml``::

    python clients/edge/edge_client.py --server HOST:PORT --data local.npz
    python clients/edge/edge_client.py --server HOST:PORT --index 0 --of 4   # digits share
    python clients/edge/edge_client.py --server HOST:PORT --data local.npz \
        --tls-ca ca.pem --tls-cert client.pem --tls-key client.key           # mutual TLS

``local.npz`` holds ``x`` (examples x features, floats) and ``y`` (integer class labels).
Without ``--data`` the client trains on share ``--index`` of ``--of`` of the bundled digits
training pool, split exactly as the coordinator splits it (same ``--seed``), so the
coordinator's test set stays unseen. ``--tls-ca`` (and ``--tls-cert`` / ``--tls-key`` for
mutual TLS) connect to a coordinator that serves TLS, as ``fedlink client`` does.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from fedlink.client import (
    ClientOptions,
    SessionStats,
    TLSOptions,
    TrainPlan,
    TrainResult,
    UpdatePipeline,
)
from fedlink.client import run_client as run_sdk_client
from fedlink.client.base import planned_steps, proximal_mu
from fedlink.errors import ConfigError, FedlinkError

_SEED_MASK = (1 << 64) - 1


# -- the model ------------------------------------------------------------------------------


def split_params(params: np.ndarray, num_features: int,
                 num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Views ``(weight (classes, features), bias (classes,))`` of a flat logreg vector."""
    flat = np.asarray(params)
    expected = num_classes * (num_features + 1)
    if flat.shape != (expected,):
        raise ConfigError(
            f"the coordinator's model has {flat.size} parameters; logistic regression from "
            f"{num_features} features to {num_classes} classes has {expected}: serve a config "
            f"with [model] name = \"logreg\" on data of this shape (or pass --classes)"
        )
    weight = flat[: num_classes * num_features].reshape(num_classes, num_features)
    return weight, flat[num_classes * num_features :]


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of ``logits`` and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(len(labels))
    loss = float(-log_probs[rows, labels].mean())
    grad = np.exp(log_probs)
    grad[rows, labels] -= 1.0
    return loss, grad / len(labels)


# -- the trainer ----------------------------------------------------------------------------


class LogisticRegressionTrainer:
    """Minibatch SGD for multinomial logistic regression, in numpy (the SDK's ``Trainer``).

    ``x`` is ``(examples, features)``, ``y`` holds labels in ``[0, num_classes)``; the model
    has ``num_classes * (features + 1)`` parameters (see ``split_params``).

    Each epoch is a fresh shuffle split into ``plan.batch_size`` batches (the last one possibly
    smaller), shuffled by a generator seeded from (``seed``, ``plan.seed``). Training stops
    before the next step once ``clock() > plan.deadline`` and reports the steps it completed.
    ``plan.options["prox_mu"]`` adds FedProx's ``mu / 2 * ||w - w_global||^2``.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, num_classes: int, *, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.x, self.y = check_data(x, y)
        if int(self.y.max()) >= num_classes:
            raise ConfigError(f"local labels go up to {int(self.y.max())}, but the model has "
                              f"{num_classes} classes")
        self.num_classes = num_classes
        self.seed = seed
        self.clock = clock

    @property
    def num_features(self) -> int:
        """Features per example."""
        return int(self.x.shape[1])

    def num_examples(self) -> int:
        """Number of local training examples."""
        return len(self.y)

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train from ``params`` (left untouched) as ``plan`` says."""
        started = time.perf_counter()
        steps_planned = planned_steps(plan, self.num_examples())
        anchor = np.array(params, dtype=np.float32)
        local = anchor.copy()
        loss_sum, steps = self._run(local, anchor, plan, steps_planned)
        metrics = {"train_seconds": time.perf_counter() - started}
        if steps:
            metrics["train_loss"] = loss_sum / steps
        return TrainResult(params=local, num_examples=self.num_examples(),
                           steps_completed=steps, steps_planned=steps_planned, metrics=metrics)

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """Mean cross-entropy and accuracy of the model ``params`` on the local data (the
        SDK answers the coordinator's evaluation tasks with them)."""
        weight, bias = split_params(np.asarray(params, dtype=np.float32), self.num_features,
                                    self.num_classes)
        logits = self.x @ weight.T + bias
        loss, _ = softmax_cross_entropy(logits, self.y)
        accuracy = float((logits.argmax(axis=1) == self.y).mean())
        return {"loss": loss, "accuracy": accuracy, "examples": float(self.num_examples())}

    def _run(self, params: np.ndarray, anchor: np.ndarray, plan: TrainPlan,
             steps_planned: int) -> tuple[float, int]:
        """SGD on ``params`` in place; (summed minibatch loss, steps completed)."""
        weight, bias = split_params(params, self.num_features, self.num_classes)
        mu = proximal_mu(plan)
        loss_sum, steps = 0.0, 0
        for index in self._batches(plan):
            if steps >= steps_planned or self._past(plan.deadline):
                break
            # FedProx's pull towards the global model, taken at the pre-step parameters.
            pull = np.float32(plan.learning_rate * mu) * (params - anchor) if mu else None
            loss_sum += self._step(weight, bias, index, plan.learning_rate)
            if pull is not None:
                params -= pull
            steps += 1
        return loss_sum, steps

    def _step(self, weight: np.ndarray, bias: np.ndarray, index: np.ndarray,
              lr: float) -> float:
        """One SGD step on the batch ``index``; updates the views in place, returns the loss."""
        x = self.x[index]
        loss, grad = softmax_cross_entropy(x @ weight.T + bias, self.y[index])
        weight -= np.float32(lr) * (grad.T @ x)
        bias -= np.float32(lr) * grad.sum(axis=0)
        return loss

    def _past(self, deadline: float | None) -> bool:
        return deadline is not None and self.clock() > deadline

    def _batches(self, plan: TrainPlan) -> Iterator[np.ndarray]:
        """Endless minibatch indices: a fresh shuffle per epoch."""
        rng = np.random.default_rng([self.seed & _SEED_MASK, plan.seed & _SEED_MASK])
        while True:
            order = rng.permutation(self.num_examples())
            for start in range(0, len(order), plan.batch_size):
                yield order[start : start + plan.batch_size]


# -- local data -----------------------------------------------------------------------------


def check_data(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x as float32 (n, features), y as int64 (n,))``; ``ConfigError`` when unusable."""
    features = np.asarray(x, dtype=np.float32)
    labels = np.asarray(y)
    if features.ndim != 2 or labels.ndim != 1 or len(features) != len(labels):
        raise ConfigError(f"need x of shape (n, features) and y of shape (n,), got "
                          f"{features.shape} and {labels.shape}")
    if len(labels) == 0:
        raise ConfigError("the local dataset is empty")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ConfigError("y must hold non-negative integer class labels")
    if not np.isfinite(features).all():
        raise ConfigError("x holds non-finite values")
    return features, labels.astype(np.int64)


def load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` from a ``.npz`` file."""
    try:
        with np.load(path) as archive:
            return check_data(archive["x"], archive["y"])
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except KeyError as exc:
        raise ConfigError(f"{path} must hold arrays 'x' and 'y'") from exc


def load_digits_share(index: int, of: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Share ``index`` of an IID split of the digits training pool into ``of`` parts."""
    from fedlink.data import load_federated  # numpy only; deferred: it imports scikit-learn

    if not 0 <= index < of:
        raise ConfigError(f"--index must be in [0, {of}), got {index}")
    share = load_federated("digits", of, seed, "iid").clients[index]
    return check_data(share.x, share.y)


# -- command line ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The edge client's command line."""
    p = argparse.ArgumentParser(description="numpy-only fedlink client (logistic regression)")
    p.add_argument("--server", required=True, help="coordinator address, HOST:PORT")
    p.add_argument("--data", type=Path, help=".npz file with arrays x and y")
    p.add_argument("--index", type=int, default=0, help="without --data: digits share index")
    p.add_argument("--of", type=int, default=4, help="without --data: number of digits shares")
    p.add_argument("--classes", type=int, default=10,
                   help="number of classes of the coordinator's model (digits: 10)")
    p.add_argument("--seed", type=int, default=0,
                   help="the coordinator config's [run] seed (the data split)")
    p.add_argument("--name", default="", help="client name shown in the coordinator's log")
    p.add_argument("--token", default="", help="join token, if the coordinator needs one")
    p.add_argument("--tls-ca", default="", metavar="PEM",
                   help="connect over TLS, trusting this CA for the coordinator's certificate")
    p.add_argument("--tls-cert", default="", metavar="PEM",
                   help="client certificate for mutual TLS (with --tls-key)")
    p.add_argument("--tls-key", default="", metavar="PEM", help="its private key")
    p.add_argument("--compression", default="fp32", help="update codec (registry name)")
    p.add_argument("--max-tasks", type=int, default=None, help="leave after this many tasks")
    return p


def tls_options(args: argparse.Namespace) -> TLSOptions | None:
    """TLS from ``--tls-ca/--tls-cert/--tls-key``; None (plaintext) when none is given.

    ``--tls-cert``/``--tls-key`` without ``--tls-ca`` is TLS trusting the system's roots.
    """
    if not (args.tls_ca or args.tls_cert or args.tls_key):
        return None
    return TLSOptions(ca_file=args.tls_ca, cert_file=args.tls_cert, key_file=args.tls_key)


def run(args: argparse.Namespace) -> SessionStats:
    """Load the local data and take part in the run until it ends."""
    tls = tls_options(args)  # first: a bad flag is reported before the data is loaded
    x, y = (load_npz(args.data) if args.data
            else load_digits_share(args.index, args.of, args.seed))
    trainer = LogisticRegressionTrainer(x, y, args.classes, seed=args.seed * 7919 + args.index)
    # the session's randomness (its privacy noise, if the run asks for any) is drawn from the
    # operating system: a seed derived from the run's would let the coordinator predict it
    options = ClientOptions(name=args.name or f"edge-{args.index}", token=args.token,
                            max_tasks=args.max_tasks, tls=tls)
    pipeline = UpdatePipeline.from_names("none", args.compression)
    return run_sdk_client(args.server, trainer, options, pipeline)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run one edge client; 0 on success, 2 on a fedlink error."""
    args = build_parser().parse_args(argv)
    try:
        stats = run(args)
    except FedlinkError as exc:
        print(f"edge client: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(f"tasks {stats.tasks}, accepted {stats.accepted}, refused {stats.refused}, "
          f"retries {stats.retries}, up {stats.bytes_up} B, down {stats.bytes_down} B",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
