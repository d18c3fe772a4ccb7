"""How long a transfer takes on a ``LinkProfile``, in model time, without sending a byte.

A transfer of ``n`` bytes costs one round trip to open (twice the one-way latency, plus
jitter when the profile has some and the timing is not ``deterministic``), then ``n`` bytes at
the link's bandwidth in that direction. A check-in (``check_in_time``) is one round trip whose
answer carries the task's payload when it fits the run's ``inline_limit``, as the coordinator
sends it; a larger payload is a transfer of its own after it. One leg of a call
(``leg_time``: the request on its way up, or the answer on its way down once the coordinator
gives it) costs the one-way latency and its bytes, so that a call answered at once costs what a
transfer does, and one the coordinator holds (a secure phase's long-poll) costs that plus the
wait. Resets (``reset_every_kb`` / ``reset_every_s``,
exponential around their means) cost what the resumable protocol would resend: the transfer is
cut into the segments the real client's ``SegmentSizer`` picks (``fedlink.client.transfer``);
a reset loses the part of its segment sent so far and a round trip to ask where to resume, and
the sizer shrinks, exactly as the client's does. A blackout (``blackout_every_s`` /
``blackout_s``) stops the transfer for its duration. Everything is drawn from the generator
passed in, so a seeded simulation times every transfer the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from fedlink.client.transfer import SegmentSizer
from fedlink.netem import LinkProfile

UP = "up"
DOWN = "down"


@dataclass(frozen=True)
class TransferTime:
    """A transfer's model seconds, and what resets made it resend."""

    seconds: float
    resent_bytes: int = 0
    resets: int = 0
    blackout_s: float = 0.0


def _rate_bytes_per_s(profile: LinkProfile, direction: str) -> float:
    kbps = profile.up_kbps if direction == UP else profile.down_kbps
    return math.inf if kbps is None else kbps * 1000.0 / 8.0


def round_trip_s(profile: LinkProfile, rng: np.random.Generator | None) -> float:
    """Twice the one-way latency, each way jittered (normal, never below zero) unless
    ``rng`` is ``None`` (deterministic timing)."""
    return _latency_s(profile, rng, ways=2)


def _latency_s(profile: LinkProfile, rng: np.random.Generator | None, ways: int) -> float:
    """``ways`` one-way latencies, each jittered (normal, never below zero) unless ``rng`` is
    ``None``."""
    one_way = profile.latency_ms / 1000.0
    if rng is None or profile.jitter_ms <= 0:
        return ways * one_way
    jitter = rng.normal(0.0, profile.jitter_ms / 1000.0, size=ways)
    return float(np.maximum(one_way + jitter, 0.0).sum())


def transfer_time(profile: LinkProfile | None, num_bytes: int, direction: str,
                  rng: np.random.Generator | None) -> TransferTime:
    """Model seconds to move ``num_bytes`` over ``profile`` (``None``: an ideal link, 0 s).

    ``rng=None`` leaves out every random part (jitter, resets, blackouts): the deterministic
    timing the equivalence tests compare with real gRPC.
    """
    return _moved(profile, num_bytes, direction, rng, ways=2)


def leg_time(profile: LinkProfile | None, num_bytes: int, direction: str,
             rng: np.random.Generator | None) -> TransferTime:
    """Model seconds for one leg of a call carrying ``num_bytes``: the request reaching the
    coordinator (``UP``), or its answer reaching the client once given (``DOWN``); the two
    legs of a call answered at once cost what ``transfer_time`` does."""
    return _moved(profile, num_bytes, direction, rng, ways=1)


def check_in_time(profile: LinkProfile | None, payload_bytes: int, inline_limit: int,
                  rng: np.random.Generator | None) -> tuple[float, TransferTime]:
    """A check-in that hands the client a task and ``payload_bytes`` of its model (0: none,
    it holds it): model seconds until the client has the task, and the whole exchange's
    time. The payload travels inside the answer when it fits ``inline_limit`` (the
    coordinator's rule), so task and model arrive together after one round trip; a larger one
    is downloaded after it, a transfer of its own."""
    if profile is None:
        return 0.0, TransferTime(0.0)
    if payload_bytes and payload_bytes <= inline_limit:
        together = transfer_time(profile, payload_bytes, DOWN, rng)
        return together.seconds, together
    task_s = round_trip_s(profile, rng)
    if not payload_bytes:
        return task_s, TransferTime(task_s)
    down = transfer_time(profile, payload_bytes, DOWN, rng)
    return task_s, dataclasses.replace(down, seconds=task_s + down.seconds)


def _moved(profile: LinkProfile | None, num_bytes: int, direction: str,
           rng: np.random.Generator | None, ways: int) -> TransferTime:
    """``num_bytes`` after ``ways`` one-way latencies (resets, blackouts: ``transfer_time``)."""
    if profile is None:
        return TransferTime(0.0)
    rate = _rate_bytes_per_s(profile, direction)
    seconds = _latency_s(profile, rng, ways)
    if rng is None:
        return TransferTime(seconds + num_bytes / rate)
    resent, resets, base = _with_resets(profile, num_bytes, rate, rng)
    blackout = _blackouts(profile, seconds + base, rng)
    return TransferTime(seconds + base + blackout + resets * round_trip_s(profile, rng),
                        resent, resets, blackout)


def _next_reset_bytes(profile: LinkProfile, rate: float, rng: np.random.Generator) -> float:
    """Bytes until the next reset: the nearer of the byte and the time schedule."""
    gaps = []
    if profile.reset_every_kb:
        gaps.append(rng.exponential(profile.reset_every_kb * 1000.0))
    if profile.reset_every_s and math.isfinite(rate):
        gaps.append(rng.exponential(profile.reset_every_s) * rate)
    return min(gaps) if gaps else math.inf


def _with_resets(profile: LinkProfile, num_bytes: int, rate: float,
                 rng: np.random.Generator) -> tuple[int, int, float]:
    """(bytes resent, resets, seconds of sending) through the client's segment sizing."""
    sizer = SegmentSizer()
    left, resent, resets = num_bytes, 0, 0
    until_reset = _next_reset_bytes(profile, rate, rng)
    while left > 0:
        segment = min(left, sizer.size)
        if until_reset >= segment:
            until_reset -= segment
            left -= segment
            sizer.succeeded(segment)
            continue
        lost = int(until_reset)  # sent, not confirmed: resent after the resume
        resent += lost
        resets += 1
        sizer.failed()
        until_reset = _next_reset_bytes(profile, rate, rng)
    sent = num_bytes + resent
    return resent, resets, (0.0 if math.isinf(rate) else sent / rate)


def _blackouts(profile: LinkProfile, seconds: float, rng: np.random.Generator) -> float:
    """Seconds of blackout falling within a transfer of ``seconds`` (mean-rate Poisson)."""
    if not profile.blackout_every_s or profile.blackout_s <= 0:
        return 0.0
    count = rng.poisson(seconds / profile.blackout_every_s)
    return float(rng.exponential(profile.blackout_s, size=count).sum()) if count else 0.0
