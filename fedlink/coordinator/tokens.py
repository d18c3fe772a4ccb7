"""Per-client tokens: JSON Web Tokens (RFC 7519) through PyJWT, and the deprecated ``fl1`` format.

A token names one client (``sub``), says until when it is valid (``exp``, Unix seconds) and
may name the one run it is good for (``run``: the coordinator's ``run_name``). The coordinator
checks it with one of:

- ``HS256``: an HMAC secret it shares with whoever mints the tokens (``fedlink token issue``);
- ``ES256`` / ``RS256``: the public key of an operator's identity provider, as a PEM file or a
  JWKS file (``{"keys": [...]}``, a key picked by the token's ``kid``), so that an existing
  provider can mint device tokens and the coordinator holds no signing secret at all.

Only the configured algorithm is accepted: ``alg: none``, and an ``HS256`` token signed with the
public key of an asymmetric configuration (key confusion) are refused before any signature
check. PyJWT does the signatures; this module picks the key, checks the time claims against the
caller's clock and turns every failure into ``Unauthenticated`` with a short, fixed reason.

The older ``fl1.<claims>.<mac>`` tokens (HMAC-SHA256 over ``"fl1." + claims`` with the same
secret) are still accepted for one release when a secret is configured, with a
``DeprecationWarning`` and a log line; ``[coordinator.auth] legacy_tokens = false`` refuses them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlink.errors import ConfigError, Unauthenticated
from fedlink.private import warn_if_loose

log = logging.getLogger(__name__)

ALGORITHMS = ("HS256", "ES256", "RS256")
ASYMMETRIC = ("ES256", "RS256")
MIN_SECRET_BYTES = 32
"""RFC 7518, section 3.2: an HS256 key at least as long as the hash output (256 bits)."""
MAX_TOKEN_CHARS = 4096
MAX_CLIENT_NAME = 128
LEGACY_PREFIX = "fl1"
_DECODE_OPTIONS: Any = {
    # time claims are checked below against the caller's clock (tests, the interceptor's)
    "verify_exp": False, "verify_nbf": False, "verify_iat": False,
    "require": ["sub", "exp"], "enforce_minimum_key_length": True,
}


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def check_secret(secret: bytes) -> None:
    """``ConfigError`` unless ``secret`` is long enough to sign HS256 tokens."""
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"the token secret must be at least {MIN_SECRET_BYTES} bytes (RFC 7518 "
                          f"for HS256), got {len(secret)}; make one with "
                          "'head -c 32 /dev/urandom | base64'")


def _check_claims_in(client: str, ttl_s: float) -> None:
    if not client or len(client) > MAX_CLIENT_NAME:
        raise ConfigError(f"client name must be 1 to {MAX_CLIENT_NAME} characters")
    if not ttl_s > 0:
        raise ConfigError(f"ttl_s must be > 0, got {ttl_s}")


def issue_token(key: bytes, client: str, ttl_s: float, now: float | None = None, *,
                run: str = "", algorithm: str = "HS256", key_id: str = "") -> str:
    """A JWT for ``client`` valid for ``ttl_s`` seconds from ``now`` (default: the time).

    ``key``: the HMAC secret for ``HS256``, a PEM private key for ``ES256`` / ``RS256``.
    ``run``: the one run the token is good for (empty: any run). ``key_id``: the ``kid``
    header, naming the key in the coordinator's JWKS file.
    """
    _check_claims_in(client, ttl_s)
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if algorithm == "HS256":
        check_secret(key)
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {"sub": client, "iat": issued,
                              "exp": issued + int(max(1, round(ttl_s)))}
    if run:
        claims["run"] = run
    headers = {"kid": key_id} if key_id else None
    import jwt  # PyJWT loads the cryptography package: only where a token is made or read

    try:
        return jwt.encode(claims, key, algorithm=algorithm, headers=headers)
    except (jwt.PyJWTError, ValueError, TypeError) as exc:
        raise ConfigError(f"cannot sign an {algorithm} token with this key: {exc}") from None


def issue_legacy_token(secret: bytes, client: str, ttl_s: float,
                       now: float | None = None) -> str:
    """A deprecated ``fl1`` token (kept to test the migration; mint JWTs with ``issue_token``)."""
    check_secret(secret)
    _check_claims_in(client, ttl_s)
    issued = int(time.time() if now is None else now)
    claims = {"sub": client, "iat": issued, "exp": issued + int(max(1, round(ttl_s)))}
    payload = _b64encode(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
    signed = f"{LEGACY_PREFIX}.{payload}"
    return f"{signed}.{_b64encode(_legacy_mac(secret, signed))}"


def _legacy_mac(secret: bytes, signed: str) -> bytes:
    return hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest()


@dataclass(frozen=True)
class TokenVerifier:
    """Checks tokens for one coordinator; ``verify`` answers the client name or raises.

    ``keys``: for ``HS256`` one entry (the secret); for ``ES256`` / ``RS256`` the public keys by
    ``kid`` (``""``: the key used when a token names none). ``run_name``: the coordinator's
    run, which a token's ``run`` claim must match; ``require_run`` refuses tokens without one.
    ``legacy_secret``: accept deprecated ``fl1`` tokens signed with it (``None``: refuse them).
    """

    algorithm: str
    keys: Mapping[str, Any]
    run_name: str = ""
    require_run: bool = False
    issuer: str = ""
    audience: str = ""
    legacy_secret: bytes | None = None
    _warned: set[str] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def hs256(cls, secret: bytes, run_name: str = "", **options: Any) -> TokenVerifier:
        """A verifier of HS256 JWTs (and, for one release, ``fl1`` tokens) under ``secret``."""
        check_secret(secret)
        return cls("HS256", {"": secret}, run_name, legacy_secret=secret, **options)

    def verify(self, token: str, now: float | None = None) -> str:
        """The client name ``token`` was issued to; ``Unauthenticated`` if not valid now."""
        now = time.time() if now is None else now
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated("malformed token")
        if token.startswith(f"{LEGACY_PREFIX}."):
            return self._verify_legacy(token, now)
        claims = self._decode(token)
        return self._check_claims(claims, now)

    def _decode(self, token: str) -> dict[str, Any]:
        import jwt  # see issue_token

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("malformed token") from None
        alg = header.get("alg")
        if alg != self.algorithm:  # alg "none", and HS256 against a public key (key confusion)
            raise Unauthenticated(f"token algorithm {str(alg)[:16]!r} is not accepted here "
                                  f"(this coordinator takes {self.algorithm})")
        key = self._key_for(header.get("kid"))
        try:
            return jwt.decode(token, key, algorithms=[self.algorithm], options=_DECODE_OPTIONS,
                              issuer=self.issuer or None, audience=self.audience or None)
        except jwt.InvalidSignatureError:
            raise Unauthenticated("token signature is not valid") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(f"token lacks the {exc.claim!r} claim") from None
        except (jwt.InvalidAudienceError, jwt.InvalidIssuerError) as exc:
            raise Unauthenticated(f"token is not for this coordinator: {exc}") from None
        except jwt.PyJWTError:
            raise Unauthenticated("malformed token") from None

    def _key_for(self, kid: object) -> Any:
        if isinstance(kid, str) and kid in self.keys:
            return self.keys[kid]
        if kid is None and len(self.keys) == 1:
            return next(iter(self.keys.values()))
        raise Unauthenticated("token names no key this coordinator knows (kid)")

    def _check_claims(self, claims: Mapping[str, Any], now: float) -> str:
        name, expires = claims.get("sub"), claims.get("exp")
        if not isinstance(name, str) or not name or len(name) > MAX_CLIENT_NAME:
            raise Unauthenticated("malformed token: 'sub' must name the client")
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            raise Unauthenticated("malformed token: 'exp' must be a number")
        if now >= expires:
            raise Unauthenticated("token expired; ask for a new one")
        not_before = claims.get("nbf")
        if isinstance(not_before, int | float) and now < not_before:
            raise Unauthenticated("token is not valid yet (nbf)")
        run = claims.get("run")
        if run is None and self.require_run:
            raise Unauthenticated("token names no run ('run' claim), and this coordinator "
                                  "requires one")
        if run is not None and run != self.run_name:
            raise Unauthenticated(f"token is for another run, not {self.run_name!r}")
        return name

    def _verify_legacy(self, token: str, now: float) -> str:
        if self.legacy_secret is None:
            raise Unauthenticated("fl1 tokens are not accepted here; ask for a JWT")
        parts = token.split(".")
        if len(parts) != 3:
            raise Unauthenticated("malformed token")
        try:
            signature = _b64decode(parts[2])
        except (binascii.Error, ValueError):
            raise Unauthenticated("malformed token") from None
        if not hmac.compare_digest(signature, _legacy_mac(self.legacy_secret,
                                                          f"{parts[0]}.{parts[1]}")):
            raise Unauthenticated("token signature is not valid")
        try:
            claims = json.loads(_b64decode(parts[1]))
        except (binascii.Error, ValueError):
            raise Unauthenticated("malformed token") from None
        if not isinstance(claims, dict) or not isinstance(claims.get("exp"), int):
            raise Unauthenticated("malformed token")
        name = self._check_claims(claims, now)
        self._deprecated(name)
        return name

    def _deprecated(self, name: str) -> None:
        advice = ("fl1 tokens are deprecated and will be refused in the next release: issue "
                  "JWTs ('fedlink token issue'), or set [coordinator.auth] legacy_tokens = false "
                  "once every client has one")
        warnings.warn(advice, DeprecationWarning, stacklevel=4)
        if len(self._warned) < 64 and name not in self._warned:  # a line per client, bounded
            self._warned.add(name)
            log.warning("client %r authenticated with a deprecated fl1 token; %s", name[:64],
                        advice)


def verify_token(secret: bytes, token: str, now: float | None = None, run_name: str = "") -> str:
    """The client name of an HS256 (or legacy ``fl1``) ``token`` under ``secret``."""
    return TokenVerifier.hs256(secret, run_name).verify(token, now)


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
    check_secret(secret)
    return secret


def load_public_keys(algorithm: str, public_key_file: str = "",
                     jwks_file: str = "") -> dict[str, Any]:
    """The verification keys of an ``ES256`` / ``RS256`` configuration, by ``kid``.

    A PEM file gives one key (``kid`` ``""``); a JWKS file gives every key of ``algorithm``
    (keys of other types, symmetric ones included, are left out). ``ConfigError`` naming the
    key when a file is missing, unreadable or holds no usable key, or when the ``cryptography``
    package (which PyJWT needs for these algorithms) is not installed.
    """
    import jwt  # see issue_token
    from jwt.algorithms import has_crypto

    if not has_crypto:
        raise ConfigError(f"coordinator.auth.algorithm = {algorithm!r} needs the cryptography "
                          "package: pip install 'fedlink[jwt]'")
    verifier = jwt.get_algorithm_by_name(algorithm)
    if public_key_file:
        pem = _read(public_key_file, "coordinator.auth.public_key_file")
        try:
            keys = {"": verifier.prepare_key(pem)}
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise ConfigError(f"coordinator.auth.public_key_file {public_key_file}: not an "
                              f"{algorithm} public key ({exc})") from None
        where = f"coordinator.auth.public_key_file {public_key_file}"
    else:
        text = _read(jwks_file, "coordinator.auth.jwks_file")
        try:
            jwks = jwt.PyJWKSet.from_json(text.decode("utf-8"))
        except (jwt.PyJWTError, ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"coordinator.auth.jwks_file {jwks_file}: not a JWKS "
                              f"({exc})") from None
        keys = {key.key_id or "": key.key for key in jwks.keys
                if key.algorithm_name == algorithm}
        where = f"coordinator.auth.jwks_file {jwks_file}"
        if not keys:
            raise ConfigError(f"{where} holds no {algorithm} key")
    for key in keys.values():
        weak = verifier.check_key_length(key)  # a 1024-bit RSA key, say: refused at start-up
        if weak:
            raise ConfigError(f"{where}: {weak}")
    return keys


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
