"""Turning a link measurement into settings: chunk size, codec and density, deadline, staleness.

The rules, for a model of ``model_bytes`` as fp32 (the coordinator says how big in its probe
reply):

- **chunk size**: about ``CHUNK_SECONDS`` of uplink per chunk (a broken upload resumes from the
  last whole chunk, so a chunk is what a break costs), a power of two in [16 KiB, 1 MiB];
- **codec**: fp32 when the update crosses the uplink within ``UPLOAD_BUDGET_S``, fp16 when half
  of it does, else top-k with the density that fits the budget (about 8 bytes per kept value
  with its index; error feedback keeps what is dropped for later);
- **deadline**: ``DEADLINE_MARGIN`` x the network part of a task (download, upload, a few round
  trips) plus the device's training time, which the link cannot tell;
- **staleness**: expected when stalls were seen or the network part of a task is long; elastic
  or asynchronous rounds with a small ``max_staleness`` then keep those clients' work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedlink.netcheck.probe import NetcheckResult

KIB = 1024
CHUNK_SECONDS = 0.5
MIN_CHUNK = 16 * KIB
MAX_CHUNK = 1024 * KIB
UPLOAD_BUDGET_S = 5.0
TOPK_BYTES_PER_VALUE = 8.0
MIN_DENSITY = 0.001
DEADLINE_MARGIN = 3.0
ROUND_TRIPS_PER_TASK = 6
SLOW_TASK_S = 10.0


@dataclass(frozen=True)
class Advice:
    """Settings suggested for a link, with the reason for each."""

    chunk_bytes: int
    codec: str
    density: float | None
    network_seconds_per_task: float
    deadline_s: float
    expect_staleness: bool
    notes: tuple[str, ...]


def advise(result: NetcheckResult) -> Advice:
    """Suggested client and round settings for the link ``result`` measured."""
    up_bps = result.up.kbps * 1000 / 8
    down_bps = result.down.kbps * 1000 / 8
    chunk = _chunk_bytes(up_bps)
    codec, density, upload_bytes = _codec(result.model_bytes, up_bps)
    network = (result.model_bytes / down_bps + upload_bytes / up_bps
               + ROUND_TRIPS_PER_TASK * result.rtt_ms / 1000)
    stale = result.stalls > 0 or result.resets > 0 or network > SLOW_TASK_S
    notes = [f"chunk_bytes = {chunk}: about {CHUNK_SECONDS:g} s of uplink per chunk, so a "
             "break costs at most that much to resend",
             _codec_note(codec, density, result.model_bytes, up_bps),
             f"deadline_s >= {DEADLINE_MARGIN * network:.1f} + local training time: "
             f"{DEADLINE_MARGIN:g} x the {network:.1f} s a task spends on this link"]
    if stale:
        why = "stalls or resets were seen" if result.stalls or result.resets else \
            f"a task needs {network:.0f} s on the network"
        notes.append(f"expect stale updates ({why}): use elastic or async rounds with "
                     "max_staleness = 2-4 and a polynomial staleness weight")
    else:
        notes.append("no staleness expected from the link itself")
    return Advice(chunk_bytes=chunk, codec=codec, density=density,
                  network_seconds_per_task=network, deadline_s=DEADLINE_MARGIN * network,
                  expect_staleness=stale, notes=tuple(notes))


def _chunk_bytes(up_bps: float) -> int:
    """A power of two near ``CHUNK_SECONDS`` of uplink, within [MIN_CHUNK, MAX_CHUNK]."""
    wanted = max(MIN_CHUNK, min(MAX_CHUNK, up_bps * CHUNK_SECONDS))
    return int(2 ** math.floor(math.log2(wanted)))


def _codec(model_bytes: int, up_bps: float) -> tuple[str, float | None, float]:
    """(codec, top-k density or None, bytes an update takes) for the upload budget."""
    budget = up_bps * UPLOAD_BUDGET_S
    if model_bytes <= budget:
        return "fp32", None, float(model_bytes)
    if model_bytes / 2 <= budget:
        return "fp16", None, model_bytes / 2
    values = model_bytes / 4
    density = max(MIN_DENSITY, min(1.0, budget / (values * TOPK_BYTES_PER_VALUE)))
    return "topk", round(density, 4), values * density * TOPK_BYTES_PER_VALUE


def _codec_note(codec: str, density: float | None, model_bytes: int, up_bps: float) -> str:
    fp32_s = model_bytes / up_bps
    if codec == "topk":
        return (f"compression = \"topk\", density = {density}: an fp32 update "
                f"({model_bytes} B) would take {fp32_s:.1f} s up; error feedback on")
    if codec == "fp16":
        return (f"compression = \"fp16\": an fp32 update ({model_bytes} B) would take "
                f"{fp32_s:.1f} s up; at half size ({fp32_s / 2:.1f} s) it fits the "
                f"{UPLOAD_BUDGET_S:g} s budget")
    return (f"compression = \"fp32\": an fp32 update ({model_bytes} B) takes {fp32_s:.1f} s "
            f"up, within the {UPLOAD_BUDGET_S:g} s budget")
