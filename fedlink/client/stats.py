"""What a client session did: counters for logs, reports, benchmarks and commit metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskMark:
    """The resilience counters at the start of a task (see ``SessionStats.since``)."""

    retries: int
    resumed_bytes: int
    offline_seconds: float


@dataclass
class SessionStats:
    """What one client did during a run (for logs, reports and benchmarks).

    ``refused`` counts updates the coordinator would not use (too stale, task closed), including
    pending updates of an earlier run that were discarded at restart; ``failed`` counts tasks
    lost to corrupted transfers or forgotten tasks; ``recovered`` counts pending updates of an
    earlier process (found in the outbox) that reached the coordinator; ``accepted`` counts
    every accepted update, recovered ones included.

    ``retries`` counts retried attempts of every call (``GetTask`` and ``Commit`` included);
    ``offline_seconds`` the time the client could not reach the coordinator (backoff waits and
    failed short calls; not a transfer that moved bytes until it broke); ``resumed_bytes`` the
    upload bytes a resume did not have to send again; ``bytes_up`` the payload bytes handed to
    the network for sending; ``bytes_down`` the payload bytes received (deltas, and full models,
    including any fallback); ``delta_bytes_saved`` the download bytes that deltas (or an already
    held model) saved against full downloads; ``network_seconds`` the time spent downloading,
    uploading and committing; ``network_reported`` how much of it commits have reported to the
    coordinator. ``finished``: the coordinator's reason when it said the run is
    over (empty until then). ``channels_opened``: the channels the client opened to the
    coordinator, the first of each connection included (a second one opens with the first
    striped download, ``ClientOptions.download_connections``); ``reconnects``: those beyond
    each connection's first, the client's own reconnects (a dead connection that came back
    with another ping-ack timeout, or a stalled transfer moved to a fresh one); ``stalls``:
    transfers abandoned for making no progress; ``ranges_taken``: download ranges one
    connection took over from another (``fedlink.client.transfer.StripedPayload.steal``), each
    cutting the other's stream short (the coordinator counts what it had already sent on it);
    ``handovers``: transfers that, making no progress, went on over the other open connection
    (the two swapped connections: ``fedlink.client.transport.Transport.exchange``), with no
    new connection.
    ``evaluations`` counts evaluation tasks whose report the coordinator accepted (they are
    not in ``tasks``, which counts training tasks). ``secure_values_clipped``: values of
    masked updates that lay beyond the secure ring's ``clip`` and were clipped (only the
    client knows: the coordinator sees sums).
    """

    tasks: int = 0
    evaluations: int = 0
    accepted: int = 0
    refused: int = 0
    failed: int = 0
    recovered: int = 0
    retries: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    delta_bytes_saved: int = 0
    train_seconds: float = 0.0
    resumed_bytes: int = 0
    offline_seconds: float = 0.0
    network_seconds: float = 0.0
    network_reported: float = 0.0
    channels_opened: int = 0
    reconnects: int = 0
    stalls: int = 0
    ranges_taken: int = 0
    handovers: int = 0
    secure_values_clipped: int = 0
    refusals: list[str] = field(default_factory=list)
    finished: str = ""

    def mark(self) -> TaskMark:
        """The resilience counters now, to measure one task against."""
        return TaskMark(self.retries, self.resumed_bytes, self.offline_seconds)

    def since(self, mark: TaskMark, network_open_s: float = 0.0) -> dict[str, float]:
        """Retries, resumed bytes and offline seconds since ``mark``, and the network seconds
        not reported yet (sent as commit metrics, and at ``Leave``; see ``report_network``)."""
        return {
            "retries": float(self.retries - mark.retries),
            "resumed_bytes": float(self.resumed_bytes - mark.resumed_bytes),
            "offline_seconds": self.offline_seconds - mark.offline_seconds,
            "network_seconds": self.report_network(network_open_s),
        }

    def report_network(self, open_s: float = 0.0) -> float:
        """Network seconds since the last report, counted as reported now.

        ``open_s`` is network time already spent but not yet added to ``network_seconds`` (the
        upload of the update being committed). A commit cannot carry its own duration, so that
        reaches the next report: summed over a run, nothing but the last commit is missed.
        """
        total = self.network_seconds + open_s
        fresh, self.network_reported = total - self.network_reported, total
        return max(0.0, fresh)
