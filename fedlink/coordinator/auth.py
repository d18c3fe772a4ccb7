"""Per-client authentication: who the current call acts as, and from where.

Tokens are JSON Web Tokens (``fedlink.coordinator.tokens``): ``HS256`` under a secret the
coordinator shares with ``fedlink token issue``, or ``ES256`` / ``RS256`` under an operator's
public key or JWKS file. Clients send ``authorization: Bearer <token>`` as metadata on every call.

The server's interceptor (``fedlink.coordinator.server``, the grpc-aware side) checks the token
on every ``fedlink.v1.Coordinator`` call (health and reflection stay open, for probes) with
``authenticate`` and runs the call ``acting_as`` the token's client name (``caller_name()``).
``Join`` records that name for the new client id, and every later call naming a client id
checks it (``check_caller``): a client may act only on its own id, tasks and uploads, else
``PERMISSION_DENIED``. Without ``[coordinator.auth]`` there is no interceptor, ``caller_name()``
is ``None`` and nothing is checked.

``principal()`` names whose budget a call spends (``fedlink.coordinator.admission``): the token's
client name under per-client tokens, else the peer address the edge recorded (``calling_from``).
This module is grpc-free.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from fedlink.coordinator.config import AuthConfig
from fedlink.coordinator.tokens import (
    MAX_CLIENT_NAME,
    MAX_TOKEN_CHARS,
    MIN_SECRET_BYTES,
    TokenVerifier,
    issue_legacy_token,
    issue_token,
    load_public_keys,
    load_secret,
    verify_token,
)
from fedlink.errors import PermissionDenied, Unauthenticated

__all__ = [
    "MAX_CLIENT_NAME",
    "MAX_TOKEN_CHARS",
    "METADATA_KEY",
    "MIN_SECRET_BYTES",
    "TokenVerifier",
    "acting_as",
    "authenticate",
    "caller_name",
    "calling_from",
    "check_caller",
    "issue_legacy_token",
    "issue_token",
    "load_public_keys",
    "load_secret",
    "load_verifier",
    "peer_address",
    "peer_host",
    "principal",
    "token_from_metadata",
    "verify_token",
]

METADATA_KEY = "authorization"

_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("fedlink_caller",
                                                                     default=None)
_PEER: contextvars.ContextVar[str] = contextvars.ContextVar("fedlink_peer", default="")


def load_verifier(auth: AuthConfig, run_name: str = "") -> TokenVerifier:
    """The token verifier ``[coordinator.auth]`` describes (keys and secret read now).

    ``run_name``: the coordinator's run, which a token's ``run`` claim must name.
    """
    secret = (load_secret(auth.secret_file, auth.secret_env)
              if auth.secret_file or auth.secret_env else None)
    legacy = secret if auth.legacy_tokens else None
    options: dict[str, Any] = {"run_name": run_name, "require_run": auth.require_run,
                               "issuer": auth.issuer, "audience": auth.audience,
                               "legacy_secret": legacy}
    if auth.algorithm == "HS256":
        assert secret is not None  # AuthConfig refuses HS256 without a secret
        return TokenVerifier("HS256", {"": secret}, **options)
    keys = load_public_keys(auth.algorithm, auth.public_key_file, auth.jwks_file)
    return TokenVerifier(auth.algorithm, keys, **options)


@contextlib.contextmanager
def calling_from(peer: str) -> Iterator[None]:
    """Handle the enclosed call as coming from gRPC peer ``peer`` (``ipv4:1.2.3.4:5678``)."""
    reset = _PEER.set(peer_host(peer))
    try:
        yield
    finally:
        # A streaming handler cut short is closed by whichever task finalises its generator,
        # in another context: there is nothing of this call's to restore there.
        with contextlib.suppress(ValueError):
            _PEER.reset(reset)


def peer_host(peer: str) -> str:
    """The address of a gRPC peer string without its port (``ipv6:[::1]:5`` -> ``ipv6:[::1]``)."""
    if peer.startswith(("ipv4:", "ipv6:")):
        host, _, port = peer.rpartition(":")
        return host if port.isdigit() else peer
    return peer


def peer_address() -> str:
    """The peer address (no port) of the call being handled ("": not a gRPC call)."""
    return _PEER.get()


def principal() -> str:
    """Whose budget the call being handled spends: ``token:<name>`` under per-client tokens,
    ``peer:<address>`` without, ``""`` for a call from inside the process (simulation)."""
    name = _CALLER.get()
    if name is not None:
        return f"token:{name}"
    peer = _PEER.get()
    return f"peer:{peer}" if peer else ""


def caller_name() -> str | None:
    """The authenticated client name of the call being handled (``None``: no auth)."""
    return _CALLER.get()


def check_caller(owner: str) -> None:
    """``PermissionDenied`` unless the authenticated caller (if any) is ``owner``."""
    name = _CALLER.get()
    if name is not None and name != owner:
        raise PermissionDenied("this client id belongs to another client")


def token_from_metadata(metadata: Any) -> str:
    """The bearer token in call metadata (``(key, value)`` pairs); ``Unauthenticated`` if none."""
    for key, value in metadata or ():
        if key == METADATA_KEY:
            scheme, _, token = str(value).partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("authorization metadata must be 'Bearer <token>'")
            return token.strip()
    raise Unauthenticated("missing 'authorization: Bearer <token>' metadata")


@contextlib.contextmanager
def acting_as(name: str | None) -> Iterator[None]:
    """Handle the enclosed call as the authenticated client ``name`` (``caller_name()``)."""
    reset = _CALLER.set(name)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # an async generator closed from another context
            _CALLER.reset(reset)


def authenticate(verifier: TokenVerifier | bytes, metadata: Any,
                 now: float | None = None) -> str:
    """The client name of a call's ``authorization: Bearer`` metadata (``Unauthenticated``).

    ``verifier``: the coordinator's ``TokenVerifier`` (an HMAC secret: HS256 under it).
    """
    if isinstance(verifier, bytes):
        verifier = TokenVerifier.hs256(verifier)
    return verifier.verify(token_from_metadata(metadata), now)
