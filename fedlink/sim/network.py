"""Per-client and per-profile network figures of a simulation, for events and the report."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from fedlink.client import SessionStats
from fedlink.metrics.kinds import ClientNetwork
from fedlink.netem import ClientLink, LinkCounters


@dataclass(frozen=True)
class ClientOutcome:
    """One simulated client at the end of a run: its link, the link's counters, its stats."""

    index: int
    link: ClientLink | None
    counters: LinkCounters | None
    stats: SessionStats

    @property
    def profile_name(self) -> str:
        """The link profile's name (``"direct"`` without a ``[network]`` section)."""
        return "direct" if self.link is None else self.link.profile_name

    def as_event(self) -> ClientNetwork:
        """This client's ``client_network`` event."""
        counters = self.counters.as_dict() if self.counters else {}
        return ClientNetwork(
            index=self.index,
            profile=self.profile_name,
            speed=1.0 if self.link is None else self.link.speed,
            tasks=self.stats.tasks,
            accepted=self.stats.accepted,
            refused=self.stats.refused,
            failed=self.stats.failed,
            retries=self.stats.retries,
            network_seconds=self.stats.network_seconds,
            train_seconds=self.stats.train_seconds,
            link=counters,
        )


_SUMMED = ("bytes_up", "bytes_down", "resets", "blackouts", "stalled_s")


def network_summary(outcomes: tuple[ClientOutcome, ...]) -> dict[str, Any]:
    """Per-profile totals: clients, bytes on the link, resets, retries, time on the network.

    ``bytes_up``/``bytes_down`` are what crossed the emulated link (gRPC framing included);
    ``network_seconds`` is the clients' time spent downloading, uploading and committing,
    ``train_seconds`` their local training time, ``comm_share`` the first over both;
    ``packet_only`` names the profile's settings the TCP proxy could not apply.
    """
    rows: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "clients": 0, "accepted": 0, "refused": 0, "retries": 0, "network_seconds": 0.0,
        "train_seconds": 0.0, "packet_only": [], **{k: 0 for k in _SUMMED}})
    for outcome in outcomes:
        row = rows[outcome.profile_name]
        row["clients"] += 1
        row["accepted"] += outcome.stats.accepted
        row["refused"] += outcome.stats.refused
        row["retries"] += outcome.stats.retries
        row["network_seconds"] += outcome.stats.network_seconds
        row["train_seconds"] += outcome.stats.train_seconds
        if outcome.link is not None:
            row["packet_only"] = list(outcome.link.profile.packet_only_fields)
        if outcome.counters is not None:
            for key in _SUMMED:
                row[key] += getattr(outcome.counters, key)
    for row in rows.values():
        total = row["network_seconds"] + row["train_seconds"]
        row["comm_share"] = row["network_seconds"] / total if total > 0 else None
    return {"profiles": {name: rows[name] for name in sorted(rows)}}
