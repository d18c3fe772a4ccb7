"""Experiment configuration: one TOML file drives ``fedlink simulate``, ``serve`` and ``client``.

Sections (every key optional unless noted; unknown keys are an error)::

    [run]          name, seed, output_dir, train_workers, torch_threads
    [data]         dataset, clients, partition, options = { alpha = 0.5, ... }
    [model]        name, options = { hidden = [64, 64] }
    [client]       compression, privacy
    [coordinator]  rounds, server_optimizer, ... with sub-tables
    [coordinator.flush]     goal, min_updates, deadline_s, over_selection, max_staleness
    [coordinator.training]  local_steps, local_epochs, batch_size, learning_rate
    [coordinator.limits]    chunk_bytes, long_poll_s, ...
    [network]      preset | profile | fleet, speed, profiles (see fedlink.netem.fleet)

``[coordinator] run_name`` defaults to ``[run] name``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlink.config import from_table, load_toml, require
from fedlink.coordinator import CoordinatorConfig
from fedlink.errors import ConfigError
from fedlink.netem import Fleet, parse_network


@dataclass(frozen=True)
class RunSection:
    """Name, seed and where results go; how simulated clients train.

    ``train_workers = 0`` trains each simulated client on the event loop's thread (fastest for
    small models; no heartbeats while training); ``n >= 1`` uses a pool of ``n`` threads.
    """

    name: str = "fedlink-run"
    seed: int = 0
    output_dir: str = "runs"
    train_workers: int = 0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        require(bool(self.name) and "/" not in self.name, "run.name",
                "must be a non-empty name without '/'")
        require(self.seed >= 0, "run.seed", "must be >= 0")
        require(self.train_workers >= 0, "run.train_workers", "must be >= 0")
        require(self.torch_threads >= 1, "run.torch_threads", "must be >= 1")


@dataclass(frozen=True)
class DataSection:
    """Which dataset, split among how many clients, by which partitioner."""

    dataset: str = "digits"
    clients: int = 10
    partition: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(self.clients >= 1, "data.clients", f"must be >= 1, got {self.clients}")


@dataclass(frozen=True)
class ModelSection:
    """Which registered model, with which options."""

    name: str = "mlp"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientSection:
    """The client update pipeline: privacy stage and compression codec, by registry name."""

    compression: str = "fp32"
    privacy: str = "none"


@dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment: run, data, model, client pipeline and coordinator."""

    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    client: ClientSection = field(default_factory=ClientSection)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    network: Fleet | None = None

    @classmethod
    def from_dict(cls, table: Mapping[str, Any],
                  base_dir: Path | None = None) -> ExperimentConfig:
        """Build from a parsed TOML document (``base_dir``: where relative paths start)."""
        sections = {"run": RunSection, "data": DataSection, "model": ModelSection,
                    "client": ClientSection}
        unknown = sorted(set(table) - set(sections) - {"coordinator", "network"})
        if unknown:
            raise ConfigError(f"unknown sections {unknown}; allowed: "
                              f"{sorted([*sections, 'coordinator', 'network'])}")
        values: dict[str, Any] = {k: from_table(c, table.get(k, {}), k)
                                  for k, c in sections.items()}
        coordinator = dict(table.get("coordinator", {}))
        coordinator.setdefault("run_name", values["run"].name)
        coordinator.setdefault("seed", values["run"].seed)
        values["coordinator"] = CoordinatorConfig.from_dict(coordinator)
        if "network" in table:
            values["network"] = parse_network(table["network"], seed=values["run"].seed,
                                              base_dir=base_dir)
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path) -> ExperimentConfig:
        """Load and validate a TOML experiment file."""
        try:
            return cls.from_dict(load_toml(path), base_dir=Path(path).parent)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (written into ``summary.json``)."""
        plain: dict[str, Any] = {f.name: dataclasses.asdict(getattr(self, f.name))
                                 for f in dataclasses.fields(self) if f.name != "network"}
        plain["network"] = None if self.network is None else self.network.to_dict()
        return plain
