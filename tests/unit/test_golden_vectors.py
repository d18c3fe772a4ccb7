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
    # (codecs.json is the 1.0 file: its randk vectors use numpy's choice, no index_rule sent)
    assert "index_rule" not in header["codecParams"]
    rule = {"index_rule": "numpy"} if vector["codec"].startswith("randk") else {}
    ours = pack(floats(vector["input_bits"]),
                get_codec(vector["codec"], **vector["options"], **rule),
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


# -- protocol 1.1 ---------------------------------------------------------------------------

V11 = load("codecs_1_1.json")
MASK = (1 << 64) - 1


def splitmix64(state: int) -> int:
    """The SplitMix64 output for ``state`` (already advanced), with Python ints only."""
    z = state & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def randk_indices(seed: int, n: int, k: int) -> list[int]:
    """The spec's rule, written from docs/protocol.md alone."""
    keys = [(splitmix64(seed + (i + 1) * 0x9E3779B97F4A7C15), i) for i in range(n)]
    return sorted(i for _, i in sorted(keys)[:k])


def holds(vector: dict[str, Any]) -> None:
    """Decode to the golden values, and re-encode to the golden bytes."""
    data = bytes.fromhex(vector["data_hex"])
    header = vector["header"]
    n = len(vector["input_bits"])
    decoded = decoder_for(vector["codec"]).decode(data, header["codecParams"], n)
    assert header["checksum"] == sha256(data) and int(header["numBytes"]) == len(data)
    assert decoded.astype("<f4").tobytes() == floats(vector["decoded_bits"]).tobytes()
    assert header["valuesChecksum"] == sha256(floats(vector["decoded_bits"]).tobytes())
    ours = pack(floats(vector["input_bits"]), get_codec(vector["codec"], **vector["options"]),
                np.random.default_rng(SEED))
    assert ours.data == data and header_json(ours.header) == header


def test_splitmix64_matches_the_reference_outputs() -> None:
    # the first outputs of SplitMix64 seeded with 0, as published with the algorithm
    assert V11["splitmix64_seed0_keys"][:3] == [
        "e220a8397b1dcdaf", "6e789e6aa1b965f4", "06c45d188009454f"]
    assert V11["splitmix64_seed0_keys"] == [
        f"{splitmix64((i + 1) * 0x9E3779B97F4A7C15):016x}" for i in range(4)]


@pytest.mark.parametrize("table", V11["randk_indices"],
                         ids=[f"n{t['n']}k{t['k']}" for t in V11["randk_indices"]])
def test_randk_index_tables_follow_the_splitmix64_rule(table: dict[str, Any]) -> None:
    seed, n, k = int(table["seed"]), table["n"], table["k"]
    assert table["indices"] == randk_indices(seed, n, k)
    from fedlink.compress.sparse import splitmix_indices
    assert splitmix_indices(seed, n, k).tolist() == table["indices"]


def test_the_index_tables_cover_large_vectors_and_the_whole_seed_range() -> None:
    tables = V11["randk_indices"]
    assert max(t["n"] for t in tables) > 10_000
    assert {int(t["seed"]) for t in tables} >= {0, 2**63 - 1}


@pytest.mark.parametrize("vector", V11["randk"], ids=[v["codec"] for v in V11["randk"]])
def test_randk_1_1_vectors_hold_and_name_their_rule(vector: dict[str, Any]) -> None:
    holds(vector)
    params = vector["header"]["codecParams"]
    assert params["index_rule"] == "splitmix64"
    kept = randk_indices(int(params["seed"]), len(vector["input_bits"]),
                         int.from_bytes(bytes.fromhex(vector["data_hex"])[:4], "little"))
    decoded = floats(vector["decoded_bits"])
    assert all(decoded[i] == 0 for i in range(decoded.size) if i not in kept)


def test_a_1_0_randk_update_still_decodes_by_numpys_choice() -> None:
    vector = next(v for v in CODEC_VECTORS if v["codec"] == "randk")
    data = bytes.fromhex(vector["data_hex"])
    params = vector["header"]["codecParams"]
    decoded = decoder_for("randk").decode(data, params, 12)
    assert decoded.tobytes() == floats(vector["decoded_bits"]).tobytes()
    # read by the 1.1 rule, the same bytes land elsewhere: the flag is what tells them apart
    relabelled = decoder_for("randk").decode(data, {**params, "index_rule": "splitmix64"}, 12)
    assert relabelled.tobytes() != decoded.tobytes()


@pytest.mark.parametrize("vector", V11["topk_ties"], ids=["q", "h", "fp16"])
def test_topk_keeps_the_lowest_indices_among_equal_magnitudes(vector: dict[str, Any]) -> None:
    holds(vector)
    values = floats(vector["input_bits"])
    k = int.from_bytes(bytes.fromhex(vector["data_hex"])[1:5], "little")
    order = sorted(range(values.size), key=lambda i: (-abs(float(values[i])), i))
    kept = np.flatnonzero(floats(vector["decoded_bits"]) != 0).tolist()
    assert kept == sorted(order[:k])


@pytest.mark.parametrize("vector", V11["qsgd_edges"], ids=[v["case"] for v in V11["qsgd_edges"]])
def test_qsgd_decodes_as_f32_of_code_minus_s_times_f32_c_over_s(vector: dict[str, Any]) -> None:
    holds(vector)
    data = bytes.fromhex(vector["data_hex"])
    bits = int(vector["header"]["codecParams"]["bits"])
    s = (1 << (bits - 1)) - 1
    c = np.frombuffer(data[:4], "<f4")[0]
    stream = int.from_bytes(data[4:], "big")
    total = (len(data) - 4) * 8
    n = len(vector["input_bits"])
    codes = [(stream >> (total - bits * (j + 1))) & ((1 << bits) - 1) for j in range(n)]
    step = np.float32(c / np.float32(s))
    expected = [np.float32(np.float32(code - s) * step) for code in codes]
    assert np.array(expected, "<f4").tobytes() == floats(vector["decoded_bits"]).tobytes()


def test_the_qsgd_edges_are_ones_where_the_rounding_shows() -> None:
    differ = 0
    for vector in V11["qsgd_edges"]:
        data = bytes.fromhex(vector["data_hex"])
        s = (1 << (int(vector["header"]["codecParams"]["bits"]) - 1)) - 1
        c = float(np.frombuffer(data[:4], "<f4")[0])
        for value in floats(vector["decoded_bits"]):
            code = round(float(value) / (c / s)) + s if c else s
            differ += np.float32((code - s) * c / s) != value
    assert differ > 0


@pytest.mark.parametrize("vector", V11["sign_scales"], ids=["a", "b", "c"])
def test_sign_scale_is_a_float64_mean_rounded_once(vector: dict[str, Any]) -> None:
    holds(vector)
    values = floats(vector["input_bits"]).astype(np.float64)
    scale = np.frombuffer(bytes.fromhex(vector["data_hex"])[:4], "<f4")[0]
    assert scale == np.float32(sum(abs(values)) / values.size)


def spec_kept_count(density: float, n: int) -> int:
    """docs/protocol.md section 6: ``min(n, max(1, ceil(density * n - 1e-9)))``, 0 for n = 0."""
    import math
    return min(n, max(1, math.ceil(density * n - 1e-9))) if n else 0


@pytest.mark.parametrize("density", [1e-6, 0.01, 0.07, 0.1, 0.25, 1 / 3, 0.5, 0.999, 1.0])
@pytest.mark.parametrize("n", [0, 1, 7, 12, 100, 330, 10_001])
def test_topk_and_randk_keep_the_count_the_spec_states(density: float, n: int) -> None:
    values = np.linspace(-1.0, 1.0, n, dtype=np.float32) + np.float32(0.001)
    for name in ("topk", "randk"):
        data = pack(values, get_codec(name, density=density), np.random.default_rng(SEED)).data
        k = int.from_bytes(data[1:5] if name == "topk" else data[:4], "little")
        assert k == spec_kept_count(density, n), (name, density, n)


def test_every_topk_vector_keeps_the_count_the_spec_states() -> None:
    for vector in [*V11["topk_ties"], *(v for v in CODEC_VECTORS if v["codec"].startswith("topk"))]:
        k = int.from_bytes(bytes.fromhex(vector["data_hex"])[1:5], "little")
        assert k == spec_kept_count(vector["options"]["density"], len(vector["input_bits"]))
