"""Local-file datasets are read lazily: at start only the central test set and the train
labels; a client's share of the train features when that client trains (and a client that
never trains never reads its share), with the same values an eager read gives."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedlink.client import TrainPlan
from fedlink.client.lazy import LazyTrainer
from fedlink.data import load_federated
from fedlink.data.lazy import LazyDataset
from fedlink.experiment.setup import Experiment
from fedlink.sim import ExperimentConfig

RNG = np.random.default_rng(3)


def _counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str,
              record: Callable[..., str]) -> list[str]:
    """Wrap ``owner.name`` so that each call appends ``record(*args)`` to the list returned."""
    calls: list[str] = []
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(record(*args))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_image_folder_decodes_a_clients_images_only_when_its_share_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image, ImageFile

    pixels = {}
    for split, count in (("train", 4), ("test", 1)):
        for name in ("cat", "dog"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                path = tmp_path / split / name / f"{i}.png"
                pixels[path] = RNG.integers(0, 256, (6, 5, 3), np.uint8)
                Image.fromarray(pixels[path]).save(path)
    decoded = _counting(monkeypatch, ImageFile.ImageFile, "load", lambda image: image.filename)

    data = load_federated("image_folder", 4, 0, root=str(tmp_path))

    assert sorted({Path(f).parent.parent.name for f in decoded}) == ["test"]
    assert len(set(decoded)) == 2
    assert all(isinstance(c, LazyDataset) and not c.loaded for c in data.clients)
    decoded.clear()
    share = data.clients[2]
    rows = share.x
    files = list(map(Path, dict.fromkeys(decoded)))  # PIL may load a file in two calls
    assert len(files) == len(share) == 2 and share.loaded
    assert not any(c.loaded for i, c in enumerate(data.clients) if i != 2)
    for path, row, label in zip(files, rows, share.y, strict=True):
        np.testing.assert_allclose(row, pixels[path].transpose(2, 0, 1).ravel() / 255.0,
                                   rtol=1e-6)
        assert ["cat", "dog"][label] == path.parent.name
    decoded.clear()
    _ = share.x
    assert decoded == []  # read once


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_reads_a_share_of_x_train_when_it_is_used(tmp_path: Path,
                                                       save: Callable[..., None]) -> None:
    x_train = RNG.random((12, 2, 3))
    users = np.array(["u1"] * 5 + ["u2"] * 4 + ["u3"] * 3)
    save(tmp_path / "d.npz", x_train=x_train, y_train=np.arange(12) % 3,
         x_test=RNG.random((4, 2, 3)), y_test=np.arange(4) % 3, users_train=users)

    data = load_federated("npz", 3, 0, "natural", root=str(tmp_path / "d.npz"))

    share = data.clients[1]
    assert isinstance(share, LazyDataset) and not share.loaded and len(share) == 4
    np.testing.assert_array_equal(share.x, x_train[5:9].reshape(4, 6).astype(np.float32))
    np.testing.assert_array_equal(share.y, np.arange(5, 9) % 3)
    assert share.loaded and not data.clients[0].loaded


def test_leaf_reads_a_writers_features_from_its_json_file_when_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = {}
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        for index, chunk in enumerate((["w0", "w1"], ["w2", "w3"])):
            data = {u: {"x": RNG.random((3, 784)).tolist(), "y": [int(RNG.integers(62))] * 3}
                    for u in chunk}
            samples.update({(split, u): d for u, d in data.items()})
            document = {"users": chunk, "num_samples": [3, 3], "user_data": data}
            (tmp_path / split / f"all_data_{index}.json").write_text(json.dumps(document))
    parsed = _counting(monkeypatch, json, "load", lambda fh: Path(fh.name).name)

    fed = load_federated("femnist", 3, 0, root=str(tmp_path))

    assert len(parsed) == 4  # the index of the train files, then the test files
    parsed.clear()
    writer = fed.clients[2]  # w2, in the second train file
    assert not writer.loaded
    np.testing.assert_allclose(writer.x, np.asarray(samples["train", "w2"]["x"]), rtol=1e-6)
    assert parsed == ["all_data_1.json"]
    assert writer.y.tolist() == samples["train", "w2"]["y"]
    assert not fed.clients[0].loaded and not fed.clients[1].loaded


def test_a_simulated_client_reads_its_share_when_it_trains_not_when_it_joins(
        tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x_train=RNG.random((9, 4)), y_train=np.arange(9) % 2,
             x_test=RNG.random((4, 4)), y_test=np.arange(4) % 2,
             users_train=np.array(["a"] * 5 + ["b"] * 4))
    config = ExperimentConfig.from_dict({"run": {"seed": 1}, "data": {
        "dataset": "npz", "clients": 2, "partition": "natural",
        "options": {"root": str(tmp_path / "d.npz")}}})
    experiment = Experiment.build(config)
    shares = experiment.data.clients

    trainer = experiment.trainer(0)
    assert isinstance(trainer, LazyTrainer)
    assert trainer.num_examples() == 5  # what joining reports, from the labels
    assert not trainer.built and not any(s.loaded for s in shares)  # type: ignore[attr-defined]
    trainer.train(experiment.initial_vector(), TrainPlan(local_steps=1, batch_size=4))
    assert trainer.built and shares[0].loaded and not shares[1].loaded  # type: ignore[attr-defined]
    assert experiment.client_examples(1) == 4 and not shares[1].loaded  # type: ignore[attr-defined]
