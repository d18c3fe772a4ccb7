"""TLS material for the coordinator's port: the PEM files named by ``TLSConfig``, read and checked.

grpc-free; ``fedlink.coordinator.server`` turns the material into server credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedlink.coordinator.config import TLSConfig
from fedlink.errors import ConfigError
from fedlink.private import warn_if_loose


@dataclass(frozen=True)
class ServerTLSMaterial:
    """The server's key and certificate chain, and for mutual TLS the clients' CA (PEM bytes)."""

    private_key: bytes
    certificate_chain: bytes
    client_ca: bytes | None


def read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file; ``ConfigError`` naming ``tls.<what>`` if it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"tls.{what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"tls.{what} {path}: not a PEM file")
    return data


def load_server_material(config: TLSConfig) -> ServerTLSMaterial:
    """Read the files of ``config`` (``ConfigError`` if TLS is off or a file is unusable)."""
    if not config.enabled:
        raise ConfigError("tls: cert_file and key_file are not set")
    warn_if_loose(config.key_file, "tls.key_file")
    return ServerTLSMaterial(
        private_key=read_pem(config.key_file, "key_file"),
        certificate_chain=read_pem(config.cert_file, "cert_file"),
        client_ca=read_pem(config.client_ca_file, "client_ca_file")
        if config.client_ca_file else None)
