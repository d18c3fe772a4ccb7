"""Datasets from local files, in their published on-disk formats; never downloaded at run time.

Each builder takes ``root`` (a folder or file the user placed) and, when it is missing, fails
with a ``ConfigError`` saying what was expected there and where to get it. Features come out
as flat float32 rows (images in C x H x W order, scaled to [0, 1]: reshape them in the model,
e.g. ``nn.Unflatten(1, (3, 32, 32))``); labels as int64.

=================  ==========================================================  ===============
name               what ``root`` holds                                         partition
=================  ==========================================================  ===============
``cifar10``        ``cifar-10-batches-py/`` (``data_batch_1..5``, ``test_batch``,  ``iid``
                   python pickles)
``cifar100``       ``cifar-100-python/`` (``train``, ``test``); ``label =      ``iid``
                   "fine" | "coarse"``
``femnist``        LEAF's ``train/*.json`` and ``test/*.json`` (``users``,      ``natural``
                   ``user_data: {user: {x: [[784 floats]], y: [class]}}``)       (by writer)
``shakespeare``    LEAF's JSON layout, ``x`` 80-character strings, ``y`` the    ``natural``
                   next character                                                (by speaker)
``image_folder``   ``train/<class>/*.png|jpg`` and ``test/<class>/...``        ``iid``
                   (torchvision's ``ImageFolder`` layout; Pillow decodes)
``npz``            one ``.npz`` with ``x_train``, ``y_train``, ``x_test``,      ``iid``, or
                   ``y_test`` (optional ``users_train``: natural groups)          ``natural``
``hf_disk``        a Hugging Face ``DatasetDict`` written by ``save_to_disk``   ``iid``
                   (needs ``datasets``: ``pip install 'fedlink[hf]'``)
=================  ==========================================================  ===============

The LEAF datasets are partitioned naturally: client ``i`` is the ``i``-th writer (or
speaker) in file order, and the central test set pools those writers' LEAF test samples.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedlink.data.base import NATURAL, CentralData, Dataset, register_dataset
from fedlink.errors import ConfigError

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
LEAF_URL = "https://github.com/TalwalkarLab/leaf (run its preprocess.sh for {name})"
SHAKESPEARE_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
"""LEAF's Shakespeare vocabulary: a character's index is its class and its feature value."""
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


def _missing(what: str, root: Path, source: str) -> ConfigError:
    return ConfigError(f"{what} not found: expected {root}; fedlink never downloads data at "
                       f"run time: get it from {source} and place it there (or set the "
                       f"dataset's root option)")


def _root(root: str, name: str) -> Path:
    if not root:
        raise ConfigError(f"dataset {name!r} needs options.root: where its files are")
    return Path(root).expanduser()


def _central(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
             num_classes: int, name: str,
             groups: tuple[np.ndarray, ...] | None = None) -> CentralData:
    """``CentralData`` from (x, y) pairs whose x may have any number of trailing dimensions."""
    def dataset(x: np.ndarray, y: np.ndarray, split: str) -> Dataset:
        flat = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
        return Dataset(flat, np.asarray(y, dtype=np.int64), num_classes, flat.shape[1],
                       f"{name}-{split}")
    return CentralData(dataset(*train, "train"), dataset(*test, "test"), groups)


# -- CIFAR ------------------------------------------------------------------------------------


def _unpickle(path: Path) -> dict[bytes, Any]:
    with path.open("rb") as fh:
        loaded: dict[bytes, Any] = pickle.load(fh, encoding="bytes")
    return loaded


def _cifar_images(batch: dict[bytes, Any]) -> np.ndarray:
    """CIFAR's uint8 rows (R, G, B planes of 32 x 32) as float32 in [0, 1]."""
    return np.asarray(batch[b"data"], dtype=np.float32) / np.float32(255.0)


def cifar10(num_clients: int, rng: np.random.Generator, *, root: str = "") -> CentralData:
    """CIFAR-10 from the python pickles (50000 train, 10000 test, 3072 features, 10 classes)."""
    folder = _root(root, "cifar10") / "cifar-10-batches-py"
    files = [folder / f"data_batch_{i}" for i in range(1, 6)] + [folder / "test_batch"]
    absent = [f for f in files if not f.is_file()]
    if absent:
        raise _missing("CIFAR-10", absent[0], CIFAR10_URL)
    batches = [_unpickle(f) for f in files]
    train_x = np.concatenate([_cifar_images(b) for b in batches[:5]])
    train_y = np.concatenate([np.asarray(b[b"labels"]) for b in batches[:5]])
    test = batches[5]
    return _central((train_x, train_y), (_cifar_images(test), np.asarray(test[b"labels"])),
                    10, "cifar10")


def cifar100(num_clients: int, rng: np.random.Generator, *, root: str = "",
             label: str = "fine") -> CentralData:
    """CIFAR-100 (100 fine or 20 coarse classes) from the python pickles."""
    if label not in ("fine", "coarse"):
        raise ConfigError(f"cifar100.label: must be 'fine' or 'coarse', got {label!r}")
    folder = _root(root, "cifar100") / "cifar-100-python"
    for part in ("train", "test"):
        if not (folder / part).is_file():
            raise _missing("CIFAR-100", folder / part, CIFAR100_URL)
    key = f"{label}_labels".encode()
    train, test = _unpickle(folder / "train"), _unpickle(folder / "test")
    return _central((_cifar_images(train), np.asarray(train[key])),
                    (_cifar_images(test), np.asarray(test[key])),
                    100 if label == "fine" else 20, f"cifar100-{label}")


# -- LEAF -------------------------------------------------------------------------------------


def _leaf_users(folder: Path, name: str) -> Iterator[tuple[str, dict[str, list[Any]]]]:
    """(user, {"x": ..., "y": ...}) over every JSON file of a LEAF split, in file order."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        raise _missing(f"LEAF {name} JSON files", folder / "*.json",
                       LEAF_URL.format(name=name))
    for path in files:
        with path.open(encoding="utf-8") as fh:
            document = json.load(fh)
        try:
            for user in document["users"]:
                yield str(user), document["user_data"][user]
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: not LEAF's layout (users, user_data): {exc}") from exc


def _leaf(num_clients: int, root: str, name: str, num_classes: int,
          encode: Any) -> CentralData:
    """The first ``num_clients`` users of a LEAF dataset, one natural group each."""
    base = _root(root, name)
    chosen: dict[str, dict[str, list[Any]]] = {}
    for user, data in _leaf_users(base / "train", name):
        chosen.setdefault(user, data)
        if len(chosen) == num_clients:
            break
    if len(chosen) < num_clients:
        raise ConfigError(f"{name}: {base / 'train'} holds {len(chosen)} users, "
                          f"{num_clients} clients were asked for")
    test_x, test_y = [], []
    for user, data in _leaf_users(base / "test", name):
        if user in chosen:
            test_x += [encode(x) for x in data["x"]]
            test_y += [encode(y, label=True) for y in data["y"]]
    if not test_y:
        raise ConfigError(f"{name}: {base / 'test'} holds no samples of the chosen users")
    xs, ys, groups, start = [], [], [], 0
    for data in chosen.values():
        xs += [encode(x) for x in data["x"]]
        ys += [encode(y, label=True) for y in data["y"]]
        groups.append(np.arange(start, len(ys), dtype=np.int64))
        start = len(ys)
    return _central((np.asarray(xs), np.asarray(ys)), (np.asarray(test_x), np.asarray(test_y)),
                    num_classes, name, tuple(groups))


def _femnist_encode(value: Any, label: bool = False) -> Any:
    return int(value) if label else np.asarray(value, dtype=np.float32)


def _shakespeare_encode(value: str, label: bool = False) -> Any:
    indices = [SHAKESPEARE_LETTERS.find(ch) for ch in value]
    if -1 in indices:
        raise ConfigError(f"shakespeare: character outside LEAF's vocabulary in {value!r}")
    return indices[0] if label else np.asarray(indices, dtype=np.float32)


def femnist(num_clients: int, rng: np.random.Generator, *, root: str = "") -> CentralData:
    """LEAF FEMNIST (28 x 28 = 784 features, 62 classes), one client per writer."""
    return _leaf(num_clients, root, "femnist", 62, _femnist_encode)


def shakespeare(num_clients: int, rng: np.random.Generator, *, root: str = "") -> CentralData:
    """LEAF Shakespeare: 80 character indices -> the next character (80 classes), one client
    per speaking role; feed the features to an ``nn.Embedding`` after ``.long()``."""
    return _leaf(num_clients, root, "shakespeare", len(SHAKESPEARE_LETTERS),
                 _shakespeare_encode)


# -- image folders, npz, Hugging Face -----------------------------------------------------------


def _image_split(folder: Path, classes: list[str], size: tuple[int, ...] | None,
                 grayscale: bool) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image  # deferred: only this loader decodes images

    xs, ys = [], []
    for label, name in enumerate(classes):
        for path in sorted((folder / name).iterdir()):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            with Image.open(path) as opened:
                image = opened.convert("L" if grayscale else "RGB")
            if size is not None:
                image = image.resize((size[1], size[0]))
            pixels = np.asarray(image, dtype=np.float32) / np.float32(255.0)
            xs.append(pixels[None] if grayscale else pixels.transpose(2, 0, 1))
            ys.append(label)
    shapes = {x.shape for x in xs}
    if len(shapes) > 1:
        raise ConfigError(f"image_folder: images in {folder} differ in size {sorted(shapes)}; "
                          f"set options.size = [height, width]")
    return np.stack(xs), np.asarray(ys)


def image_folder(num_clients: int, rng: np.random.Generator, *, root: str = "",
                 size: tuple[int, int] | list[int] | None = None,
                 grayscale: bool = False) -> CentralData:
    """An ``ImageFolder`` tree: ``train/<class>/`` and ``test/<class>/``; classes sorted by
    name; every image resized to ``size = [height, width]`` when given."""
    base = _root(root, "image_folder")
    train_dir, test_dir = base / "train", base / "test"
    for folder in (train_dir, test_dir):
        if not folder.is_dir():
            raise _missing("image_folder split", folder, "your own images, one folder per class")
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not classes:
        raise ConfigError(f"image_folder: {train_dir} has no class folders")
    shape = None if size is None else tuple(int(s) for s in size)
    return _central(_image_split(train_dir, classes, shape, grayscale),
                    _image_split(test_dir, [c for c in classes if (test_dir / c).is_dir()],
                                 shape, grayscale), len(classes), base.name)


def npz(num_clients: int, rng: np.random.Generator, *, root: str = "",
        num_classes: int = 0) -> CentralData:
    """Arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` (any trailing shape) from one
    ``.npz``; ``users_train`` (one id per train example), when present, gives the natural
    partition (first ``num_clients`` ids in order of appearance). ``num_classes`` defaults to
    ``max(label) + 1``."""
    path = _root(root, "npz")
    if not path.is_file():
        raise _missing("npz file", path, "your own arrays (numpy.savez)")
    with np.load(path, allow_pickle=False) as arrays:
        missing = sorted({"x_train", "y_train", "x_test", "y_test"} - set(arrays.files))
        if missing:
            raise ConfigError(f"{path}: lacks arrays {missing} (has {sorted(arrays.files)})")
        loaded = {k: arrays[k] for k in arrays.files}
    y_train, y_test = loaded["y_train"], loaded["y_test"]
    classes = num_classes or int(max(y_train.max(), y_test.max())) + 1
    groups = None
    if "users_train" in loaded:
        users = loaded["users_train"]
        order = list(dict.fromkeys(users.tolist()))[:num_clients]
        groups = tuple(np.flatnonzero(users == user) for user in order)
    return _central((loaded["x_train"], y_train), (loaded["x_test"], y_test), classes,
                    path.stem, groups)


def hf_disk(num_clients: int, rng: np.random.Generator, *, root: str = "",
            features: str = "image", label: str = "label", train: str = "train",
            test: str = "test") -> CentralData:
    """A Hugging Face ``DatasetDict`` saved with ``save_to_disk``: column ``features``
    (numbers, arrays or images; images scaled to [0, 1]) and integer column ``label``."""
    try:
        import datasets  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise ConfigError("dataset 'hf_disk' needs the datasets package: pip install "
                          "'fedlink[hf]'") from exc
    path = _root(root, "hf_disk")
    if not path.is_dir():
        raise _missing("Hugging Face dataset", path, "datasets' save_to_disk")
    saved = datasets.load_from_disk(str(path))
    splits = []
    for split in (train, test):
        if split not in saved:
            raise ConfigError(f"{path}: no split {split!r} (has {sorted(saved)})")
        table = saved[split].with_format("numpy")
        x = np.asarray(table[features], dtype=np.float32)
        if saved[split].features[features].__class__.__name__ == "Image":
            x = x / np.float32(255.0)
        splits.append((x, np.asarray(table[label])))
    info = saved[train].features[label]
    classes = getattr(info, "num_classes", None) or int(max(s[1].max() for s in splits)) + 1
    return _central(splits[0], splits[1], classes, path.name)


register_dataset("cifar10", cifar10)
register_dataset("cifar100", cifar100)
register_dataset("femnist", femnist, default_partition=NATURAL)
register_dataset("shakespeare", shakespeare, default_partition=NATURAL)
register_dataset("image_folder", image_folder)
register_dataset("npz", npz)
register_dataset("hf_disk", hf_disk)
