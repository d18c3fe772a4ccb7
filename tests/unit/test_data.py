"""fedlink.data: datasets, partitioners and load_federated."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fedlink.data import (
    CentralData,
    Dataset,
    FederatedData,
    dirichlet,
    get_dataset,
    get_partitioner,
    iid,
    load_federated,
    register_dataset,
    register_partitioner,
    shards,
)
from fedlink.errors import ConfigError

DIGITS_TRAIN, DIGITS_TEST = 1437, 360


def all_indices(parts: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(parts))


def label_skew(fed: FederatedData) -> float:
    """Mean total-variation distance between client label mixes and the overall mix."""
    counts = np.sum([c.label_counts() for c in fed.clients], axis=0)
    overall = counts / counts.sum()
    return float(
        np.mean([0.5 * np.abs(c.label_counts() / len(c) - overall).sum() for c in fed.clients])
    )


@pytest.fixture(scope="module")
def digits_labels() -> np.ndarray:
    return load_federated("digits", 1, seed=0).clients[0].y


# ---- digits -------------------------------------------------------------------------------


def test_digits_split_sizes_types_and_scaling() -> None:
    fed = load_federated("digits", num_clients=5, seed=0)
    assert fed.num_clients == 5
    assert sum(fed.client_sizes()) == DIGITS_TRAIN
    assert len(fed.test) == DIGITS_TEST
    assert (fed.num_features, fed.num_classes) == (64, 10)
    for data in (*fed.clients, fed.test):
        assert data.x.dtype == np.float32 and data.y.dtype == np.int64
        assert data.x.shape == (len(data), 64)
        assert data.x.min() >= 0.0 and data.x.max() <= 1.0
    assert fed.test.x.max() == 1.0


def test_digits_read_without_importing_sklearn_match_its_loader() -> None:
    # the bundled file is read directly (importing sklearn costs seconds of every start)
    code = ("import sys; from fedlink.data.digits import _raw; x, y = _raw(); "
            "print(x.shape, y.shape, 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split(")")
    assert out[-1].strip() == "False", out
    from sklearn.datasets import load_digits

    from fedlink.data.digits import _raw

    x, y = _raw()
    bunch = load_digits()
    np.testing.assert_array_equal(x, bunch.data.astype(np.float32) / np.float32(16.0))
    np.testing.assert_array_equal(y, bunch.target)


def test_digits_test_set_is_stratified() -> None:
    counts = load_federated("digits", 1, seed=3).test.label_counts()
    assert counts.sum() == DIGITS_TEST
    assert counts.min() >= 35 and counts.max() <= 37


def test_digits_train_and_test_are_disjoint() -> None:
    fed = load_federated("digits", 1, seed=0)
    train = _rows(fed.clients[0])
    test = _rows(fed.test)
    # a few digits images are duplicates in the source data; nearly all must be apart
    assert len(train & test) <= 5


def _rows(data: Dataset) -> set[bytes]:
    return {row.tobytes() + bytes([label]) for row, label in zip(data.x, data.y, strict=True)}


def test_digits_is_reproducible_with_seed() -> None:
    first = load_federated("digits", 4, seed=7, partition="dirichlet", alpha=0.5)
    again = load_federated("digits", 4, seed=7, partition="dirichlet", alpha=0.5)
    other = load_federated("digits", 4, seed=8, partition="dirichlet", alpha=0.5)
    for a, b in zip(first.clients, again.clients, strict=True):
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert np.array_equal(first.test.x, again.test.x)
    assert not np.array_equal(first.test.x, other.test.x)
    assert first.client_sizes() != other.client_sizes()


def test_test_set_does_not_depend_on_partition() -> None:
    by_iid = load_federated("digits", 5, seed=1, partition="iid")
    by_shards = load_federated("digits", 5, seed=1, partition="shards")
    assert np.array_equal(by_iid.test.x, by_shards.test.x)
    assert np.array_equal(by_iid.test.y, by_shards.test.y)


def test_unstratified_split_has_same_size() -> None:
    fed = load_federated("digits", 2, seed=0, stratify=False, test_fraction=0.5)
    assert len(fed.test) == 899 and sum(fed.client_sizes()) == 898


# ---- partitioners -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards"])
@pytest.mark.parametrize("num_clients", [1, 7, 20])
def test_partition_covers_every_index_exactly_once(
    digits_labels: np.ndarray, name: str, num_clients: int
) -> None:
    parts = get_partitioner(name)(digits_labels, num_clients, np.random.default_rng(0))
    assert len(parts) == num_clients
    assert np.array_equal(all_indices(parts), np.arange(len(digits_labels)))
    assert all(part.dtype == np.int64 and len(part) > 0 for part in parts)


def test_iid_sizes_differ_by_at_most_one(digits_labels: np.ndarray) -> None:
    sizes = [len(p) for p in iid(digits_labels, 10, np.random.default_rng(0))]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    skew = {
        alpha: np.mean(
            [
                label_skew(load_federated("digits", 10, seed, partition="dirichlet", alpha=alpha))
                for seed in range(3)
            ]
        )
        for alpha in (100.0, 1.0, 0.1)
    }
    assert skew[100.0] < 0.1
    assert skew[100.0] < skew[1.0] < skew[0.1]
    assert skew[0.1] > 0.5


def test_dirichlet_gives_every_client_min_samples(digits_labels: np.ndarray) -> None:
    for seed in range(5):
        parts = dirichlet(
            digits_labels, 50, np.random.default_rng(seed), alpha=0.01, min_samples=20
        )
        assert min(len(p) for p in parts) >= 20
        assert np.array_equal(all_indices(parts), np.arange(len(digits_labels)))


def test_dirichlet_refuses_impossible_floor(digits_labels: np.ndarray) -> None:
    with pytest.raises(ConfigError, match="need >= 2000"):
        dirichlet(digits_labels, 100, np.random.default_rng(0), min_samples=20)


def test_shards_give_each_client_few_labels(digits_labels: np.ndarray) -> None:
    parts = shards(digits_labels, 10, np.random.default_rng(0), shards_per_client=2)
    labels_per_client = [len(np.unique(digits_labels[p])) for p in parts]
    assert max(labels_per_client) <= 4  # a shard may straddle one label boundary
    assert np.mean(labels_per_client) <= 3
    fed = load_federated("digits", 10, seed=0, partition="shards", shards_per_client=1)
    assert np.mean([len(np.unique(c.y)) for c in fed.clients]) <= 2.5


def test_partition_needs_enough_examples() -> None:
    labels = np.zeros(5, dtype=np.int64)
    with pytest.raises(ConfigError):
        iid(labels, 6, np.random.default_rng(0))
    with pytest.raises(ConfigError):
        shards(labels, 3, np.random.default_rng(0), shards_per_client=2)


# ---- synthetic ----------------------------------------------------------------------------


def test_synthetic_shapes_classes_and_sizes() -> None:
    fed = load_federated("synthetic", num_clients=30, seed=0, max_samples=2000)
    assert fed.partition == "natural"
    assert (fed.num_features, fed.num_classes) == (60, 10)
    assert fed.num_clients == 30
    sizes = np.array(fed.client_sizes())
    assert sizes.min() >= 40  # >= 50 per device, 20% of which is held out
    assert sizes.max() <= 1600  # capped at 2000 per device
    assert len(fed.test) == pytest.approx(sizes.sum() / 4, rel=0.05)
    labels = np.concatenate([c.y for c in fed.clients])
    assert labels.min() >= 0 and labels.max() <= 9
    assert len(np.unique(labels)) >= 5
    assert fed.test.x.dtype == np.float32 and fed.test.y.dtype == np.int64


def test_synthetic_sizes_follow_fedprox_lognormal_without_a_cap() -> None:
    fed = load_federated("synthetic", num_clients=200, seed=1, test_fraction=0.0001)
    totals = np.array(fed.client_sizes()) + 1  # one example per device is held out
    assert totals.min() >= 50
    # int(lognormal(4, 2)) + 50: median e^4 + 50 = 105; the tail passes the old 2000 cap
    assert np.median(totals) == pytest.approx(104.6, rel=0.25)
    assert totals.max() > 2000
    with pytest.raises(ConfigError, match="max_samples"):
        load_federated("synthetic", 2, seed=0, max_samples=10)


def test_synthetic_is_reproducible_with_seed() -> None:
    first = load_federated("synthetic", 5, seed=3, alpha=0.5, beta=0.5)
    again = load_federated("synthetic", 5, seed=3, alpha=0.5, beta=0.5)
    other = load_federated("synthetic", 5, seed=4, alpha=0.5, beta=0.5)
    for a, b in zip(first.clients, again.clients, strict=True):
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(first.clients[0].x[:10], other.clients[0].x[:10])


def test_synthetic_devices_do_not_depend_on_count() -> None:
    small = load_federated("synthetic", 3, seed=0)
    large = load_federated("synthetic", 10, seed=0)
    for a, b in zip(small.clients, large.clients[:3], strict=True):
        assert np.array_equal(a.x, b.x)


def test_synthetic_devices_differ_in_inputs_and_labels() -> None:
    fed = load_federated("synthetic", 10, seed=0, alpha=1.0, beta=1.0)
    means = np.array([c.x.mean() for c in fed.clients])
    assert means.std() > 0.2
    assert label_skew(fed) > 0.2


def test_synthetic_pool_can_be_repartitioned() -> None:
    fed = load_federated("synthetic", 8, seed=0, partition="iid", alpha=0.0, beta=0.0)
    sizes = fed.client_sizes()
    assert max(sizes) - min(sizes) <= 1


# ---- load_federated errors and registries -------------------------------------------------


def test_unknown_dataset_lists_known_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown dataset 'mnist'.*digits.*synthetic"):
        load_federated("mnist", 2, 0)
    with pytest.raises(ConfigError, match="digits"):
        get_dataset("nope")


def test_unknown_partition_lists_known_names() -> None:
    with pytest.raises(ConfigError, match="dirichlet, iid, kclasses, natural, quantity, shards"):
        load_federated("digits", 2, 0, partition="labels")
    with pytest.raises(ConfigError, match="known: dirichlet, iid, kclasses, quantity, shards"):
        get_partitioner("labels")


def test_unknown_option_is_refused_with_accepted_list() -> None:
    with pytest.raises(ConfigError, match=r"\['colour'\].*'alpha'.*'test_fraction'"):
        load_federated("digits", 2, 0, partition="dirichlet", colour="red")
    with pytest.raises(ConfigError, match="alpha"):
        load_federated("digits", 2, 0, alpha=0.5)  # iid takes no alpha


def test_option_both_sides_accept_is_refused() -> None:
    with pytest.raises(ConfigError, match="both"):
        load_federated("synthetic", 5, 0, partition="dirichlet", alpha=0.5)


def test_natural_partition_needs_natural_data() -> None:
    with pytest.raises(ConfigError, match="no natural partition"):
        load_federated("digits", 2, 0, partition="natural")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_clients": 0}, "num_clients"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"stratify": "yes"}, "stratify"),
        ({"partition": "dirichlet", "alpha": 0}, "alpha"),
        ({"partition": "dirichlet", "alpha": True}, "alpha"),
        ({"partition": "shards", "shards_per_client": 0}, "shards_per_client"),
    ],
)
def test_bad_values_are_config_errors(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"name": "digits", "num_clients": 3, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=field):
        load_federated(**args)  # type: ignore[arg-type]


def test_custom_dataset_and_partitioner_can_be_registered() -> None:
    def tiny(num_clients: int, rng: np.random.Generator, *, size: int = 12) -> CentralData:
        x = rng.random((size, 2)).astype(np.float32)
        data = Dataset(x, np.arange(size) % 2, num_classes=2, num_features=2, name="tiny")
        return CentralData(train=data, test=data)

    def halves(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return list(np.array_split(np.arange(len(labels)), num_clients))

    register_dataset("test-tiny", tiny, replace=True)
    register_partitioner("test-halves", halves, replace=True)
    fed = load_federated("test-tiny", 2, 0, partition="test-halves", size=10)
    assert fed.client_sizes() == (5, 5)
    with pytest.raises(ConfigError, match="already registered"):
        register_dataset("test-tiny", tiny)


def test_registering_kwargs_function_is_refused() -> None:
    def loose(labels: np.ndarray, num_clients: int, rng: object, **params: object) -> list:
        return []

    with pytest.raises(ConfigError, match="keyword-only"):
        register_partitioner("test-loose", loose)


# ---- Dataset contract ---------------------------------------------------------------------


def test_dataset_converts_and_freezes_arrays() -> None:
    x = np.zeros((3, 2))
    y = np.array([0, 1, 1], dtype=np.int32)
    data = Dataset(x, y, num_classes=2, num_features=2)
    assert data.x.dtype == np.float32 and data.y.dtype == np.int64
    assert not data.x.flags.writeable and not data.y.flags.writeable
    assert x.flags.writeable
    assert data.label_counts().tolist() == [1, 2]
    assert len(data.subset(np.array([2]))) == 1


@pytest.mark.parametrize(
    ("x", "y", "classes", "features"),
    [
        (np.zeros((3, 2)), np.zeros(2, dtype=np.int64), 2, 2),
        (np.zeros((3, 2)), np.array([0, 1, 2]), 2, 2),
        (np.zeros((3, 2)), np.array([0.0, 1.0, 0.0]), 2, 2),
        (np.zeros((3, 2)), np.zeros(3, dtype=np.int64), 2, 3),
        (np.zeros(3), np.zeros(3, dtype=np.int64), 2, 1),
    ],
    ids=["length", "label-range", "float-labels", "features", "1-D"],
)
def test_dataset_refuses_inconsistent_arrays(
    x: np.ndarray, y: np.ndarray, classes: int, features: int
) -> None:
    with pytest.raises(ConfigError):
        Dataset(x, y, num_classes=classes, num_features=features)


def test_data_package_imports_neither_torch_nor_grpc() -> None:
    code = (
        "import sys; from fedlink.data import load_federated; "
        "load_federated('digits', 2, 0); load_federated('synthetic', 2, 0); "
        "assert 'torch' not in sys.modules and 'grpc' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_subset_is_the_checked_dataset_of_its_rows() -> None:
    """``subset`` skips the checks its rows passed already, and gives what they would give."""
    rng = np.random.default_rng(0)
    data = Dataset(rng.normal(size=(9, 3)), rng.integers(0, 4, 9), 4, 3, "pool")
    rows = np.array([8, 0, 3, 3])
    part, checked = data.subset(rows, "part"), Dataset(data.x[rows], data.y[rows], 4, 3, "part")
    for got, want in ((part.x, checked.x), (part.y, checked.y)):
        assert got.dtype == want.dtype and got.flags.c_contiguous
        assert not got.flags.writeable
        np.testing.assert_array_equal(got, want)
    assert (part.num_classes, part.num_features, part.name) == (4, 3, "part")
    assert data.subset(rows).name == "pool"
    assert not np.shares_memory(part.x, data.x)  # a copy: the pool's rows stay its own
    with pytest.raises(IndexError):
        data.subset(np.array([9]))
