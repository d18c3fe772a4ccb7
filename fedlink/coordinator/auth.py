"""Per-client authentication: HMAC-signed bearer tokens, and who the current call acts as.

A token names one client and when it expires; the coordinator and ``fedlink token issue`` share
a secret, and nothing else needs to be stored server-side. The format is::

    fl1.<base64url(JSON {"sub": name, "iat": issued_at, "exp": expires_at})>.<base64url(mac)>

where ``mac = HMAC-SHA256(secret, "fl1." + payload)`` (base64url without padding; times are
Unix seconds). Clients send ``authorization: Bearer <token>`` as metadata on every call.

The server's interceptor (``fedlink.coordinator.server``, the grpc-aware side) checks the token
on every ``fedlink.v1.Coordinator`` call (health and reflection stay open, for probes) with
``authenticate`` and runs the call ``acting_as`` the token's client name (``caller_name()``).
``Join`` records that name for the new client id, and every later call naming a client id
checks it (``check_caller``): a client may act only on its own id, tasks and uploads, else
``PERMISSION_DENIED``. Without a configured secret there is no interceptor, ``caller_name()``
is ``None`` and nothing is checked. This module is grpc-free.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import hashlib
import hmac
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedlink.errors import ConfigError, PermissionDenied, Unauthenticated
from fedlink.private import warn_if_loose

TOKEN_PREFIX = "fl1"
MIN_SECRET_BYTES = 16
MAX_TOKEN_CHARS = 1024
MAX_CLIENT_NAME = 128
METADATA_KEY = "authorization"

_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("fedlink_caller",
                                                                     default=None)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, signed: str) -> bytes:
    return hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest()


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"the token secret must be at least {MIN_SECRET_BYTES} bytes, "
                          f"got {len(secret)}")


def issue_token(secret: bytes, client: str, ttl_s: float, now: float | None = None) -> str:
    """A token for ``client`` valid for ``ttl_s`` seconds from ``now`` (default: the time)."""
    _check_secret(secret)
    if not client or len(client) > MAX_CLIENT_NAME:
        raise ConfigError(f"client name must be 1 to {MAX_CLIENT_NAME} characters")
    if not ttl_s > 0:
        raise ConfigError(f"ttl_s must be > 0, got {ttl_s}")
    issued = int(time.time() if now is None else now)
    claims = {"sub": client, "iat": issued, "exp": issued + int(max(1, round(ttl_s)))}
    payload = _b64encode(json.dumps(claims, separators=(",", ":"),
                                    sort_keys=True).encode("utf-8"))
    signed = f"{TOKEN_PREFIX}.{payload}"
    return f"{signed}.{_b64encode(_mac(secret, signed))}"


def verify_token(secret: bytes, token: str, now: float | None = None) -> str:
    """The client name ``token`` was issued to; ``Unauthenticated`` if it is not valid now.

    Refuses malformed tokens, a signature that does not match ``secret`` (checked in constant
    time, before anything in the payload is trusted) and expired tokens.
    """
    if not token or len(token) > MAX_TOKEN_CHARS:
        raise Unauthenticated("malformed token")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise Unauthenticated("malformed token")
    try:
        signature = _b64decode(parts[2])
    except (binascii.Error, ValueError):
        raise Unauthenticated("malformed token") from None
    if not hmac.compare_digest(signature, _mac(secret, f"{parts[0]}.{parts[1]}")):
        raise Unauthenticated("token signature is not valid")
    try:
        claims = json.loads(_b64decode(parts[1]))
    except (binascii.Error, ValueError):
        raise Unauthenticated("malformed token") from None
    if not isinstance(claims, dict):
        raise Unauthenticated("malformed token")
    name, expires = claims.get("sub"), claims.get("exp")
    if not isinstance(name, str) or not name or not isinstance(expires, int):
        raise Unauthenticated("malformed token")
    if (time.time() if now is None else now) >= expires:
        raise Unauthenticated("token expired; ask for a new one")
    return name


def load_secret(secret_file: str = "", secret_env: str = "") -> bytes:
    """Read the token secret from a file (surrounding whitespace stripped) or an env variable.

    ``ConfigError`` when it is missing or shorter than ``MIN_SECRET_BYTES``; the secret itself
    never appears in a message.
    """
    if secret_file:
        warn_if_loose(secret_file, "auth.secret_file")
        try:
            secret = Path(secret_file).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"token secret file {secret_file}: {exc.strerror}") from None
    elif secret_env:
        value = os.environ.get(secret_env)
        if value is None:
            raise ConfigError(f"environment variable {secret_env} (the token secret) is not set")
        secret = value.strip().encode("utf-8")
    else:
        raise ConfigError("no token secret configured: set secret_file or secret_env")
    _check_secret(secret)
    return secret


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


def authenticate(secret: bytes, metadata: Any, now: float | None = None) -> str:
    """The client name of a call's ``authorization: Bearer`` metadata (``Unauthenticated``)."""
    return verify_token(secret, token_from_metadata(metadata), now)
