"""``BoundVector.of``: one binding per working module, found again when its tensors change."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedlink.params import to_vector
from fedlink.params.flat import BoundVector


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))


def test_a_module_keeps_its_binding_while_its_tensors_stay() -> None:
    model = _model()
    bound = BoundVector.of(model)
    with torch.no_grad():  # in place, as an optimizer or batch norm updates
        model[0].weight.add_(1.0)
        model[1].running_mean.add_(1.0)
    assert BoundVector.of(model) is bound
    assert np.array_equal(bound.read(), to_vector(model))


def test_a_replaced_tensor_is_bound_anew_and_written_to() -> None:
    model = _model()
    old = BoundVector.of(model)
    model[0].weight = nn.Parameter(torch.zeros(2, 3))
    bound = BoundVector.of(model)
    assert bound is not old
    vector = np.arange(bound.spec.size, dtype=np.float32)
    bound.load(vector)
    assert np.array_equal(to_vector(model), vector)
    assert float(model[0].weight.sum()) == float(vector[:6].sum())


def test_freezing_a_parameter_changes_the_layout() -> None:
    model = _model()
    assert "0.bias" in BoundVector.of(model).spec.names
    model[0].bias.requires_grad_(False)  # a frozen weight is not in the vector
    assert "0.bias" not in BoundVector.of(model).spec.names


def test_a_dtype_change_is_bound_anew() -> None:
    model = _model()
    before = BoundVector.of(model)
    model.double()
    after = BoundVector.of(model)
    assert after is not before and "float64" in after.spec.dtypes
