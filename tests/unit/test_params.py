"""fedlink.params: a torch model's trainable parameters as one flat float32 vector."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedlink.errors import ConfigError
from fedlink.params import (
    BUFFER,
    COUNTER,
    FROZEN,
    TRAINABLE,
    ParamSpec,
    load_vector,
    spec_of,
    to_vector,
)


def make_mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def weight(model: nn.Module, index: int) -> torch.Tensor:
    return model.get_submodule(str(index)).get_parameter("weight")


def bits(vector: np.ndarray) -> np.ndarray:
    return np.asarray(vector, dtype=np.float32).view(np.uint32)


def test_spec_lists_trainable_parameters_in_order() -> None:
    spec = spec_of(make_mlp())
    assert spec.names == ("0.weight", "0.bias", "2.weight", "2.bias")
    assert spec.shapes == ((4, 5), (4,), (3, 4), (3,))
    assert spec.dtypes == ("float32",) * 4
    assert spec.size == 20 + 4 + 12 + 3
    assert spec.offsets == (0, 20, 24, 36)
    assert len(spec) == 4


def test_to_vector_is_contiguous_float32_copy() -> None:
    model = make_mlp()
    vector = to_vector(model)
    assert vector.dtype == np.float32
    assert vector.shape == (spec_of(model).size,)
    assert vector.flags.c_contiguous
    vector[:] = 7.0
    assert not torch.any(weight(model, 0) == 7.0)


def test_round_trip_is_bit_identical() -> None:
    model = make_mlp()
    spec = spec_of(model)
    rng = np.random.default_rng(0)
    vector = rng.standard_normal(spec.size).astype(np.float32)
    special = [-0.0, 1e-45, np.finfo(np.float32).max, np.finfo(np.float32).tiny]
    vector[:4] = np.array(special, dtype=np.float32)
    load_vector(model, vector)
    assert np.array_equal(bits(to_vector(model)), bits(vector))


def test_load_writes_values_where_the_spec_says() -> None:
    model = make_mlp()
    spec = spec_of(model)
    vector = np.arange(spec.size, dtype=np.float32)
    load_vector(model, vector, spec)
    views = spec.unflatten(vector)
    for name, param in model.named_parameters():
        assert np.array_equal(param.detach().numpy(), views[name])
    assert model.get_submodule("2").get_parameter("bias").tolist() == [36.0, 37.0, 38.0]


def test_load_leaves_vector_untouched_and_unaliased() -> None:
    model = make_mlp()
    vector = np.ones(spec_of(model).size, dtype=np.float32)
    load_vector(model, vector)
    vector[:] = 5.0
    assert torch.all(weight(model, 0) == 1.0)
    with torch.no_grad():
        weight(model, 0).fill_(3.0)
    assert np.all(vector == 5.0)


def test_load_accepts_read_only_and_float64_vectors() -> None:
    model = make_mlp()
    size = spec_of(model).size
    frozen = np.full(size, 0.5, dtype=np.float32)
    frozen.flags.writeable = False
    load_vector(model, frozen)
    assert np.all(to_vector(model) == 0.5)
    load_vector(model, np.full(size, 0.25))
    assert np.all(to_vector(model) == 0.25)


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_length_is_a_config_error(delta: int) -> None:
    model = make_mlp()
    size = spec_of(model).size
    with pytest.raises(ConfigError, match=f"{size + delta} elements.*{size}"):
        load_vector(model, np.zeros(size + delta, dtype=np.float32))


@pytest.mark.parametrize(
    "vector",
    [np.zeros((39, 1), dtype=np.float32), np.zeros(39, dtype=np.int32)],
    ids=["2-D", "integer"],
)
def test_bad_vector_shape_or_dtype_is_a_config_error(vector: np.ndarray) -> None:
    with pytest.raises(ConfigError):
        load_vector(make_mlp(), vector)


def test_spec_of_another_model_is_refused() -> None:
    model = make_mlp()
    other = ParamSpec(
        names=spec_of(model).names,
        shapes=((5, 4), (4,), (3, 4), (3,)),
        dtypes=("float32",) * 4,
    )
    assert other.size == spec_of(model).size
    with pytest.raises(ConfigError, match="does not describe"):
        load_vector(model, np.zeros(other.size, dtype=np.float32), other)


def test_frozen_parameters_are_left_out_and_buffers_travel() -> None:
    first, norm = nn.Linear(3, 4), nn.BatchNorm1d(4)
    model = nn.Sequential(first, norm, nn.Linear(4, 2))
    first.requires_grad_(False)
    before = first.weight.detach().clone()
    spec = spec_of(model)
    assert spec.names == ("1.weight", "1.bias", "1.running_mean", "1.running_var",
                          "1.num_batches_tracked", "2.weight", "2.bias")
    assert spec.dtypes[4] == "int64"
    vector = np.full(spec.size, 2.0, dtype=np.float32)
    vector[spec.offsets[4]] = 6.6  # an averaged counter: rounded, not truncated
    load_vector(model, vector)
    assert torch.equal(first.weight, before)
    assert torch.equal(norm.get_buffer("running_mean"), torch.full((4,), 2.0))
    assert norm.get_buffer("num_batches_tracked").item() == 7
    assert to_vector(model)[spec.offsets[4]] == 7.0


def test_non_persistent_buffers_stay_out() -> None:
    model = nn.Linear(2, 2)
    model.register_buffer("scratch", torch.zeros(3), persistent=False)
    assert spec_of(model).names == ("weight", "bias")


def test_state_the_vector_cannot_carry_is_refused() -> None:
    model = nn.Linear(2, 2)
    model.register_buffer("mask", torch.ones(2, dtype=torch.bool))
    with pytest.raises(ConfigError, match=r"'mask' has dtype torch\.bool"):
        spec_of(model)
    counter = nn.Linear(2, 2)
    counter.register_buffer("steps", torch.tensor(2**24 + 1))
    with pytest.raises(ConfigError, match=r"cannot\s+carry exactly"):
        to_vector(counter)


def test_tied_parameters_appear_once() -> None:
    first = nn.Linear(3, 3)
    model = nn.Sequential(first, nn.Tanh(), first)
    assert spec_of(model).names == ("0.weight", "0.bias")


def test_mapping_of_tensors_matches_module() -> None:
    model = make_mlp()
    named = dict(model.named_parameters())
    assert spec_of(named) == spec_of(model)
    assert np.array_equal(to_vector(named), to_vector(model))


def test_state_dict_matches_module() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    # the same layout; only the module knows which plain tensors are buffers
    assert spec_of(model.state_dict()).same_layout(spec_of(model))
    assert np.array_equal(to_vector(model.state_dict()), to_vector(model))


def test_half_precision_round_trip_is_exact() -> None:
    model = make_mlp().half()
    spec = spec_of(model)
    assert set(spec.dtypes) == {"float16"}
    vector = to_vector(model)
    assert vector.dtype == np.float32
    load_vector(model, vector)
    assert np.array_equal(bits(to_vector(model)), bits(vector))


def test_spec_dict_round_trip() -> None:
    spec = spec_of(make_mlp())
    assert ParamSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ConfigError):
        ParamSpec.from_dict({"names": []})


def test_spec_validates_its_fields() -> None:
    with pytest.raises(ConfigError):
        ParamSpec(names=("a",), shapes=((1,), (2,)), dtypes=("float32",))
    with pytest.raises(ConfigError):
        ParamSpec(names=("a", "a"), shapes=((1,), (2,)), dtypes=("float32",) * 2)


def test_empty_model_has_empty_vector() -> None:
    model = nn.ReLU()
    assert spec_of(model).size == 0
    assert to_vector(model).shape == (0,)
    load_vector(model, np.zeros(0, dtype=np.float32))


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(
        st.lists(st.integers(min_value=0, max_value=4), min_size=0, max_size=3),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_round_trip_for_any_shapes(shapes: list[list[int]], seed: int) -> None:
    module = nn.Module()
    for i, shape in enumerate(shapes):
        module.register_parameter(f"p{i}", nn.Parameter(torch.zeros(shape)))
    spec = spec_of(module)
    assert spec.shapes == tuple(tuple(s) for s in shapes)
    vector = np.random.default_rng(seed).standard_normal(spec.size).astype(np.float32)
    load_vector(module, vector, spec)
    assert np.array_equal(bits(to_vector(module)), bits(vector))


def test_paramspec_import_does_not_load_torch_or_grpc() -> None:
    code = (
        "import sys; from fedlink.params import ParamSpec; "
        "assert 'torch' not in sys.modules and 'grpc' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_spec_records_each_tensors_kind() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    model[2].bias.requires_grad_(False)  # frozen: kept on the device, not in the vector
    spec = spec_of(model)
    assert dict(zip(spec.names, spec.kinds, strict=True)) == {
        "0.weight": TRAINABLE, "0.bias": TRAINABLE, "1.weight": TRAINABLE, "1.bias": TRAINABLE,
        "1.running_mean": BUFFER, "1.running_var": BUFFER, "1.num_batches_tracked": COUNTER,
        "2.weight": TRAINABLE}
    assert spec.mask(BUFFER).sum() == 6
    assert spec.mask(TRAINABLE).sum() == 6 + 3 + 3 + 3 + 6
    assert ParamSpec.from_dict(spec.to_dict()) == spec
    frozen = spec_of({"w": nn.Parameter(torch.zeros(2), requires_grad=False)})
    assert frozen.kinds == (FROZEN,)


def test_spec_without_kinds_means_what_it_meant_before() -> None:
    old = {"names": ["w", "n"], "shapes": [[2], []], "dtypes": ["float32", "int64"]}
    spec = ParamSpec.from_dict(old)
    assert spec.kinds == (TRAINABLE, COUNTER)
    with pytest.raises(ConfigError, match="unknown kinds"):
        ParamSpec(("w",), ((1,),), ("float32",), ("weights",))
