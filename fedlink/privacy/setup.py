"""Linking the two halves of a DP configuration, so an experiment states each setting once.

A user-level DP run is configured on the coordinator (``[[coordinator.hooks]] name =
"dp_fedavg"``: clip norm, noise multiplier, where the noise is added, accounting) and needs the
matching ``dp_fedavg`` privacy stage on every client. ``fedlink.experiment.config`` uses these
helpers so that the hook's table is the single switch: the client stage takes ``clip_norm``,
``noise``, ``noise_multiplier`` and ``clients_per_flush`` (the flush goal) from it, and the
hook's sampling rate defaults to ``goal / population``.

A sample-level DP-SGD run (``[client] trainer = "dp_sgd"``) is accounted by its clients; the
coordinator's ``dp_sgd`` hook only collects the epsilon they report into the run's record, so
it is added when the experiment does not list it (a DP-SGD run must never be recorded as one
without privacy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedlink.errors import ConfigError

if TYPE_CHECKING:
    from fedlink.coordinator.config import CoordinatorConfig

HOOK = "dp_fedavg"
STAGE = "dp_fedavg"
SGD_TRAINER = "dp_sgd"
DP_SGD_OPTIONS = frozenset({"dp_max_grad_norm", "dp_noise_multiplier", "dp_target_epsilon",
                            "dp_target_steps", "dp_delta", "dp_accountant", "dp_clipping"})
"""The ``trainer_options`` the DP-SGD trainer reads (``fedlink.privacy.dp_sgd``): any other
``dp_*`` option is refused as a misspelling, not left to its default."""
SGD_HOOK = "dp_sgd"
_SHARED = ("clip_norm", "noise", "noise_multiplier")


def _dp_hooks(hooks: tuple[Mapping[str, Any], ...] | list[Mapping[str, Any]]
              ) -> list[Mapping[str, Any]]:
    return [h for h in hooks if isinstance(h, Mapping) and h.get("name") == HOOK]


def with_sampling_defaults(hooks: list[Any], population: int, goal: int) -> list[Any]:
    """``hooks`` with ``population``/``cohort`` filled into a ``dp_fedavg`` table lacking a rate.

    ``cohort`` is the number of updates a flush aggregates (the flush goal), so the sampling
    rate is ``goal / population``.
    """
    out: list[Any] = []
    for table in hooks:
        if (isinstance(table, Mapping) and table.get("name") == HOOK
                and not table.get("sample_rate")):
            table = {"population": population, "cohort": goal, **table}
        out.append(table)
    return out


def with_run_seed(config: CoordinatorConfig) -> CoordinatorConfig:
    """``config`` with its seed filled into a ``dp_fedavg`` table that names none: a
    simulation's central noise follows the run's seed, so that the run can be repeated. A
    served coordinator draws it from the operating system instead (the hook's default)."""
    hooks = tuple({"seed": config.seed, **table}
                  if isinstance(table, Mapping) and table.get("name") == HOOK else table
                  for table in config.hooks)
    return dataclasses.replace(config, hooks=hooks)


def with_dp_sgd_report(hooks: list[Any], trainer: str,
                       trainer_options: Mapping[str, Any]) -> list[Any]:
    """``hooks`` with the ``dp_sgd`` report hook added when ``trainer`` is DP-SGD and no hook
    collects its epsilon (its ``accountant`` is the clients' ``dp_accountant``)."""
    if trainer != SGD_TRAINER or any(isinstance(t, Mapping) and t.get("name") == SGD_HOOK
                                     for t in hooks):
        return hooks
    return [*hooks, {"name": SGD_HOOK,
                     "accountant": str(trainer_options.get("dp_accountant", "rdp"))}]


def stage_options(privacy: str, options: Mapping[str, Any],
                  hooks: tuple[Mapping[str, Any], ...], goal: int,
                  aggregator: str = "mean") -> dict[str, Any]:
    """The client's privacy-stage options, completed from the coordinator's ``dp_fedavg`` hook.

    ``ConfigError`` when exactly one half of DP-FedAvg is configured (clipping without the
    hook would leave central noise and accounting out; the hook without clipping would
    account for a sensitivity nobody enforces), when a setting given on both sides differs,
    or when the aggregator is not the weighted ``mean`` (the hook's noise is calibrated to the
    sensitivity of a weighted mean; robust rules and FedNova have another).
    """
    dp = _dp_hooks(hooks)
    if privacy != STAGE:
        if dp:
            raise ConfigError(f"coordinator.hooks: the {HOOK!r} hook needs [client] privacy = "
                              f"{STAGE!r} (clients must clip their updates)")
        return dict(options)
    if len(dp) != 1:
        raise ConfigError(f"client.privacy = {STAGE!r} needs exactly one [[coordinator.hooks]] "
                          f"table with name = {HOOK!r} (noise, accounting), found {len(dp)}")
    if aggregator != "mean":
        raise ConfigError(f"coordinator.aggregator: the {HOOK!r} hook calibrates its noise to "
                          f"the weighted 'mean', not {aggregator!r}")
    hook = dp[0]
    merged = dict(options)
    defaults: dict[str, Any] = {"clip_norm": hook.get("clip_norm", 1.0),
                                "noise": hook.get("noise", "central"),
                                "noise_multiplier": hook.get("noise_multiplier", 1.0),
                                "clients_per_flush": goal}
    for key, value in defaults.items():
        if key in merged and key in _SHARED and merged[key] != value:
            raise ConfigError(f"client.privacy_options.{key} = {merged[key]!r} differs from "
                              f"the {HOOK!r} hook's {value!r}; set it once, on the hook")
        merged.setdefault(key, value)
    return merged
