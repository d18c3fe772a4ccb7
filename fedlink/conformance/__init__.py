"""Protocol conformance of an external client: ``fedlink conformance --client-cmd "..."``.

Starts real coordinators (on loopback unless told otherwise), runs the client command against
each, injects faults (cut transfers, a lost commit reply, corrupted bytes both ways, a slow
commit, an overload refusal, a forgotten client) and reports by name which protocol behaviours
the client showed: join, task, resume download, resume upload, idempotent commit, delta,
refusal handling, a new upload id after ``DATA_LOSS``, model verification, heartbeats, the
retry hint, re-joining, evaluation tasks, metrics, leave, inline payloads, each downlink codec
and each lossy update codec (``docs/protocol.md``); asked for, secure aggregation (a secure
round, a retried ``SecureMasked``, a group member that vanished: groups the runner fills with
fedlink clients of its own, ``docs/secure-aggregation.md``).
"""

from fedlink.conformance.checks import CHECKS, Verdict
from fedlink.conformance.probe import FaultPlan
from fedlink.conformance.runner import (
    DOWNLINK_CODECS,
    LOSSY_CODECS,
    ConformanceOptions,
    Scenario,
    ScenarioResult,
    format_report,
    run_conformance,
)

__all__ = [
    "CHECKS",
    "DOWNLINK_CODECS",
    "LOSSY_CODECS",
    "ConformanceOptions",
    "FaultPlan",
    "Scenario",
    "ScenarioResult",
    "Verdict",
    "format_report",
    "run_conformance",
]
