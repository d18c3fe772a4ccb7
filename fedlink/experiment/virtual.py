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

from fedlink.config import changed_fields, check_fields, require
from fedlink.errors import ConfigError

AVAILABILITY = ("always", "diurnal", "trace")
DAY_S = 86_400.0
"""One day of model time, the default ``period_s``."""


@dataclass(frozen=True)
class VirtualSection:
    """The ``[virtual]`` table (see the module docstring).

    Read only with ``[run] mode = "virtual"``: a gRPC run refuses any key set here. A key
    whose switch is off is refused rather than recorded unread: ``online_fraction`` needs
    ``availability = "diurnal"``, ``trace_file`` needs ``"trace"``, ``period_s`` either of
    them; ``features`` and ``classes`` need ``population > 0``.
    """

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
        self._refuse_knobs_switched_off()

    def _refuse_knobs_switched_off(self) -> None:
        """A key read only under a switch this table turns off would change nothing."""
        for key, readers in (("online_fraction", ("diurnal",)),
                             ("period_s", ("diurnal", "trace")),
                             ("trace_file", ("trace",))):
            if self.availability not in readers and key in changed_fields(self):
                raise ConfigError(
                    f"virtual.{key}: read only with availability = "
                    f"{' or '.join(repr(r) for r in readers)}, so with {self.availability!r} "
                    f"it could not take effect. Unset it, or set that availability")
        for key in ("features", "classes"):
            if self.population == 0 and key in changed_fields(self):
                raise ConfigError(
                    f"virtual.{key}: shapes the synthetic clients of population > 0; with "
                    f"population = 0 the clients are the experiment's [data] and [model], so "
                    f"it could not take effect. Unset it, or set virtual.population")


@dataclass(frozen=True)
class RaySection:
    """The ``[ray]`` table: ``address`` of a Ray cluster to train on (``""``: start a local Ray
    on loopback for the run; see ``fedlink.sim.virtual.backends.ray_actors``).

    Read only by ``[run] backend = "ray"`` with ``[virtual] workers > 0`` (or a backend of
    your own): an ``address`` is refused in a gRPC run, with ``workers = 0`` and with the
    ``"processes"`` or ``"inline"`` backend."""

    address: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "ray")
