"""Measuring the link to a coordinator with its ``Probe`` call: RTT, jitter, goodput each way.

The measurement, over one channel (the same options as a fedlink client's):

1. one untimed probe opens the connection (TCP and HTTP/2 set-up are not the link's RTT);
2. ``rtt_probes`` empty probes, one after another: RTT is their median, jitter the mean
   difference between consecutive ones (RFC 3550's estimator, without its smoothing);
3. per direction, one probe of ``first_bytes`` estimates the goodput, then ``repeats`` probes
   sized to take about ``window_s`` each measure it; goodput is payload bits over the time a
   probe took beyond the RTT, averaged over the repeats within 1.5x of the fastest (a
   blackout in one repeat is a stall, not the link's capacity).

A call that takes much longer than expected (``stall_factor`` x its expected time, and at least
``stall_min_s`` more) counts as a stall; a call that fails ``UNAVAILABLE`` as a reset (it is
tried again, up to ``attempts`` times).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from fedlink.errors import ConfigError, RemoteError, ResourceExhausted, remote_error
from fedlink.netcheck.tcpinfo import TcpStats, connections_to, tcp_stats
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire.options import client_channel_options

KIB = 1024
OUTLIER_FACTOR = 1.5


@dataclass(frozen=True)
class NetcheckOptions:
    """How long and how hard to measure; every size is capped by the coordinator's limit."""

    rtt_probes: int = 10
    first_bytes: int = 32 * KIB
    window_s: float = 1.0
    repeats: int = 2
    attempts: int = 3
    call_timeout_s: float = 60.0
    stall_factor: float = 3.0
    stall_min_s: float = 1.0
    token: str = ""

    def __post_init__(self) -> None:
        if self.rtt_probes < 2 or self.repeats < 1 or self.attempts < 1:
            raise ConfigError("netcheck: rtt_probes >= 2, repeats >= 1 and attempts >= 1")
        if self.first_bytes < 1 or self.window_s <= 0 or self.call_timeout_s <= 0:
            raise ConfigError("netcheck: first_bytes, window_s and call_timeout_s must be > 0")


@dataclass(frozen=True)
class Goodput:
    """One direction: the goodput measured, what was sent to measure it, and every repeat."""

    kbps: float
    probe_bytes: int
    samples_kbps: tuple[float, ...]


@dataclass(frozen=True)
class NetcheckResult:
    """What ``measure`` found (JSON-ready through ``dataclasses.asdict``)."""

    target: str
    rtt_ms: float
    rtt_min_ms: float
    jitter_ms: float
    up: Goodput
    down: Goodput
    stalls: int
    resets: int
    model_bytes: int
    seconds: float
    rtt_samples_ms: tuple[float, ...] = ()
    tcp: tuple[TcpStats, ...] = field(default=())


class _Prober:
    """Times ``Probe`` calls on one channel, counting stalls and resets."""

    def __init__(self, channel: grpc.Channel, options: NetcheckOptions) -> None:
        self._stub = pb_grpc.CoordinatorStub(channel)
        self._options = options
        self._metadata = (("authorization", f"Bearer {options.token}"),) if options.token \
            else None
        self.resets = 0
        self.max_bytes = 0
        self.model_bytes = 0
        self.calls: list[tuple[float, int, int]] = []  # (seconds, bytes up, bytes down)

    def timed(self, up: int, down: int) -> float:
        """Seconds one probe carrying ``up`` bytes and asking ``down`` back took."""
        for attempt in range(self._options.attempts):
            started = time.perf_counter()
            try:
                reply = self._stub.Probe(pb.ProbeRequest(payload=bytes(up), reply_bytes=down),
                                         timeout=self._options.call_timeout_s,
                                         metadata=self._metadata)
            except grpc.RpcError as err:
                error = _remote(err)
                if error.code != "UNAVAILABLE" or attempt + 1 == self._options.attempts:
                    raise error from err
                self.resets += 1
                continue
            seconds = time.perf_counter() - started
            self.max_bytes, self.model_bytes = reply.max_bytes, reply.model_bytes
            self.calls.append((seconds, up, down))
            return seconds
        raise AssertionError("unreachable")


def _remote(err: grpc.RpcError) -> RemoteError:
    """A grpc error as fedlink's ``RemoteError``."""
    code: grpc.StatusCode = err.code()  # type: ignore[attr-defined]
    return remote_error(code.name, str(err.details()))  # type: ignore[attr-defined]


def measure(target: str, options: NetcheckOptions | None = None) -> NetcheckResult:
    """Measure the link to the coordinator at ``target`` (``host:port``); see module doc."""
    options = options or NetcheckOptions()
    started = time.perf_counter()
    before = connections_to(target)
    with grpc.insecure_channel(target, options=client_channel_options()) as channel:
        prober = _Prober(channel, options)
        prober.timed(0, 0)  # opens the connection; learns the size cap
        rtts = [prober.timed(0, 0) for _ in range(options.rtt_probes)]
        rtt = statistics.median(rtts)
        up_samples, up_bytes = _goodput(prober, options, rtt, upward=True)
        down_samples, down_bytes = _goodput(prober, options, rtt, upward=False)
        stats = tcp_stats(target, exclude=before)
    up, down = _best(up_samples, up_bytes), _best(down_samples, down_bytes)
    stalls = _stalls(prober.calls[1:], rtt, up.kbps, down.kbps, options)
    return NetcheckResult(
        target=target, rtt_ms=rtt * 1000, rtt_min_ms=min(rtts) * 1000,
        jitter_ms=statistics.fmean(abs(a - b) for a, b in itertools.pairwise(rtts)) * 1000,
        up=up, down=down, stalls=stalls, resets=prober.resets,
        model_bytes=prober.model_bytes, seconds=time.perf_counter() - started,
        rtt_samples_ms=tuple(r * 1000 for r in rtts), tcp=stats)


def _goodput(prober: _Prober, options: NetcheckOptions, rtt: float,
             upward: bool) -> tuple[list[tuple[float, float]], int]:
    """(seconds, kbps) of each sized probe one way, and the size they used."""
    cap = max(1, prober.max_bytes)

    def probe(size: int) -> tuple[float, float]:
        seconds = prober.timed(size, 0) if upward else prober.timed(0, size)
        return seconds, size * 8 / max(seconds - rtt, 1e-6) / 1000

    size = min(options.first_bytes, cap)
    _, estimate = probe(size)
    size = int(min(cap, max(size, estimate * 1000 / 8 * options.window_s)))
    return [probe(size) for _ in range(options.repeats)], size


def _best(samples: Sequence[tuple[float, float]], size: int) -> Goodput:
    """The mean over the repeats that were not slowed by a stall: those within
    ``OUTLIER_FACTOR`` of the fastest (a blackout slows a repeat; nothing speeds one up)."""
    fastest = min(seconds for seconds, _ in samples)
    kept = [kbps for seconds, kbps in samples if seconds <= OUTLIER_FACTOR * fastest]
    return Goodput(kbps=statistics.fmean(kept), probe_bytes=size,
                   samples_kbps=tuple(kbps for _, kbps in samples))


def _stalls(calls: Sequence[tuple[float, int, int]], rtt: float, up_kbps: float,
            down_kbps: float, options: NetcheckOptions) -> int:
    """Calls that took ``stall_factor`` x what the measured link predicts for them, and at
    least ``stall_min_s`` more."""
    stalled = 0
    for seconds, up, down in calls:
        expected = rtt + up * 8 / (up_kbps * 1000) + down * 8 / (down_kbps * 1000)
        stalled += seconds > max(expected * options.stall_factor, expected + options.stall_min_s)
    return stalled


def rate_limited(error: RemoteError) -> bool:
    """Whether ``error`` is the coordinator's probe rate limit (worth waiting for)."""
    return isinstance(error, ResourceExhausted) and error.retryable
