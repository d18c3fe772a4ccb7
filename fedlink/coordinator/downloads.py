"""Which downloads a client has: ``download_finished`` when the bytes arrived, counted once.

Handing a chunk to gRPC is not delivering it: a stream cut by the network was "sent" in full
by the coordinator while the client got a part, and a resumed download sent its tail again.
Counting per stream gave more bytes down than clients received. So the coordinator only
*offers* payloads here (per task and kind: the model or a delta), learns what the client holds
from its next calls (a ``Download`` from offset ``n`` says it has the first ``n`` bytes), and
settles the count when the client shows it has everything: its ``Commit`` for that task (it
trained on the model). One ``download_finished`` per task and kind then carries the bytes the
client has, whatever number of streams it took.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Offered:
    """One payload offered for one task: its size, and what the client is known to hold."""

    total: int
    bytes_saved: int
    base_version: int | None
    inline: bool
    held: int = 0
    sent_to_end: bool = False
    first_offset: int | None = None


@dataclass
class DownloadLedger:
    """Payloads offered per ``(client id, task id)``, by kind (``"model"``/``"delta"``)."""

    _offers: dict[tuple[str, str], dict[str, Offered]] = field(default_factory=dict)

    def offer(self, client_id: str, task_id: str, kind: str, total: int, bytes_saved: int,
              base_version: int | None = None, inline: bool = False) -> None:
        """A payload of ``total`` bytes goes to the client (inline: in the ``Task`` reply)."""
        offers = self._offers.setdefault((client_id, task_id), {})
        if kind not in offers:
            offers[kind] = Offered(total, bytes_saved, base_version, inline)
        if inline:
            offers[kind].sent_to_end = True

    def streaming(self, client_id: str, task_id: str, kind: str, offset: int) -> None:
        """A ``Download`` asked for ``kind`` from ``offset``: the client holds that much."""
        offer = self._offers.get((client_id, task_id), {}).get(kind)
        if offer is not None:
            offer.held = max(offer.held, min(offset, offer.total))
            if offer.first_offset is None:
                offer.first_offset = offset

    def streamed(self, client_id: str, task_id: str, kind: str) -> None:
        """A stream handed the payload's last byte to gRPC (delivery still unconfirmed)."""
        offer = self._offers.get((client_id, task_id), {}).get(kind)
        if offer is not None:
            offer.sent_to_end = True

    def confirm(self, client_id: str, task_id: str) -> list[dict[str, Any]]:
        """The client has its task's payloads (it committed): ``download_finished`` fields
        for each, once; a payload never sent to its end counts the bytes the client held."""
        finished = []
        for kind, offer in self._offers.pop((client_id, task_id), {}).items():
            held = offer.total if offer.sent_to_end else offer.held
            fields: dict[str, Any] = {
                "client_id": client_id, "task_id": task_id, "bytes": held,
                "offset": offer.first_offset or 0, "delta": kind == "delta",
                "bytes_saved": offer.bytes_saved if kind == "delta" else 0}
            if offer.base_version is not None:
                fields["base_version"] = offer.base_version
            if offer.inline:
                fields["inline"] = True
            finished.append(fields)
        return finished

    def forget_client(self, client_id: str) -> None:
        """Drop what was offered to a client that left."""
        for key in [k for k in self._offers if k[0] == client_id]:
            del self._offers[key]
