"""What a client reports about itself at ``Commit`` (``CommitRequest.metrics``), made loggable.

The coordinator trusts these figures no further than the event log: they never change how an
update is weighted. Known keys become fields of the ``update_accepted`` event:

==================== =====================================================================
``retries``          calls the client retried for this task (int, >= 0)
``resumed_bytes``    upload bytes the client did not resend because the coordinator held
                     them (int, >= 0)
``offline_seconds``  time the client spent unable to reach the coordinator (>= 0)
``train_seconds``    local training time (>= 0)
``network_seconds``  time the task spent downloading and uploading (>= 0)
``train_loss``       mean local training loss (any finite value)
==================== =====================================================================

Any other key with a finite value is passed through under ``client_metrics`` (at most
``MAX_EXTRA_METRICS`` keys of at most ``MAX_KEY_LENGTH`` characters, the rest dropped), so
trainer-specific figures reach the log without the coordinator knowing them. Non-finite
values, negative counts or durations, and keys over the limits are dropped silently: a
misbehaving client cannot break the log or make it grow without bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

COUNTS = ("retries", "resumed_bytes")
DURATIONS = ("offline_seconds", "train_seconds", "network_seconds")
SIGNED = ("train_loss",)
KNOWN = frozenset(COUNTS + DURATIONS + SIGNED)
MAX_EXTRA_METRICS = 16
MAX_KEY_LENGTH = 64


def event_fields(metrics: Mapping[str, float]) -> dict[str, Any]:
    """The ``update_accepted`` fields for a client's reported ``metrics`` (see module doc)."""
    fields: dict[str, Any] = {}
    for key in COUNTS:
        value = _finite(metrics.get(key))
        if value is not None and value >= 0:
            fields[key] = int(value)
    for key in DURATIONS:
        value = _finite(metrics.get(key))
        if value is not None and value >= 0:
            fields[key] = value
    for key in SIGNED:
        value = _finite(metrics.get(key))
        if value is not None:
            fields[key] = value
    extra = _extra(metrics)
    if extra:
        fields["client_metrics"] = extra
    return fields


def _extra(metrics: Mapping[str, float]) -> dict[str, float]:
    """Finite values of unknown keys, within the count and key-length limits."""
    extra: dict[str, float] = {}
    for key in sorted(metrics):
        if key in KNOWN or len(key) > MAX_KEY_LENGTH:
            continue
        value = _finite(metrics[key])
        if value is not None:
            extra[key] = value
            if len(extra) == MAX_EXTRA_METRICS:
                break
    return extra


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


REPORTED_COUNTERS = ("retries", "offline_seconds", "resumed_bytes")
"""The resilience counters a refused update and ``Leave`` carry into their events."""


def reported_counters(metrics: Mapping[str, float]) -> dict[str, float]:
    """The resilience counters among a client's ``metrics`` (finite, >= 0; others ignored)."""
    return {name: float(metrics[name]) for name in REPORTED_COUNTERS
            if name in metrics and math.isfinite(metrics[name]) and metrics[name] >= 0}
