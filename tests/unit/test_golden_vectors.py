"""The golden vectors in ``protos/testdata/`` hold for fedlink, so they cannot drift.

Each file is checked twice: with fedlink (its codecs decode the golden bytes to the golden
values, and encode the golden input to the golden bytes wherever the format is byte-exact),
and with nothing but ``hashlib``/``zlib``/``base64``, as an implementer in another language
would check them. The recorded sessions must equal a fresh recording.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedlink.compress import CODECS, decoder_for, get_codec
from fedlink.compress.delta import apply_delta
from fedlink.conformance.golden import SEED, header_json
from fedlink.conformance.session import record_sessions
from fedlink.wire import pack

TESTDATA = Path(__file__).resolve().parents[2] / "protos" / "testdata"
REGENERATE = "python -m fedlink.conformance.golden protos/testdata"


def load(name: str) -> Any:
    return json.loads((TESTDATA / name).read_text())


def floats(bits: list[str]) -> np.ndarray:
    return np.frombuffer(bytes.fromhex("".join(bits)), dtype="<f4")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


CODEC_VECTORS = load("codecs.json")["vectors"]


def test_every_codec_has_a_golden_vector() -> None:
    assert [v["codec"] for v in CODEC_VECTORS] == list(CODECS.names()), \
        f"codecs changed: regenerate with {REGENERATE}"


@pytest.mark.parametrize("vector", CODEC_VECTORS, ids=[v["codec"] for v in CODEC_VECTORS])
def test_codec_vector_holds_byte_for_byte(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["data_hex"])
    header = vector["header"]
    decoded = decoder_for(vector["codec"]).decode(data, header["codecParams"],
                                                   len(vector["input_bits"]))
    # what any implementation checks: sizes and both checksums, by hashlib alone
    assert int(header["numBytes"]) == len(data)
    assert header["checksum"] == sha256(data)
    assert header["valuesChecksum"] == sha256(floats(vector["decoded_bits"]).tobytes())
    # fedlink decodes the golden bytes to the golden values, bit for bit
    assert decoded.astype("<f4").tobytes() == floats(vector["decoded_bits"]).tobytes()
    # and, where the format is byte-exact, encodes the golden input to the golden bytes
    ours = pack(floats(vector["input_bits"]), get_codec(vector["codec"], **vector["options"]),
                np.random.default_rng(SEED))
    if vector["zlib"]:
        assert ours.header.values_checksum == header["valuesChecksum"]
    else:
        assert ours.data == data and header_json(ours.header) == header


def test_fp32_zlib_is_byte_planes_deflated() -> None:
    vector = next(v for v in CODEC_VECTORS if v["codec"] == "fp32-zlib")
    raw = zlib.decompress(bytes.fromhex(vector["data_hex"]))
    values = np.frombuffer(raw, np.uint8).reshape(4, -1).T.copy().view("<f4").reshape(-1)
    assert values.tobytes() == floats(vector["input_bits"]).tobytes()


def test_delta_vector_rebuilds_the_new_model_and_verifies_by_values_checksum() -> None:
    delta = load("delta.json")
    old, new = floats(delta["old_bits"]), floats(delta["new_bits"])
    data = bytes.fromhex(delta["data_hex"])
    assert zlib.decompress(data).hex() == delta["xor_hex"]
    rebuilt = (old.view("<u4") ^ np.frombuffer(zlib.decompress(data), "<u4")).view("<f4")
    assert rebuilt.tobytes() == new.tobytes()
    assert apply_delta(old, data).tobytes() == new.tobytes()
    assert delta["delta_header"]["checksum"] == sha256(data)
    assert delta["model_header"]["valuesChecksum"] == sha256(rebuilt.tobytes())
    assert delta["delta_header"]["valuesChecksum"] == delta["model_header"]["valuesChecksum"]


@pytest.mark.parametrize("kind", ["inline", "streamed"])
def test_recorded_sessions_are_what_the_coordinator_says_today(kind: str) -> None:
    recorded = load(f"session_{kind}.json")["messages"]
    assert recorded == record_sessions()[kind], f"protocol changed: regenerate with {REGENERATE}"


def test_the_inline_session_verifies_without_fedlink() -> None:
    messages = load("session_inline.json")["messages"]
    task = next(m["reply"]["task"] for m in messages if m["call"] == "GetTask"
                and "task" in m["reply"])
    model = base64.b64decode(task["modelData"])
    assert sha256(model) == task["model"]["checksum"] == task["model"]["valuesChecksum"]
    commit = next(m for m in messages if m["call"] == "Commit")
    update = base64.b64decode(commit["request"]["updateData"])
    assert sha256(update) == commit["request"]["update"]["checksum"]
    assert commit["reply"]["flushedVersion"] == "1"


def test_the_streamed_session_reassembles_from_its_chunks() -> None:
    messages = {m["call"]: m for m in load("session_streamed.json")["messages"]}
    chunks = messages["Download"]["reply"]
    model = b"".join(base64.b64decode(c["data"]) for c in chunks)
    header = next(m["reply"]["task"]["model"] for m in load("session_streamed.json")["messages"]
                  if m["call"] == "GetTask" and "task" in m["reply"])
    assert sha256(model) == header["checksum"] and len(chunks) == 3
    upload = messages["Upload"]["request"]
    assert [int(c.get("offset", "0")) for c in upload] == [0, 16, 32]
    assert messages["UploadStatus"]["reply"]["committedOffset"] == "48"
