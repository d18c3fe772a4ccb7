"""Protocol conformance of an external client: ``fedlink conformance --client-cmd "..."``.

Starts real coordinators on loopback, runs the client command against each, injects faults
(a cut download, a cut upload, a lost commit reply, a corrupted upload) and reports which
protocol behaviours the client showed: join, task, resume download, resume upload, idempotent
commit, delta, refusal handling, inline payloads and each downlink codec (``docs/protocol.md``).
"""

from fedlink.conformance.checks import CHECKS, Verdict
from fedlink.conformance.probe import FaultPlan
from fedlink.conformance.runner import (
    DOWNLINK_CODECS,
    ConformanceOptions,
    Scenario,
    ScenarioResult,
    format_report,
    run_conformance,
)

__all__ = [
    "CHECKS",
    "DOWNLINK_CODECS",
    "ConformanceOptions",
    "FaultPlan",
    "Scenario",
    "ScenarioResult",
    "Verdict",
    "format_report",
    "run_conformance",
]
