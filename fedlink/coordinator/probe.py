"""Answering ``Probe`` calls (``fedlink netcheck``): allowed by config, sized and rate-limited.

A probe costs the coordinator what its payloads cost its link, so the desk refuses every probe
unless ``[coordinator.netcheck] enabled``, caps each payload at ``max_bytes`` either way, and
spends one token of a coordinator-wide bucket of ``probes_per_minute`` per call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from fedlink.coordinator.limits import TokenBucket
from fedlink.coordinator.operations import NetcheckConfig
from fedlink.errors import ResourceExhausted, UpdateRefused
from fedlink.refusals import RefusalCode


class ProbesOff(UpdateRefused):
    """The coordinator does not answer probes (``FAILED_PRECONDITION``)."""

    reason = RefusalCode.PROBES_OFF


@dataclass(frozen=True)
class ProbeAnswer:
    """What a probe gets back: filler bytes, and figures for the caller's advice."""

    payload: bytes
    received_bytes: int
    model_bytes: int
    max_bytes: int


class ProbeDesk:
    """Checks and answers probes for one coordinator (``model_bytes``: its fp32 model size)."""

    def __init__(self, config: NetcheckConfig, model_bytes: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.model_bytes = model_bytes
        self._clock = clock
        rate = config.probes_per_minute / 60.0
        self._bucket = TokenBucket(rate, float(config.probes_per_minute),
                                   float(config.probes_per_minute), clock())

    def answer(self, received_bytes: int, reply_bytes: int) -> ProbeAnswer:
        """The reply to a probe that carried ``received_bytes`` and asks for ``reply_bytes``.

        Raises ``ProbesOff`` when probes are not allowed and ``ResourceExhausted`` over the
        size cap (not retryable) or the rate limit (retryable, with a hint).
        """
        cap = self.config.max_bytes
        if not self.config.enabled:
            raise ProbesOff("this coordinator does not answer netcheck probes; its operator "
                            "can allow them with [coordinator.netcheck] enabled = true")
        if received_bytes > cap or reply_bytes > cap:
            raise ResourceExhausted(f"probe payloads are limited to {cap} bytes each way")
        wait = self._bucket.take(self._clock())
        if wait > 0:
            raise ResourceExhausted("too many netcheck probes; slow down", retry_after_s=wait)
        return ProbeAnswer(bytes(reply_bytes), received_bytes, self.model_bytes, cap)
