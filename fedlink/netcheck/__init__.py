"""Diagnosing the link to a coordinator, through fedlink's own protocol.

- ``fedlink.netcheck.probe.measure``: RTT, jitter, goodput each way, stalls and resets, with
  the ``Probe`` call (which the coordinator answers only where its config allows it);
- ``fedlink.netcheck.tcpinfo``: retransmissions and congestion window from the kernel;
- ``fedlink.netcheck.advice.advise``: chunk size, codec and density, deadline, staleness;
- ``fedlink.netcheck.health.check_health``: the gRPC health service, for ``fedlink health``.

The seed's habit on a bad link (iperf3 for bandwidth, ``ss -ti`` for retransmits) in one
command: ``fedlink netcheck HOST:PORT`` (``--json`` for scripts).
"""
