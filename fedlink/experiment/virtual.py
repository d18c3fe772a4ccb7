"""``[virtual]``: how a virtual-clock run (``[run] mode = "virtual"``) times and picks clients.

- ``step_cost_s``: model seconds one local SGD step takes at speed 1 (a client's fleet speed
  multiplies it);
- ``poll_s``: model seconds between the coordinator's deadline/liveness polls;
- ``deterministic``: time transfers without jitter, resets or blackouts (what the equivalence
  with real gRPC compares);
- ``population``: > 0 replaces the experiment's data with that many lazily generated synthetic
  clients (``fedlink.sim.virtual.population.SyntheticSpec``; ``features``, ``classes``);
- ``availability``: ``"always"``, ``"diurnal"`` (``online_fraction`` of every ``period_s``) or
  ``"trace"`` (``trace_file``, see ``fedlink.sim.virtual.availability``);
- ``max_model_s``: end the run after this much model time (0: no limit);
- ``workers``: processes (or Ray actors) that train selected clients in parallel (0: train
  in the loop's process); ``[run] backend`` says which (``fedlink.sim.virtual.backends``).
  Each worker builds the run's data and model once. Worth it when local training dominates
  (a torch model, several local steps); for tiny models the hand-over costs more than the
  training;
- ``residual_memory_mb``: memory for error-feedback residuals (biased codecs); beyond it the
  least recently used are spilled to a file in the run folder
  (``fedlink.sim.virtual.residuals``).

``[ray]`` (``RaySection``), for ``[run] backend = "ray"``: ``address``, the Ray cluster to join
(``""``, the default: a local Ray started for the run on 127.0.0.1 with ``workers`` CPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedlink.config import check_fields, require

AVAILABILITY = ("always", "diurnal", "trace")
DAY_S = 86_400.0
"""One day of model time, the default ``period_s``."""


@dataclass(frozen=True)
class VirtualSection:
    """The ``[virtual]`` table (see the module docstring)."""

    step_cost_s: float = 0.05
    poll_s: float = 1.0
    deterministic: bool = False
    population: int = 0
    features: int = 32
    classes: int = 10
    availability: str = "always"
    online_fraction: float = 0.3
    period_s: float = DAY_S
    trace_file: str = ""
    max_model_s: float = 0.0
    workers: int = 0
    residual_memory_mb: float = 1024.0

    def __post_init__(self) -> None:
        check_fields(self, "virtual")
        require(self.step_cost_s >= 0, "virtual.step_cost_s", "must be >= 0")
        require(self.poll_s > 0, "virtual.poll_s", "must be > 0")
        require(self.population >= 0, "virtual.population", "must be >= 0")
        require(self.availability in AVAILABILITY, "virtual.availability",
                f"must be one of {AVAILABILITY}, got {self.availability!r}")
        require(self.availability != "trace" or bool(self.trace_file), "virtual.trace_file",
                "is needed with availability = 'trace'")
        require(self.max_model_s >= 0, "virtual.max_model_s", "must be >= 0 (0: no limit)")
        require(self.workers >= 0, "virtual.workers", "must be >= 0 (0: train in the loop)")
        require(self.residual_memory_mb >= 0, "virtual.residual_memory_mb", "must be >= 0")


@dataclass(frozen=True)
class RaySection:
    """The ``[ray]`` table: ``address`` of a Ray cluster to train on (``""``: start a local Ray
    on loopback for the run; see ``fedlink.sim.virtual.backends.ray_actors``)."""

    address: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "ray")
