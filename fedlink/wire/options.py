"""gRPC channel and server options shared by the coordinator and the client SDK.

Why these values (see NETWORK-FACTS): a link that goes silent without a reset is noticed only
through keepalive pings, and only by the wait for the ping's ack, ``grpc.http2.ping_timeout_ms``
(its default is 60 s); the server must allow the client's ping rate or it answers GOAWAY
``too_many_pings``; BDP probing keeps large transfers fast on high-latency links. Message
limits sit above the largest chunk we ever send.

**The coordinator's receive window is fixed by default** (``SERVER_STREAM_WINDOW_BYTES``, BDP
probing off on the server only; ``[coordinator.limits] stream_window_bytes`` sets it, 0 turns
BDP probing back on). gRPC core accepts a stream's data up to the window it advertised
before the application asks for a message; with BDP probing on, that window grew on a fast
link to megabytes per stream, so 200 concurrent calls just under the message cap on 2
connections were each buffered whole by core, before fedlink's budget of bytes in flight
(``fedlink.coordinator.inflight``) could refuse them: the coordinator peaked 250 to 400 MiB
above its start. With a fixed window, what core holds for messages not asked for is at most
``max_concurrent_streams x SERVER_STREAM_WINDOW_BYTES`` per connection; a message the
coordinator does read opens its stream's window to the message's whole length at once, so a
chunked upload costs about one round trip per chunk (measured at 100 ms RTT: 8 MiB in 1 MiB
chunks took 0.95 s, 0.33 s with BDP probing). Downloads keep the client's BDP probing.

The ping-ack wait must exceed the link's round trip, and the time the ack spends queued behind
data in flight: on a slow *uplink* the ping waits behind the client's upload, on a slow
*downlink* the ack waits behind the coordinator's download (measured: a 3 s timeout cut most
16 MB uploads at 8 Mbit/s; a fixed 5 s timeout killed every call over a 10 s RTT link and cut
1.2 MB downloads at 1 Mbit/s). No fixed value fits every link, so the client chooses it per
connection from what it has measured (``fedlink.client.liveness``) and passes it here.

``grpc.keepalive_timeout_ms`` is a different thing: gRPC also uses it as the sockets'
``TCP_USER_TIMEOUT``, the time the kernel lets sent data go unacknowledged before aborting the
connection. A short one turns a loss burst that TCP's retransmissions would carry through into
``Connection timed out``; so it is set long and on its own.
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 8 << 20
KEEPALIVE_TIME_MS = 2_000
"""Default idle time before the client's keepalive ping (how soon silence is probed)."""
PING_TIMEOUT_MS = 5_000
"""Default (and the smallest, by default) ping-ack wait: a silent short-RTT link is noticed
about ``KEEPALIVE_TIME_MS + PING_TIMEOUT_MS`` (7 s) into it."""
TCP_USER_TIMEOUT_MS = 300_000
"""Default ``TCP_USER_TIMEOUT`` of the client's sockets (via ``grpc.keepalive_timeout_ms``)."""
MAX_RECONNECT_BACKOFF_MS = 5_000
"""gRPC's own wait between reconnect attempts, at most (its default grows to 120 s). fedlink
retries calls itself, with its own backoff; while gRPC waits to reconnect, every call fails
at once with the cached error, so a coordinator that was down several times in a row (a crash
loop, a flaky link) could be back for minutes before a client's channel tried again."""
SERVER_PING_TIMEOUT_MS = 60_000
"""How long the coordinator waits for a client's ping ack, and its sockets' TCP user timeout.
Generous: on a slow uplink the ack queues behind the upload's data, on a long link it takes a
round trip, and the coordinator tells dead clients by their heartbeats, not by pings."""

SERVER_STREAM_WINDOW_BYTES = 64 << 10
"""The coordinator's default HTTP/2 stream window for data it has not asked for (HTTP/2's
default)."""

GrpcOptions = list[tuple[str, int | str]]


def client_channel_options(ping_timeout_ms: int = PING_TIMEOUT_MS,
                           keepalive_time_ms: int = KEEPALIVE_TIME_MS,
                           tcp_user_timeout_ms: int = TCP_USER_TIMEOUT_MS) -> GrpcOptions:
    """Options for a client's channel to the coordinator, with the link's timeouts."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", keepalive_time_ms),
        # gRPC's TCP_USER_TIMEOUT; the ping-ack wait is ping_timeout_ms below
        ("grpc.keepalive_timeout_ms", max(tcp_user_timeout_ms, ping_timeout_ms)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.ping_timeout_ms", ping_timeout_ms),
        ("grpc.http2.bdp_probe", 1),
        ("grpc.initial_reconnect_backoff_ms", 500),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
        ("grpc.enable_retries", 0),  # fedlink retries itself, with resumable transfers
    ]


def server_options(max_receive_bytes: int = MAX_MESSAGE_BYTES) -> GrpcOptions:
    """Options for the coordinator's server; it reads no message over ``max_receive_bytes``
    (gRPC refuses a larger one from its length prefix, before reading it). The stream window
    is a limit of its own (``stream_window_options``)."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", SERVER_PING_TIMEOUT_MS),
        ("grpc.http2.ping_timeout_ms", SERVER_PING_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.so_reuseport", 0),
    ]


def stream_window_options(window_bytes: int) -> GrpcOptions:
    """The coordinator's HTTP/2 stream window: fixed at ``window_bytes`` (BDP probing off), or
    grown by BDP probing when ``window_bytes`` is 0 (see the module docstring for the cost of
    each)."""
    if window_bytes == 0:
        return [("grpc.http2.bdp_probe", 1)]
    # a fixed window: BDP probing grew it per stream, for data nobody asked for yet
    return [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", window_bytes)]
