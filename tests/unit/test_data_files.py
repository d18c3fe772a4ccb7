"""Local-file datasets, each on a small fixture written in its exact on-disk format, and the
error each gives when its files are missing; the ``kclasses`` and ``quantity`` partitioners."""

from __future__ import annotations

import json
import pickle
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from fedlink.data import load_federated
from fedlink.data.files import SHAKESPEARE_LETTERS
from fedlink.errors import ConfigError

RNG = np.random.default_rng(0)


def _cifar_batch(path: Path, n: int, label_keys: dict[str, int]) -> None:
    """A CIFAR python pickle: bytes keys, uint8 rows of R, G, B planes, label lists."""
    batch = {b"batch_label": b"fixture", b"data": RNG.integers(0, 256, (n, 3072), np.uint8),
             b"filenames": [f"img{i}.png".encode() for i in range(n)]}
    for key, classes in label_keys.items():
        batch[key.encode()] = [int(v) for v in RNG.integers(0, classes, n)]
    with path.open("wb") as fh:
        pickle.dump(batch, fh, protocol=2)


def test_cifar10_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        _cifar_batch(folder / f"data_batch_{i}", 8, {"labels": 10})
    _cifar_batch(folder / "test_batch", 6, {"labels": 10})
    data = load_federated("cifar10", 4, 0, root=str(tmp_path))
    assert data.client_sizes() == (10, 10, 10, 10) and len(data.test) == 6
    assert data.num_features == 3072 and data.num_classes == 10
    assert data.test.x.min() >= 0.0 and data.test.x.max() <= 1.0
    raw = pickle.loads((folder / "test_batch").read_bytes())
    np.testing.assert_allclose(data.test.x[0], raw[b"data"][0] / 255.0, rtol=1e-6)
    (folder / "data_batch_3").unlink()
    with pytest.raises(ConfigError, match=r"CIFAR-10 not found: expected .*data_batch_3.*"
                                          r"cifar-10-python\.tar\.gz"):
        load_federated("cifar10", 4, 0, root=str(tmp_path))


def test_cifar100_pickles_fine_and_coarse(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for part, n in (("train", 20), ("test", 5)):
        _cifar_batch(folder / part, n, {"fine_labels": 100, "coarse_labels": 20})
    fine = load_federated("cifar100", 2, 0, root=str(tmp_path))
    coarse = load_federated("cifar100", 2, 0, root=str(tmp_path), label="coarse")
    assert (fine.num_classes, coarse.num_classes) == (100, 20)
    with pytest.raises(ConfigError, match="CIFAR-100 not found"):
        load_federated("cifar100", 2, 0, root=str(tmp_path / "elsewhere"))


def _leaf(root: Path, users: dict[str, int], make_x: object, make_y: object) -> None:
    """LEAF's layout: train/ and test/ JSON files with users, num_samples and user_data."""
    for split, share in (("train", 1.0), ("test", 0.5)):
        (root / split).mkdir(parents=True)
        names = list(users)
        for index, chunk in enumerate((names[:2], names[2:])):  # users spread over two files
            data = {u: {"x": [make_x() for _ in range(max(1, int(users[u] * share)))],  # type: ignore[operator]
                        "y": [make_y() for _ in range(max(1, int(users[u] * share)))]}  # type: ignore[operator]
                    for u in chunk}
            document = {"users": chunk, "num_samples": [len(data[u]["y"]) for u in chunk],
                        "user_data": data}
            (root / split / f"all_data_{index}_niid_0_{split}.json").write_text(
                json.dumps(document))


def test_femnist_leaf_json_natural_partition(tmp_path: Path) -> None:
    users = {"f0000_14": 5, "f0001_41": 3, "f0002_07": 8, "f0003_22": 2}
    _leaf(tmp_path, users, lambda: RNG.random(784).tolist(), lambda: int(RNG.integers(62)))
    data = load_federated("femnist", 3, 0, root=str(tmp_path))  # natural by default
    assert data.partition == "natural"
    assert data.client_sizes() == (5, 3, 8)  # one client per writer, in file order
    assert len(data.test) == 2 + 1 + 4  # the chosen writers' LEAF test samples
    assert (data.num_features, data.num_classes) == (784, 62)
    with pytest.raises(ConfigError, match="holds 4 users, 5 clients"):
        load_federated("femnist", 5, 0, root=str(tmp_path))
    with pytest.raises(ConfigError, match=r"LEAF femnist JSON files not found.*leaf"):
        load_federated("femnist", 3, 0, root=str(tmp_path / "missing"))


def test_shakespeare_leaf_json_encodes_characters(tmp_path: Path) -> None:
    def line() -> str:
        return "".join(RNG.choice(list(SHAKESPEARE_LETTERS), 80))

    _leaf(tmp_path, {"ALLS_WELL_HELENA": 4, "HAMLET_OPHELIA": 2, "a": 2, "b": 2}, line,
          lambda: str(RNG.choice(list(SHAKESPEARE_LETTERS))))
    data = load_federated("shakespeare", 2, 0, root=str(tmp_path))
    assert data.client_sizes() == (4, 2) and data.num_features == 80
    assert data.num_classes == len(SHAKESPEARE_LETTERS) == 80
    first = json.loads((tmp_path / "train" / "all_data_0_niid_0_train.json").read_text())
    text = first["user_data"]["ALLS_WELL_HELENA"]["x"][0]
    assert [SHAKESPEARE_LETTERS[int(i)] for i in data.clients[0].x[0]] == list(text)
    with pytest.raises(ConfigError, match="LEAF shakespeare JSON files not found"):
        load_federated("shakespeare", 2, 0, root=str(tmp_path / "missing"))


def test_image_folder_tree(tmp_path: Path) -> None:
    from PIL import Image

    for split, count in (("train", 3), ("test", 1)):
        for name in ("cat", "dog"):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = RNG.integers(0, 256, (6, 5, 3), np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    data = load_federated("image_folder", 2, 0, root=str(tmp_path))
    assert data.num_classes == 2 and data.num_features == 3 * 6 * 5
    assert sorted(data.test.y.tolist()) == [0, 1]
    small = load_federated("image_folder", 2, 0, root=str(tmp_path), size=[4, 4],
                           grayscale=True)
    assert small.num_features == 16
    with pytest.raises(ConfigError, match="image_folder split not found"):
        load_federated("image_folder", 2, 0, root=str(tmp_path / "missing"))


def test_npz_with_natural_users(tmp_path: Path) -> None:
    path = tmp_path / "mine.npz"
    np.savez(path, x_train=RNG.random((12, 2, 3)), y_train=np.arange(12) % 3,
             x_test=RNG.random((4, 2, 3)), y_test=np.arange(4) % 3,
             users_train=np.array(["u1"] * 5 + ["u2"] * 4 + ["u3"] * 3))
    pooled = load_federated("npz", 3, 0, root=str(path))
    assert pooled.num_features == 6 and pooled.num_classes == 3
    natural = load_federated("npz", 2, 0, "natural", root=str(path))
    assert natural.client_sizes() == (5, 4)
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((2, 2)))
    with pytest.raises(ConfigError, match=r"lacks arrays \['x_test', 'y_test', 'y_train'\]"):
        load_federated("npz", 1, 0, root=str(tmp_path / "bad.npz"))
    with pytest.raises(ConfigError, match="npz file not found"):
        load_federated("npz", 1, 0, root=str(tmp_path / "none.npz"))


def test_hugging_face_save_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    features = datasets.Features({"pixels": datasets.Sequence(datasets.Value("float32")),
                                  "label": datasets.ClassLabel(num_classes=4)})

    def split(n: int) -> object:
        return datasets.Dataset.from_dict(
            {"pixels": RNG.random((n, 5)).tolist(), "label": (np.arange(n) % 4).tolist()},
            features=features)

    datasets.DatasetDict({"train": split(12), "test": split(4)}).save_to_disk(tmp_path / "hf")
    data = load_federated("hf_disk", 3, 0, root=str(tmp_path / "hf"), features="pixels")
    assert data.client_sizes() == (4, 4, 4) and data.num_classes == 4
    assert data.num_features == 5
    with pytest.raises(ConfigError, match="Hugging Face dataset not found"):
        load_federated("hf_disk", 3, 0, root=str(tmp_path / "none"), features="pixels")


def test_kclasses_gives_each_client_exactly_k_classes() -> None:
    data = load_federated("digits", 5, 0, "kclasses", k=2)
    assert [len(np.unique(c.y)) for c in data.clients] == [2] * 5
    assert sum(data.client_sizes()) == 1437  # 5 x 2 places cover all 10 classes
    again = load_federated("digits", 5, 0, "kclasses", k=2)
    assert all(np.array_equal(a.y, b.y) for a, b in zip(data.clients, again.clients,
                                                        strict=True))
    with pytest.raises(ConfigError, match="k: 11 classes per client"):
        load_federated("digits", 5, 0, "kclasses", k=11)


def test_quantity_skew_is_seeded_and_skewed_with_iid_labels() -> None:
    sizes = load_federated("digits", 10, 0, "quantity", exponent=1.0).client_sizes()
    assert sizes == load_federated("digits", 10, 0, "quantity", exponent=1.0).client_sizes()
    assert sum(sizes) == 1437 and min(sizes) >= 10
    assert max(sizes) > 3 * sorted(sizes)[len(sizes) // 2]  # a few clients hold most
    assert sizes != load_federated("digits", 10, 1, "quantity", exponent=1.0).client_sizes()


def test_label_distribution_plot_in_the_report(tmp_path: Path) -> None:
    from fedlink.metrics import write_report
    from fedlink.metrics.distribution import LABEL_PLOT, label_distribution

    data = load_federated("digits", 4, 0, "kclasses", k=2)
    entry = label_distribution([c.label_counts().tolist() for c in data.clients])
    assert [sum(1 for v in row if v) for row in entry["counts"]] == [2, 2, 2, 2]
    flush = {"kind": "flush", "model_version": 1, "accuracy": 0.5, "elapsed": 1.0}
    report = write_report(tmp_path, [flush], {"label_distribution": entry}).read_text()
    assert f"![Labels per client]({LABEL_PLOT})" in report
    assert ET.parse(tmp_path / LABEL_PLOT).getroot().tag == "{http://www.w3.org/2000/svg}svg"


def test_kclasses_with_fewer_places_than_classes_leaves_some_out() -> None:
    data = load_federated("digits", 4, 0, "kclasses", k=2)
    held = set().union(*(set(c.y.tolist()) for c in data.clients))
    assert len(held) == 8 and [len(np.unique(c.y)) for c in data.clients] == [2] * 4
