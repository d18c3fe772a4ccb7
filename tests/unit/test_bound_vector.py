"""``BoundVector``: the module's tensors found once, loaded and read as ``load_vector`` and
``to_vector`` do (a trainer built per simulated task uses it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedlink.errors import ConfigError
from fedlink.params.flat import BoundVector, load_vector, spec_of, to_vector


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def test_bound_vector_reads_and_loads_what_the_plain_functions_do() -> None:
    model, twin = _model(), _model()
    bound = BoundVector(model)
    assert bound.spec == spec_of(model)
    np.testing.assert_array_equal(bound.read(), to_vector(model))
    target = np.arange(bound.spec.size, dtype=np.float32) / 7 + 0.4  # counter: rounds to 1
    bound.load(target)
    load_vector(twin, target)
    np.testing.assert_array_equal(bound.read(), to_vector(twin))
    assert int(model[1].num_batches_tracked) == int(twin[1].num_batches_tracked)


def test_bound_vector_sees_in_place_training_and_refuses_a_wrong_length() -> None:
    model = _model()
    bound = BoundVector(model)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # what an optimizer step does
    np.testing.assert_array_equal(bound.read(), to_vector(model))
    with pytest.raises(ConfigError):
        bound.load(np.zeros(bound.spec.size + 1, dtype=np.float32))


def test_an_adopted_binding_loads_and_reads_through_the_modules_own_tensors() -> None:
    """``adopt``: the module keeps its tensor objects and values, which become views of the
    staging vector; load and read then give what the per-tensor path gives."""
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    tensors = [p for p in model.parameters()]
    before = to_vector(model)
    bound = BoundVector(model)
    assert bound.adopt() and bound.adopt()
    assert [p for p in model.parameters()] == tensors  # the same objects
    np.testing.assert_array_equal(to_vector(model), before)
    vector = np.arange(before.size, dtype=np.float32) / 7
    bound.load(vector)
    np.testing.assert_array_equal(to_vector(model), vector)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # training writes the module: read sees it
    expected = to_vector(model)
    read = bound.read()
    np.testing.assert_array_equal(read, expected)
    read[:] = 0  # a copy: the module is untouched
    np.testing.assert_array_equal(to_vector(model), expected)


def test_a_binding_with_integer_buffers_or_shared_memory_is_not_adopted() -> None:
    with_counter = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))  # int64 num_batches_tracked
    assert not BoundVector(with_counter).adopt()
    shared = nn.Linear(4, 4)
    shared.register_buffer("transposed", shared.weight.detach().t())  # a view of the weight
    assert not BoundVector(shared).adopt()
    with torch.no_grad():
        shared.weight.fill_(2.0)
    assert float(shared.transposed[0, 1]) == 2.0  # the view still sees the weight
