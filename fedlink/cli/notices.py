"""What ``fedlink serve`` and ``fedlink client`` say about a file written for a simulation."""

from __future__ import annotations

import sys

from fedlink.experiment.config import ExperimentConfig


def say_simulation_sections_ignored(config: ExperimentConfig, who: str, why: str) -> None:
    """Say on stderr which of ``[network]`` and ``[partial_work]``, the sections that shape a
    simulation's clients, ``config`` sets, since ``who`` (a real coordinator or client, for
    ``why``) does not apply them."""
    simulated = [name for name, used in (("[network]", config.network is not None),
                                         ("[partial_work]", config.partial_work.enabled))
                 if used]
    if simulated:
        print(f"{who}: {' and '.join(simulated)} shape a simulation's clients and are not "
              f"applied here ({why})", file=sys.stderr, flush=True)
