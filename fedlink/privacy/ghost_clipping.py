"""Opacus's ghost clipping, driven by forward hooks and ``torch.autograd.grad``.

Ghost clipping (Li et al. 2021; Bu et al. 2022) clips each example's gradient to L2 norm ``C``
without materialising per-example gradients: a first backward pass gives, for every layer, the
gradient of each example's loss with respect to the layer's output ("backprops"); with the
layer's input ("activations") that determines the norm of each example's gradient of the
layer's parameters (for ``nn.Linear``, example ``i``'s weight gradient ``b_i a_i^T`` has
squared norm ``||b_i||^2 ||a_i||^2``). The per-example
norms over all parameters give clip factors ``c_i = min(1, C / (||g_i|| + 1e-6))``, and a
second backward pass of ``sum_i c_i * loss_i`` leaves ``sum_i c_i g_i``, the sum of the clipped
per-example gradients, in each ``p.grad``.

This module computes exactly what Opacus's ``GradSampleModuleFastGradientClipping`` with
``DPLossFastGradientClipping`` computes (tested against it, and against clipping brute-force
per-example gradients): Opacus's clip factor, and per-layer norms from Opacus's norm samplers
(``NORM_SAMPLERS``; for layers that have none, Opacus's per-example gradient samplers,
``GRAD_SAMPLERS``, and the norm of what they return, which is Opacus's "fast gradient
clipping"), except for ``nn.Linear`` on 2-D inputs, whose norms are the same closed form
Opacus's sampler evaluates, in fewer operations (``_linear_squares``). What differs is the
plumbing, which dominates the cost of a step on a small model:

- Opacus registers a *full backward hook* on every layer, which wraps each layer's inputs and
  outputs in extra autograd functions and runs Python for every layer in *both* backward
  passes. Here a plain forward hook records each layer's input and output, and the first pass
  is ``torch.autograd.grad(sum_i loss_i, layer outputs)``: it yields the backprops directly
  and computes no parameter gradients (Opacus computes them and throws them away).
- The first pass differentiates the *summed* loss, so backprops are per-example gradients as
  they are (Opacus differentiates the mean and multiplies by the batch size).

Like Opacus's ghost clipping it refuses parameter tying (a layer called twice in one forward
pass, or a parameter shared by two layers) and layers with buffers (batch norm mixes examples);
a layer type Opacus has no sampler for (Opacus would fall back to functorch) is a
``ConfigError`` that suggests ``dp_clipping = "per_sample"``. A layer's output or input
modified in place after the layer ran (``nn.ReLU(inplace=True)``) is detected and refused too:
the recorded tensors would no longer be the layer's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from opacus import GradSampleModuleFastGradientClipping
from torch import nn

from fedlink.errors import ConfigError

_NORM_SAMPLERS: dict[type, Callable[..., dict[nn.Parameter, torch.Tensor]]] = (
    GradSampleModuleFastGradientClipping.NORM_SAMPLERS)
_GRAD_SAMPLERS: dict[type, Callable[..., dict[nn.Parameter, torch.Tensor]]] = (
    GradSampleModuleFastGradientClipping.GRAD_SAMPLERS)


class _Capture:
    """One layer call recorded by the forward hook: module, detached inputs, output.

    With the version counters of the output and the inputs at the time of the call, to tell
    when an in-place operation changed them afterwards.
    """

    __slots__ = ("activations", "module", "output", "versions")

    def __init__(self, module: nn.Module, activations: list[Any], output: torch.Tensor) -> None:
        self.module = module
        self.activations = activations
        self.output = output
        self.versions = self._versions()

    def _versions(self) -> tuple[int, ...]:
        return (self.output._version,
                *(t._version for t in self.activations if isinstance(t, torch.Tensor)))

    def changed(self) -> bool:
        """Whether the output or an input was modified in place since the call."""
        return self._versions() != self.versions


class GhostClipping:
    """Per-example clipping of ``model``'s gradients to ``max_grad_norm`` (ghost clipping).

    ``backward(losses)`` takes the per-example losses of the last forward pass made inside
    ``recording()`` and leaves the sum of the clipped per-example gradients in each trainable
    parameter's ``.grad`` (to be noised and averaged by Opacus's
    ``DPOptimizerFastGradientClipping``). ``ConfigError`` at construction when the model has a
    layer ghost clipping cannot handle.
    """

    def __init__(self, model: nn.Module, max_grad_norm: float) -> None:
        errors = GradSampleModuleFastGradientClipping.validate(module=model, strict=False)
        if errors:
            raise ConfigError(f"DP-SGD cannot train this model: {errors[0]}")
        self.max_grad_norm = float(max_grad_norm)
        self._captured: list[_Capture] = []
        self._called: set[int] = set()
        self._recording = False
        owner: dict[int, str] = {}
        layers: list[nn.Module] = []
        for name, module in model.named_modules():
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            kind = type(module)
            if kind not in _NORM_SAMPLERS and kind not in _GRAD_SAMPLERS:
                raise ConfigError(
                    f"DP-SGD ghost clipping has no per-example gradient norm for layer "
                    f"{name or '<model>'} ({kind.__name__}); use dp_clipping = \"per_sample\"")
            for p in own:
                if id(p) in owner:
                    raise ConfigError(f"DP-SGD ghost clipping does not support parameters "
                                      f"shared by layers ({owner[id(p)]} and {name})")
                owner[id(p)] = name
            layers.append(module)
        for module in layers:  # only once every layer is known to be supported
            module.register_forward_hook(self._capture)

    def recording(self) -> _Recording:
        """Context manager: layer calls made inside it are recorded for ``backward``."""
        return _Recording(self)

    def _capture(self, module: nn.Module, inputs: Sequence[Any], output: Any) -> None:
        if not self._recording or not torch.is_grad_enabled():
            return
        if not isinstance(output, torch.Tensor):
            raise ConfigError(f"DP-SGD ghost clipping needs layers that return one tensor; "
                              f"{type(module).__name__} returned {type(output).__name__}")
        if id(module) in self._called:
            raise ConfigError(f"DP-SGD ghost clipping does not support a layer called twice in "
                              f"one forward pass ({type(module).__name__})")
        self._called.add(id(module))
        activations = [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]
        self._captured.append(_Capture(module, activations, output))

    def per_example_norms(self, losses: torch.Tensor) -> torch.Tensor:
        """L2 norm of each example's gradient of ``losses[i]`` over all trainable parameters.

        Per layer: ``_linear_squares`` for ``nn.Linear`` on 2-D inputs, Opacus's norm samplers
        (or gradient samplers) for any other layer; the graph is retained for the second pass.
        """
        captured = self._captured
        if not captured:  # no layer with trainable parameters took part: zero gradients
            return torch.zeros_like(losses)
        for c in captured:
            if c.changed():
                raise ConfigError(
                    f"DP-SGD ghost clipping: the input or output of a {type(c.module).__name__} "
                    f"layer is modified in place (e.g. ReLU(inplace=True)); use an out-of-place "
                    f"activation or dp_clipping = \"per_sample\"")
        backprops = torch.autograd.grad(losses.sum(), [c.output for c in captured],
                                        retain_graph=True, allow_unused=True)
        total: torch.Tensor | None = None
        for c, backprop in zip(captured, backprops, strict=True):
            if backprop is None:  # the layer's output does not reach the loss: zero gradient
                continue
            square = _squares(c, backprop)
            total = square if total is None else total + square
        if total is None:
            return torch.zeros_like(losses)
        return total.sqrt()

    def backward(self, losses: torch.Tensor) -> torch.Tensor:
        """Leave ``sum_i c_i * grad(losses[i])`` in ``.grad``; the clip factors ``c``."""
        try:
            norms = self.per_example_norms(losses)
            coef = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)  # Opacus's factor
            torch.sum(coef.detach() * losses).backward()
        finally:
            self._captured.clear()
            self._called.clear()
        return coef


def _squares(c: _Capture, backprop: torch.Tensor) -> torch.Tensor:
    """Squared norm of each example's gradient of the parameters of layer call ``c``."""
    module = c.module
    if type(module) is nn.Linear and backprop.dim() == 2:
        return _linear_squares(module, c.activations[0], backprop)
    kind = type(module)
    if kind in _NORM_SAMPLERS:
        norms = list(_NORM_SAMPLERS[kind](module, c.activations, backprop).values())
    else:
        norms = [g.reshape(len(g), -1).norm(2, dim=-1)
                 for g in _GRAD_SAMPLERS[kind](module, c.activations, backprop).values()]
    return torch.stack([n.square() for n in norms], dim=0).sum(dim=0)


def _linear_squares(module: nn.Linear, activation: torch.Tensor,
                    backprop: torch.Tensor) -> torch.Tensor:
    """``||grad_W_i||^2 + ||grad_b_i||^2 = ||b_i||^2 ||a_i||^2 + ||b_i||^2`` for ``nn.Linear``.

    Example ``i``'s gradient of the weight is the outer product ``b_i a_i^T`` of its backprop
    and its input, whose Frobenius norm is ``||b_i|| ||a_i||``; of the bias, ``b_i``. This is
    what Opacus's ``compute_linear_norm_sample`` computes for 2-D inputs, as two row-wise dot
    products instead of three ``einsum`` calls and two square roots (which took a fifth of a
    step on a small MLP).
    """
    b2 = torch.linalg.vecdot(backprop, backprop)
    square: torch.Tensor | None = None
    if module.weight.requires_grad:
        a = activation.to(backprop.dtype)
        square = b2 * torch.linalg.vecdot(a, a)
    if module.bias is not None and module.bias.requires_grad:
        square = b2 if square is None else square + b2
    assert square is not None  # only layers with a trainable parameter are hooked
    return square


class _Recording:
    def __init__(self, clipping: GhostClipping) -> None:
        self._clipping = clipping

    def __enter__(self) -> None:
        self._clipping._captured.clear()
        self._clipping._called.clear()
        self._clipping._recording = True

    def __exit__(self, *exc: object) -> None:
        self._clipping._recording = False
