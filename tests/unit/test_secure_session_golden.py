"""The recorded secure session (``protos/testdata/session_secure.json``) is what the coordinator
says today, and an implementer can check every step of it without fedlink: the roster is the
advertised keys, each share reaches the neighbour it was sealed for, and the masked vectors,
less the masks rebuilt from the unmask answers, decode to the model the group flushed."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("cryptography")

from secagg_by_hand import agree, lagrange_at_zero, prg

TESTDATA = Path(__file__).resolve().parents[2] / "protos" / "testdata"
REGENERATE = "python -m fedlink.conformance.golden protos/testdata"
DROPPED = 3
"""The member that shared its keys and then vanished."""


def recorded() -> dict[str, Any]:
    result: dict[str, Any] = json.loads((TESTDATA / "session_secure.json").read_text())
    return result


def calls(session: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [m for m in session["messages"] if m["call"] == name]


def settings(session: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = calls(session, "Join")[0]["reply"]["config"]["secure"]
    return result


def element(b64: str) -> int:
    return int.from_bytes(base64.b64decode(b64), "little")


def unpacked(data: bytes, count: int, bits: int) -> list[int]:
    """Values packed ``bits`` apiece, least significant bit first (``docs/protocol.md``)."""
    stream = int.from_bytes(data, "little")
    return [(stream >> (i * bits)) & ((1 << bits) - 1) for i in range(count)]


def model(task: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(task["modelData"]), "<f4").astype(np.float64)


def test_the_secure_session_is_what_the_coordinator_says_today() -> None:
    from fedlink.conformance.secure_session import record_secure_session

    fresh = json.loads(json.dumps(record_secure_session()))
    assert recorded() == fresh, f"protocol changed: regenerate with {REGENERATE}"


def test_the_roster_is_the_advertised_keys_and_each_share_reaches_its_neighbour() -> None:
    session = recorded()
    adverts = calls(session, "SecureAdvertise")
    keys = [(a["request"]["cipherPublic"], a["request"]["maskPublic"]) for a in adverts]
    for n, advert in enumerate(adverts):
        reply = advert["reply"]
        assert reply.get("index", 0) == n
        assert [(m["cipherPublic"], m["maskPublic"]) for m in reply["members"]] == keys
    shares = calls(session, "SecureShare")
    sent = {(s.get("sender", 0), s.get("receiver", 0), s["ciphertext"])
            for n, c in enumerate(shares) for s in c["request"]["shares"]
            if s.get("sender", 0) == n}
    assert len(sent) == sum(len(c["request"]["shares"]) for c in shares)  # each its own
    for n, c in enumerate(shares):
        heard = {(s.get("sender", 0), s.get("receiver", 0), s["ciphertext"])
                 for s in c["reply"]["shares"]}
        assert heard == {s for s in sent if s[1] == n}


def test_the_masked_vectors_less_the_rebuilt_masks_decode_to_the_flushed_model() -> None:
    session = recorded()
    secure = settings(session)
    bits, clip = secure["modulusBits"], secure["clip"]
    step = 2 * clip / (1 << secure["quantizationBits"])
    masked = calls(session, "SecureMasked")
    heard = {json.dumps(m["reply"], sort_keys=True) for m in masked}
    assert heard == {json.dumps({"survivors": [0, 1, 2], "dropped": [3]}, sort_keys=True)}
    size = masked[0]["request"]["numValues"]
    m = 1 << bits
    total = np.zeros(size, np.int64)
    for call in masked:
        total += unpacked(base64.b64decode(call["request"]["values"]), size, bits)
    answers = [c["request"] for c in calls(session, "SecureUnmask")]
    for survivor in (0, 1, 2):  # each survivor's self mask, from its seed's shares
        seed = lagrange_at_zero([(s["x"], element(s["y"])) for a in answers for s in a["seedShares"]
                        if s.get("owner", 0) == survivor])
        total -= prg(seed.to_bytes(32, "little"), size)
    key = lagrange_at_zero([(s["x"], element(s["y"])) for a in answers for s in a["keyShares"]
                   if s.get("owner", 0) == DROPPED])
    round_id = calls(session, "SecureAdvertise")[0]["reply"]["roundId"]
    adverts = [c["request"] for c in calls(session, "SecureAdvertise")]
    for survivor in (0, 1, 2):  # the dropped member's pairwise masks, which nobody cancels
        public = base64.b64decode(adverts[survivor]["maskPublic"])
        pair = np.array(prg(agree(key, public, f"fedlink-secagg/mask/{round_id}"), size))
        total -= pair if survivor < DROPPED else -pair  # what the survivor added for it
    decoded = (total % m) * step - len(masked) * clip
    mean = decoded[:-1] / decoded[-1]
    assert decoded[-1] == pytest.approx(3.0, abs=3 * step)  # three fresh updates, weight 1
    updates = np.mean([session["updates"][f"CLIENT_{i}"] for i in range(3)], axis=0)
    assert np.all(np.abs(mean - updates) <= step)
    before, after = (model(c["reply"]["task"]) for c in calls(session, "GetTask")[::4])
    assert calls(session, "GetTask")[4]["reply"]["task"]["modelVersion"] == "1"
    assert np.allclose(after, before + mean, rtol=1e-7, atol=1e-7)
    assert [c["reply"]["flushedVersion"] for c in calls(session, "SecureUnmask")] == ["1"] * 3
