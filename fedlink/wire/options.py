"""gRPC channel and server options shared by the coordinator and the client SDK.

Why these values (see NETWORK-FACTS): a link that goes silent without a reset is noticed only
through keepalive pings, and only if the ping ack timeout is short too; the server must allow the
client's ping rate or it answers GOAWAY ``too_many_pings``; BDP probing keeps large transfers
fast on high-latency links. Message limits sit above the largest chunk we ever send.
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 8 << 20
KEEPALIVE_TIME_MS = 2_000
KEEPALIVE_TIMEOUT_MS = 5_000
"""How long a client waits for the ack of its keepalive ping: a silent link is noticed about
``KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS`` (7 s) into it. Not shorter: while an upload
saturates a slow uplink, the ping queues behind the data in the client's socket buffer and the
link's (measured: 3 s cut most 16 MB uploads at 8 Mbit/s with GOAWAY ``ping_timeout``, 5 s
none)."""
SERVER_KEEPALIVE_TIMEOUT_MS = 20_000
"""How long the coordinator waits for a client's ping ack. Generous: on a slow uplink the ack
queues behind the upload's data in the client's and the link's buffers (seconds at 1 MB/s
for a few MB), and a short timeout would cut healthy uploads with GOAWAY ``ping_timeout``.
The coordinator tells dead clients by their heartbeats, not by pings."""

GrpcOptions = list[tuple[str, int | str]]


def client_channel_options() -> GrpcOptions:
    """Options for a client's channel to the coordinator."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.bdp_probe", 1),
        ("grpc.enable_retries", 0),  # fedlink retries itself, with resumable transfers
    ]


def server_options() -> GrpcOptions:
    """Options for the coordinator's server."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", SERVER_KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.http2.bdp_probe", 1),
        ("grpc.so_reuseport", 0),
    ]
