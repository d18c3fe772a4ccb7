"""The experiment: what ``fedlink simulate``, ``fedlink serve`` and ``fedlink client`` all read.

- ``config``: the TOML experiment file as frozen sections (``ExperimentConfig``);
- ``setup``: what an experiment builds from its config (data, models, evaluator, trainers)
  and its plug points (``Plugs``);
- ``trainers``: the ``[client] trainer`` registry (``TRAINERS``);
- ``partial_work``: the ``[partial_work]`` section and the straggler trainer it wraps;
- ``virtual``: the ``[virtual]`` and ``[ray]`` sections of virtual-clock runs.

Nothing here imports ``fedlink.sim``: a deployed coordinator or client reads its experiment
without loading the simulator.
"""

from fedlink.experiment.config import ExperimentConfig

__all__ = ["ExperimentConfig"]
