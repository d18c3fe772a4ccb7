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

**What is read when.** The central test set is read at start (the coordinator evaluates on
it). The train pool's labels are read at start too (partitioners and summaries need them),
but its features are a ``fedlink.data.lazy.LazyDataset``: a client's share is read when that
client first trains, and a client that never trains never reads it.

- ``image_folder``: the files are listed and their headers read at start (sizes, checked
  equal); a share's images are decoded when its client trains.
- ``femnist``, ``shakespeare``: the train JSON files are parsed once at start to index the
  chosen users and keep their labels; a client's features are read from its user's JSON file
  when it trains (that file is parsed again then).
- ``npz``: the labels and the test arrays are read at start; ``x_train`` is memory-mapped
  from the archive when it is stored uncompressed (``numpy.savez``), so a share reads its own
  rows only; a compressed archive (``numpy.savez_compressed``) cannot be read in part, so its
  ``x_train`` is decompressed when the first client trains and kept.
- ``hf_disk``: the Arrow files are memory-mapped by ``datasets``; a share's rows are
  selected and converted when its client trains.
- CIFAR: the pickles are read at start, whole (a pickle cannot be read in part; the train
  batches hold 150 MB of uint8 pixels); what is deferred is the float32 conversion, four times
  that size, to each share when its client trains.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedlink.data.base import NATURAL, CentralData, Dataset, register_dataset
from fedlink.data.lazy import LazyDataset, Rows
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


def _eager(x: np.ndarray, y: np.ndarray, num_classes: int, name: str) -> Dataset:
    """A ``Dataset`` of ``x`` (any number of trailing dimensions, flattened) and ``y``."""
    flat = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    return Dataset(flat, np.asarray(y, dtype=np.int64), num_classes, flat.shape[1], name)


def _lazy(rows: Rows, y: Sequence[int] | np.ndarray, num_classes: int,
          shape: Sequence[int], name: str) -> LazyDataset:
    """A train pool whose examples have features of ``shape``, read by ``rows`` when used."""
    return LazyDataset(rows, np.asarray(y, dtype=np.int64), num_classes,
                       int(np.prod(shape, dtype=np.int64)), name)


# -- CIFAR ------------------------------------------------------------------------------------


def _unpickle(path: Path) -> dict[bytes, Any]:
    with path.open("rb") as fh:
        loaded: dict[bytes, Any] = pickle.load(fh, encoding="bytes")
    return loaded


def _cifar_images(batch: dict[bytes, Any]) -> np.ndarray:
    """CIFAR's uint8 rows (R, G, B planes of 32 x 32) as float32 in [0, 1]."""
    return np.asarray(batch[b"data"], dtype=np.float32) / np.float32(255.0)


class _ScaledPixels:
    """``Rows`` of a uint8 pixel array held in memory, as float32 in [0, 1]."""

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels = pixels

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The rows at ``indices``, scaled."""
        return self.pixels[indices].astype(np.float32) / np.float32(255.0)


def _cifar(train: Sequence[dict[bytes, Any]], test: dict[bytes, Any], key: bytes,
           num_classes: int, name: str) -> CentralData:
    """CIFAR's train batches (features converted when used) and its test batch."""
    pixels = np.concatenate([np.asarray(b[b"data"], dtype=np.uint8) for b in train])
    labels = np.concatenate([np.asarray(b[key]) for b in train])
    return CentralData(_lazy(_ScaledPixels(pixels), labels, num_classes, (3072,),
                             f"{name}-train"),
                       _eager(_cifar_images(test), np.asarray(test[key]), num_classes,
                              f"{name}-test"))


def cifar10(num_clients: int, rng: np.random.Generator, *, root: str = "") -> CentralData:
    """CIFAR-10 from the python pickles (50000 train, 10000 test, 3072 features, 10 classes)."""
    folder = _root(root, "cifar10") / "cifar-10-batches-py"
    files = [folder / f"data_batch_{i}" for i in range(1, 6)] + [folder / "test_batch"]
    absent = [f for f in files if not f.is_file()]
    if absent:
        raise _missing("CIFAR-10", absent[0], CIFAR10_URL)
    batches = [_unpickle(f) for f in files]
    return _cifar(batches[:5], batches[5], b"labels", 10, "cifar10")


def cifar100(num_clients: int, rng: np.random.Generator, *, root: str = "",
             label: str = "fine") -> CentralData:
    """CIFAR-100 (100 fine or 20 coarse classes) from the python pickles."""
    if label not in ("fine", "coarse"):
        raise ConfigError(f"cifar100.label: must be 'fine' or 'coarse', got {label!r}")
    folder = _root(root, "cifar100") / "cifar-100-python"
    for part in ("train", "test"):
        if not (folder / part).is_file():
            raise _missing("CIFAR-100", folder / part, CIFAR100_URL)
    return _cifar([_unpickle(folder / "train")], _unpickle(folder / "test"),
                  f"{label}_labels".encode(), 100 if label == "fine" else 20,
                  f"cifar100-{label}")


# -- LEAF -------------------------------------------------------------------------------------


def _leaf_users(folder: Path,
                name: str) -> Iterator[tuple[Path, str, dict[str, list[Any]]]]:
    """(file, user, {"x": ..., "y": ...}) over every JSON file of a LEAF split, in file
    order."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        raise _missing(f"LEAF {name} JSON files", folder / "*.json",
                       LEAF_URL.format(name=name))
    for path in files:
        document = _leaf_document(path)
        try:
            for user in document["users"]:
                yield path, str(user), document["user_data"][user]
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: not LEAF's layout (users, user_data): {exc}") from exc


def _leaf_document(path: Path) -> dict[str, Any]:
    """One LEAF JSON file, parsed."""
    with path.open(encoding="utf-8") as fh:
        document: dict[str, Any] = json.load(fh)
    return document


Encode = Callable[..., Any]
"""``encode(value, label=False)``: one LEAF ``x`` (or, with ``label``, ``y``) as fedlink's."""


class _LeafRows:
    """``Rows`` of chosen LEAF users: ``users[k] = (file, user)`` holds train examples
    ``starts[k]`` up to the next start; a user's features are read from its file when asked
    (each file parsed once per call)."""

    def __init__(self, users: Sequence[tuple[Path, str]], starts: Sequence[int],
                 encode: Encode) -> None:
        self.users, self.starts, self.encode = list(users), np.asarray(starts), encode

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The encoded features at ``indices``."""
        owners = np.searchsorted(self.starts, indices, side="right") - 1
        features: dict[int, np.ndarray] = {}
        for path in dict.fromkeys(self.users[k][0] for k in owners.tolist()):
            document = _leaf_document(path)
            for k in set(owners.tolist()):
                if self.users[k][0] == path:
                    samples = document["user_data"][self.users[k][1]]["x"]
                    features[k] = np.stack([self.encode(x) for x in samples])
        return np.stack([features[k][i - self.starts[k]]
                         for k, i in zip(owners.tolist(), indices.tolist(), strict=True)])


def _leaf(num_clients: int, root: str, name: str, num_classes: int,
          encode: Encode) -> CentralData:
    """The first ``num_clients`` users of a LEAF dataset, one natural group each; their
    labels read now, their features when used."""
    base = _root(root, name)
    users: dict[str, Path] = {}
    ys: list[int] = []
    starts, shape = [], None
    for path, user, data in _leaf_users(base / "train", name):
        if user in users:
            continue
        users[user] = path
        starts.append(len(ys))
        ys += [encode(y, label=True) for y in data["y"]]
        if shape is None and data["x"]:
            shape = np.shape(encode(data["x"][0]))
        if len(users) == num_clients:
            break
    if len(users) < num_clients:
        raise ConfigError(f"{name}: {base / 'train'} holds {len(users)} users, "
                          f"{num_clients} clients were asked for")
    test = _leaf_test(base / "test", name, set(users), encode)
    groups = tuple(np.arange(start, end, dtype=np.int64)
                   for start, end in zip(starts, [*starts[1:], len(ys)], strict=True))
    rows = _LeafRows([(path, user) for user, path in users.items()], starts, encode)
    return CentralData(_lazy(rows, ys, num_classes, shape or (test[0].shape[1],),
                             f"{name}-train"),
                       _eager(test[0], test[1], num_classes, f"{name}-test"), groups)


def _leaf_test(folder: Path, name: str, users: set[str],
               encode: Encode) -> tuple[np.ndarray, np.ndarray]:
    """The LEAF test samples of ``users``, encoded (``ConfigError`` when there are none)."""
    xs, ys = [], []
    for _, user, data in _leaf_users(folder, name):
        if user in users:
            xs += [encode(x) for x in data["x"]]
            ys += [encode(y, label=True) for y in data["y"]]
    if not ys:
        raise ConfigError(f"{name}: {folder} holds no samples of the chosen users")
    return np.asarray(xs), np.asarray(ys)


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


def _image_files(folder: Path, classes: Sequence[str]) -> tuple[list[Path], np.ndarray]:
    """The image files under ``folder/<class>/`` (sorted) and their class indices."""
    paths, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((folder / name).iterdir()):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                paths.append(path)
                labels.append(label)
    return paths, np.asarray(labels, dtype=np.int64)


class _Images:
    """``Rows`` of image files: each decoded when asked, as ``shape`` = (channels, height,
    width) float32 in [0, 1] (resized to ``size`` when given)."""

    def __init__(self, paths: Sequence[Path], shape: tuple[int, int, int],
                 size: tuple[int, ...] | None) -> None:
        self.paths, self.shape, self.size = list(paths), shape, size

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The decoded images at ``indices``, ``(len(indices), *shape)``."""
        return np.stack([self.decode(self.paths[i]) for i in indices.tolist()])

    def decode(self, path: Path) -> np.ndarray:
        """One image, ``ConfigError`` unless it has ``shape``."""
        from PIL import Image  # deferred: only this loader decodes images

        with Image.open(path) as opened:
            image = opened.convert("L" if self.shape[0] == 1 else "RGB")
        if self.size is not None:
            image = image.resize((self.size[1], self.size[0]))
        pixels = np.asarray(image, dtype=np.float32) / np.float32(255.0)
        chw = pixels[None] if self.shape[0] == 1 else pixels.transpose(2, 0, 1)
        if chw.shape != self.shape:
            raise ConfigError(f"image_folder: {path} is {chw.shape}, the others "
                              f"{self.shape}; set options.size = [height, width]")
        return chw


def _image_shape(folder: Path, paths: Sequence[Path], size: tuple[int, ...] | None,
                 grayscale: bool) -> tuple[int, int, int]:
    """(channels, height, width) of every image in ``paths``: from ``size``, or read from the
    files' headers (nothing decoded), ``ConfigError`` when they differ or there are none."""
    channels = 1 if grayscale else 3
    if size is not None:
        return channels, int(size[0]), int(size[1])
    from PIL import Image

    sizes = set()
    for path in paths:
        with Image.open(path) as opened:  # reads the header only
            sizes.add((channels, opened.height, opened.width))
    if len(sizes) != 1:
        found = f"differ in size {sorted(sizes)}" if sizes else "are none"
        raise ConfigError(f"image_folder: images in {folder} {found}; set options.size = "
                          f"[height, width]")
    return sizes.pop()


def image_folder(num_clients: int, rng: np.random.Generator, *, root: str = "",
                 size: tuple[int, int] | list[int] | None = None,
                 grayscale: bool = False) -> CentralData:
    """An ``ImageFolder`` tree: ``train/<class>/`` and ``test/<class>/``; classes sorted by
    name; every image resized to ``size = [height, width]`` when given. Train images are
    decoded when their client trains."""
    base = _root(root, "image_folder")
    train_dir, test_dir = base / "train", base / "test"
    for folder in (train_dir, test_dir):
        if not folder.is_dir():
            raise _missing("image_folder split", folder, "your own images, one folder per class")
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not classes:
        raise ConfigError(f"image_folder: {train_dir} has no class folders")
    wanted = None if size is None else tuple(int(s) for s in size)
    paths, labels = _image_files(train_dir, classes)
    shape = _image_shape(train_dir, paths, wanted, grayscale)
    test_paths, test_labels = _image_files(test_dir, [c for c in classes
                                                      if (test_dir / c).is_dir()])
    if not test_paths:
        raise ConfigError(f"image_folder: {test_dir} holds no images of the train classes")
    test = _Images(test_paths, shape, wanted)(np.arange(len(test_paths)))
    return CentralData(_lazy(_Images(paths, shape, wanted), labels, len(classes), shape,
                             f"{base.name}-train"),
                       _eager(test, test_labels, len(classes), f"{base.name}-test"))


def _npz_stored(path: Path, name: str) -> np.ndarray | None:
    """Array ``name`` of the ``.npz`` at ``path`` memory-mapped (read-only), or ``None`` when
    the archive compresses it (or its format version has no public header reader)."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{name}.npy")
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        with archive.open(info) as member:
            reader = readers.get(np.lib.format.read_magic(member))
            if reader is None:
                return None
            shape, fortran, dtype = reader(member)
            header = member.tell()
    with path.open("rb") as fh:  # the member's data starts after its local header
        fh.seek(info.header_offset)
        local = fh.read(30)
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") \
        + int.from_bytes(local[28:30], "little") + header
    if dtype.hasobject:
        return None
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape,
                     order="F" if fortran else "C")


class _NpzRows:
    """``Rows`` of one array of an ``.npz``: memory-mapped when stored uncompressed, else
    decompressed on the first call and kept."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name
        self._array: np.ndarray | None = None

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The rows at ``indices``."""
        if self._array is None:
            mapped = _npz_stored(self.path, self.name)
            if mapped is None:
                with np.load(self.path, allow_pickle=False) as arrays:
                    mapped = arrays[self.name]
            self._array = mapped
        return np.asarray(self._array[indices])


def _npz_shape(path: Path, name: str) -> tuple[int, ...]:
    """The shape of array ``name`` of an ``.npz``, from its header (no data read)."""
    with zipfile.ZipFile(path) as archive, archive.open(f"{name}.npy") as member:
        version = np.lib.format.read_magic(member)
        header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
        shape: tuple[int, ...] = header(member)[0]
    return shape


def npz(num_clients: int, rng: np.random.Generator, *, root: str = "",
        num_classes: int = 0) -> CentralData:
    """Arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` (any trailing shape) from one
    ``.npz``; ``users_train`` (one id per train example), when present, gives the natural
    partition (first ``num_clients`` ids in order of appearance). ``num_classes`` defaults to
    ``max(label) + 1``. ``x_train`` is read by each client's share when it trains."""
    path = _root(root, "npz")
    if not path.is_file():
        raise _missing("npz file", path, "your own arrays (numpy.savez)")
    with np.load(path, allow_pickle=False) as arrays:
        missing = sorted({"x_train", "y_train", "x_test", "y_test"} - set(arrays.files))
        if missing:
            raise ConfigError(f"{path}: lacks arrays {missing} (has {sorted(arrays.files)})")
        loaded = {k: arrays[k] for k in arrays.files if k != "x_train"}
    y_train, y_test = loaded["y_train"], loaded["y_test"]
    classes = num_classes or int(max(y_train.max(), y_test.max())) + 1
    groups = None
    if "users_train" in loaded:
        users = loaded["users_train"]
        order = list(dict.fromkeys(users.tolist()))[:num_clients]
        groups = tuple(np.flatnonzero(users == user) for user in order)
    shape = _npz_shape(path, "x_train")
    if shape[:1] != y_train.shape:
        raise ConfigError(f"{path}: x_train holds {shape[:1]} examples, y_train {y_train.shape}")
    return CentralData(_lazy(_NpzRows(path, "x_train"), y_train, classes, shape[1:],
                             f"{path.stem}-train"),
                       _eager(loaded["x_test"], y_test, classes, f"{path.stem}-test"), groups)


class _HfRows:
    """``Rows`` of column ``column`` of split ``split`` of a dataset saved with
    ``save_to_disk`` (``datasets`` memory-maps its Arrow files): the rows asked for are
    selected and converted, images scaled to [0, 1]."""

    def __init__(self, path: Path, split: str, column: str, scale: bool) -> None:
        self.path, self.split, self.column, self.scale = path, split, column, scale

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The features at ``indices``."""
        import datasets  # type: ignore[import-not-found,unused-ignore]

        table = datasets.load_from_disk(str(self.path))[self.split]
        picked = table.select(indices.tolist()).with_format("numpy")
        x = np.asarray(picked[self.column], dtype=np.float32)
        return x / np.float32(255.0) if self.scale else x


def hf_disk(num_clients: int, rng: np.random.Generator, *, root: str = "",
            features: str = "image", label: str = "label", train: str = "train",
            test: str = "test") -> CentralData:
    """A Hugging Face ``DatasetDict`` saved with ``save_to_disk``: column ``features``
    (numbers, arrays or images; images scaled to [0, 1]) and integer column ``label``; the
    train features are read by each client's share when it trains."""
    try:
        import datasets  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise ConfigError("dataset 'hf_disk' needs the datasets package: pip install "
                          "'fedlink[hf]'") from exc
    path = _root(root, "hf_disk")
    if not path.is_dir():
        raise _missing("Hugging Face dataset", path, "datasets' save_to_disk")
    saved = datasets.load_from_disk(str(path))
    for split in (train, test):
        if split not in saved:
            raise ConfigError(f"{path}: no split {split!r} (has {sorted(saved)})")
    images = saved[train].features[features].__class__.__name__ == "Image"
    rows = _HfRows(path, train, features, images)
    labels = [np.asarray(saved[s].with_format("numpy")[label]) for s in (train, test)]
    test_x = _HfRows(path, test, features, images)(np.arange(len(labels[1])))
    info = saved[train].features[label]
    classes = getattr(info, "num_classes", None) or int(max(y.max() for y in labels)) + 1
    return CentralData(_lazy(rows, labels[0], classes, test_x.shape[1:], f"{path.name}-train"),
                       _eager(test_x, labels[1], classes, f"{path.name}-test"))


register_dataset("cifar10", cifar10)
register_dataset("cifar100", cifar100)
register_dataset("femnist", femnist, default_partition=NATURAL)
register_dataset("shakespeare", shakespeare, default_partition=NATURAL)
register_dataset("image_folder", image_folder)
register_dataset("npz", npz)
register_dataset("hf_disk", hf_disk)
