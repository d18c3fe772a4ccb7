"""What ``fedlink serve`` and ``fedlink client`` say about a file written for a simulation."""

from __future__ import annotations

import sys

from fedlink.experiment.config import ExperimentConfig


def say_simulation_sections_ignored(config: ExperimentConfig, who: str, why: str) -> None:
    """Say on stderr which of ``[network]``, ``[partial_work]`` and ``[run] device_step_s``,
    the settings that shape a simulation's clients, ``config`` sets, since ``who`` (a real
    coordinator or client, for ``why``) does not apply them."""
    simulated = [name for name, used in (("[network]", config.network is not None),
                                         ("[partial_work]", config.partial_work.enabled),
                                         ("[run] device_step_s", config.run.device_step_s > 0))
                 if used]
    if simulated:
        names = ", ".join(simulated[:-1]) + (" and " if len(simulated) > 1 else "") + simulated[-1]
        verbs = "shape a simulation's clients and are" if len(simulated) > 1 else \
            "shapes a simulation's clients and is"
        print(f"{who}: {names} {verbs} not applied here ({why})", file=sys.stderr, flush=True)
