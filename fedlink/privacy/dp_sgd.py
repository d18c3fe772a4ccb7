"""``DPSGDTrainer``: sample-level DP-SGD in local training, through Opacus.

Import it explicitly (``from fedlink.privacy.dp_sgd import DPSGDTrainer``): it and
``fedlink.privacy.ghost_clipping`` (which only it imports) are the modules of
``fedlink.privacy`` that import torch and Opacus, so the coordinator can import the rest.

**Guarantee.** Each local step is Opacus's DP-SGD step: a Poisson sample of the client's data
(each example independently with probability ``q = batch_size / num_examples``), per-example
gradients (Opacus ``GradSampleModule``), each clipped to L2 norm ``max_grad_norm``, summed,
Gaussian noise of standard deviation ``noise_multiplier * max_grad_norm`` added, divided by the
expected batch size (Opacus ``DPOptimizer``). The client keeps one Opacus accountant for its
whole life, across tasks, so the epsilon it reports bounds what *everything* it sent reveals
about any one of its examples (example-level DP; parameters uploaded are post-processing).
Where a client's trainer is built per task (virtual mode), ``client_state`` and
``restore_client_state`` carry the accountant's history from one trainer to the next.
Layers that mix the examples of a batch (batch norm) are refused when the trainer is built
(``check_dp_model``), naming the fix: ``opacus.validators.ModuleValidator.fix`` replaces them
with ``GroupNorm`` (``[client] dp_fix_model = true`` does it for a run). A buffer that training
changes anyway (a user's layer keeping running statistics) would leave the device without
noise: a task that changes one fails (``ConfigError``) instead of uploading it.

**Data.** A fedlink ``Dataset``, a torch ``Dataset`` of ``(input, target)`` pairs, or a
``DataLoader`` (its dataset and ``collate_fn`` are used, and its ``batch_size`` is the expected
batch: Opacus's ``DPDataLoader`` does the same; its sampler is replaced by Poisson sampling,
which the accounting assumes). Tensors (a fedlink ``Dataset``, a ``TensorDataset``) are moved
to the device once and sliced; any other dataset is read example by example for each sample.

These are the parts ``opacus.PrivacyEngine.make_private`` assembles; the trainer assembles them
itself so that Poisson sampling slices tensors already on the device instead of going through a
``DataLoader`` (several times faster per step on small models), and so that one accountant
spans tasks. ``ghost`` clipping (the default) is ``fedlink.privacy.ghost_clipping``: Opacus's
ghost clipping (per-layer norms as Opacus's norm samplers compute them, Opacus's clip factor, a
second backward pass), driven by forward hooks and ``torch.autograd.grad`` instead of Opacus's
full backward hooks: the same clipped sum (tested against Opacus), in about half the time per
step on small models. Noise, averaging and the step are Opacus's
``DPOptimizerFastGradientClipping``.

**Options** (``TrainPlan.options``, strings, served from ``[coordinator.training]
trainer_options``):

=========================== ===============================================================
``dp_max_grad_norm``        per-example clip norm ``C`` (default 1.0)
``dp_noise_multiplier``     ``sigma``; or, instead,
``dp_target_epsilon``       the epsilon to reach after ``dp_target_steps`` local steps:
``dp_target_steps``         ``sigma`` is then Opacus's ``get_noise_multiplier`` for them,
                            and the trainer refuses to train past ``dp_target_steps``
                            (``PrivacyBudgetExhausted``)
``dp_delta``                delta of the reported epsilon (default 1e-5; keep it below
                            ``1 / num_examples``)
``dp_accountant``           ``rdp`` (default) or ``prv``
``dp_clipping``             ``ghost`` (default): ghost clipping, which computes each
                            example's gradient norm without materialising the gradient and
                            rescales with a second backward pass; or
                            ``per_sample``: Opacus's classic per-example gradients
                            (``GradSampleModule``). Both clip every example's gradient to
                            ``dp_max_grad_norm`` exactly; ``ghost`` is faster,
                            ``per_sample`` supports more layer types (through functorch) and
                            in-place activations
=========================== ===============================================================

``TrainResult.metrics`` carries ``dp_epsilon`` (spent so far), ``dp_delta``,
``dp_noise_multiplier``, ``dp_sample_rate``, ``dp_steps`` (local DP steps so far) and
``dp_max_grad_norm``; they reach the coordinator's event log as client metrics.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from opacus.validators import ModuleValidator
from opacus.validators.errors import ShouldReplaceModuleError
from torch import nn

from fedlink.client.base import TrainPlan, TrainResult, planned_steps, proximal_mu
from fedlink.client.torch_trainer import TorchData, resolve_device
from fedlink.clock import RealClock
from fedlink.data.base import Dataset
from fedlink.errors import ConfigError, FedlinkError
from fedlink.models.training import PlainSGD
from fedlink.params import TRAINABLE
from fedlink.params.flat import load_vector, spec_of, to_vector
from fedlink.privacy.accounting import Accountant, check_accountant
from fedlink.privacy.ghost_clipping import GhostClipping
from fedlink.privacy.setup import DP_SGD_OPTIONS

_SEED_MASK = (1 << 64) - 1

CLIPPING_MODES = ("ghost", "per_sample")
"""How per-example gradients are clipped: Opacus's ghost clipping, or materialised gradients."""


class _GhostOptimizer(DPOptimizerFastGradientClipping):
    """Opacus's ghost-clipping optimizer, with less Python per step.

    Same arithmetic (Opacus's ``add_noise`` and ``scale_grad``); it accumulates with ``clone``
    instead of ``deepcopy`` (which costs more than the clipping itself on small models), keeps
    its list of parameters instead of rebuilding it from the parameter groups several times a
    step, and draws the noise as Opacus's ``_generate_noise`` does without allocating the
    zeros tensor it returns only when ``std == 0`` (the same draws from the same generator).
    Over a plain ``torch.optim.SGD`` (one parameter group, no momentum, weight decay,
    Nesterov or maximize: what ``DPSGDTrainer`` builds) the descent and the clearing of
    gradients skip ``torch.optim``'s per-call wrapper (profiling, hooks, option dispatch),
    which cost a small model's step more than the descent itself: the same ``p -= lr * grad``
    per tensor, the same bits.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        super().__init__(optimizer, **kwargs)
        self._param_list: list[Any] = [
            p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self._plain = PlainSGD(self._param_list, 0.0) \
            if self._param_list and _is_plain_sgd(optimizer) else None

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Opacus's: drop every summed gradient (unless the last step was skipped) and every
        gradient (``set_to_none``; else torch's own zeroing)."""
        if not set_to_none or self._plain is None:
            super().zero_grad(set_to_none)
            return
        if not self._is_last_step_skipped:
            for p in self.params:
                p.summed_grad = None
        self._plain.zero_grad(set_to_none=True)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Opacus's step: accumulate, noise and scale (``pre_step``), then descend at the
        rate the parameter group holds now (a scheduler may have changed it)."""
        if closure is not None or self._plain is None:
            return super().step(closure)
        if self.pre_step():
            self._plain.lr = float(self.original_optimizer.param_groups[0]["lr"])
            self._plain.step()
        return None

    @property
    def params(self) -> list[Any]:
        """The trainable parameters (fixed: the parameter groups do not change)."""
        cached = self.__dict__.get("_param_list")
        return cached if cached is not None else super().params

    def add_noise(self) -> None:
        """``grad = summed_grad + N(0, (z * C)^2)``, one draw per parameter, as Opacus's."""
        std = getattr(self, "_adjusted_noise_multiplier", self.noise_multiplier) * \
            self.max_grad_norm
        if self.secure_mode or std == 0:
            super().add_noise()  # Opacus's own path for the cases it treats apart
            return
        for p in self.params:
            summed = p.summed_grad
            _check_processed_flag(summed)
            noise = torch.normal(mean=0, std=std, size=summed.shape, device=summed.device,
                                 generator=self.generator, dtype=summed.dtype)
            p.grad = (summed + noise).view_as(p)
            _mark_as_processed(summed)

    def accumulate(self) -> None:
        """``summed_grad += grad`` (the already clipped and summed gradient of the batch)."""
        for p in self.params:
            if p.summed_grad is not None:
                p.summed_grad.add_(p.grad.detach())
            else:
                p.summed_grad = p.grad.detach().clone()


def _is_plain_sgd(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is a plain ``torch.optim.SGD`` with one parameter group (no
    momentum, dampening, weight decay, Nesterov, maximize, or a tensor rate)."""
    if type(optimizer) is not torch.optim.SGD or len(optimizer.param_groups) != 1:
        return False
    group = optimizer.param_groups[0]
    return bool(group["momentum"] == 0 and group["dampening"] == 0
                and group["weight_decay"] == 0 and not group["nesterov"]
                and not group["maximize"] and not isinstance(group["lr"], torch.Tensor))


class PrivacyBudgetExhausted(FedlinkError):
    """The client has already taken the ``dp_target_steps`` its target epsilon allows."""


@dataclass(frozen=True)
class DPSGDOptions:
    """DP-SGD settings parsed from a plan's options (see the module docstring)."""

    max_grad_norm: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    target_steps: int | None = None
    delta: float = 1e-5
    accountant: str = "rdp"
    clipping: str = "ghost"

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> DPSGDOptions:
        """Parse and validate ``dp_*`` options (``ConfigError`` naming the bad one, or a
        ``dp_*`` option this trainer does not read: a misspelt clip norm would otherwise
        train at the default one)."""
        unknown = sorted(k for k in options if k.startswith("dp_") and k not in DP_SGD_OPTIONS)
        if unknown:
            raise ConfigError(f"{', '.join(unknown)}: not a DP-SGD option (it reads "
                              f"{', '.join(sorted(DP_SGD_OPTIONS))})")
        steps = _opt_number(options, "dp_target_steps")
        parsed = cls(
            max_grad_norm=_number(options, "dp_max_grad_norm", 1.0),
            noise_multiplier=_opt_number(options, "dp_noise_multiplier"),
            target_epsilon=_opt_number(options, "dp_target_epsilon"),
            target_steps=None if steps is None else int(steps),
            delta=_number(options, "dp_delta", 1e-5),
            accountant=check_accountant(options.get("dp_accountant", "rdp"), "dp_accountant"),
            clipping=options.get("dp_clipping", "ghost"),
        )
        parsed.check()
        return parsed

    def check(self) -> None:
        """``ConfigError`` unless the settings describe one valid DP-SGD configuration."""
        if self.clipping not in CLIPPING_MODES:
            raise ConfigError(f"dp_clipping: must be one of {', '.join(CLIPPING_MODES)}, "
                              f"got {self.clipping!r}")
        if not self.max_grad_norm > 0:
            raise ConfigError(f"dp_max_grad_norm: must be > 0, got {self.max_grad_norm}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"dp_delta: must be in (0, 1), got {self.delta}")
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ConfigError("DP-SGD needs exactly one of dp_noise_multiplier and "
                              "dp_target_epsilon")
        if self.noise_multiplier is not None and not self.noise_multiplier > 0:
            raise ConfigError(f"dp_noise_multiplier: must be > 0, got {self.noise_multiplier}")
        if self.target_epsilon is not None:
            if not self.target_epsilon > 0:
                raise ConfigError(f"dp_target_epsilon: must be > 0, got {self.target_epsilon}")
            if self.target_steps is None or self.target_steps < 1:
                raise ConfigError("dp_target_steps: must be >= 1 with dp_target_epsilon "
                                  "(the local steps the target epsilon must cover)")


def _number(options: Mapping[str, str], key: str, default: float) -> float:
    value = _opt_number(options, key)
    return default if value is None else value


def _opt_number(options: Mapping[str, str], key: str) -> float | None:
    raw = options.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}: must be a number, got {raw!r}") from exc
    if not math.isfinite(value):
        raise ConfigError(f"{key}: must be finite, got {raw!r}")
    return value


FIX_HINT = ("replace them with GroupNorm: [client] dp_fix_model = true does it for a run "
            "(opacus.validators.ModuleValidator.fix(model) in code), or build the model with "
            "nn.GroupNorm / nn.LayerNorm")


def check_dp_model(model: nn.Module) -> None:
    """``ConfigError`` unless Opacus can train ``model`` with DP-SGD, naming the layers it
    refuses and, for layers it can replace (batch norm), the fix."""
    errors = ModuleValidator.validate(model, strict=False)
    if not errors:
        return
    fixable = [e for e in errors if isinstance(e, ShouldReplaceModuleError)]
    names = [name for name, module in model.named_modules()
             if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats]
    where = f" (layers {', '.join(names)})" if names else ""
    if fixable:
        raise ConfigError(f"DP-SGD cannot train this model: it has layers that mix the examples "
                          f"of a batch{where}, so no per-example guarantee holds; {FIX_HINT}. "
                          f"Opacus says: {str(fixable[0]).split('. ')[0]}")
    raise ConfigError(f"DP-SGD cannot train this model: {errors[0]}")


def fix_dp_model(model: nn.Module) -> nn.Module:
    """``model`` with the layers Opacus refuses replaced (batch norm by ``GroupNorm``), by
    ``opacus.validators.ModuleValidator.fix`` (a copy); ``ConfigError`` when something is
    left that it cannot fix."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about each replacement it makes
        fixed = ModuleValidator.fix(model)
    errors = ModuleValidator.validate(fixed, strict=False)
    if errors:
        raise ConfigError(f"dp_fix_model: Opacus could not make this model trainable with "
                          f"DP-SGD: {errors[0]}")
    return fixed


class _SampledData:
    """A client's local data, read by the index of a Poisson sample.

    Tensors (a fedlink ``Dataset``, a two-tensor ``TensorDataset``) are put on the device once
    and sliced; another torch dataset is read example by example and collated (the loader's
    ``collate_fn``, else torch's default). ``batch_size``: the loader's, when it has one.
    """

    def __init__(self, data: TorchData, dtype: torch.dtype, device: torch.device) -> None:
        loader = data if isinstance(data, torch.utils.data.DataLoader) else None
        source: Any = data if loader is None else loader.dataset
        self.batch_size: int | None = None if loader is None else loader.batch_size
        self.device = device
        self._collate = torch.utils.data.default_collate if loader is None else loader.collate_fn
        self._source = source
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        if isinstance(source, Dataset):
            self.x = torch.tensor(source.x, dtype=dtype, device=device)
            self.y = torch.tensor(source.y, dtype=torch.int64, device=device)
        elif isinstance(source, torch.utils.data.TensorDataset) and len(source.tensors) == 2:
            self.x, self.y = (t.to(device) for t in source.tensors)
        elif not isinstance(source, torch.utils.data.Dataset) or not hasattr(source, "__len__"):
            raise ConfigError(f"DP-SGD cannot train on a {type(source).__name__}: expected a "
                              f"fedlink Dataset, or a torch Dataset (or DataLoader) with a "
                              f"length (Poisson sampling draws each example by index)")
        if len(self) == 0:
            raise ConfigError("cannot train on an empty dataset")

    def __len__(self) -> int:
        return len(self.y) if self.y is not None else len(self._source)

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples at ``index`` (a non-empty 1-D index on the CPU), on the device, with
        integer targets as int64 (what cross-entropy takes)."""
        if self.x is not None and self.y is not None:
            where = index.to(self.device)
            x, y = self.x[where], self.y[where]
        else:
            batch = self._collate([self._source[i] for i in index.tolist()])
            if not isinstance(batch, tuple | list) or len(batch) != 2:
                raise ConfigError(f"each example must be (input, target), got a collated "
                                  f"{type(batch).__name__}")
            x, y = batch[0].to(self.device), batch[1].to(self.device)
        if not y.is_floating_point():
            y = y.long()
        return x, y


class DPSGDTrainer:
    """Local DP-SGD (Opacus) on a torch model over flat float32 parameter vectors.

    Same contract as ``TorchTrainer`` (``train(params, plan)``, deadlines, seeded sampling:
    the same plan gives the same Poisson samples and noise), with the guarantee described in
    the module docstring. The first ``train`` fixes the DP settings for the trainer's life; a
    later plan with different ``dp_*`` options is a ``ConfigError`` (the accountant could not
    describe a mix it was not told about). ``prox_mu`` is not supported (``ConfigError``).

    ``data``: see the module docstring (any ``TorchData``). ``device``: a ``torch.device`` or
    a setting of ``fedlink.client.device`` (``resolve_device``). ``ConfigError`` at
    construction for a model Opacus cannot train (``check_dp_model``, which names the fix for
    batch norm), an empty dataset, or a device not on this machine.

    Attributes: ``model`` (the working module), ``spec``, ``accountant`` (Opacus's).
    """

    def __init__(
        self,
        model: nn.Module,
        data: TorchData,
        *,
        device: torch.device | str = "cpu",
        seed: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        where = resolve_device(device)
        check_dp_model(model)
        self.model = model.to(where)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        if not self._params:
            raise ConfigError("the model has no trainable parameters")
        self.spec = spec_of(self.model)
        self._fixed = ~self.spec.mask(TRAINABLE)  # what DP-SGD must leave as it was
        self._data = _SampledData(data, self._params[0].dtype, where)
        self._device = where
        self._gsm: nn.Module | None = None  # Opacus's wrapper (per_sample), by the first plan
        self._ghost: GhostClipping | None = None  # ghost clipping's hooks, by the first plan
        self._seed = seed
        self._clock = clock or RealClock().now  # the clock plan.deadline is on
        self._options: DPSGDOptions | None = None
        self._sigma = 0.0
        self.accountant: Any = None  # Opacus's, created with the first plan's kind
        self._steps = 0
        self._q = 0.0
        self._batch_size = 0
        self._restored: dict[str, Any] | None = None

    def client_state(self) -> dict[str, Any] | None:
        """What must outlive this trainer for its client's epsilon to stay true: the
        accountant's history and the steps taken (``None`` before the first ``train``).

        A simulation that builds a client's trainer per task (virtual mode) hands it to the
        next one with ``restore_client_state``; a device keeps one trainer and needs neither.
        """
        if self.accountant is None:
            return None
        return {"history": [tuple(h) for h in self.accountant.history], "steps": self._steps}

    def restore_client_state(self, state: Mapping[str, Any]) -> None:
        """Continue from ``client_state()`` of the client's earlier trainer: its accountant
        history and step count count towards this trainer's epsilon and budget."""
        self._restored = dict(state)

    def num_examples(self) -> int:
        """Number of local training examples."""
        return len(self._data)

    @property
    def sample_rate(self) -> float:
        """Poisson sampling rate ``q`` of the first plan (``batch_size / num_examples``)."""
        return self._q

    @property
    def noise_multiplier(self) -> float:
        """``sigma`` in use (0 before the first ``train``)."""
        return self._sigma

    @property
    def dp_steps(self) -> int:
        """DP-SGD steps taken over the trainer's life."""
        return self._steps

    def epsilon(self) -> float:
        """Epsilon spent so far at the configured delta (0 before any step).

        The steps are recorded in Opacus's accountant (``self.accountant``); its history is
        evaluated with ``fedlink.privacy.accounting``, the same Opacus analysis with the
        one-step RDP cached, so a task does not spend a quarter of a second recomputing it
        (the numbers are equal; tested).
        """
        if self.accountant is None or self._options is None or not self._steps:
            return 0.0
        evaluate = Accountant(self._options.accountant)
        evaluate.history = [(float(z), float(q), int(n)) for z, q, n in self.accountant.history]
        return evaluate.epsilon(self._options.delta)

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Run up to the planned number of DP-SGD steps from ``params``; report epsilon."""
        started = time.perf_counter()
        options = self._configure(plan)
        steps_planned = planned_steps(plan, self.num_examples())
        allowed = steps_planned
        if options.target_steps is not None:
            allowed = min(steps_planned, options.target_steps - self._steps)
            if allowed <= 0:
                raise PrivacyBudgetExhausted(
                    f"DP-SGD budget spent: {self._steps} of dp_target_steps "
                    f"{options.target_steps} taken (epsilon {self.epsilon():.4g})")
        load_vector(self.model, params, self.spec)
        loaded = to_vector(self.model) if self._fixed.any() else params  # counters rounded
        loss_sum, steps = self._run(plan, allowed, options)
        trained = to_vector(self.model)
        self._check_untouched(loaded, trained)
        metrics = {"train_seconds": time.perf_counter() - started,
                   "dp_epsilon": self.epsilon(), "dp_delta": options.delta,
                   "dp_noise_multiplier": self._sigma, "dp_sample_rate": self._q,
                   "dp_steps": float(self._steps), "dp_max_grad_norm": options.max_grad_norm}
        if steps:
            metrics["train_loss"] = loss_sum / steps
        return TrainResult(params=trained, num_examples=self.num_examples(),
                           steps_completed=steps, steps_planned=steps_planned, metrics=metrics)

    def _check_untouched(self, loaded: np.ndarray, trained: np.ndarray) -> None:
        """``ConfigError`` when training changed a tensor that is not a trainable weight (a
        buffer a layer updates in its forward pass): DP-SGD noises gradients, so that change
        would leave the device without noise."""
        if not self._fixed.any():
            return
        changed = self._fixed & (loaded != trained)
        if changed.any():
            first = int(np.argmax(changed))
            name = next(n for n, o, k in zip(self.spec.names, self.spec.offsets,
                                             self.spec.numels, strict=True) if o <= first < o + k)
            raise ConfigError(f"DP-SGD training changed the model's buffer {name!r}, which "
                              f"DP-SGD's noise does not cover; its new value cannot be sent. "
                              f"{FIX_HINT}, or keep the layer's statistics fixed")

    def _configure(self, plan: TrainPlan) -> DPSGDOptions:
        """Parse the plan's DP options; fix them (and sigma, q) on the first call."""
        if proximal_mu(plan) > 0:
            raise ConfigError("prox_mu: FedProx is not supported by the DP-SGD trainer")
        options = DPSGDOptions.from_options(plan.options)
        if self._options is not None:
            if options != self._options or plan.batch_size != self._batch_size:
                raise ConfigError("DP-SGD settings (dp_* options, batch_size) must not change "
                                  "during a run")
            return options
        if plan.batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {plan.batch_size}")
        self._batch_size = plan.batch_size
        expected = self._data.batch_size or plan.batch_size  # a DataLoader's own, else the plan's
        self._q = min(1.0, expected / self.num_examples())
        if options.noise_multiplier is not None:
            self._sigma = options.noise_multiplier
        else:
            assert options.target_epsilon is not None and options.target_steps is not None
            self._sigma = float(get_noise_multiplier(
                target_epsilon=options.target_epsilon, target_delta=options.delta,
                sample_rate=self._q, steps=options.target_steps,
                accountant=options.accountant))
        self._wrap(options)
        self.accountant = create_accountant(options.accountant)
        if self._restored is not None:  # the client's earlier tasks, under the same settings
            self.accountant.history = [tuple(h) for h in self._restored["history"]]
            self._steps = int(self._restored["steps"])
        self._options = options
        return options

    def _wrap(self, options: DPSGDOptions) -> None:
        """Attach the clipping mode's hooks (``ConfigError`` on unsupported layers)."""
        if options.clipping == "ghost":
            self._ghost = GhostClipping(self.model, options.max_grad_norm)
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._gsm = GradSampleModule(self.model, loss_reduction="mean")
        except NotImplementedError as exc:  # a layer Opacus cannot clip per example
            raise ConfigError(f"DP-SGD cannot train this model: {exc}") from exc

    def _optimizer(self, plan: TrainPlan, options: DPSGDOptions) -> DPOptimizer:
        """Opacus's DP optimizer over plain SGD, for the clipping mode."""
        expected = max(1, round(self._q * self.num_examples()))
        kind = _GhostOptimizer if options.clipping == "ghost" else DPOptimizer
        return kind(torch.optim.SGD(self._params, lr=plan.learning_rate),
                    noise_multiplier=self._sigma, max_grad_norm=options.max_grad_norm,
                    expected_batch_size=expected, loss_reduction="mean")

    def _run(self, plan: TrainPlan, steps_planned: int,
             options: DPSGDOptions) -> tuple[float, int]:
        """Up to ``steps_planned`` Poisson-sampled DP-SGD steps; (summed loss, steps)."""
        assert self.accountant is not None
        optimizer = self._optimizer(plan, options)
        ghost = self._ghost
        state = np.random.SeedSequence([self._seed & _SEED_MASK, plan.seed & _SEED_MASK])
        sampler, noise_seed = (int(s) for s in state.generate_state(2, np.uint64))
        generator = torch.Generator().manual_seed(sampler)
        optimizer.generator = torch.Generator(device=self._device).manual_seed(noise_seed)
        n = self.num_examples()
        total = torch.zeros((), dtype=torch.float64, device=self._device)
        steps = 0
        self.model.train()
        with torch.enable_grad(), warnings.catch_warnings():
            # per_sample: torch warns that Opacus's full backward hooks fire without input
            # gradients (the data needs none): expected here
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(steps_planned):
                if plan.deadline is not None and self._clock() > plan.deadline:
                    break
                mask = torch.rand(n, generator=generator) < self._q
                index = mask.nonzero().squeeze(1)
                optimizer.zero_grad(set_to_none=True)
                if not len(index):  # an empty Poisson sample still takes a (pure-noise) step
                    self._empty_gradients(options)
                elif ghost is not None:
                    x, y = self._data.take(index)
                    with ghost.recording():
                        logits = self.model(x)
                    losses = F.cross_entropy(logits, y, reduction="none")
                    ghost.backward(losses)
                    total += losses.detach().mean()
                else:
                    assert self._gsm is not None
                    x, y = self._data.take(index)
                    loss = F.cross_entropy(self._gsm(x), y)
                    loss.backward()
                    total += loss.detach()
                optimizer.step()
                self.accountant.step(noise_multiplier=self._sigma, sample_rate=self._q)
                self._steps += 1
                steps += 1
        return total.item(), steps

    def _empty_gradients(self, options: DPSGDOptions) -> None:
        """What a backward pass over zero examples leaves, for the optimizer to noise."""
        for p in self._params:
            if options.clipping == "ghost":
                p.grad = torch.zeros_like(p)
            else:
                p.grad_sample = torch.zeros(  # type: ignore[attr-defined]
                    (0, *p.shape), dtype=p.dtype, device=p.device)
