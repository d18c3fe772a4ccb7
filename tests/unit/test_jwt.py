"""Per-client tokens as JWTs: HS256 under the secret, ES256 / RS256 under a public key or JWKS
file, the claims the coordinator checks, the deprecated ``fl1`` tokens, and the classic attacks
on JWT verifiers (``alg: none``, key confusion)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm

from fedlink.cli import main as fedlink_main
from fedlink.coordinator.auth import load_verifier
from fedlink.coordinator.config import AuthConfig
from fedlink.coordinator.tokens import (
    TokenVerifier,
    issue_legacy_token,
    issue_token,
    verify_token,
)
from fedlink.errors import ConfigError, Unauthenticated

SECRET = b"0123456789abcdef0123456789abcdef-jwt"
OTHER = b"another-secret-0123456789abcdef-0123"
NOW = 1_800_000_000.0
RUN = "digits-2026"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: dict[str, Any], claims: dict[str, Any], key: bytes | None) -> str:
    """A compact JWS built without PyJWT, HMAC-SHA256 under ``key`` (``None``: unsigned)."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest() if key else b""
    return f"{signing_input}.{b64(signature)}"


def claims(**extra: Any) -> dict[str, Any]:
    return {"sub": "alice", "iat": int(NOW), "exp": int(NOW) + 60, **extra}


def pem_private(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def pem_public(key: Any) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def jwks_file(tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey) -> Path:
    """A JWKS with the EC key as ``k1``, an unrelated EC key ``k2`` and a symmetric key."""
    first = ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True) | {"kid": "k1"}
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    second = ECAlgorithm.to_jwk(other, as_dict=True) | {"kid": "k2"}
    symmetric = {"kty": "oct", "kid": "s1", "k": b64(SECRET)}
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [first, second, symmetric]}))
    return path


# -- HS256 -------------------------------------------------------------------------------------


def test_hs256_round_trip_names_the_client_and_is_a_standard_jwt() -> None:
    token = issue_token(SECRET, "alice", 60, now=NOW, run=RUN)
    assert verify_token(SECRET, token, now=NOW + 59, run_name=RUN) == "alice"
    decoded = jwt.decode(token, SECRET, algorithms=["HS256"],
                         options={"verify_exp": False, "verify_iat": False})
    assert decoded == claims(run=RUN)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


def test_hs256_expired_token_is_refused() -> None:
    token = issue_token(SECRET, "alice", 60, now=NOW)
    with pytest.raises(Unauthenticated, match="expired"):
        verify_token(SECRET, token, now=NOW + 60)


def test_a_token_for_another_run_is_refused() -> None:
    token = issue_token(SECRET, "alice", 60, now=NOW, run="another-run")
    with pytest.raises(Unauthenticated, match="another run"):
        verify_token(SECRET, token, now=NOW, run_name=RUN)
    anyrun = issue_token(SECRET, "alice", 60, now=NOW)
    assert verify_token(SECRET, anyrun, now=NOW, run_name=RUN) == "alice"
    strict = TokenVerifier.hs256(SECRET, RUN, require_run=True)
    with pytest.raises(Unauthenticated, match="names no run"):
        strict.verify(anyrun, now=NOW)


def test_hs256_bad_signature_is_refused() -> None:
    with pytest.raises(Unauthenticated, match="signature"):
        verify_token(SECRET, issue_token(OTHER, "alice", 60, now=NOW), now=NOW)
    header, _, signature = issue_token(SECRET, "alice", 60, now=NOW).split(".")
    mallory = b64(json.dumps(claims(sub="mallory")).encode())
    with pytest.raises(Unauthenticated, match="signature"):
        verify_token(SECRET, f"{header}.{mallory}.{signature}", now=NOW)


def test_required_claims_and_nbf_are_checked() -> None:
    no_exp = hand_made({"alg": "HS256", "typ": "JWT"}, {"sub": "alice"}, SECRET)
    with pytest.raises(Unauthenticated, match="'exp'"):
        verify_token(SECRET, no_exp, now=NOW)
    no_sub = hand_made({"alg": "HS256"}, {"exp": int(NOW) + 60}, SECRET)
    with pytest.raises(Unauthenticated, match="'sub'"):
        verify_token(SECRET, no_sub, now=NOW)
    later = hand_made({"alg": "HS256"}, claims(nbf=int(NOW) + 30), SECRET)
    with pytest.raises(Unauthenticated, match="not valid yet"):
        verify_token(SECRET, later, now=NOW)


def test_issuer_and_audience_must_match_when_configured() -> None:
    verifier = TokenVerifier.hs256(SECRET, issuer="https://idp.example", audience="fedlink")
    good = jwt.encode(claims(iss="https://idp.example", aud="fedlink"), SECRET, "HS256")
    assert verifier.verify(good, now=NOW) == "alice"
    for wrong in (claims(iss="https://evil.example", aud="fedlink"),
                  claims(iss="https://idp.example", aud="other"), claims()):
        with pytest.raises(Unauthenticated):
            verifier.verify(jwt.encode(wrong, SECRET, "HS256"), now=NOW)


def test_secrets_shorter_than_the_hash_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        issue_token(b"x" * 31, "alice", 60)
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        TokenVerifier.hs256(b"x" * 16)


# -- the classic attacks -----------------------------------------------------------------------


def test_alg_none_is_refused() -> None:
    unsigned = hand_made({"alg": "none", "typ": "JWT"}, claims(), None)
    with pytest.raises(Unauthenticated, match="'none' is not accepted"):
        verify_token(SECRET, unsigned, now=NOW)
    lowercase = hand_made({"alg": "None"}, claims(), None)
    with pytest.raises(Unauthenticated, match="not accepted"):
        verify_token(SECRET, lowercase, now=NOW)


def test_key_confusion_hs256_signed_with_the_public_key_is_refused(
        tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey, rsa_key: rsa.RSAPrivateKey) -> None:
    for algorithm, key in (("ES256", ec_key), ("RS256", rsa_key)):
        public = tmp_path / f"{algorithm}.pem"
        public.write_bytes(pem_public(key))
        verifier = load_verifier(AuthConfig(algorithm=algorithm, public_key_file=str(public)))
        forged = hand_made({"alg": "HS256", "typ": "JWT"}, claims(), pem_public(key))
        with pytest.raises(Unauthenticated, match="'HS256' is not accepted"):
            verifier.verify(forged, now=NOW)
        honest = issue_token(pem_private(key), "alice", 60, now=NOW, algorithm=algorithm)
        assert verifier.verify(honest, now=NOW) == "alice"


# -- ES256 / RS256 against an operator's keys --------------------------------------------------


def test_es256_with_a_jwks_file(jwks_file: Path, ec_key: ec.EllipticCurvePrivateKey) -> None:
    verifier = load_verifier(AuthConfig(algorithm="ES256", jwks_file=str(jwks_file)), RUN)
    assert sorted(verifier.keys) == ["k1", "k2"]  # the symmetric key is left out
    private = pem_private(ec_key)
    token = issue_token(private, "edge-7", 60, now=NOW, run=RUN, algorithm="ES256",
                        key_id="k1")
    assert verifier.verify(token, now=NOW) == "edge-7"
    with pytest.raises(Unauthenticated, match="signature"):  # k2 did not sign it
        verifier.verify(issue_token(private, "edge-7", 60, now=NOW, algorithm="ES256",
                                    key_id="k2"), now=NOW)
    with pytest.raises(Unauthenticated, match="kid"):
        verifier.verify(issue_token(private, "edge-7", 60, now=NOW, algorithm="ES256",
                                    key_id="k9"), now=NOW)
    with pytest.raises(Unauthenticated, match="kid"):  # two keys: a token must name one
        verifier.verify(issue_token(private, "edge-7", 60, now=NOW, algorithm="ES256"),
                        now=NOW)
    with pytest.raises(Unauthenticated, match="expired"):
        verifier.verify(token, now=NOW + 60)
    # a token signed HS256 with the JWKS's own symmetric key is still refused
    with pytest.raises(Unauthenticated, match="not accepted"):
        verifier.verify(jwt.encode(claims(), SECRET, "HS256", headers={"kid": "s1"}), now=NOW)


def test_rs256_with_a_public_key_file(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    public = tmp_path / "idp.pem"
    public.write_bytes(pem_public(rsa_key))
    verifier = load_verifier(AuthConfig(algorithm="RS256", public_key_file=str(public)))
    token = issue_token(pem_private(rsa_key), "edge-1", 60, now=NOW, algorithm="RS256")
    assert verifier.verify(token, now=NOW) == "edge-1"
    imposter = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(Unauthenticated, match="signature"):
        verifier.verify(issue_token(pem_private(imposter), "edge-1", 60, now=NOW,
                                    algorithm="RS256"), now=NOW)


def test_auth_config_refuses_keys_that_cannot_take_effect(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"coordinator\.auth\.public_key_file"):
        AuthConfig(algorithm="ES256")
    with pytest.raises(ConfigError, match=r"coordinator\.auth\.public_key_file"):
        AuthConfig(secret_env="X", jwks_file="keys.json")
    with pytest.raises(ConfigError, match=r"coordinator\.auth\.jwks_file"):
        AuthConfig(algorithm="RS256", public_key_file="a.pem", jwks_file="b.json")
    with pytest.raises(ConfigError, match=r"coordinator\.auth\.algorithm"):
        AuthConfig(algorithm="HS512", secret_env="X")
    for alone in ({"audience": "fedlink"}, {"require_run": True}, {"legacy_tokens": False}):
        with pytest.raises(ConfigError, match=r"coordinator\.auth\.secret_file"):
            AuthConfig(**alone)  # type: ignore[arg-type]
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"keys": [{"kty": "oct", "k": b64(SECRET)}]}))
    with pytest.raises(ConfigError, match="no ES256 key"):
        load_verifier(AuthConfig(algorithm="ES256", jwks_file=str(empty)))
    weak = tmp_path / "weak.pem"
    weak.write_bytes(pem_public(rsa.generate_private_key(public_exponent=65537, key_size=1024)))
    with pytest.raises(ConfigError, match="1024"):
        load_verifier(AuthConfig(algorithm="RS256", public_key_file=str(weak)))
    with pytest.raises(ConfigError, match=r"missing\.pem"):
        load_verifier(AuthConfig(algorithm="ES256",
                                 public_key_file=str(tmp_path / "missing.pem")))


# -- fl1, for one release ----------------------------------------------------------------------


def test_legacy_fl1_tokens_are_accepted_with_a_deprecation_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    legacy = issue_legacy_token(SECRET, "old-device", 60, now=NOW)
    assert legacy.startswith("fl1.")
    verifier = TokenVerifier.hs256(SECRET)
    with caplog.at_level(logging.WARNING), pytest.warns(DeprecationWarning, match="fl1"):
        assert verifier.verify(legacy, now=NOW) == "old-device"
    assert "deprecated fl1 token" in caplog.text and "old-device" in caplog.text
    with pytest.raises(Unauthenticated, match="expired"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        verifier.verify(legacy, now=NOW + 60)
    forged = issue_legacy_token(OTHER, "old-device", 60, now=NOW)
    with pytest.raises(Unauthenticated, match="signature"):
        verifier.verify(forged, now=NOW)


def test_legacy_tokens_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDLINK_TEST_SECRET", SECRET.decode())
    verifier = load_verifier(AuthConfig(secret_env="FEDLINK_TEST_SECRET", legacy_tokens=False))
    with pytest.raises(Unauthenticated, match="fl1 tokens are not accepted"):
        verifier.verify(issue_legacy_token(SECRET, "old-device", 60, now=NOW), now=NOW)
    assert verifier.verify(issue_token(SECRET, "new-device", 60, now=NOW), now=NOW) == (
        "new-device")


# -- fedlink token issue -----------------------------------------------------------------------


def test_cli_mints_es256_tokens_for_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         ec_key: ec.EllipticCurvePrivateKey) -> None:
    private, public = tmp_path / "signing.pem", tmp_path / "public.pem"
    private.write_bytes(pem_private(ec_key))
    public.write_bytes(pem_public(ec_key))
    assert fedlink_main(["token", "issue", "--client", "edge-3", "--run", RUN, "--ttl-s", "60",
                         "--private-key", str(private)]) == 0
    token = capsys.readouterr().out.strip()
    verifier = load_verifier(AuthConfig(algorithm="ES256", public_key_file=str(public)), RUN)
    assert verifier.verify(token) == "edge-3"
    elsewhere = load_verifier(AuthConfig(algorithm="ES256", public_key_file=str(public)), "x")
    with pytest.raises(Unauthenticated, match="another run"):
        elsewhere.verify(token)
