"""Secure aggregation's pieces and a whole round with dropouts (fedlink.secagg)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from fedlink.errors import ConfigError
from fedlink.secagg import (
    SecAggAborted,
    SecAggConfig,
    SecAggError,
    SecureClient,
    SecureSum,
    UnmaskRequest,
    UnmaskShares,
    crypto,
    decode_sum,
    encode,
    encode_weighted,
    run_round,
    shamir,
    weighted_mean,
)
from fedlink.secagg.base import AdvertiseKeys
from fedlink.secagg.graph import neighbours


def _seeded(seed: int) -> shamir.RandomBelow:
    rng = random.Random(seed)
    return lambda n: rng.randrange(n)


def test_any_threshold_shares_rebuild_the_secret_and_fewer_do_not() -> None:
    secret = shamir.PRIME - 12345
    shares = shamir.split(secret, list(range(1, 8)), 4, _seeded(1))
    for subset in itertools.combinations(shares.items(), 4):
        assert shamir.reconstruct(subset, 4) == secret
    # three shares interpolated as if they were enough give some other value
    assert shamir.reconstruct(list(shares.items())[:3], 3) != secret
    with pytest.raises(SecAggError, match="3 shares given, 4 needed"):
        shamir.reconstruct(list(shares.items())[:3], 4)


def test_shamir_matches_its_polynomial() -> None:
    # f(x) = 7 + 3x + 5x^2 over the field: coefficients drawn from a fixed sequence
    draws = iter([3, 5])
    shares = shamir.split(7, [1, 2, 3], 3, lambda n: next(draws))
    assert shares == {1: 15, 2: 33, 3: 61}
    assert shamir.reconstruct(shares.items(), 3) == 7


def test_shamir_refuses_bad_points_and_secrets() -> None:
    with pytest.raises(SecAggError, match="distinct and non-zero"):
        shamir.split(1, [0, 1, 2], 2, _seeded(0))
    with pytest.raises(SecAggError, match="field element"):
        shamir.split(shamir.PRIME, [1, 2], 2, _seeded(0))
    with pytest.raises(SecAggError, match="two shares at one point"):
        shamir.reconstruct([(1, 5), (1, 6)], 2)


def test_key_agreement_is_symmetric_and_bound_to_purpose_and_round() -> None:
    a, b = crypto.private_key(_seeded(1)), crypto.private_key(_seeded(2))
    ab = crypto.agree(a, crypto.public_key(b), "mask", 7)
    assert ab == crypto.agree(b, crypto.public_key(a), "mask", 7)
    assert ab != crypto.agree(a, crypto.public_key(b), "share", 7)
    assert ab != crypto.agree(a, crypto.public_key(b), "mask", 8)


def test_a_share_altered_or_misdirected_does_not_decrypt() -> None:
    key = bytes(range(32))
    sealed = crypto.encrypt(key, b"share", 1, 2, 3)
    assert crypto.decrypt(key, sealed, 1, 2, 3) == b"share"
    tampered = bytes([sealed[0] ^ 1]) + sealed[1:]
    for args in ((tampered, 1, 2, 3), (sealed, 1, 2, 4), (sealed, 2, 2, 3)):
        with pytest.raises(SecAggError, match="does not decrypt"):
            crypto.decrypt(key, *args)


def test_mask_expansion_is_aes_ctr_of_the_seed() -> None:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    seed = bytes(range(32))
    words = crypto.expand(seed, 5)
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    expected = np.frombuffer(enc.update(bytes(20)), dtype="<u4")
    assert words.dtype == np.uint32 and np.array_equal(words, expected)
    assert np.array_equal(crypto.expand(seed, 3), words[:3])


def test_encoding_is_unbiased_and_the_sum_decodes_exactly() -> None:
    config = SecAggConfig(max_clients=10)
    rng = np.random.default_rng(0)
    values = np.array([-2.0, -1.0, -0.3, 0.0, 0.123456, 1.0, 5.0])
    encoded = encode(values, config, rng)
    assert encoded.clipped == 2
    assert encoded.values.dtype == np.uint32 and encoded.values.max() <= config.levels
    # the mean of many stochastic roundings is the value (within the sampling error)
    many = [decode_sum(encode(np.full(2000, 0.123456), config, rng).values, 1, config).mean()
            for _ in range(5)]
    assert abs(np.mean(many) - 0.123456) < config.step / 10
    total = sum(encode(values, config, rng).values for _ in range(10))
    decoded = decode_sum(total, 10, config)
    assert np.allclose(decoded, 10 * np.clip(values, -1, 1), atol=10 * config.step)


def test_a_weighted_update_decodes_to_its_mean_and_a_weight_beyond_the_clip_is_refused() -> None:
    config = SecAggConfig(max_clients=10)
    rng = np.random.default_rng(1)
    updates, weights = [np.full(4, 0.02), np.full(4, 0.06)], [1.0, 0.5]
    total = sum(encode_weighted(u, w, config, rng).values
                for u, w in zip(updates, weights, strict=True))
    mean, weight = weighted_mean(total, 2, config)
    assert np.allclose(mean, (0.02 + 0.5 * 0.06) / 1.5, atol=4 * config.step)
    assert abs(weight - 1.5) < 2 * config.step
    with pytest.raises(SecAggError, match="clip >= 1"):
        encode_weighted(updates[0], 1.0, SecAggConfig(max_clients=10, clip=0.5), rng)


def test_config_refuses_a_modulus_that_cannot_hold_the_sum() -> None:
    assert SecAggConfig().bits == 16  # 24-bit ring, up to 255 clients
    with pytest.raises(ConfigError, match="does not fit in Z_m"):
        SecAggConfig(modulus_bits=24, quantization_bits=20, max_clients=100)
    with pytest.raises(ConfigError, match="threshold"):
        SecAggConfig(threshold=1.0)


def test_the_sparse_graph_is_symmetric_and_regular() -> None:
    graph = neighbours(range(50), 8, seed=3)
    assert all(len(n) == 8 for n in graph.values())
    assert all(i in graph[j] for i, n in graph.items() for j in n)
    assert graph == neighbours(range(50), 8, seed=3)
    assert neighbours(range(5), None, 0)[2] == (0, 1, 3, 4)


@pytest.mark.parametrize("k", [None, 12])
def test_a_round_with_dropouts_unmasks_exactly_the_survivors_sum(k: int | None) -> None:
    rng = np.random.default_rng(1)
    n, d = 30, 50
    updates = [rng.normal(0, 0.1, d) for _ in range(n)]
    weights = [float(w) for w in rng.uniform(0.1, 1.0, n)]
    config = SecAggConfig(neighbours=k, threshold=0.4 if k else 0.5)
    result = run_round(updates, weights, config, drop_after_sharing={3, 7, 11},
                       drop_after_input={5}, seed=4, random_below=_seeded(5))
    assert result.exact
    assert result.delivered == frozenset(range(n)) - {3, 7, 11}
    mean, weight = weighted_mean(result.total, len(result.delivered), config)
    alive = sorted(result.delivered)
    expected = sum(weights[i] * updates[i] for i in alive) / sum(weights[i] for i in alive)
    assert weight == pytest.approx(sum(weights[i] for i in alive), abs=n * config.step)
    assert np.allclose(mean, expected, atol=n * config.step)


def test_too_many_dropouts_abort_the_round_naming_the_client() -> None:
    rng = np.random.default_rng(2)
    updates = [rng.normal(0, 0.1, 10) for _ in range(6)]
    with pytest.raises(SecAggAborted, match="cannot be rebuilt"):
        run_round(updates, [1.0] * 6, SecAggConfig(), drop_after_sharing={0},
                  drop_after_input={1, 2, 3}, seed=1)


def test_the_coordinator_holds_no_individual_input() -> None:
    config, size = SecAggConfig(), 20
    clients = [SecureClient(i, config, 1, size) for i in range(4)]
    server = SecureSum(config, 1, size, graph_seed=1)
    roster = server.collect_keys([c.advertise() for c in clients])
    for c in clients:
        server.collect_shares(c.client, c.share_keys(roster, 1))
    server.close_sharing()
    inputs = [np.full(size, 1000 * (i + 1), dtype=np.uint32) for i in range(4)]
    for c, x in zip(clients, inputs, strict=True):
        c.receive_shares(server.shares_for(c.client))
        masked = c.masked_input(x)
        assert not np.array_equal(masked.values, x)
        server.collect_masked(masked)
    held = [v for v in vars(server).values() if isinstance(v, np.ndarray)]
    assert all(not np.array_equal(h, x) for h in held for x in inputs)
    total, count = server.finish([c.unmask(server.unmask_request()) for c in clients])
    assert count == 4 and np.array_equal(total, sum(inputs))


def test_a_client_never_reveals_both_secrets_of_one_client() -> None:
    config = SecAggConfig()
    clients = [SecureClient(i, config, 1, 4) for i in range(3)]
    server = SecureSum(config, 1, 4, graph_seed=1)
    roster = server.collect_keys([c.advertise() for c in clients])
    for c in clients:
        server.collect_shares(c.client, c.share_keys(roster, 1))
    server.close_sharing()
    clients[0].receive_shares(server.shares_for(0))
    with pytest.raises(SecAggError, match="both delivered and dropped"):
        clients[0].unmask(UnmaskRequest(frozenset({1}), frozenset({1})))
    clients[0].unmask(UnmaskRequest(frozenset({0, 1}), frozenset({2})))
    with pytest.raises(SecAggError, match="already answered"):
        clients[0].unmask(UnmaskRequest(frozenset({0, 2}), frozenset({1})))


def test_a_roster_needs_keys_only_for_the_neighbours_and_refuses_one_without_them() -> None:
    config = SecAggConfig(max_clients=6, neighbours=2)
    clients = [SecureClient(i, config, 1, 4) for i in range(6)]
    roster = SecureSum(config, 1, 4, graph_seed=1).collect_keys(c.advertise() for c in clients)
    mine = {0, *neighbours(range(6), 2, 1)[0]}
    bare = [a if a.client in mine else AdvertiseKeys(a.client, b"", b"") for a in roster]
    assert len(clients[0].share_keys(bare, 1)) == 2  # one share per neighbour, as in full
    missing = next(iter(mine - {0}))
    without = [AdvertiseKeys(a.client, b"", b"") if a.client == missing else a for a in roster]
    with pytest.raises(SecAggError, match=f"no keys for neighbour.*{missing}"):
        SecureClient(0, config, 1, 4).share_keys(without, 1)


def test_shares_are_handed_out_only_after_phase_two_closes() -> None:
    config = SecAggConfig()
    clients = [SecureClient(i, config, 1, 4) for i in range(3)]
    server = SecureSum(config, 1, 4, graph_seed=1)
    roster = server.collect_keys([c.advertise() for c in clients])
    server.collect_shares(0, clients[0].share_keys(roster, 1))
    with pytest.raises(SecAggError, match="once phase 2 is closed"):
        server.shares_for(0)
    server.close_sharing()
    with pytest.raises(SecAggError, match="cannot share keys now"):
        server.collect_shares(1, clients[1].share_keys(roster, 1))


def test_a_round_without_weights_sums_the_updates_alone() -> None:
    rng = np.random.default_rng(3)
    updates = [rng.normal(0, 0.1, 40) for _ in range(8)]
    config = SecAggConfig(max_clients=8)
    result = run_round(updates, None, config, drop_after_sharing={2}, seed=2)
    assert result.exact and result.total.size == 40  # no weight coordinate
    alive = sorted(result.delivered)
    decoded = decode_sum(result.total, len(alive), config)
    assert np.allclose(decoded, sum(updates[i] for i in alive), atol=len(alive) * config.step)


def _shared(n: int, config: SecAggConfig, round_id: int,
            size: int) -> tuple[list[SecureClient], SecureSum]:
    """``n`` clients that advertised and shared their keys, and the closed sharing phase."""
    clients = [SecureClient(i, config, round_id, size) for i in range(n)]
    server = SecureSum(config, round_id, size, graph_seed=round_id)
    roster = server.collect_keys([c.advertise() for c in clients])
    for c in clients:
        server.collect_shares(c.client, c.share_keys(roster, round_id))
    server.close_sharing()
    return clients, server


def test_unmasking_can_finish_exactly_when_the_answers_rebuild_every_secret() -> None:
    """Phase 4 closes as soon as the answers in hand rebuild every survivor's seed and every
    dropped client's key: ``can_finish`` turns true exactly when ``finish`` stops refusing,
    before every survivor answered, and the sum is then already exact."""
    n, size, config = 8, 6, SecAggConfig(threshold=0.5)
    rng = np.random.default_rng(3)
    inputs = [rng.integers(0, config.modulus, size, dtype=np.uint32) for _ in range(n)]
    clients, server = _shared(n, config, 9, size)
    going_on = [c for c in clients if c.client != 2]  # 2 vanishes after sharing
    for c in going_on:
        c.receive_shares(server.shares_for(c.client))
        server.collect_masked(c.masked_input(inputs[c.client]))
    request = server.unmask_request()
    plain = sum(inputs[c.client] for c in going_on) & np.uint32(config.modulus - 1)
    answers: list[UnmaskShares] = []
    for c in going_on:
        ready = server.can_finish(answers)
        if ready:
            break
        with pytest.raises(SecAggAborted):
            server.finish(answers)
        answers.append(c.unmask(request))
    assert server.can_finish(answers) and len(answers) < len(going_on)
    total, count = server.finish(answers)
    assert count == len(going_on) and np.array_equal(total, plain)


def _survivors_round(n: int, config: SecAggConfig, survivors: frozenset[int]) -> tuple[
        bool, bool]:
    """A round in which every client shares and only ``survivors`` deliver and answer:
    whether ``rebuildable`` said so before the inputs came, and whether ``finish`` could."""
    size = 3
    clients, server = _shared(n, config, 5, size)
    told = server.rebuildable(survivors)
    for c in clients:
        if c.client in survivors:
            c.receive_shares(server.shares_for(c.client))
            server.collect_masked(c.masked_input(np.zeros(size, np.uint32)))
    request = server.unmask_request()
    try:
        server.finish([c.unmask(request) for c in clients if c.client in survivors])
    except SecAggAborted:
        return told, False
    return told, True


@pytest.mark.parametrize(("n", "k"), [(6, None), (8, 4)])
def test_rebuildable_says_beforehand_whether_the_survivors_answers_unmask_the_sum(
        n: int, k: int | None) -> None:
    """A quorum closes a phase early only when the members in it could unmask the sum alone:
    ``rebuildable`` must agree with ``finish`` for every set of survivors (full and sparse
    graphs), so that it neither closes a phase into a lost group nor waits for nothing."""
    config = SecAggConfig(neighbours=k, threshold=0.5)
    outcomes = set()
    for count in range(2, n + 1):
        for survivors in itertools.combinations(range(n), count):
            told, finished = _survivors_round(n, config, frozenset(survivors))
            assert told == finished, survivors
            outcomes.add(finished)
    assert outcomes == {True, False}  # both cases met


def test_an_unmask_answer_the_round_cannot_use_is_refused_before_it_counts() -> None:
    """Read as sent, a share at another point than its sender's, one outside the field, or
    one of a client the request does not name that way would rebuild a wrong secret and
    unmask a wrong sum (seen: a sum flushed with 2.7 times its weight). Each is refused; the
    honest answer passes and the sum is exact."""
    config, size = SecAggConfig(), 6
    clients, server = _shared(4, config, 1, size)
    inputs = [np.full(size, 7 * (i + 1), dtype=np.uint32) for i in range(3)]
    for c, x in zip(clients[:3], inputs, strict=True):  # client 3 drops after sharing
        c.receive_shares(server.shares_for(c.client))
        server.collect_masked(c.masked_input(x))
    clients[3].receive_shares(server.shares_for(3))
    request = server.unmask_request()
    honest = clients[0].unmask(request)
    owner, (x, y) = next(iter(honest.seed_shares.items()))
    key_owner, key_share = next(iter(honest.key_shares.items()))

    def altered(**changes: dict[int, tuple[int, int]]) -> UnmaskShares:
        return UnmaskShares(**{"client": 0, "seed_shares": honest.seed_shares,
                               "key_shares": honest.key_shares, **changes})

    bad = {
        "another point": altered(seed_shares={**honest.seed_shares, owner: (x + 1, y)}),
        "outside the field": altered(seed_shares={**honest.seed_shares,
                                                  owner: (x, shamir.PRIME)}),
        "a dropped client's seed": altered(seed_shares={**honest.seed_shares,
                                                        key_owner: key_share}),
        "a survivor's key": altered(key_shares={**honest.key_shares, owner: (x, y)}),
        "not a sharer": UnmaskShares(9, honest.seed_shares, honest.key_shares),
    }
    for why, answer in bad.items():
        with pytest.raises(SecAggError):
            server.check_answer(answer)
            pytest.fail(f"accepted {why}")
    answers = [honest, *(c.unmask(request) for c in clients[1:3])]
    for answer in answers:
        server.check_answer(answer)
    total, count = server.finish(answers)
    assert count == 3 and np.array_equal(total, sum(inputs))
