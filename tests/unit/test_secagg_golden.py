"""The secure-aggregation golden vectors (``protos/testdata/secagg_*.json``) hold for fedlink,
and say what they say without fedlink: each file is checked against a fresh recording and
against ``cryptography``'s primitives and plain integer arithmetic, as an implementer in
another language would check it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from secagg_by_hand import P, agree, lagrange_at_zero, prg

from fedlink.secagg import SecAggConfig, SecureClient, SecureSum
from fedlink.secagg.golden import vectors
from fedlink.secagg.packing import pack, unpack

TESTDATA = Path(__file__).resolve().parents[2] / "protos" / "testdata"
NAMES = ("secagg_keys.json", "secagg_masks.json", "secagg_encoding.json", "secagg_round.json")


def load(name: str) -> Any:
    return json.loads((TESTDATA / name).read_text())


def integer(hex_le: str) -> int:
    return int.from_bytes(bytes.fromhex(hex_le), "little")


def replayed(draws: list[int]) -> Callable[[int], int]:
    """``random_below`` that answers the recorded draws in order."""
    values = iter(draws)
    return lambda bound: next(values)


@pytest.mark.parametrize("name", NAMES)
def test_the_files_equal_a_fresh_recording(name: str) -> None:
    fresh = json.loads(json.dumps(vectors()[name]))
    assert load(name) == fresh, "regenerate with python -m fedlink.secagg.golden protos/testdata"


def test_keys_are_x25519_and_hkdf_sha256_of_purpose_and_round() -> None:
    v = load("secagg_keys.json")
    a, b = integer(v["private_a"]), integer(v["private_b"])
    assert a < P and b < P
    for private, public in ((a, v["public_a"]), (b, v["public_b"])):
        key = X25519PrivateKey.from_private_bytes(private.to_bytes(32, "little"))
        assert key.public_key().public_bytes_raw().hex() == public
    for entry in v["agreed"]:
        assert entry["info"] == f"fedlink-secagg/{entry['purpose']}/{entry['round']}"
        assert agree(a, bytes.fromhex(v["public_b"]), entry["info"]).hex() == entry["key"]
        assert agree(b, bytes.fromhex(v["public_a"]), entry["info"]).hex() == entry["key"]


def test_masks_shares_and_share_encryption() -> None:
    v = load("secagg_masks.json")
    for entry in v["prg"]:
        assert prg(bytes.fromhex(entry["seed"]), 12) == entry["words"]
    pair = v["pairwise"]
    words = prg(bytes.fromhex(pair["seed"]), len(pair["plus"]))
    m = 1 << pair["modulus_bits"]
    assert pair["plus"] == [w % m for w in words]
    assert pair["minus"] == [-w % m for w in words]
    sh = v["shamir"]
    assert int(sh["prime"]) == P
    coefficients = [integer(sh["secret"])] + [integer(c) for c in sh["coefficients"]]
    for x, y in sh["shares"].items():
        assert integer(y) == sum(c * int(x) ** k for k, c in enumerate(coefficients)) % P
    points = [(int(x), integer(y)) for x, y in sh["shares"].items()]
    assert lagrange_at_zero(points[1:]) == integer(sh["secret"])
    enc = v["share_encryption"]
    nonce = enc["sender"].to_bytes(4, "little") + enc["receiver"].to_bytes(4, "little") + \
        bytes(4)
    assert enc["nonce"] == nonce.hex()
    sealed = AESGCM(bytes.fromhex(enc["key"])).encrypt(
        nonce, bytes.fromhex(enc["plaintext"]), enc["associated_data"].encode())
    assert sealed.hex() == enc["ciphertext"]


def test_encoding_rounds_by_the_recorded_draws_and_packs_lsb_first() -> None:
    v = load("secagg_encoding.json")
    c = v["config"]
    levels, clip = 1 << c["quantization_bits"], c["clip"]
    step = 2 * clip / levels
    for x, u, e in zip(v["values"], v["draws"], v["encoded"], strict=True):
        scaled = (min(max(x, -clip), clip) + clip) / step
        assert e == min(int(np.floor(scaled)) + (u < scaled - np.floor(scaled)), levels)
    bits = c["modulus_bits"]
    stream = int.from_bytes(bytes.fromhex(v["packed"]), "little")
    assert [(stream >> (bits * i)) & ((1 << bits) - 1) for i in range(len(v["encoded"]))] == \
        v["encoded"]
    assert pack(np.array(v["encoded"], np.uint32), bits).hex() == v["packed"]


def randk_seed(run_seed: int, round_id: int) -> int:
    import hashlib

    label = f"fedlink-secagg/randk/{run_seed}/{round_id}".encode()
    return int.from_bytes(hashlib.sha256(label).digest()[:8], "little") >> 1


def randk_kept(seed: int, size: int, density: float) -> list[int]:
    """The coordinates with the smallest SplitMix64 keys of ``seed``, in order."""
    mask = (1 << 64) - 1

    def key(i: int) -> int:
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    return sorted(sorted(range(size), key=key)[:math.ceil(density * size - 1e-9)])


def rounded(scaled: float, draw: float) -> int:
    """Stochastic rounding: up when the draw falls below the fraction."""
    return math.floor(scaled) + (draw < scaled - math.floor(scaled))


def test_randk_keeps_the_smallest_splitmix64_keys_of_the_round_seed() -> None:
    r = load("secagg_encoding.json")["randk"]
    for entry in r["rounds"]:
        seed = randk_seed(entry["run_seed"], entry["round"])
        assert int(entry["seed"]) == seed
        assert entry["indices"] == randk_kept(seed, r["size"], r["density"])


def test_a_weighted_update_under_group_randk_is_w_times_its_kept_values_then_w() -> None:
    v = load("secagg_encoding.json")["weighted"]
    c = v["config"]
    levels, clip, w = 1 << c["quantization_bits"], c["clip"], v["weight"]
    assert v["indices"] == randk_kept(randk_seed(v["run_seed"], v["round"]),
                                      len(v["update"]), v["density"])
    values = [w * v["update"][i] for i in v["indices"]] + [w]
    assert len(v["encoded"]) == len(v["draws"]) == len(values)
    for x, u, e in zip(values, v["draws"], v["encoded"], strict=True):
        assert e == min(rounded((min(max(x, -clip), clip) + clip) * levels / (2 * clip), u),
                        levels)
    assert v["encoded"][-1] == round((w + clip) * levels / (2 * clip))  # the weight, exact


def test_a_ddp_update_is_clipped_rounded_within_the_bound_and_noised_by_its_share() -> None:
    v = load("secagg_encoding.json")["ddp"]
    c = v["config"]
    d, m = c["size"], 1 << c["modulus_bits"]
    gamma = c["clip_norm"] / 2 ** c["granularity_bits"]
    units = c["clip_norm"] / gamma
    mu = (c["noise_multiplier"] * units) ** 2
    slack = math.sqrt(2 * math.log(1 / c["beta"]))
    bound = math.sqrt(min(units ** 2 + d / 4 + slack * (units + math.sqrt(d) / 2),
                          (units + math.sqrt(d)) ** 2))
    l1 = min(math.sqrt(d) * bound, bound ** 2)
    assert (v["gamma"], v["mu"]) == (gamma, mu)
    assert v["norm_bound"] == pytest.approx(bound, rel=1e-12)
    assert v["l1_bound"] == pytest.approx(l1, rel=1e-12)
    norm = math.sqrt(sum(x * x for x in v["update"]))
    scaled = [v["weight"] * x * min(1.0, c["clip_norm"] / norm) / gamma for x in v["update"]]
    tries = [[rounded(x, u) for x, u in zip(scaled, draws, strict=True)]
             for draws in v["rounding_draws"]]
    assert len(tries) == 2  # the vector pins down a refused first rounding
    *refused, kept = tries
    assert all(math.sqrt(sum(r * r for r in t)) > bound for t in refused)
    assert math.sqrt(sum(r * r for r in kept)) <= bound
    assert v["encoded"] == [(r + a - b) % m for r, a, b in
                            zip(kept, v["noise_plus"], v["noise_minus"], strict=True)]
    for alpha, rdp in v["rdp"].items():
        a = int(alpha)
        expected = a * bound ** 2 / (2 * mu) + min(
            ((2 * a - 1) * bound ** 2 + 6 * l1) / (4 * mu ** 2), 3 * l1 / (2 * mu))
        assert rdp == pytest.approx(expected, rel=1e-12)


def test_k_is_the_ceiling_of_density_times_n_less_a_billionth() -> None:
    kept = load("secagg_encoding.json")["randk"]["kept_count"]
    assert kept == {d: math.ceil(float(d) * 100 - 1e-9) for d in kept}
    assert kept["0.07"] == 7  # 0.07 * 100 is 7.000000000000001 in binary floating point


def test_the_sparse_graph_is_the_sha256_cycle_joined_k_over_2_each_way() -> None:
    import hashlib

    g = load("secagg_encoding.json")["graph"]

    def digest(client: int) -> bytes:
        return hashlib.sha256(f"fedlink-secagg/graph/{g['seed']}/{client}".encode()).digest()

    order = sorted(g["clients"], key=digest)
    assert g["order"] == order
    n, half = len(order), (g["neighbours"] + 1) // 2
    expected: dict[str, set[int]] = {str(c): set() for c in order}
    for position, client in enumerate(order):
        for step in range(1, half + 1):
            other = order[(position + step) % n]
            expected[str(client)].add(other)
            expected[str(other)].add(client)
    assert g["graph"] == {c: sorted(v) for c, v in expected.items()}


def test_the_recorded_round_replays_message_for_message() -> None:
    v = load("secagg_round.json")
    c = v["config"]
    config = SecAggConfig(modulus_bits=c["modulus_bits"], quantization_bits=c["quantization_bits"],
                          clip=c["clip"], max_clients=c["max_clients"],
                          neighbours=c["neighbours"], threshold=c["threshold"])
    size, round_id = v["size"], v["round"]
    clients = []
    for i, draws in sorted(v["draws"].items()):
        clients.append(SecureClient(int(i), config, round_id, size,
                                    replayed([integer(d) for d in draws])))
    server = SecureSum(config, round_id, size, graph_seed=v["graph_seed"])
    adverts = [cl.advertise() for cl in clients]
    assert [(a.cipher_public.hex(), a.mask_public.hex()) for a in adverts] == \
        [(a["cipher_public"], a["mask_public"]) for a in v["advertise"]]
    roster = server.collect_keys(adverts)
    sent = [s for cl in clients for s in cl.share_keys(roster, v["graph_seed"])]
    assert [(s.sender, s.receiver, s.ciphertext.hex()) for s in sent] == \
        [(s["sender"], s["receiver"], s["ciphertext"]) for s in v["shares"]]
    for cl in clients:
        server.collect_shares(cl.client, [s for s in sent if s.sender == cl.client])
    server.close_sharing()
    for i, packed in v["masked"].items():
        cl = clients[int(i)]
        cl.receive_shares(server.shares_for(cl.client))
        masked = cl.masked_input(np.array(v["inputs"][i], np.uint32))
        assert pack(masked.values, config.modulus_bits).hex() == packed
        server.collect_masked(masked)
    request = server.unmask_request()
    assert sorted(request.dropped) == v["unmask_request"]["dropped"] == v["dropped_after_sharing"]
    total, count = server.finish([clients[a["client"]].unmask(request) for a in v["unmask"]])
    assert (list(map(int, total)), count) == (v["sum"], v["count"])


def test_the_recorded_sum_is_the_survivors_inputs_and_unmasks_by_hand() -> None:
    v = load("secagg_round.json")
    bits = v["config"]["modulus_bits"]
    m = 1 << bits
    survivors = v["unmask_request"]["survivors"]
    assert v["sum"] == [sum(v["inputs"][str(i)][k] for i in survivors) % m
                        for k in range(v["size"])]
    # the masked vectors summed, minus the rebuilt self masks, minus the dropped client's
    # pairwise masks with each survivor, is the sum (sign: +1 when the lower id adds it)
    masked = [unpack(bytes.fromhex(v["masked"][str(i)]), v["size"], bits).astype(np.int64)
              for i in survivors]
    total = sum(masked) % m
    for i in survivors:
        shares = [(a["client"] + 1, integer(a["seed_shares"][str(i)])) for a in v["unmask"]
                  if str(i) in a["seed_shares"]]
        seed = lagrange_at_zero(shares[:2])
        total = (total - np.array(prg(seed.to_bytes(32, "little"), v["size"]))) % m
    (dropped,) = v["unmask_request"]["dropped"]
    shares = [(a["client"] + 1, integer(a["key_shares"][str(dropped)])) for a in v["unmask"]]
    key = lagrange_at_zero(shares[:2])
    for j in survivors:
        public = bytes.fromhex(v["advertise"][j]["mask_public"])
        pair = np.array(prg(agree(key, public, f"fedlink-secagg/mask/{v['round']}"), v["size"]))
        sign = 1 if j < dropped else -1  # what j added for the pair (j, dropped)
        total = (total - sign * pair) % m
    assert list(map(int, total)) == v["sum"]
